"""How much prompt lookup could add to the drafter's tree rounds: a replay.

Generates each prompt with the default tree and no lookup (``lookup_tokens=0``), then
replays its rounds: at each round's start, the chain ``domino.lookup.NgramIndex`` would
propose (from the prompt and the output so far) is compared with the tokens the round
went on to produce. Prints the tree's tokens per round and the better of tree and lookup
per round, the most a graft of that chain could give at those round boundaries (an upper
bound: it ignores that a longer round moves the next round's start). The engine's real
speed with the graft is ``bench_e2e.py``'s "+ lookup" row.

    python benchmarks/lookup_replay.py [--num-prompts 8] [--max-new-tokens 128] [--lookup-tokens 10]
"""

from __future__ import annotations

import argparse

import torch

from bench_e2e import load
from domino.loading import DEFAULT_DRAFTER_DIR
from domino.lookup import DEFAULT_LOOKUP_TOKENS, NgramIndex
from eval_acceptance import chat_prompts, humaneval_prompts


def replay(gen, prompts, max_new_tokens: int, lookup_tokens: int) -> tuple[float, float, float, int]:
    """(tree tokens per round, best-of tokens per round, share of rounds lookup wins, rounds)."""
    tree = best = wins = rounds = 0
    for p in prompts:
        res = gen.generate(p, max_new_tokens=max_new_tokens, lookup_tokens=0)
        out = res.token_ids
        index = NgramIndex(gen.encode(p) + out[:1])
        pos = 1  # the first token comes from the prefill
        for a in res.acceptance_lengths:
            chain = index.propose(lookup_tokens)
            m = 0
            while m < len(chain) and pos + m < len(out) and chain[m] == out[pos + m]:
                m += 1
            tree, best, wins, rounds = tree + a, best + max(a, m + 1), wins + (m + 1 > a), rounds + 1
            index.extend(out[pos:pos + a])
            pos += a
    return tree / rounds, best / rounds, wins / rounds, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lookup-tokens", type=int, default=DEFAULT_LOOKUP_TOKENS)
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    gen = load("bf16-sb", DEFAULT_DRAFTER_DIR)
    for name, prompts in (("HumanEval", humaneval_prompts(args.num_prompts, 0)),
                          ("held-out chat", chat_prompts(args.num_prompts))):
        tree, best, wins, rounds = replay(gen, prompts, args.max_new_tokens, args.lookup_tokens)
        print(f"{name}: {rounds} rounds; tree alone {tree:.3f} tokens a round, better of tree and lookup "
              f"({args.lookup_tokens} tokens) {best:.3f}; lookup longer in {wins:.0%} of rounds")


if __name__ == "__main__":
    main()
