"""Triton kernel of ``build_tree_kernel_efficient``, the same contract as the CUDA kernel
(csrc/cuda/build_tree_kernel_efficient.cu, whose header states the bytes, the limits and
what bad index values do): one program per request, the N nodes as a register vector.

Triton has no gather from registers, so the index chasing goes through memory: each
node's parent is found by a scan of the N - 1 selected indices (one scalar load a step,
the same address for every lane), the parents are parked in ``retrive_next_token`` (this
request's own row, written with the first children at the end), and each node walks to
the root by gathering its current node's parent from there, N - 1 steps at most (a node
still walking after them is on a parent cycle and is made an orphan). A second walk
writes the mask: bits of a word (bit-packed), or ones scattered into the rows after they
were zero-filled. First child and next sibling come from one scan over the parents. So
nothing is N x N: registers stay a few vectors of N (no spills up to N = 256, the most
it takes; SGLang uses N <= 64), and the barriers order the parked parents and the mask
rows between the program's threads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_NODES = 256
NUM_WARPS = 4


@triton.jit
def _walk_up(scratch, cur):
    """One step to the root: each walking node (cur > 0) moves to its parent, read from the
    parked row; the others stay. Returns (the new cur, which were walking)."""
    walking = cur > 0
    return tl.where(walking, tl.load(scratch + cur, mask=walking, other=0).to(tl.int32), cur), walking


@triton.jit
def _build_tree_kernel(plist_ptr, sel_ptr, seq_ptr, mask_ptr, mask_numel, pos_ptr, ridx_ptr, nt_ptr, ns_ptr, b_total,
                       topk, parents, n, MODE: tl.constexpr, PACKED_BYTES: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_B: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, BLOCK_N)
    live = idx < n
    sel_row = sel_ptr + b * (n - 1)
    seq = tl.maximum(tl.load(seq_ptr + b), 0)
    base = b * n
    scratch = nt_ptr + base  # this request's parents until its first children are written

    # Each node's parent: the root when selected / topk == 0, else the first node whose
    # selected index equals parent_list[b, selected / topk]; -1 for the root and orphans.
    has_sel = live & (idx >= 1)
    s = tl.load(sel_row + idx - 1, mask=has_sel, other=-1)
    slot = tl.where(s >= 0, s // topk, parents)
    lookup = has_sel & (slot > 0) & (slot < parents)
    want = tl.load(plist_ptr + b * parents + slot, mask=lookup, other=-1)
    first = tl.full([BLOCK_N], BLOCK_N, tl.int32)
    for j in range(0, n - 1):
        first = tl.where((first == BLOCK_N) & (want == tl.load(sel_row + j)), j, first)
    parent = tl.where(has_sel & (s >= 0) & (slot == 0), 0, tl.where(lookup & (first < BLOCK_N), first + 1, -1))
    tl.store(scratch + idx, parent, mask=live)
    tl.debug_barrier()

    # Depths: every node walks to the root; one still walking after n - 1 steps is on a
    # cycle (so is every node above it) and is made an orphan at depth 1.
    cur = tl.where(live, idx, 0)
    depth = tl.zeros([BLOCK_N], dtype=tl.int32)
    for _step in range(0, n):
        cur, walking = _walk_up(scratch, cur)
        depth += walking.to(tl.int32)
    cyclic = depth >= n
    depth = tl.where(cyclic, 1, depth)
    tl.store(pos_ptr + base + idx, seq + depth, mask=live)
    tl.store(ridx_ptr + base + idx, base + idx, mask=live)

    # The mask: row t holds the root, t and t's ancestors (an orphan: the root and itself).
    walker = live & ~cyclic  # walks again, marking each ancestor
    if MODE == 2:  # QLEN_ONLY_BITPACKING: bit j of a little-endian word per row
        one = tl.full([BLOCK_N], 1, tl.int64)
        word = tl.where(live, one | (one << idx), 0)
        cur = tl.where(walker, idx, 0)
        for _step in range(0, n):
            cur, walking = _walk_up(scratch, cur)
            word = word | tl.where(walking & (cur > 0), one << cur, 0)
        for k in tl.static_range(PACKED_BYTES):
            tl.store(mask_ptr + (base + idx) * PACKED_BYTES + k, ((word >> (8 * k)) & 255).to(tl.uint8), mask=live)
    else:
        if MODE == 1:  # QLEN_ONLY: N x N bools per request
            rows = mask_ptr + base * n
            stride = n
            ok = live
        else:  # FULL_MASK: rows of seq_len + N columns after the previous requests' blocks
            cap = mask_numel.to(tl.int64) + 1  # mask_numel is an i32 below 2^31: + 1 would wrap
            offset = tl.full([], 0, tl.int64)
            for start in range(0, b_total, BLOCK_B):
                bb = start + tl.arange(0, BLOCK_B)
                sb = tl.maximum(tl.load(seq_ptr + bb, mask=bb < b, other=0), 0)
                size = tl.where(sb > mask_numel // n, cap, (sb + n) * n)
                offset = tl.minimum(cap, offset + tl.sum(tl.where(bb < b, size, 0), 0))
            rows = mask_ptr + offset + seq
            stride = seq + n
            ok = live & (seq <= mask_numel // n) & (offset <= mask_numel - (seq + n) * n)
        for r in range(0, n):  # zero rows, then the ones (the barrier orders the two)
            tl.store(rows + r * stride + idx, tl.zeros([BLOCK_N], tl.uint8), mask=ok)
        tl.debug_barrier()
        row = rows + idx * stride
        tl.store(row, tl.full([BLOCK_N], 1, tl.uint8), mask=ok)
        tl.store(row + idx, tl.full([BLOCK_N], 1, tl.uint8), mask=ok)
        cur = tl.where(walker, idx, 0)
        for _step in range(0, n):
            cur, walking = _walk_up(scratch, cur)
            tl.store(row + cur, tl.full([BLOCK_N], 1, tl.uint8), mask=ok & walking & (cur > 0))

    # Links, children in ascending node order, from the parents (an orphan's is -1).
    parent = tl.where(cyclic, -1, parent)
    tl.debug_barrier()  # every walk has read the parked parents
    tl.store(scratch + idx, parent, mask=live)
    tl.debug_barrier()
    first_child = tl.full([BLOCK_N], BLOCK_N, tl.int32)
    next_sib = tl.full([BLOCK_N], BLOCK_N, tl.int32)
    for v in range(1, n):
        pv = tl.load(scratch + v).to(tl.int32)
        first_child = tl.where((first_child == BLOCK_N) & (idx == pv), v, first_child)
        next_sib = tl.where((next_sib == BLOCK_N) & (idx < v) & (parent == pv) & (pv >= 0), v, next_sib)
    tl.debug_barrier()  # every lane has read the parents before the first children replace them
    tl.store(nt_ptr + base + idx, tl.where(first_child < BLOCK_N, first_child, -1), mask=live)
    tl.store(ns_ptr + base + idx, tl.where(next_sib < BLOCK_N, next_sib, -1), mask=live)


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                                retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num,
                                tree_mask_mode):
    """``build_tree_kernel_efficient`` with the op's schema (outputs written in place)."""
    bs, n = selected_index.shape[0], draft_token_num
    if n > MAX_NODES:
        raise ValueError(f"the Triton build_tree_kernel_efficient handles draft_token_num <= {MAX_NODES}, got {n}")
    if bs == 0:
        return
    parents = topk * (depth - 1) + 1
    plist = parent_list if parent_list.numel() > 0 else selected_index  # never read when empty (depth 1)
    mask_bytes = tree_mask.view(-1).view(torch.uint8)
    packed = 1 if n <= 8 else (2 if n <= 16 else 4)
    _build_tree_kernel[(bs,)](plist, selected_index, verified_seq_len, mask_bytes, tree_mask.numel(), positions,
                              retrive_index, retrive_next_token, retrive_next_sibling, bs, topk, parents, n,
                              MODE=tree_mask_mode, PACKED_BYTES=packed, BLOCK_N=max(2, triton.next_power_of_2(n)),
                              BLOCK_B=min(1024, triton.next_power_of_2(bs)), num_warps=NUM_WARPS)
