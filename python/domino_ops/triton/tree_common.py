"""``@triton.jit`` helpers shared by the Triton kernels of the tree ops (verify_tree_greedy,
tree_speculative_sampling_target_only, verify_tree_sampling), as csrc/cuda/tree_common.cuh
is by the CUDA ones.

As there, bad index values never become addresses: an out-of-range link reads as -1, a
node whose retrive_index slot is out of range is never written through (and ends a walk),
and sibling walks are bounded by the node count. The walk keeps the accepted path in a
small register vector (``path``, one entry per accept_index column) with the token each
path node's predicts slot gets (``toks``); the outputs are then written in one vectorised
pass, each predicts slot once (no write-after-write ordering between threads is needed).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tree_link(row_ptr, node, n, ok):
    """row[node] where ``ok`` and node >= 0, as a link: a node in [0, n), else -1."""
    v = tl.load(row_ptr + node, mask=ok & (node >= 0), other=-1)
    return tl.where((v >= 0) & (v < n), v, -1)


@triton.jit
def start_walk(BLOCK_S: tl.constexpr):
    """A walk's registers at the root: (js, path, toks, node, num): the column indices, the
    path (path[0] = the root), the token per path node (-1: none yet), the current node
    and the number of accepted tokens."""
    js = tl.arange(0, BLOCK_S)
    return js, tl.zeros([BLOCK_S], dtype=tl.int64), tl.full([BLOCK_S], -1, tl.int64), tl.full([], 0, tl.int64), \
        tl.full([], 0, tl.int64)


@triton.jit
def write_tree_outputs(pred_ptr, acc_index_ptr, acc_num_ptr, ridx_row, b, n, steps, limit, path, toks, num,
                       BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr):
    """predicts[ridx[u]] = toks[j] for path node u = path[j] (j <= num; the last j wins if
    a node repeats), -1 for the request's other nodes; accept_index[b] = ridx[path[0..num]]
    then -1; accept_token_num[b] = num."""
    js = tl.arange(0, BLOCK_S)
    on = js <= num
    for start in range(0, n, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        r = tl.load(ridx_row + offs, mask=offs < n, other=-1)
        ok = (offs < n) & (r >= 0) & (r < limit)
        match = (offs[:, None] == path[None, :]) & on[None, :]
        jsel = tl.max(tl.where(match, js[None, :], -1), axis=1)
        val = tl.sum(tl.where(js[None, :] == jsel[:, None], toks[None, :], 0), axis=1)
        tl.store(pred_ptr + r, tl.where(jsel >= 0, val, -1).to(tl.int32), mask=ok)
    slots = tl.load(ridx_row + path, mask=on & (js < steps), other=-1)
    tl.store(acc_index_ptr + b * steps + js, tl.where(on, slots, -1).to(tl.int32), mask=js < steps)
    tl.store(acc_num_ptr + b, num.to(tl.int32))


def block_sizes(n: int, steps: int) -> dict:
    """BLOCK_N (node chunk of the output pass) and BLOCK_S (accept_index columns)."""
    return dict(BLOCK_N=min(64, triton.next_power_of_2(n)), BLOCK_S=triton.next_power_of_2(steps))
