"""Triton kernel of ``verify_tree_sampling`` (recursive rejection sampling over a draft
tree), the same contract as the CUDA kernel (csrc/cuda/verify_tree_sampling.cu, whose
header states the bytes, the limits and the rounding): one program per request copies each
visited node's target and draft rows into its float64 workspace rows p and q, verifies the
children in sibling order (accept when q(x) > 0 and coin * q(x)/qn < p(x)/pn; a rejection rewrites p as
max(0, p/pn - q/qn) when that has positive total and removes x from q), draws the last
token by inverse CDF of max(0, p) and writes the outputs in one pass
(tree_common.write_tree_outputs). The totals are chunked tl.sum reductions (not the CPU's
index-order sums): the last bits can differ. Bad index values never become addresses
(tree_common); a candidate token outside [0, V) is skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from domino_ops.triton.row_sampler import BLOCK_V, pick_from_weights
from domino_ops.triton.tree_common import block_sizes, start_walk, tree_link, write_tree_outputs


@triton.jit
def _residual(p_ws, q_ws, offs, V, pn, qn):
    """max(0, p/pn - q/qn) over one chunk (q/qn = 0 when qn is 0; NaN -> 0)."""
    m = offs < V
    p = tl.load(p_ws + offs, mask=m, other=0.0)
    q = tl.load(q_ws + offs, mask=m, other=0.0)
    d = p / pn - tl.where(qn > 0, q / qn, 0.0)
    return tl.where(m & (d > 0), d, 0.0)


@triton.jit
def _row_total(ws, V, BLOCK: tl.constexpr, POSITIVE: tl.constexpr):
    """The total of a float64 workspace row (of max(0, w) when POSITIVE)."""
    total = tl.full([], 0.0, tl.float64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w = tl.load(ws + offs, mask=offs < V, other=0.0)
        total += tl.sum(tl.where(w > 0, w, 0.0) if POSITIVE else w, 0)
    return total


@triton.jit
def _verify_tree_sampling_kernel(pred_ptr, acc_index_ptr, acc_num_ptr, cand_ptr, ridx_ptr, nt_ptr, ns_ptr,
                                 coins_ptr, final_ptr, p_ptr, q_ptr, ws_ptr, n, steps, V, limit,
                                 BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = b * n
    p_ws = ws_ptr + 2 * b * V
    q_ws = p_ws + V
    js, path, toks, node, num = start_walk(BLOCK_S)
    go = tl.full([], 1, tl.int1)
    while go:
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < V
            tl.store(p_ws + offs, tl.load(p_ptr + (row + node) * V + offs, mask=m, other=0.0).to(tl.float64), mask=m)
            tl.store(q_ws + offs, tl.load(q_ptr + (row + node) * V + offs, mask=m, other=0.0).to(tl.float64), mask=m)
        tl.debug_barrier()
        pn = tl.full([], 1.0, tl.float64)
        qn = tl.full([], 1.0, tl.float64)
        accepted = tl.full([], 0, tl.int1)
        token = tl.full([], -1, tl.int64)
        child = tree_link(nt_ptr + row, node, n, num + 1 < steps)
        tried = tl.full([], 0, tl.int64)
        while child >= 0:
            x = tl.load(cand_ptr + row + child)
            x_ok = (x >= 0) & (x < V)
            px = tl.load(p_ws + x, mask=x_ok, other=0.0)
            qx = tl.load(q_ws + x, mask=x_ok, other=0.0)
            coin = tl.load(coins_ptr + row + child)
            q_now = tl.where(qn > 0, qx / qn, 0.0)
            accepted = x_ok & (q_now > 0) & (coin * q_now < px / pn)  # q = 0: could not have been drawn
            token = x
            if x_ok & (accepted == 0):
                total = tl.full([], 0.0, tl.float64)
                for start in range(0, V, BLOCK):
                    total += tl.sum(_residual(p_ws, q_ws, start + tl.arange(0, BLOCK), V, pn, qn), 0)
                tl.debug_barrier()
                if total > 0:
                    for start in range(0, V, BLOCK):
                        offs = start + tl.arange(0, BLOCK)
                        tl.store(p_ws + offs, _residual(p_ws, q_ws, offs, V, pn, qn), mask=offs < V)
                    pn = total
                tl.debug_barrier()
                tl.store(q_ws + x, 0.0)
                tl.debug_barrier()
                qn = _row_total(q_ws, V, BLOCK, False)
            tried += 1
            nxt = tl.where(tried < n, tree_link(ns_ptr + row, child, n, child >= 0), -1)
            child = tl.where(accepted, child - n - 1, nxt)  # accepted: leave the loop (child < 0)
        child = tl.where(accepted, child + n + 1, -1)
        toks = tl.where(accepted & (js == num), token, toks)
        num += accepted.to(tl.int64)
        path = tl.where(accepted & (js == num), child, path)
        node = tl.where(accepted, child, node)
        go = accepted
        tl.debug_barrier()

    # The final draw from max(0, p) at `node` (token 0 when nothing is positive).
    target = tl.load(final_ptr + b) * _row_total(p_ws, V, BLOCK, True)
    final = tl.maximum(pick_from_weights(p_ws, V, target, BLOCK, True), 0)
    toks = tl.where(js == num, final.to(tl.int64), toks)
    write_tree_outputs(pred_ptr, acc_index_ptr, acc_num_ptr, ridx_ptr + row, b, n, steps, limit, path, toks, num,
                       BLOCK_N, BLOCK_S)


def verify_tree_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                         retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                         draft_probs):
    """``verify_tree_sampling`` with the op's schema (outputs written in place)."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    V = target_probs.shape[2]
    if bs == 0:
        return
    workspace = torch.empty(2 * bs * V, dtype=torch.float64, device=target_probs.device)
    _verify_tree_sampling_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                                        retrive_next_token, retrive_next_sibling, uniform_samples,
                                        uniform_samples_for_final_sampling, target_probs, draft_probs, workspace, n,
                                        steps, V, predicts.numel(), BLOCK=min(BLOCK_V, triton.next_power_of_2(V)),
                                        **block_sizes(n, steps))
