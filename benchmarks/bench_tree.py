"""The sgl-kernel-compatible tree ops on the CPU: C++ kernel vs PyTorch reference.

SGLang-like sizes: batch 1 and 8, EAGLE topk 4 and depth 5, N = 8 / 16 / 64 draft tokens,
sequence lengths around 1k, a 32k vocabulary for the sampler (``--vocab``). For each op it
reports the median time of the dispatcher op (``torch.ops.domino_ops.<op>``, outputs
preallocated), of the validating wrapper (``domino_ops.<op>``, backend "native") and of the
reference (``backend="reference"``). The trees are real EAGLE drafts: random scores, the
N-1 best candidates, built by the op itself.

    python benchmarks/bench_tree.py                 # full table
    python benchmarks/bench_tree.py --quick         # fewer repeats
    python benchmarks/bench_tree.py --threads 1     # one intra-op thread

The sampler runs requests in parallel (build_tree only for large batches). On a machine
whose cores are busy with other work, an OpenMP region can wait a whole scheduler slice
(tens of ms) for a worker; compare with --threads 1 before reading anything into that.
"""

from __future__ import annotations

import argparse

import torch

import domino_ops
from timing import median_seconds

TOPK, DEPTH = 4, 5


def median_us(fn, repeats: int, warmup: int = 2) -> float:
    return median_seconds(fn, repeats, warmup) * 1e6


def eagle_draft(bs: int, n: int, gen: torch.Generator):
    """parent_list, selected_index of bs random EAGLE drafts (SGLang's layout): scores are
    products of probabilities along the path, the n-1 best are kept, sorted by index."""
    plists, sels = [], []
    for _ in range(bs):
        scores = torch.rand(TOPK, generator=gen)
        plist = [-1] + list(range(TOPK))
        prev = list(range(TOPK))
        for s in range(1, DEPTH):
            if s > 1:
                frontier = [prev[i] for i in torch.randperm(len(prev), generator=gen)[:TOPK].tolist()]
                plist += frontier
            else:
                frontier = prev
            child = scores[frontier].repeat_interleave(TOPK) * torch.rand(TOPK * TOPK, generator=gen)
            base = scores.numel()
            scores = torch.cat([scores, child])
            prev = list(range(base, base + TOPK * TOPK))
        plists.append(plist)
        sels.append(torch.sort(torch.topk(scores, n - 1).indices).values)
    return torch.tensor(plists, dtype=torch.int64), torch.stack(sels)


def tree_buffers(bs: int, n: int, seq_lens: torch.Tensor, mode: int):
    if mode == domino_ops.tree_ops.QLEN_ONLY_BITPACKING:
        mask = torch.zeros(bs * n, dtype=domino_ops.reference_tree.packed_mask_dtype(n))
    elif mode == domino_ops.tree_ops.QLEN_ONLY:
        mask = torch.ones(bs * n * n, dtype=torch.bool)
    else:
        mask = torch.ones(int(seq_lens.sum()) * n + bs * n * n, dtype=torch.bool)
    return [mask, torch.empty(bs * n, dtype=torch.int64)] + [torch.full((bs, n), -1, dtype=torch.int64) for _ in range(3)]


def row(op, bs, n, extra, raw, wrapper, ref):
    print(f"{op:<38} {bs:>3} {n:>3} {extra:<10} {raw:>10.1f} {wrapper:>10.1f} {ref:>12.1f} {ref / raw:>9.0f}x")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats, ref_repeats = (20, 3) if args.quick else (200, 7)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; times in microseconds (median)")
    print(f"{'op':<38} {'bs':>3} {'N':>3} {'mode/V':<10} {'torch.ops':>10} {'wrapper':>10} {'reference':>12} {'ref/ops':>10}")
    modes = {0: "FULL", 1: "QLEN", 2: "PACKED"}
    for bs in (1, 8):
        for n in (8, 16, 64):
            parent_list, selected = eagle_draft(bs, n, gen)
            seq_lens = torch.randint(512, 1536, (bs,), generator=gen)
            for mode, name in modes.items():
                if mode == 2 and n > 32:
                    continue
                bufs = tree_buffers(bs, n, seq_lens, mode)
                a = (parent_list, selected, seq_lens, *bufs, TOPK, DEPTH, n, mode)
                raw = median_us(lambda: torch.ops.domino_ops.build_tree_kernel_efficient(*a), repeats)
                wrap = median_us(lambda: domino_ops.build_tree_kernel_efficient(*a, backend="native"), repeats)
                ref = median_us(lambda: domino_ops.build_tree_kernel_efficient(*a, backend="reference"), ref_repeats, 1)
                row("build_tree_kernel_efficient", bs, n, name, raw, wrap, ref)
            # The verify ops run on the tree just built.
            bufs = tree_buffers(bs, n, seq_lens, 1)
            torch.ops.domino_ops.build_tree_kernel_efficient(parent_list, selected, seq_lens, *bufs, TOPK, DEPTH, n, 1)
            _, _, ridx, nxt, sib = bufs
            candidates = torch.randint(0, args.vocab, (bs, n), generator=gen)
            first_child = candidates.gather(1, nxt.clamp(min=0))
            planted = (nxt >= 0) & (torch.rand(bs, n, generator=gen) < 0.7)
            target_predict = torch.where(planted, first_child, torch.randint(0, args.vocab, (bs, n), generator=gen))
            outs = (torch.empty(bs * n, dtype=torch.int32), torch.empty(bs, DEPTH + 1, dtype=torch.int32),
                    torch.empty(bs, dtype=torch.int32))
            a = (*outs, candidates, ridx, nxt, sib, target_predict)
            raw = median_us(lambda: torch.ops.domino_ops.verify_tree_greedy(*a), repeats)
            wrap = median_us(lambda: domino_ops.verify_tree_greedy(*a, backend="native"), repeats)
            ref = median_us(lambda: domino_ops.verify_tree_greedy(*a, backend="reference"), ref_repeats, 1)
            row("verify_tree_greedy", bs, n, "", raw, wrap, ref)

            logits = torch.randn(bs, n, args.vocab, generator=gen) * 2
            logits.scatter_add_(2, target_predict.unsqueeze(-1), torch.full((bs, n, 1), 6.0))
            target_probs = torch.softmax(logits, dim=-1)
            coins, final = torch.rand(bs, n, generator=gen), torch.rand(bs, generator=gen)
            a = (*outs, candidates, ridx, nxt, sib, coins, final, target_probs, None, 1.0, 1.0, True)
            raw = median_us(lambda: torch.ops.domino_ops.tree_speculative_sampling_target_only(*a), repeats)
            wrap = median_us(lambda: domino_ops.tree_speculative_sampling_target_only(*a, backend="native"), repeats)
            ref = median_us(lambda: domino_ops.tree_speculative_sampling_target_only(*a, backend="reference"),
                            ref_repeats, 1)
            row("tree_speculative_sampling_target_only", bs, n, f"V={args.vocab}", raw, wrap, ref)


if __name__ == "__main__":
    main()
