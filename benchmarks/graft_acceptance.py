"""How often the target accepts the new tokens of grafted chains (prompt lookup, the
datastore), position by position: the numbers behind ``domino.generate.GRAFT_PRIOR``.

Greedy tree rounds of the shipped drafter (a fixed ``TreeShape(3, 4, --nodes)``, so no
budget cuts a graft: every chain is grafted at its full length, ``lookup_tokens`` 10 and
``datastore_tokens`` 6) on HumanEval and on held-out chat prompts. For each kind of graft
(a prompt-lookup chain after a match of ``domino.lookup.LONG_MATCH`` tokens or more, one
after a shorter match, a datastore chain) it prints, for new token j (the chain's tokens
after those that follow the drafter's own nodes), how many grafts reached j (their tokens
before j all accepted) and the share of those whose token j was accepted too: the
conditional rates the budget's ``best_graft_length`` multiplies, and the prior it starts
each call from.

    python benchmarks/graft_acceptance.py [--num-prompts 12] [--max-new-tokens 128] [--nodes 10]
"""

from __future__ import annotations

import argparse

import torch

import domino
import domino.generate
from domino.budget import DepthAcceptance
from domino.generate import new_graft_acceptance
from eval_acceptance import chat_prompts, humaneval_prompts


class CountingAcceptance(DepthAcceptance):
    """DepthAcceptance that also keeps raw counts (no prior, no fading) under its ``kind``."""

    counts: dict[str, tuple[list[int], list[int]]] = {}
    kind: str | None = None

    def update(self, verified, accepted):
        super().update(verified, accepted)
        if self.kind is None:  # the drafter's own depth counts
            return
        n = len(self.tried)
        reached, kept = self.counts.setdefault(self.kind, ([0] * n, [0] * n))
        for k, a in zip(verified, accepted):
            for j in range(min(k, a + 1, n)):
                reached[j] += 1
                kept[j] += j < a


def counted_graft_acceptance(lookup_tokens: int, datastore_tokens: int) -> dict:
    """The engine's per-kind graft counters (domino.generate.new_graft_acceptance), counting."""
    counters = new_graft_acceptance(lookup_tokens, datastore_tokens)
    for kind, c in counters.items():
        c.kind = kind
    return counters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=10, help="the drafter's tree nodes per round, root included")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    domino.generate.DepthAcceptance = CountingAcceptance  # the engine's counters, counted raw here
    domino.generate.new_graft_acceptance = counted_graft_acceptance
    gen = domino.load_default()
    lookup, store = domino.generate.DEFAULT_LOOKUP_TOKENS, domino.generate.DEFAULT_DATASTORE_TOKENS
    for label, prompts in (("HumanEval", humaneval_prompts(args.num_prompts)), ("chat", chat_prompts(args.num_prompts))):
        CountingAcceptance.counts = {}
        for p in prompts:
            gen.generate(p, max_new_tokens=args.max_new_tokens, tree=domino.TreeShape(3, 4, args.nodes),
                         lookup_tokens=lookup, datastore_tokens=store)
        print(f"\n{label}: {len(prompts)} prompts x {args.max_new_tokens} tokens, TreeShape(3, 4, {args.nodes}), "
              f"grafts at full length")
        for kind, n in (("lookup-long", lookup), ("lookup-short", lookup), ("datastore", store)):
            reached, kept = CountingAcceptance.counts.get(kind, ([0] * n, [0] * n))
            rates = " ".join(f"{k / r:.2f}" if r else "  - " for k, r in zip(kept, reached))
            print(f"  {kind:12s} new token 1..{n}: reached {reached}")
            print(f"  {kind:12s} accepted given reached: {rates}")


if __name__ == "__main__":
    main()
