"""What a draft vocabulary of K tokens costs and saves: held-out coverage, drafting time
and acceptance, for several K side by side in one run, with the default target and drafter
(SmolLM2-135M-Instruct as ``domino.load_default`` runs it: bf16 with the small-batch linear and attention;
the table of 2026-11-23 in benchmarks/results/draft_vocab.txt was measured in fp32).

    python benchmarks/bench_draft_vocab.py --sizes 0 32768 16384 8192 4096 --num-prompts 16

K = 0 is the whole vocabulary (no restriction). For each K: the share of held-out response
tokens (shard 0 of the regenerated mix) inside the K most frequent training-response
tokens (``training/draft_vocab.py``); drafting 1, 4 and 15 tokens (backbone + base logits +
head, the fastest of ``--repeats`` after a warm-up, as ``domino.budget`` measures a round:
cache of 128 context tokens); a one-token target forward for scale; and tau through the
generator on HumanEval prompts (chain of the whole block, greedy), as
``eval_acceptance.py`` measures it. Run on a quiet machine.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from eval_acceptance import humaneval_prompts, mean_tau  # noqa: E402
from training.draft_vocab import coverage, most_frequent, response_counts  # noqa: E402

import domino  # noqa: E402
from domino.budget import measure_round_costs  # noqa: E402
from domino_ops import cpu  # noqa: E402

DATA = ROOT / "training" / "regenerated" / "smollm2_mix"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 32768, 16384, 8192, 4096])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()

    gen = domino.load_default()
    shipped = gen.drafter.draft_vocab
    counts, held = response_counts(DATA, {0})
    prompts = humaneval_prompts(args.num_prompts)
    print(f"{cpu.model()} ({platform.machine()}), {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"HumanEval prompts 0..{args.num_prompts - 1}, {args.max_new_tokens} new tokens, chain of "
          f"{gen.drafter.config.num_drafts}; fastest of {args.repeats}")
    print(f"{'K':>6} | {'coverage':>8} | {'draft 1':>8} | {'draft 4':>8} | {'draft 15':>8} | {'target 1':>8} | "
          f"{'d15/t1':>6} | {'tau':>6}")
    for K in args.sizes:
        vocab = None if K == 0 else most_frequent(counts, K)
        gen.drafter.set_draft_vocab(vocab)
        cov = 1.0 if vocab is None else coverage(vocab, held)
        c = measure_round_costs(gen, repeats=args.repeats)
        tau = mean_tau(gen, prompts, use_head=True, temperature=0.0, max_new_tokens=args.max_new_tokens)
        n = gen.drafter.config.num_drafts
        label = "all" if vocab is None else str(vocab.numel())  # fewer when fewer tokens were ever seen
        print(f"{label:>6} | {cov:8.4f} | {c.draft_ms[1]:8.1f} | {c.draft_ms[4]:8.1f} | {c.draft_ms[n]:8.1f} | "
              f"{c.verify_ms[1]:8.1f} | {c.draft_ms[n] / c.verify_ms[1]:6.2f} | {tau:6.3f}", flush=True)
    gen.drafter.set_draft_vocab(shipped)


if __name__ == "__main__":
    main()
