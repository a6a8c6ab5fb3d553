"""Retrieval drafting for tree rounds: chains from a datastore of the target's own outputs.

A drafter of a few million parameters rarely guesses the boilerplate its target writes
again and again (a ``return`` line, a docstring's shape, a code fence), and prompt lookup
(:mod:`domino.lookup`) only finds what this one sequence already holds. Retrieval-based
speculative decoding (REST, He et al., NAACL 2024; SuffixDecoding's global tree does the
same with earlier outputs) looks the sequence's suffix up in a corpus instead and proposes
what most often followed it there. Here the corpus is the target's own greedy responses
to the training prompts, which the drafter's training regenerated anyway
(``training/build_datastore.py``; HumanEval and the held-out shard are never in it).

:meth:`TokenDatastore.propose` finds the longest suffix of the context, among
:data:`NGRAM_SIZES`, that occurs in the corpus, takes its first :data:`MAX_MATCHES`
occurrences, and walks their continuations token by token: the most frequent next token,
as long as at least :data:`MIN_SHARE` of the occurrences still in the walk agree on it,
then only those occurrences. :func:`domino.tree.graft_chains` grafts the chain onto the
round's draft tree beside the prompt-lookup chain; greedy verification keeps whichever
path the target agrees with longest, so the output is still exactly the target's.

The index is one sorted array of n-gram keys per size, built when the datastore is
loaded (numpy; 2.6 s for the five sizes over the shipped 5M tokens on the 2-core Zen 4
VM, 234 MB held, ~400 MB at the build's peak) or memory-mapped from a directory it was
cached in (``index_dir``; :func:`domino.load` keeps it in the domino cache), and every
hash hit is checked against the tokens, so a hash collision never proposes anything. A
proposal costs ~0.1 ms.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from domino.cache_dirs import write_directory

__all__ = ["TokenDatastore", "NGRAM_SIZES", "MAX_MATCHES", "MIN_SHARE", "DEFAULT_DATASTORE_TOKENS",
           "DATASTORE_FILE"]

# Suffix lengths looked up, longest first. Not below 4: a 2-token suffix occurs thousands
# of times in millions of tokens, after unrelated text (replaying the shipped drafter's
# rounds on 8 HumanEval prompts, a 2-token match's chain had its first token right in a
# third of the rounds and its third in 3 %). Minimum 3 and 4 ran within noise of each
# other in an ad-hoc A/B in the engine (HumanEval 1.60x both, chat 1.54x / 1.50x, one
# run each; not a benchmark of record); 4 keeps the surer chains.
NGRAM_SIZES = (12, 8, 6, 5, 4)
# Occurrences of the suffix whose continuations are counted (the first ones in the
# corpus): bounds the work of a proposal when the suffix is common.
MAX_MATCHES = 256
# A chain goes on while at least this share of the occurrences still followed agree on the
# next token (0.5: it follows at least as many of them as every other token together).
MIN_SHARE = 0.5
# Tokens of the datastore chain grafted per greedy tree round at most (DominoGenerator.generate's
# datastore_tokens; with the adaptive budget each round grafts the part that pays,
# domino.budget.best_graft_length). Each grafted node costs verification time (~0.6 ms at ~10 nodes on
# the Zen 4 VM) and a retrieved chain's later tokens are rarely right: 6 and 10 ran within
# noise of each other in the same ad-hoc A/B (HumanEval 1.60x / 1.62x, chat 1.50x /
# 1.45x), 6 verifying ~1 node less a round.
DEFAULT_DATASTORE_TOKENS = 6
# Where a drafter checkpoint keeps the datastore of its target's outputs
DATASTORE_FILE = "datastore.npz"

_MULT = 1_000_003  # the rolling hash's multiplier (odd: a unit mod 2**64)
_MASK = (1 << 64) - 1
_SEPARATOR = -1  # between sequences in the corpus: no n-gram crosses it, no chain runs past it
_INDEX_FORMAT = 1  # of the keys _build makes: a cached index of another format is not read
# Cached indexes kept in an index_dir, the most recently used ones: each is ~230 MB for the
# shipped datastore, and every new datastore (a package upgrade, a rebuilt corpus) makes a
# new one, so without a bound the cache would grow by that much per version.
CACHED_INDEXES_KEPT = 2


def _signed64(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def _hash(tokens: Sequence[int]) -> int:
    """The hash of one n-gram, as the vectorised build computes it (int64, wrapping)."""
    h = 0
    for t in tokens:
        h = (h * _MULT + int(t) + 1) & _MASK
    return _signed64(h)


class TokenDatastore:
    """An n-gram index over a corpus of token sequences that proposes continuations.

    ``tokens``: a 1-D integer array of token ids >= 0, sequences separated by -1 (see
    :meth:`from_sequences`). ``sizes``: the suffix lengths looked up, distinct, >= 1.
    ``index_dir``: where to keep the built index (one subdirectory per corpus and sizes,
    memory-mapped when found again: a load takes milliseconds instead of seconds, and
    processes on one machine share its pages), or None to build it in memory."""

    def __init__(self, tokens: np.ndarray, sizes: Sequence[int] = NGRAM_SIZES, index_dir: str | Path | None = None):
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(f"tokens must be a 1-D integer array, got {tokens.dtype} of shape {list(tokens.shape)}")
        if tokens.size and int(tokens.min()) < _SEPARATOR:
            raise ValueError(f"tokens must be token ids >= 0 or -1 (a separator), got {int(tokens.min())}")
        sizes = tuple(sorted({int(n) for n in sizes}, reverse=True))
        if not sizes or sizes[-1] < 1:
            raise ValueError(f"sizes must be n-gram lengths >= 1, got {sizes!r}")
        # a separator at the end: every occurrence has a next entry to read
        if not tokens.size or tokens[-1] != _SEPARATOR:
            tokens = np.append(tokens, _SEPARATOR)
        self.tokens = tokens.astype(np.int64)
        self.sizes = sizes
        self._pos_bits = max(1, int(self.tokens.size - 1).bit_length())  # a position fits below the hash
        self._index = self._build() if index_dir is None else self._cached_index(Path(index_dir))

    def _cached_index(self, index_dir: Path) -> dict[int, np.ndarray]:
        """The index from ``index_dir``'s subdirectory for this corpus and these sizes,
        memory-mapped; built here and written there first when it is missing
        (:func:`domino.cache_dirs.write_directory`: never half-written)."""
        digest = hashlib.sha256(self.tokens.tobytes())
        digest.update(repr((self.sizes, _MULT, _INDEX_FORMAT)).encode())
        where = index_dir / f"datastore-{digest.hexdigest()[:20]}"
        names = {n: f"keys_{n}.npy" for n in self.sizes}

        def complete(d: Path) -> bool:
            return all((d / f).exists() for f in names.values())

        def write(tmp: Path) -> None:
            for n, f in names.items():
                np.save(tmp / f, index[n])

        if not complete(where):
            index = self._build()
            write_directory(where, write, complete)
            _prune_cached_indexes(index_dir, keep=where)
            return index
        try:
            os.utime(where)  # used now: what _prune_cached_indexes keeps
        except OSError:  # a read-only cache is still read
            pass
        return {n: np.load(where / f, mmap_mode="r") for n, f in names.items()}

    def _build(self) -> dict[int, np.ndarray]:
        """Per size n: a sorted int64 key per n-gram that crosses no separator, its hash's
        top bits above its start position (one array sorts faster than an argsort of the
        hashes and a gather). The hashes of all sizes come from one pass per token of the
        longest: the n-gram hash at i is the (n-1)-gram hash at i times the multiplier
        plus the token at i + n - 1."""
        t = self.tokens
        h = np.zeros(t.size, dtype=np.int64)
        crosses = np.zeros(t.size, dtype=bool)
        index = {n: np.empty(0, np.int64) for n in self.sizes}
        for n in range(1, max(self.sizes) + 1):
            count = t.size - n + 1
            if count <= 0:
                break
            col = t[n - 1:]
            with np.errstate(over="ignore"):  # the hash wraps mod 2**64, as _hash does
                h = h[:count] * _MULT + (col + 1)
            crosses = crosses[:count] | (col == _SEPARATOR)
            if n in self.sizes:
                starts = np.flatnonzero(~crosses)
                keys = ((h[starts] >> self._pos_bits) << self._pos_bits) | starts
                keys.sort()  # by hash, then (equal hashes) by position
                index[n] = keys
        return index

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]], sizes: Sequence[int] = NGRAM_SIZES) -> "TokenDatastore":
        """A datastore over token sequences (lists of ids >= 0), none continuing into the next."""
        parts = []
        for s in sequences:
            parts.append(np.asarray(list(s), dtype=np.int64))
            parts.append(np.array([_SEPARATOR], dtype=np.int64))
        return cls(np.concatenate(parts) if parts else np.empty(0, np.int64), sizes)

    def __len__(self) -> int:
        """Corpus entries, separators included."""
        return int(self.tokens.size)

    def save(self, path: str | Path) -> None:
        """Writes the corpus (compressed; uint16 when every id fits) to ``path``, as it is
        named (an .npz archive)."""
        t = self.tokens
        if t.max(initial=0) < np.iinfo(np.uint16).max:
            stored = np.where(t == _SEPARATOR, np.iinfo(np.uint16).max, t).astype(np.uint16)
        else:
            stored = t.astype(np.int32)
        with open(path, "wb") as f:  # a path given as a name: numpy would append ".npz"
            np.savez_compressed(f, tokens=stored)

    @classmethod
    def load(cls, path: str | Path, sizes: Sequence[int] = NGRAM_SIZES,
             index_dir: str | Path | None = None) -> "TokenDatastore":
        """A datastore from :meth:`save`'s file, its index built here or found in
        ``index_dir`` (see the class)."""
        with np.load(path) as f:
            stored = f["tokens"]
        if stored.dtype == np.uint16:
            tokens = np.where(stored == np.iinfo(np.uint16).max, _SEPARATOR, stored.astype(np.int64))
        else:
            tokens = stored.astype(np.int64)
        return cls(tokens, sizes, index_dir)

    def occurrences(self, ngram: Sequence[int]) -> np.ndarray:
        """Start positions [<= MAX_MATCHES] of the first occurrences of ``ngram`` (a length
        in ``sizes``) in the corpus, ascending."""
        n, keys, bits = len(ngram), self._index[len(ngram)], self._pos_bits
        q = (_hash(ngram) >> bits) << bits
        lo, hi = np.searchsorted(keys, q, "left"), np.searchsorted(keys, q | ((1 << bits) - 1), "right")
        want = np.asarray(ngram, dtype=np.int64)
        found, take = [], 2 * MAX_MATCHES
        # The hits come in position order; a hash collision must not propose, so the tokens
        # are checked, a slice at a time (a common n-gram has tens of thousands of hits).
        for start in range(lo, hi, take):
            at = keys[start:min(hi, start + take)] & ((1 << bits) - 1)
            found.append(at[(self.tokens[at[:, None] + np.arange(n)] == want).all(1)])
            if sum(f.size for f in found) >= MAX_MATCHES:
                break
        return np.concatenate(found)[:MAX_MATCHES] if found else np.empty(0, np.int64)

    def propose(self, context: Sequence[int], max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that most often followed the longest suffix of
        ``context`` (token ids) found in the corpus, each agreed on by at least
        :data:`MIN_SHARE` of the occurrences that agreed on the tokens before it; []
        when no suffix of the sizes occurs."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an int >= 0, got {max_tokens!r}")
        if max_tokens == 0:
            return []
        for n in self.sizes:
            if len(context) < n:
                continue
            at = self.occurrences(list(context[-n:]))
            if at.size:
                return self._continuation(at + n, max_tokens)
        return []

    def _continuation(self, nxt: np.ndarray, max_tokens: int) -> list[int]:
        """The majority walk from the positions ``nxt`` (where each occurrence goes on):
        the most frequent next token (the smallest id among equally frequent ones) while it
        follows at least MIN_SHARE of the occurrences, those that end there included."""
        out: list[int] = []
        while len(out) < max_tokens:
            following = self.tokens[nxt]
            going_on = following[following != _SEPARATOR]
            if not going_on.size:
                break
            values, counts = np.unique(going_on, return_counts=True)
            best = int(counts.argmax())
            if counts[best] < MIN_SHARE * following.size:
                break
            token = int(values[best])
            out.append(token)
            nxt = nxt[following == token] + 1
        return out


def _prune_cached_indexes(index_dir: Path, keep: Path) -> None:
    """Removes the cached indexes in ``index_dir`` beyond the :data:`CACHED_INDEXES_KEPT`
    most recently used (by modification time, which every load refreshes), never ``keep``.
    A process still reading a removed index keeps its memory maps (POSIX unlink semantics);
    one that loads that datastore later builds its index again."""
    cached = [d for d in index_dir.glob("datastore-*") if d.is_dir() and not d.name.endswith(".tmp") and d != keep]
    cached.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    for d in cached[CACHED_INDEXES_KEPT - 1:]:
        shutil.rmtree(d, ignore_errors=True)
