"""Prompt lookup for tree rounds: a chain of tokens copied from earlier in the sequence.

Code and chat answers repeat what came before them (identifiers, a function signature, a
line of the prompt). Prompt lookup (as HF's ``prompt_lookup_num_tokens``) proposes, after
the last 3 (else 2) tokens, the tokens that followed their latest earlier occurrence in
the prompt and the output. :func:`domino.tree.graft_chain` grafts that chain onto the
round's draft tree, sharing the nodes where it agrees with the drafter, and the target
verifies both in its one forward: greedy verification keeps whichever path the target
agrees with longest, so the output is still exactly the target's.

Replaying the shipped drafter's tree rounds on 8 HumanEval and 8 held-out chat prompts
(SmolLM2, 128 tokens; ``benchmarks/lookup_replay.py``), the better of tree and a 10-token
lookup per round would advance 3.10-3.11 and 2.41-2.42 tokens where the tree alone advances
2.02-2.03 and 1.93 (two runs, ``benchmarks/results/lookup_replay_zen4_session12.txt``; an
upper bound: ``benchmarks/bench_e2e.py`` times the real thing).
"""

from __future__ import annotations

__all__ = ["NgramIndex", "NGRAM_SIZES", "DEFAULT_LOOKUP_TOKENS"]

NGRAM_SIZES = (3, 2)  # the suffix lengths tried, longest first (a 1-gram match proposes noise)
# Tokens of the lookup chain grafted per greedy tree round (DominoGenerator.generate's
# lookup_tokens): HF prompt lookup's usual 10. Longer chains can only add accepted tokens
# (the replay's bound on HumanEval: 5 / 10 / 15 tokens 2.67 / 3.10 / 3.26 a round) but each
# grafted node costs verification time; in one-off timings (not a benchmark of record)
# 5 to 15 tokens ran within run-to-run noise of each other.
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
