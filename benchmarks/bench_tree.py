"""The tree ops (the sgl-kernel-compatible three and verify_tree_sampling): C++ CPU kernel vs
PyTorch reference, and, when a CUDA device exists, the CUDA and Triton kernels.

SGLang-like sizes: batch 1 and 8, EAGLE topk 4 and depth 5, N = 8 / 16 / 64 draft tokens,
sequence lengths around 1k, a 32k vocabulary for the sampler (``--vocab``). For each op it
reports the median time of the dispatcher op (``torch.ops.domino_ops.<op>``, outputs
preallocated), of the validating wrapper (``domino_ops.<op>``, backend "native") and of the
reference (``backend="reference"``). The trees are real EAGLE drafts: random scores, the
N-1 best candidates, built by the op itself. With a CUDA device a second table times the
CUDA kernel (``torch.ops.domino_ops.<op>`` on CUDA tensors) and the Triton kernel
(``domino_ops.triton.kernel(op)``) on the same inputs, each call followed by a device
synchronize (so a time includes the launch); without one it says they were skipped. A third
table times the greedy verification's target tokens: ``torch.argmax`` against
``domino.tree.target_argmax``, which the engine uses.

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


def cases(vocab: int, gen: torch.Generator):
    """(op, bs, N, label, dispatcher-op arguments) at every benchmarked size (CPU tensors)."""
    modes = {0: "FULL", 1: "QLEN", 2: "PACKED"}
    for bs in (1, 8):
        for n in (8, 16, 64):
            parent_list, selected = eagle_draft(bs, n, gen)
            seq_lens = torch.randint(512, 1536, (bs,), generator=gen)
            for mode, name in modes.items():
                if mode == 2 and n > 32:
                    continue
                bufs = tree_buffers(bs, n, seq_lens, mode)
                yield ("build_tree_kernel_efficient", bs, n, name,
                       (parent_list, selected, seq_lens, *bufs, TOPK, DEPTH, n, mode))
            # The verify ops run on the tree just built.
            bufs = tree_buffers(bs, n, seq_lens, 1)
            torch.ops.domino_ops.build_tree_kernel_efficient(parent_list, selected, seq_lens, *bufs, TOPK, DEPTH, n, 1)
            _, _, ridx, nxt, sib = bufs
            candidates = torch.randint(0, vocab, (bs, n), generator=gen)
            first_child = candidates.gather(1, nxt.clamp(min=0))
            planted = (nxt >= 0) & (torch.rand(bs, n, generator=gen) < 0.7)
            target_predict = torch.where(planted, first_child, torch.randint(0, vocab, (bs, n), generator=gen))
            outs = (torch.empty(bs * n, dtype=torch.int32), torch.empty(bs, DEPTH + 1, dtype=torch.int32),
                    torch.empty(bs, dtype=torch.int32))
            yield "verify_tree_greedy", bs, n, "", (*outs, candidates, ridx, nxt, sib, target_predict)
            logits = torch.randn(bs, n, vocab, generator=gen) * 2
            logits.scatter_add_(2, target_predict.unsqueeze(-1), torch.full((bs, n, 1), 6.0))
            target_probs = torch.softmax(logits, dim=-1)
            coins, final = torch.rand(bs, n, generator=gen), torch.rand(bs, generator=gen)
            yield ("tree_speculative_sampling_target_only", bs, n, f"V={vocab}",
                   (*outs, candidates, ridx, nxt, sib, coins, final, target_probs, None, 1.0, 1.0, True))
            # the draft that (nominally) proposed the children: the target's rows, sharpened
            draft_probs = torch.softmax(logits * 1.5, dim=-1)
            yield ("verify_tree_sampling", bs, n, f"V={vocab}",
                   (*outs, candidates, ridx, nxt, sib, coins.double(), final.double(), target_probs, draft_probs))


def gpu_table(all_cases, repeats: int) -> None:
    """CUDA kernel vs Triton kernel on the device, or a note that they were skipped."""
    if not torch.cuda.is_available():
        print("\nno CUDA device: the CUDA and Triton kernel timings were skipped")
        return
    from domino_ops import triton as triton_ops
    print(f"\n{torch.cuda.get_device_name()}: CUDA and Triton kernels, microseconds per call (median, with a sync)")
    print(f"{'op':<38} {'bs':>3} {'N':>3} {'mode/V':<10} {'CUDA':>10} {'Triton':>10}")
    for op, bs, n, label, a in all_cases:
        dev_args = tuple(x.cuda() if isinstance(x, torch.Tensor) else x for x in a)
        timed = {}
        for name, fn in (("CUDA", getattr(torch.ops.domino_ops, op) if domino_ops.has_kernel(op, "cuda") else None),
                         ("Triton", triton_ops.kernel(op))):
            if fn is None:
                timed[name] = float("nan")
                continue
            timed[name] = median_us(lambda: (fn(*dev_args), torch.cuda.synchronize()), repeats, 3)
        print(f"{op:<38} {bs:>3} {n:>3} {label:<10} {timed['CUDA']:>10.1f} {timed['Triton']:>10.1f}")


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
    all_cases = list(cases(args.vocab, gen))
    for op, bs, n, label, a in all_cases:
        raw = median_us(lambda: getattr(torch.ops.domino_ops, op)(*a), repeats)
        wrap = median_us(lambda: getattr(domino_ops, op)(*a, backend="native"), repeats)
        ref = median_us(lambda: getattr(domino_ops, op)(*a, backend="reference"), ref_repeats, 1)
        row(op, bs, n, label, raw, wrap, ref)
    argmax_table(repeats)
    gpu_table(all_cases, repeats)


def argmax_table(repeats: int) -> None:
    """The greedy tree verification's target tokens, one per node: torch.argmax against
    ``domino.tree.target_argmax`` (domino_ops.sample at temperature 0) on the logits a tree
    round has, SmolLM2's 49,152-token vocabulary."""
    from domino.tree import target_argmax

    V = 49152
    print(f"\ngreedy tree verification's target tokens, [bs, N, {V}] logits: microseconds (median)")
    print(f"{'dtype':<10} {'bs':>3} {'N':>3} {'torch.argmax':>13} {'target_argmax':>14} {'speedup':>8}")
    for dtype in (torch.float32, torch.bfloat16):
        for bs, n in ((1, 11), (1, 24), (4, 11)):
            logits = torch.randn(bs, n, V).to(dtype)
            torch_us = median_us(lambda: logits.argmax(-1), repeats)
            ours = median_us(lambda: target_argmax(logits), repeats)
            print(f"{str(dtype)[6:]:<10} {bs:>3} {n:>3} {torch_us:>13.1f} {ours:>14.1f} {torch_us / ours:>7.1f}x")


if __name__ == "__main__":
    main()
