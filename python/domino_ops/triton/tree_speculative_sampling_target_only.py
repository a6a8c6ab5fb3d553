"""Triton kernel of ``tree_speculative_sampling_target_only``, the same contract as the CUDA
kernel (csrc/cuda/tree_speculative_sampling_target_only.cu, whose header states the bytes
and limits): one program per request walks the tree (one coin per node, float32 running
acceptance sum over the children in sibling order), then draws the last token by inverse
CDF (float64) of the residual at the last accepted node, the rejected children's tokens
zeroed, and writes the outputs in one pass (tree_common.write_tree_outputs).
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from domino_ops.triton.row_sampler import BLOCK_V
from domino_ops.triton.tree_common import block_sizes, start_walk, tree_link, write_tree_outputs


@triton.jit
def _residual(p_row, q_row, offs, V, has_q, cand_row, nt_row, ns_row, node, n, masked):
    """Residual weights of one vocabulary chunk (float64): max(p - q, 0) (q = 0 unless
    ``has_q``; NaN -> 0), zero at the tokens of ``node``'s children when ``masked`` (every
    child there was rejected)."""
    m = offs < V
    x = tl.load(p_row + offs, mask=m, other=0.0)
    x = x - tl.load(q_row + offs, mask=m & has_q, other=0.0)
    w = tl.where(x > 0, x, 0.0)
    child = tree_link(nt_row, node, n, masked)
    tried = tl.full([], 0, tl.int64)
    while child >= 0:
        t = tl.load(cand_row + child)
        w = tl.where(offs == t, 0.0, w)
        tried += 1
        child = tl.where(tried < n, tree_link(ns_row, child, n, child >= 0), -1)
    return w.to(tl.float64)


@triton.jit
def _tree_sampling_kernel(pred_ptr, acc_index_ptr, acc_num_ptr, cand_ptr, ridx_ptr, nt_ptr, ns_ptr, coins_ptr,
                          final_ptr, p_ptr, q_ptr, threshold_single, acc_div, n, steps, V, limit,
                          HAS_Q: tl.constexpr, BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = b * n
    js, path, toks, node, num = start_walk(BLOCK_S)
    done = tl.full([], 0, tl.int1)
    masked = tl.full([], 0, tl.int1)  # the walk ended with every child of `node` rejected
    for _level in range(1, steps):
        active = done == 0
        p_row = p_ptr + (row + node) * V
        coin = tl.load(coins_ptr + row + node)
        acc = tl.full([], 0.0, tl.float32)
        accepted = tl.full([], 0, tl.int1)
        token = tl.full([], -1, tl.int64)
        child = tree_link(nt_ptr + row, node, n, active)
        tried = tl.full([], 0, tl.int64)
        while child >= 0:
            t = tl.load(cand_ptr + row + child)
            t_ok = (t >= 0) & (t < V)
            pt = tl.load(p_row + t, mask=t_ok, other=0.0)
            acc = tl.where(t_ok, acc + pt, acc)
            accepted = t_ok & ((coin <= tl.math.div_rn(acc, acc_div)) | (pt >= threshold_single))
            token = t
            tried += 1
            nxt = tl.where(tried < n, tree_link(ns_ptr + row, child, n, child >= 0), -1)
            child = tl.where(accepted, child - n - 1, nxt)  # accepted: leave the loop (child < 0)
        child = tl.where(accepted, child + n + 1, -1)
        take = active & accepted
        masked = masked | (active & (accepted == 0))
        toks = tl.where(take & (js == num), token, toks)
        num += take.to(tl.int64)
        path = tl.where(take & (js == num), child, path)
        node = tl.where(take, child, node)
        done = done | (take == 0)

    # The final draw at `node`.
    p_row = p_ptr + (row + node) * V
    q_row = q_ptr + (row + node) * V
    has_q = HAS_Q & (num != steps - 1)
    cand_row = cand_ptr + row
    total = tl.full([], 0.0, tl.float64)
    for start in range(0, V, BLOCK):
        w = _residual(p_row, q_row, start + tl.arange(0, BLOCK), V, has_q, cand_row, nt_ptr + row, ns_ptr + row,
                      node, n, masked)
        total += tl.sum(w, 0)
    target = tl.load(final_ptr + b).to(tl.float64) * total
    carry = tl.full([], 0.0, tl.float64)
    found = V
    last_positive = -1
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w = _residual(p_row, q_row, offs, V, has_q, cand_row, nt_ptr + row, ns_ptr + row, node, n, masked)
        cdf = carry + tl.cumsum(w, 0)
        found = tl.minimum(found, tl.min(tl.where((cdf > target) & (w > 0), offs, V), 0))
        last_positive = tl.maximum(last_positive, tl.max(tl.where(w > 0, offs, -1), 0))
        carry += tl.sum(w, 0)
    final = tl.where(found < V, found, tl.where(last_positive >= 0, last_positive, V - 1))
    toks = tl.where(js == num, final.to(tl.int64), toks)
    write_tree_outputs(pred_ptr, acc_index_ptr, acc_num_ptr, ridx_ptr + row, b, n, steps, limit, path, toks, num,
                       BLOCK_N, BLOCK_S)


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single, threshold_acc, deterministic):
    """``tree_speculative_sampling_target_only`` with the op's schema (outputs written in
    place; ``deterministic`` is accepted and ignored: the kernel is deterministic)."""
    del deterministic
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    V = target_probs.shape[2]
    if bs == 0:
        return
    single = float(np.float32(threshold_single))
    acc_div = float(max(np.float32(threshold_acc), np.float32(1e-9)))  # sgl-kernel's cap, in float32
    has_q = draft_probs is not None
    _tree_sampling_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                                 retrive_next_token, retrive_next_sibling, uniform_samples,
                                 uniform_samples_for_final_sampling, target_probs,
                                 draft_probs if has_q else target_probs, single, acc_div, n, steps, V,
                                 predicts.numel(), HAS_Q=has_q, BLOCK=min(BLOCK_V, triton.next_power_of_2(V)),
                                 **block_sizes(n, steps))
