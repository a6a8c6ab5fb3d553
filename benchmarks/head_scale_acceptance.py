"""Is the shipped drafter's head under- or over-confident? Its correction
``W2 silu(W1 [h; S])`` scaled by ``alpha`` (W2 multiplied in place on the loaded default
generator, so every kernel path sees it), measured side by side for each ``alpha`` in one
run. A better alpha than 1 would be a free gain: folded into W2, no training.

Mean acceptance length (``eval_acceptance.mean_tau``: greedy whole-block chains, head on)
on the first ``--num-prompts`` HumanEval or held-out chat prompts.

    python benchmarks/head_scale_acceptance.py [--prompts humaneval|chat] [--num-prompts 32] [--alphas 0.8 1 1.25 1.5]
"""

from __future__ import annotations

import argparse
import time

import torch

import domino
from eval_acceptance import chat_prompts, humaneval_prompts, mean_tau


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", choices=("chat", "humaneval"), default="humaneval")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--alphas", type=float, nargs="+", default=[1.0, 0.8, 1.25, 1.5])
    args = p.parse_args()
    gen = domino.load_default()
    prompts = chat_prompts(args.num_prompts) if args.prompts == "chat" else humaneval_prompts(args.num_prompts)
    w2 = gen.drafter.embed_proj[2].weight
    shipped = w2.detach().clone()
    print(f"{args.prompts} prompts 0..{len(prompts) - 1}, greedy chains, {args.max_new_tokens} new tokens, head on; "
          "the head's correction times alpha")
    for alpha in args.alphas:
        with torch.no_grad():  # in place: the parameter's version moves, the packed copies follow
            w2.copy_((shipped.float() * alpha).to(shipped.dtype))
        t0 = time.perf_counter()
        tau = mean_tau(gen, prompts, use_head=True, temperature=0.0, max_new_tokens=args.max_new_tokens)
        print(f"alpha {alpha:5.2f}  tau {tau:.3f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    with torch.no_grad():
        w2.copy_(shipped)


if __name__ == "__main__":
    main()
