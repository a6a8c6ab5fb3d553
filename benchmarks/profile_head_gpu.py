"""Per-kernel GPU time of one head step at the paper shape (bf16 weights, table mode, greedy):
a batch-1 rollout step (k = 1) and a tree step (domino_head_expand, 4 children per node) for
frontiers of 1, 4 and 16 nodes, CUDA kernels and Triton, from the torch profiler (10 calls
each, after warm-up). Says which kernel a step's time goes to; bench_head.py times the
steps themselves. Needs a GPU and domino_ops built with its CUDA kernels.

    python benchmarks/profile_head_gpu.py [--shape small|paper]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import domino_ops
from bench_head import SHAPES, make_inputs


def kernel_table(fn, calls: int = 10) -> str:
    """The profiler's CUDA-time table of ``calls`` calls of ``fn`` (after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=70)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="paper", choices=list(SHAPES))
    args = parser.parse_args()
    if not (torch.cuda.is_available() and domino_ops.cuda_compiled):
        raise SystemExit("needs a CUDA device and domino_ops built with its CUDA kernels")
    dev = torch.device("cuda")
    H, G, r, V = SHAPES[args.shape]
    base, hproj, state, gru_input, _, w_hh, w1s, w2 = [
        x.to(dev) if x is not None else None
        for x in make_inputs(1, 1, H, G, r, V, torch.bfloat16, True, torch.Generator().manual_seed(0))]
    print(f"{torch.cuda.get_device_name()}, {args.shape} shape, bf16, table mode, greedy; times are for 10 calls")
    for backend in ("native", "triton"):
        print(f"\n== rollout step (k = 1, b = 1), {backend}")
        print(kernel_table(lambda: domino_ops.domino_head_rollout(base, hproj, state, gru_input, None, w_hh, w1s, w2,
                                                                  backend=backend)))
        for n in (1, 4, 16):
            node_state = (torch.randn(n, G) * 0.5).to(dev)
            zeros = torch.zeros(n, dtype=torch.long, device=dev)
            print(f"\n== expand step, {n} nodes x 4 children, {backend}")
            print(kernel_table(lambda: domino_ops.domino_head_expand(
                base, hproj, node_state, zeros, zeros, gru_input, None, w_hh, w1s, w2, num_children=4,
                write_node_logits=False, backend=backend)))


if __name__ == "__main__":
    main()
