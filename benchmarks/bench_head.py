"""Head-rollout latency: domino_ops CPU kernel vs the eager PyTorch reference, side by side.

For each shape, batch, weight dtype and GRU-input mode it times one k-step greedy rollout
(median of repeats, warm-up excluded) and reports the bytes the rollout must move (the
floor: every weight once per step, one base-logit row per sequence per step), the achieved
GB/s, that as a share of this machine's copy bandwidth (measured in the same run) and the
speedup over eager.

    python benchmarks/bench_head.py                 # full table (paper + small shape)
    python benchmarks/bench_head.py --quick         # small shape only
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import domino_ops
from domino_ops import reference

SHAPES = {
    # name: (H, G, r, V)
    "paper": (4096, 1024, 256, 151936),
    "small": (576, 256, 64, 49152),
}


def median_ms(fn, repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 7) -> float:
    """STREAM-style copy bandwidth: (read + write) bytes / time of a large tensor copy."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), repeats, warmup=2)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def rollout_bytes(b, k, H, G, r, V, wbytes, table: bool) -> int:
    """Bytes a k-step rollout must move: weights once per step plus per-sequence rows."""
    per_step = (V * r + 3 * G * G + r * G) * wbytes  # w2, w_hh, w1s
    per_step += b * 3 * G * wbytes if table else (3 * G * H + b * H) * wbytes  # table rows or w_ih + E rows
    per_step += b * V * wbytes + b * r * 4  # base-logit row (same dtype as weights here) + hproj
    return k * per_step


def make_inputs(b, k, H, G, r, V, dtype, table: bool, gen: torch.Generator):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    base = rnd(b, k, V, scale=2.0)
    hproj = torch.randn(b, k, r, generator=gen)
    state = torch.randn(b, G, generator=gen) * 0.5
    w_hh, w1s, w2 = rnd(3 * G, G, scale=G ** -0.5), rnd(r, G, scale=G ** -0.5), rnd(V, r, scale=r ** -0.5)
    if table:
        gru_input, w_ih = rnd(V, 3 * G), None
    else:
        gru_input, w_ih = rnd(V, H), rnd(3 * G, H, scale=H ** -0.5)
    return base, hproj, state, gru_input, w_ih, w_hh, w1s, w2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small shape, fewer repeats")
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.repeats = ["small"], 3

    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    copy_bw = copy_bandwidth_gbs()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"copy bandwidth {copy_bw:.1f} GB/s (read+write of a 1 GiB tensor)")
    print(f"greedy rollout, k = {args.k}; median of {args.repeats} after warm-up; "
          "bytes = weights once per step + one base row per sequence per step")
    header = (f"{'shape':6} {'b':>2} {'wt':4} {'gru_input':9} | {'MB/roll':>8} | {'kernel ms':>9} {'GB/s':>6} "
              f"{'%copy':>6} | {'eager ms':>9} {'GB/s':>6} {'%copy':>6} | {'speedup':>7}")
    print(header)
    print("-" * len(header))
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes:
        H, G, r, V = SHAPES[shape]
        for dname in args.dtypes:
            dtype = dtypes[dname]
            for table in (True, False):
                for b in args.batches:
                    inputs = make_inputs(b, args.k, H, G, r, V, dtype, table, gen)
                    nbytes = rollout_bytes(b, args.k, H, G, r, V, dtype.itemsize, table)
                    kern = median_ms(lambda: domino_ops.domino_head_rollout(*inputs), args.repeats)
                    eager = median_ms(lambda: reference.domino_head_rollout(*inputs), args.repeats)
                    kbw, ebw = nbytes / kern / 1e6, nbytes / eager / 1e6
                    mode = "table" if table else "embed+w_ih"
                    print(f"{shape:6} {b:>2} {dname:4} {mode:9} | {nbytes / 1e6:8.1f} | {kern:9.2f} {kbw:6.1f} "
                          f"{100 * kbw / copy_bw:5.1f}% | {eager:9.2f} {ebw:6.1f} {100 * ebw / copy_bw:5.1f}% | "
                          f"{eager / kern:6.2f}x")
                    del inputs


if __name__ == "__main__":
    main()
