"""How often the target accepts the new tokens of grafted chains (prompt lookup, the
datastore), position by position: the numbers behind ``domino.generate.GRAFT_PRIOR``.

Greedy tree rounds of the shipped drafter (a fixed ``TreeShape(3, 4, --nodes)``, so no
budget cuts a graft: every chain is grafted at its full length, ``lookup_tokens`` 10 and
``datastore_tokens`` 6) on HumanEval and on held-out chat prompts. For each source it
prints, for new token j (the chain's tokens after those that follow the drafter's own
nodes), how many grafts reached j (their tokens before j all accepted) and the share of
those whose token j was accepted too: the conditional rates the budget's
``best_graft_length`` multiplies, and the prior it starts each call from.

    python benchmarks/graft_acceptance.py [--num-prompts 12] [--max-new-tokens 128] [--nodes 10]
"""

from __future__ import annotations

import argparse

import torch

import domino
import domino.generate
from domino.budget import DepthAcceptance
from eval_acceptance import chat_prompts, humaneval_prompts


class CountingAcceptance(DepthAcceptance):
    """DepthAcceptance that also keeps raw counts (no prior, no fading) by its depth count."""

    counts: dict[int, tuple[list[int], list[int]]] = {}

    def update(self, verified, accepted):
        super().update(verified, accepted)
        n = len(self.tried)
        reached, kept = self.counts.setdefault(n, ([0] * n, [0] * n))
        for k, a in zip(verified, accepted):
            for j in range(min(k, a + 1, n)):
                reached[j] += 1
                kept[j] += j < a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=10, help="the drafter's tree nodes per round, root included")
    args = ap.parse_args()

    torch.set_grad_enabled(False)
    domino.generate.DepthAcceptance = CountingAcceptance  # the engine's counters, counted raw here
    gen = domino.load_default()
    lookup, store = domino.generate.DEFAULT_LOOKUP_TOKENS, domino.generate.DEFAULT_DATASTORE_TOKENS
    names = {lookup: "prompt lookup", store: "datastore"}
    for label, prompts in (("HumanEval", humaneval_prompts(args.num_prompts)), ("chat", chat_prompts(args.num_prompts))):
        CountingAcceptance.counts = {}
        for p in prompts:
            gen.generate(p, max_new_tokens=args.max_new_tokens, tree=domino.TreeShape(3, 4, args.nodes),
                         lookup_tokens=lookup, datastore_tokens=store)
        print(f"\n{label}: {len(prompts)} prompts x {args.max_new_tokens} tokens, TreeShape(3, 4, {args.nodes}), "
              f"grafts at full length")
        for n, name in names.items():
            reached, kept = CountingAcceptance.counts.get(n, ([0] * n, [0] * n))
            rates = " ".join(f"{k / r:.2f}" if r else "  - " for k, r in zip(kept, reached))
            print(f"  {name:13s} new token 1..{n}: reached {reached}")
            print(f"  {name:13s} accepted given reached: {rates}")


if __name__ == "__main__":
    main()
