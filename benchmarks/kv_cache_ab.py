"""HF's DynamicCache against domino.kv_cache.GrowingCache under the target's forward as the
engine calls it (SmolLM2-135M-Instruct, bf16, the CPU kernels: ``domino.load``'s
configuration), side by side in one run: after a prompt of each length, forwards over 1
token (a decode step) and 6 tokens (a verification), each cropped back after, the two
caches alternating; median of ``--repeats`` after 2 warm-ups, and whether the logits agree
bit for bit. Both caches run the target's layers one kernel call at a time (into a
GrowingCache the engine runs them as one ``domino_ops.decoder_layers`` call, which
``decoder_layers_ab.py`` measures): this compares the caches alone.

    python benchmarks/kv_cache_ab.py [--prompts 150 1000 2000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

import domino
from domino import fast_forward
from domino.kv_cache import GrowingCache
from domino.loading import DEFAULT_DRAFTER_DIR, smollm2_dir
from domino.target import cache_kwarg
from domino_ops import cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, nargs="+", default=[150, 1000, 2000])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 6])
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    fast_forward._decoder_layers_in_one_call = fast_forward._decoder_layers_in_python  # the caches alone
    gen = domino.load(smollm2_dir(), DEFAULT_DRAFTER_DIR, dtype=torch.bfloat16, small_batch_linear=True,
                      small_batch_attention=True)
    model, kv = gen.target, cache_kwarg(gen.target.forward)
    print(f"{cpu.model()}, CPU build {cpu.isa()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"median of {args.repeats}, ms per forward")
    print(f"{'prompt':>6} | {'tokens':>6} | {'DynamicCache':>12} | {'GrowingCache':>12} | ratio | same logits")
    g = torch.Generator().manual_seed(0)
    for T in args.prompts:
        ids = torch.randint(100, 20000, (1, T), generator=g)
        caches = {"dynamic": DynamicCache(), "growing": GrowingCache()}
        for c in caches.values():
            model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kv: c})
        for k in args.tokens:
            block = torch.randint(100, 20000, (1, k), generator=g)
            pos = torch.arange(T, T + k)[None]
            times, logits = {n: [] for n in caches}, {}
            for _ in range(args.repeats + 2):
                for n, c in caches.items():
                    t0 = time.perf_counter()
                    logits[n] = model(input_ids=block, position_ids=pos, use_cache=True, **{kv: c}).logits
                    times[n].append(time.perf_counter() - t0)
                    c.crop(-k)
            d, gr = (statistics.median(times[n][2:]) * 1e3 for n in ("dynamic", "growing"))
            same = torch.equal(logits["dynamic"], logits["growing"])
            print(f"{T:6} | {k:6} | {d:12.2f} | {gr:12.2f} | {d / gr:5.2f} | {'yes' if same else 'NO'}", flush=True)


if __name__ == "__main__":
    main()
