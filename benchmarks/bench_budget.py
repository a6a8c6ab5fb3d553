"""The verification budget's two policy choices, side by side in one run against plain
decoding (all greedy, chain rounds (``tree=None``), every output token-identical to plain
decoding):

- how drafting is timed for the cost model (``domino.budget.measure_round_costs``):
  ``cold``, each drafting right after a target forward, as in a round (what the library
  does), or ``warm``, back to back (what it did before 2026-11-24);
- whether the per-depth acceptance evidence fades (``DepthAcceptance(memory=32)``, what
  the library does: a stretch where drafting stopped paying is forgotten after ~32
  rounds) or is kept for the whole request (``keep``).

Prompts: HumanEval, held-out ShareGPT chat, and `make run`'s prompt (three times). Default
configuration (``domino.load_default``: bf16, small-batch linear and attention). Tokens/s
is total tokens over total time per method and pass, the median of ``--repeats`` passes;
methods alternate per prompt; one warm-up generation excluded.

    python benchmarks/bench_budget.py [--num-prompts 12] [--max-new-tokens 96] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    from eval_acceptance import chat_prompts, humaneval_prompts

    from domino import budget, load_default
    from domino.budget import DepthAcceptance
    from domino_ops import cpu

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3, help="passes over the prompts (median)")
    args = p.parse_args()

    gen = load_default()
    cold = budget.measure_round_costs(gen, 1)
    timed = budget._min_ms
    budget._min_ms = lambda fns, repeats, before=None: timed(fns, repeats)  # drafting timed back to back
    warm = budget.measure_round_costs(gen, 1)
    budget._min_ms = timed
    defaults = DepthAcceptance.__init__.__defaults__  # (prior, prior_weight, memory)
    variants = {"warm/keep": (warm, float("inf")), "cold/keep": (cold, float("inf")),
                "warm/forget": (warm, defaults[2]), "cold/forget (default)": (cold, defaults[2])}
    print(f"{cpu.model()}; SmolLM2-135M-Instruct + the shipped drafter, bf16, small-batch linear + attention; "
          f"{args.max_new_tokens} new tokens per prompt")
    for name, c in (("cold", cold), ("warm", warm)):
        print(f"  {name} costs: draft ms n=1..5 {[round(x, 1) for x in c.draft_ms[1:6]]}, "
              f"verify ms t=1..5 {[round(x, 1) for x in c.verify_ms[1:6]]}")
    make_run = [[{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]]
    print("prompts    | " + " | ".join(["plain", *variants]))
    for label, prompts in (("HumanEval", humaneval_prompts(args.num_prompts)), ("chat", chat_prompts(args.num_prompts)),
                           ("make run", make_run * 3)):
        passes = {m: [] for m in ["plain", *variants]}
        accepted = {m: [] for m in variants}
        gen.generate(prompts[0], max_new_tokens=8)  # warm-up
        gen.generate_target_only(prompts[0], max_new_tokens=8)
        try:
            for _ in range(args.repeats):
                totals = {m: [0, 0.0] for m in passes}
                for prompt in prompts:
                    for m in totals:
                        t0 = time.perf_counter()
                        if m == "plain":
                            out = gen.generate_target_only(prompt, max_new_tokens=args.max_new_tokens)
                        else:
                            gen._costs[1], memory = variants[m]
                            DepthAcceptance.__init__.__defaults__ = (*defaults[:2], memory)
                            out = gen.generate(prompt, max_new_tokens=args.max_new_tokens, tree=None)
                            accepted[m] += out.acceptance_lengths
                        totals[m][0] += len(out.token_ids)
                        totals[m][1] += time.perf_counter() - t0
                for m, (n, sec) in totals.items():
                    passes[m].append(n / sec)
        finally:
            DepthAcceptance.__init__.__defaults__ = defaults
        tps = {m: statistics.median(v) for m, v in passes.items()}
        cells = [f"{tps['plain']:.1f} tok/s"] + [
            f"{tps[m]:.1f} ({tps[m] / tps['plain']:.2f}x, tau {sum(accepted[m]) / len(accepted[m]):.2f})" for m in variants]
        print(f"{label:10} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
