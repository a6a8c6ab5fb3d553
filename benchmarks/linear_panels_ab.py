"""Interleaved A/B of SmolLM2-135M-Instruct's linear layers (all 211, the LM head included),
float32 and bf16, through ``small_batch_linear`` (row-major weights) and through
``small_batch_linear_packed`` on panels of the same dtype, at M = 1, 4, 8, 9, 12 and 16 rows: each repeat
runs every layer once per variant, the variants alternating, median (and minimum) of 15
after warm-up. The layers' 540 MB (float32) or 270 MB (bf16) stream from memory at every
pass, as in a forward. Then one layer's shape (1536 x 576) in cache (one weight, called 40
times) and streaming (40 distinct weights), M = 1 to 32, with the multiply-add rates. Needs
a CPU that runs the packed kernel (AVX2 + FMA, or AVX-512); the packed product is the one
``small_batch_linear_packed_path()`` names.

    python benchmarks/linear_panels_ab.py [--dtypes fp32,bf16] [--skip-one-layer]

With benchmarks/compare_builds.sh it compares two builds of the kernels, alternating.
"""

import argparse
import statistics
import time

import torch

import domino_ops
from domino.loading import smollm2_dir
from timing import median_seconds


def median_ms(f) -> float:
    """Median of 15 timed calls after 3 warm-up ones, in ms."""
    return median_seconds(f, 15, warmup=3) * 1e3


def one_layer_table(dtype: torch.dtype, N: int = 1536, K: int = 576, layers: int = 40) -> None:
    """One layer's shape through both kernels, in cache and streaming."""
    w = torch.randn(N, K).to(dtype)
    ws = [torch.randn(N, K).to(dtype) for _ in range(layers)]
    p = domino_ops.pack_small_batch_linear_weight(w, dtype=dtype)
    ps = [domino_ops.pack_small_batch_linear_weight(x, dtype=dtype) for x in ws]
    print(f"\n{N} x {K} {dtype}, {layers} calls a timing: in cache (one weight) and streaming ({layers} weights, "
          f"{layers * N * K * w.element_size() / 1e6:.0f} MB); ms (G multiply-adds/s)")
    print("| M | row-major in cache | panels in cache | row-major streaming | panels streaming |")
    print("|---:|---:|---:|---:|---:|")
    for M in (1, 2, 4, 8, 16, 32):
        x = torch.randn(M, K).to(dtype)
        cells = [median_ms(lambda: [domino_ops.small_batch_linear(x, w) for _ in range(layers)]),
                 median_ms(lambda: [domino_ops.small_batch_linear_packed(x, p) for _ in range(layers)]),
                 median_ms(lambda: [domino_ops.small_batch_linear(x, wi) for wi in ws]),
                 median_ms(lambda: [domino_ops.small_batch_linear_packed(x, pi) for pi in ps])]
        print(f"| {M} | " + " | ".join(f"{t:.2f} ({layers * M * N * K / t / 1e6:.0f})" for t in cells) + " |")


def model_table(dtype: torch.dtype) -> None:
    """SmolLM2's layers through both kernels, interleaved, at 1, 4, 8, 9, 12 and 16 rows (9 and
    12: a tree verification's rows, where the tiles take turns)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=dtype)
    weights = [m.weight.detach().contiguous() for m in model.modules() if type(m) is torch.nn.Linear]
    panels = [domino_ops.pack_small_batch_linear_weight(w, dtype=dtype) for w in weights]
    print(f"\n{len(weights)} {dtype} layers, {sum(w.numel() * w.element_size() for w in weights) / 1e6:.0f} MB; "
          f"{torch.get_num_threads()} threads; packed product {domino_ops.small_batch_linear_packed_path()}")
    for M in (1, 4, 8, 9, 12, 16):
        xs = [torch.randn(M, w.shape[1]).to(dtype) for w in weights]
        calls = {"row-major": lambda: [domino_ops.small_batch_linear(x, w) for x, w in zip(xs, weights)],
                 "panels": lambda: [domino_ops.small_batch_linear_packed(x, p) for x, p in zip(xs, panels)]}
        for _ in range(2):
            for f in calls.values():
                f()
        times = {k: [] for k in calls}
        for _ in range(15):
            for k, f in calls.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"M = {M:2d}: " + "  ".join(f"{k} {med[k]:.2f} ms (min {min(times[k]) * 1e3:.2f})" for k in calls)
              + f"  row-major / panels {med['row-major'] / med['panels']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--skip-one-layer", action="store_true", help="only the model's layers")
    args = ap.parse_args()
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for name in args.dtypes.split(","):
        model_table(dtypes[name])
        if not args.skip_one_layer:
            one_layer_table(dtypes[name])


if __name__ == "__main__":
    main()
