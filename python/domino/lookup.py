"""Prompt lookup for tree rounds: a chain of tokens copied from earlier in the sequence.

Code and chat answers repeat what came before them (identifiers, a function signature, a
line of the prompt). Prompt lookup (as HF's ``prompt_lookup_num_tokens``) proposes, after
the last 3 (else 2) tokens, the tokens that followed their latest earlier occurrence in
the prompt and the output. :func:`domino.tree.graft_chain` grafts that chain onto the
round's draft tree, sharing the nodes where it agrees with the drafter, and the target
verifies both in its one forward: greedy verification keeps whichever path the target
agrees with longest, so the output is still exactly the target's.

Measured by replaying the shipped drafter's rounds on 8 HumanEval and 8 held-out chat
prompts (SmolLM2, 128 tokens): the better of tree and lookup per round would advance 3.17
and 2.52 tokens where the tree alone advances 2.03 and 1.93 (`benchmarks/bench_e2e.py`
times the real thing).
"""

from __future__ import annotations

__all__ = ["NgramIndex", "NGRAM_SIZES", "DEFAULT_LOOKUP_TOKENS"]

NGRAM_SIZES = (3, 2)  # the suffix lengths tried, longest first (a 1-gram match proposes noise)
# Tokens of the lookup chain grafted per greedy tree round (DominoGenerator.generate's
# lookup_tokens): HF prompt lookup's usual 10. The length hardly matters here: on HumanEval
# 0-7, one pass each, 5 / 8 / 12 / 15 tokens ran at 70.4 / 73.1 / 74.0 / 75.6 tok/s (none:
# 61.5); on HumanEval 8-15 plus 8 chat prompts, two passes, 6 / 10 / 15 at 65.1 / 64.7 /
# 62.7 (within run-to-run noise of each other).
DEFAULT_LOOKUP_TOKENS = 10


class NgramIndex:
    """The tokens of one sequence (prompt, then output) and, for each n-gram of
    :data:`NGRAM_SIZES` that has a token after it, where its latest occurrence ends.
    O(1) per token appended and per proposal."""

    def __init__(self, tokens: list[int]):
        self.tokens: list[int] = []
        self._next: dict[tuple, int] = {}  # n-gram -> index of the token after its latest occurrence
        self.extend(tokens)

    def extend(self, new: list[int]) -> None:
        """Appends tokens. The n-grams ending at the new last token are indexed only once a
        token follows them (the suffix must find an *earlier* occurrence)."""
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new)
        for end in range(max(start - 1, 0), len(self.tokens) - 1):  # n-grams ending at `end`, followed by end + 1
            for n in NGRAM_SIZES:
                if end + 1 >= n:
                    self._next[(n, *self.tokens[end + 1 - n:end + 1])] = end + 1

    def propose(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens that followed the latest earlier occurrence of the
        longest suffix n-gram found; [] when none occurred before."""
        if max_tokens <= 0:
            return []
        for n in NGRAM_SIZES:
            if len(self.tokens) < n:
                continue
            at = self._next.get((n, *self.tokens[-n:]))
            if at is not None:
                return self.tokens[at:at + max_tokens]
        return []
