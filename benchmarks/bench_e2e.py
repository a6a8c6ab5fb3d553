"""End-to-end greedy decoding on HumanEval prompts, every method in one run, side by side.

Methods: plain HF ``generate``; HF prompt-lookup decoding (``prompt_lookup_num_tokens``);
Domino with the head off (backbone only, the DFlash baseline); Domino. Reports tokens/s
(total new tokens / total time, after one warm-up generation per method), mean acceptance
length (tokens advanced per target forward), speedup over plain, and whether every output
is identical to plain greedy decoding.

    python benchmarks/bench_e2e.py --num-prompts 20 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import time

import torch

import domino
from eval_acceptance import humaneval_prompts  # one prompt format for both benchmarks


def run_method(name, fn, prompts):
    fn(prompts[0], 8)  # warm-up, not timed
    tokens, accepts, outputs = 0, [], []
    t0 = time.perf_counter()
    for p in prompts:
        ids, acc = fn(p, None)
        outputs.append(ids)
        tokens += len(ids)
        accepts.extend(acc)
    elapsed = time.perf_counter() - t0
    return dict(name=name, tps=tokens / elapsed, tau=sum(accepts) / max(len(accepts), 1), outputs=outputs,
                tokens=tokens, elapsed=elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=20)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--drafter", help="drafter checkpoint (default: the shipped one)")
    parser.add_argument("--prompt-lookup-tokens", type=int, default=10)
    args = parser.parse_args()

    gen = domino.load_default(quiet=False) if args.drafter is None else domino.load(
        domino.loading.smollm2_dir(), args.drafter, quiet=False)
    prompts = humaneval_prompts(args.num_prompts, args.offset)
    M = args.max_new_tokens
    torch.set_grad_enabled(False)

    def plain(p, m):
        r = gen.generate_target_only(p, max_new_tokens=m or M)
        return r.token_ids, [1] * len(r.token_ids)

    def lookup(p, m):
        r = gen.generate_target_only(p, max_new_tokens=m or M, prompt_lookup_num_tokens=args.prompt_lookup_tokens)
        return r.token_ids, []

    def spec(use_head):
        def f(p, m):
            r = gen.generate(p, max_new_tokens=m or M, use_head=use_head)
            return r.token_ids, r.acceptance_lengths
        return f

    results = [run_method("plain HF generate", plain, prompts),
               run_method(f"HF prompt lookup ({args.prompt_lookup_tokens})", lookup, prompts),
               run_method("Domino, head off (DFlash)", spec(False), prompts),
               run_method("Domino", spec(True), prompts)]
    base = results[0]
    print(f"\nHumanEval prompts {args.offset}..{args.offset + len(prompts) - 1}, greedy, max_new_tokens={M}, "
          f"block {gen.drafter.config.block_size}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'method':30} | {'tok/s':>7} | {'tau':>5} | {'speedup':>7} | {'tokens':>6} | identical to plain")
    print("-" * 84)
    for r in results:
        same = all(a == b for a, b in zip(r["outputs"], base["outputs"]))
        tau = f"{r['tau']:.2f}" if r["name"] != results[1]["name"] else "  n/a"
        print(f"{r['name']:30} | {r['tps']:7.1f} | {tau:>5} | {r['tps'] / base['tps']:6.2f}x | {r['tokens']:6d} | "
              f"{'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
