"""Triton kernel of ``build_tree_kernel_efficient``, the same contract as the CUDA kernel
(csrc/cuda/build_tree_kernel_efficient.cu, whose header states the bytes, the limits and
what bad index values do): one program per request, the N nodes as a register vector.

Triton has no gather from registers, so the index chasing is done with N x N one-hot
selections: each node's parent is the first column of ``selected == parent_list[slot]``;
the ancestor matrix grows by one level per step (``cur = parent[cur]`` as a masked row
reduction), N - 1 steps at most (a node still walking after them is on a parent cycle and
is made an orphan); first child and next sibling are row minima of parent comparisons. So
a program holds a few N x N tiles: N <= 256 here (SGLang uses N <= 64).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_NODES = 256
NUM_WARPS = 8  # the N x N tiles: 64 x 64 int64 over 256 threads keeps them in registers


@triton.jit
def _build_tree_kernel(plist_ptr, sel_ptr, seq_ptr, mask_ptr, mask_numel, pos_ptr, ridx_ptr, nt_ptr, ns_ptr, b_total,
                       topk, parents, n, MODE: tl.constexpr, PACKED_BYTES: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_B: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, BLOCK_N).to(tl.int64)
    live = idx < n
    sel_row = sel_ptr + b * (n - 1)
    seq = tl.maximum(tl.load(seq_ptr + b), 0)

    # Each node's parent: the root when selected / topk == 0, else the first node whose
    # selected index equals parent_list[b, selected / topk]; -1 for the root and orphans.
    has_sel = live & (idx >= 1)
    s = tl.load(sel_row + idx - 1, mask=has_sel, other=-1)
    slot = tl.where(s >= 0, s // topk, parents)
    lookup = has_sel & (slot > 0) & (slot < parents)
    want = tl.load(plist_ptr + b * parents + slot, mask=lookup, other=-1)
    s_col = tl.load(sel_row + idx, mask=idx < n - 1, other=-1)
    eq = (want[:, None] == s_col[None, :]) & (idx[None, :] < n - 1) & lookup[:, None]
    first = tl.min(tl.where(eq, idx[None, :], BLOCK_N), axis=1)
    parent = tl.where(has_sel & (s >= 0) & (slot == 0), 0, tl.where(lookup & (first < BLOCK_N), first + 1, -1))

    # Ancestor matrix (root column and self included) and depths, one level per step.
    init = ((idx[None, :] == 0) | (idx[None, :] == idx[:, None])) & live[:, None]
    anc = init
    cur = tl.where(live, idx, 0)
    depth = tl.zeros([BLOCK_N], dtype=tl.int64)
    for _step in range(0, n):
        walking = cur > 0
        depth += walking.to(tl.int64)
        up = tl.sum(tl.where(cur[:, None] == idx[None, :], parent[None, :], 0), axis=1)
        cur = tl.where(walking, up, cur)
        anc = anc | ((idx[None, :] == cur[:, None]) & (cur[:, None] > 0))
    cyclic = depth >= n  # still walking after n - 1 steps: made an orphan
    parent = tl.where(cyclic, -1, parent)
    depth = tl.where(cyclic, 1, depth)
    anc = tl.where(cyclic[:, None], init, anc)

    # Links, children in ascending node order.
    kids = (parent[None, :] == idx[:, None]) & (idx[None, :] >= 1) & live[None, :]
    first_child = tl.min(tl.where(kids, idx[None, :], BLOCK_N), axis=1)
    sibs = (parent[None, :] == parent[:, None]) & (parent[:, None] >= 0) & (idx[None, :] > idx[:, None]) & live[None, :]
    next_sib = tl.min(tl.where(sibs, idx[None, :], BLOCK_N), axis=1)
    base = b * n
    tl.store(ridx_ptr + base + idx, base + idx, mask=live)
    tl.store(pos_ptr + base + idx, seq + depth, mask=live)
    tl.store(nt_ptr + base + idx, tl.where(first_child < BLOCK_N, first_child, -1), mask=live)
    tl.store(ns_ptr + base + idx, tl.where(next_sib < BLOCK_N, next_sib, -1), mask=live)

    cell = live[:, None] & live[None, :]
    if MODE == 2:  # QLEN_ONLY_BITPACKING: bit j of a little-endian word per row
        word = tl.sum(tl.where(anc & cell, tl.full([1, BLOCK_N], 1, tl.int64) << idx[None, :], 0), axis=1)
        for k in tl.static_range(PACKED_BYTES):
            tl.store(mask_ptr + (base + idx) * PACKED_BYTES + k, ((word >> (8 * k)) & 255).to(tl.uint8), mask=live)
    elif MODE == 1:  # QLEN_ONLY: N x N bools per request
        tl.store(mask_ptr + (base + idx[:, None]) * n + idx[None, :], anc.to(tl.uint8), mask=cell)
    else:  # FULL_MASK: rows of seq_len + N columns after the previous requests' blocks
        cap = mask_numel + 1
        offset = tl.full([], 0, tl.int64)
        for start in range(0, b_total, BLOCK_B):
            bb = start + tl.arange(0, BLOCK_B)
            sb = tl.maximum(tl.load(seq_ptr + bb, mask=bb < b, other=0), 0)
            size = tl.where(sb > mask_numel // n, cap, (sb + n) * n)
            offset = tl.minimum(cap, offset + tl.sum(tl.where(bb < b, size, 0), 0))
        ok = (seq <= mask_numel // n) & (offset <= mask_numel - (seq + n) * n)
        ptrs = mask_ptr + offset + idx[:, None] * (seq + n) + seq + idx[None, :]
        tl.store(ptrs, anc.to(tl.uint8), mask=cell & ok)


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
