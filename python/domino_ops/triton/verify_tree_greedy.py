"""Triton kernel of ``verify_tree_greedy``, the same contract as the CUDA kernel
(csrc/cuda/verify_tree_greedy.cu, whose header states the bytes and limits): one program
per request walks the tree from the root, taking at each level the first child (in
sibling order) whose candidate equals the target's token at the current node, then writes
predicts, accept_index and accept_token_num in one pass (tree_common.write_tree_outputs).
"""

from __future__ import annotations

import triton.language as tl
import triton

from domino_ops.triton.tree_common import block_sizes, start_walk, tree_link, write_tree_outputs


@triton.jit
def _verify_tree_greedy_kernel(pred_ptr, acc_index_ptr, acc_num_ptr, cand_ptr, ridx_ptr, nt_ptr, ns_ptr, target_ptr,
                               n, steps, limit, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    row = b * n
    js, path, toks, node, num = start_walk(BLOCK_S)
    done = tl.full([], 0, tl.int1)
    for _level in range(1, steps):
        r = tl.load(ridx_ptr + row + node)
        ok = (r >= 0) & (r < limit) & (done == 0)
        want = tl.load(target_ptr + r, mask=ok, other=0)
        child = tree_link(nt_ptr + row, node, n, ok)
        c = tl.load(cand_ptr + row + child, mask=child >= 0, other=0)
        tried = tl.full([], 0, tl.int64)
        searching = (child >= 0) & (c != want)
        while searching:
            tried += 1
            child = tl.where(tried < n, tree_link(ns_ptr + row, child, n, child >= 0), -1)
            c = tl.load(cand_ptr + row + child, mask=child >= 0, other=0)
            searching = (child >= 0) & (c != want)
        take = ok & (child >= 0)
        toks = tl.where(take & (js == num), c, toks)
        num += take.to(tl.int64)
        path = tl.where(take & (js == num), child, path)
        node = tl.where(take, child, node)
        done = done | (take == 0)
    last = tl.load(ridx_ptr + row + node)
    bonus = tl.load(target_ptr + last, mask=(last >= 0) & (last < limit), other=-1)
    toks = tl.where(js == num, bonus, toks)
    write_tree_outputs(pred_ptr, acc_index_ptr, acc_num_ptr, ridx_ptr + row, b, n, steps, limit, path, toks, num,
                       BLOCK_N, BLOCK_S)


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, target_predict):
    """``verify_tree_greedy`` with the op's schema (outputs written in place)."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    if bs == 0:
        return
    _verify_tree_greedy_kernel[(bs,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                                      retrive_next_token, retrive_next_sibling, target_predict, n, steps,
                                      min(predicts.numel(), bs * n), **block_sizes(n, steps))
