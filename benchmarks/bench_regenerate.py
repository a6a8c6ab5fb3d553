"""Data regeneration speed (issue 14): response tokens per second of
``training.generate_data.regenerate`` on one shard's prompts, for several group sizes side
by side in one run (a group is decoded in one left-padded batch, the prompts sorted by
length; 64 = the whole shard in one batch, as before groups existed).

    python benchmarks/bench_regenerate.py [--shard 1] [--num-prompts 64] [--group-sizes 64 16 8]

The target is SmolLM2-135M-Instruct in fp32, as ``generate_data`` runs it, at one thread
(one data-generation worker per core). Each group size runs once after a short warm-up
(a full shard takes minutes); the responses must be the same token ids whatever the
grouping, up to rounding ties, and the script says how many differ. Run on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.generate_data import read_shard_records, regenerate, shard_path  # noqa: E402

from domino.config import default_drafter_config  # noqa: E402
from domino.loading import smollm2_dir  # noqa: E402
from domino.target import special_token_ids  # noqa: E402
from domino_ops import cpu  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "training" / "regenerated" / "smollm2_mix")
    p.add_argument("--shard", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--group-sizes", type=int, nargs="+", default=[64, 16, 8])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    target_dir = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    eos, pad = special_token_ids(model, tok)
    layer_ids = default_drafter_config(model.config).target_layer_ids
    prompts = [r["prompt_ids"] for r in read_shard_records(shard_path(args.data, args.shard))][:args.num_prompts]
    lengths = sorted(len(q) for q in prompts)
    print(f"{cpu.model()}, {args.threads} thread(s), torch {torch.__version__}; shard {args.shard}: "
          f"{len(prompts)} prompts of {lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}), "
          f"up to {args.max_new_tokens} new tokens")
    regenerate(model, prompts[:2], layer_ids, set(eos), pad, 4)  # warm-up
    print(f"{'group':>6} | {'seconds':>8} | {'tokens':>7} | {'tok/s':>6} | responses differing from the first row's")
    first = None
    for g in args.group_sizes:
        t0 = time.perf_counter()
        data = regenerate(model, prompts, layer_ids, set(eos), pad, args.max_new_tokens, group_size=g)
        dt = time.perf_counter() - t0
        tokens = data.response_offsets[-1]
        first = first or data.records
        differ = sum(a != b for a, b in zip(first, data.records))
        print(f"{g:>6} | {dt:8.1f} | {tokens:7d} | {tokens / dt:6.1f} | {differ}", flush=True)


if __name__ == "__main__":
    main()
