"""Prompt lookup for tree rounds: a chain of tokens copied from earlier in the sequence.

Code and chat answers repeat what came before them (identifiers, a function signature, a
line of the prompt). Prompt lookup (as HF's ``prompt_lookup_num_tokens``) proposes the
tokens that followed the latest earlier occurrence, in the prompt and the output, of the
longest suffix among :data:`NGRAM_SIZES` (12 down to 2 tokens) that occurred before.
:func:`domino.tree.graft_chains` grafts that chain onto the round's draft tree, sharing the
nodes where it agrees with the drafter, and the target verifies both in its one forward:
greedy verification keeps whichever path the target agrees with longest, so the output is
still exactly the target's.

Replaying the shipped drafter's tree rounds on 8 HumanEval and 8 held-out chat prompts
(SmolLM2, 128 tokens; ``benchmarks/lookup_replay.py``), the better of tree and a 10-token
lookup per round would advance 3.29 and 2.69 tokens where the tree alone advances 2.07
and 1.99 (``benchmarks/results/lookup_replay_ngram_sizes_zen4_session13.txt``; an upper
bound: ``benchmarks/bench_e2e.py`` times the real thing).
"""

from __future__ import annotations

__all__ = ["NgramIndex", "NGRAM_SIZES", "LONG_MATCH", "DEFAULT_LOOKUP_TOKENS"]

# The suffix lengths tried, longest first (a 1-gram match proposes noise), as vLLM's n-gram
# proposer tries its max down to its min: a longer match is likelier to continue as it
# did before. Proposals are made in the same rounds as with (3, 2) (a 2-gram match exists
# whenever a longer one does), so verification costs the same. Replaying the shipped
# drafter's tree rounds on 8 HumanEval and 8 held-out chat prompts (``python
# benchmarks/lookup_replay.py --ngram-sizes 3,2 12,8,6,5,4,3,2``,
# benchmarks/results/lookup_replay_ngram_sizes_zen4_session13.txt), the better of tree
# and a 10-token lookup per round rose from 3.17 / 2.48 tokens with (3, 2) to 3.29 / 2.69.
# That bound counts rounds at the tree's boundaries, where the engine's longer rounds skip
# ahead: in bench_e2e.py's records the engine's tokens a round went from 2.48-2.49 / 2.24
# (twelfth session, (3, 2)) to 2.53 / 2.35 (thirteenth, these sizes).
NGRAM_SIZES = (12, 8, 6, 5, 4, 3, 2)
# From this suffix length on a lookup chain counts as a long match, whose acceptance the
# graft budget tracks apart from the short matches' (domino.generate.lookup_graft_kind): the
# first new token of a chain after a 2- or 3-token match was right 14 % / 35 % of the time
# (HumanEval / chat), after 4 or more 67 % / 85 % (benchmarks/graft_acceptance.py,
# results/graft_acceptance_zen3_session46.txt; an ad-hoc split by exact length had 12-27 %
# after 2 tokens, 25-55 % after 3, 50-100 % from 4 on).
LONG_MATCH = 4
# Tokens of the lookup chain grafted per greedy tree round at most (DominoGenerator.generate's
# lookup_tokens; with the adaptive budget each round grafts the part that pays,
# domino.budget.best_graft_length): HF prompt lookup's usual 10. Longer chains can only add accepted tokens
# (the replay's bound on HumanEval with n-grams (3, 2): 5 / 10 / 15 tokens 2.67 / 3.10 /
# 3.26 a round, results/lookup_replay_zen4_session12.txt) but each
# grafted node costs verification time; in one-off timings (not a benchmark of record)
# 5 to 15 tokens ran within run-to-run noise of each other.
DEFAULT_LOOKUP_TOKENS = 10


class NgramIndex:
    """The tokens of one sequence (prompt, then output) and, for each n-gram of the suffix
    lengths ``sizes`` (longest first; default :data:`NGRAM_SIZES`) that has a token after
    it, where its latest occurrence ends. O(1) per token appended and per proposal."""

    def __init__(self, tokens: list[int], sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = tuple(sizes)
        self.tokens: list[int] = []
        self._next: dict[tuple, int] = {}  # n-gram -> index of the token after its latest occurrence
        self.extend(tokens)

    def extend(self, new: list[int]) -> None:
        """Appends tokens. The n-grams ending at the new last token are indexed only once a
        token follows them (the suffix must find an *earlier* occurrence)."""
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new)
        for end in range(max(start - 1, 0), len(self.tokens) - 1):  # n-grams ending at `end`, followed by end + 1
            for n in self.sizes:
                if end + 1 >= n:
                    self._next[(n, *self.tokens[end + 1 - n:end + 1])] = end + 1

    def propose(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the latest earlier occurrence of the
        longest suffix n-gram found; [] when none occurred before."""
        return self.propose_match(max_tokens)[0]

    def propose_match(self, max_tokens: int) -> tuple[list[int], int]:
        """:meth:`propose`'s tokens and the length n of the suffix n-gram they follow (0
        when none occurred before): a longer match is likelier to go on as it did."""
        if max_tokens <= 0:
            return [], 0
        for n in self.sizes:
            if len(self.tokens) < n:
                continue
            at = self._next.get((n, *self.tokens[-n:]))
            if at is not None:
                return self.tokens[at:at + max_tokens], n
        return [], 0
