"""Triton kernels of ``domino_head_expand`` (one step of Domino tree drafting for a frontier
of n nodes), the same step as the CUDA kernels (csrc/cuda/domino_head_expand.cu, whose
header states the bytes and limits), from the rollout's helpers
(:mod:`domino_ops.triton.domino_head_rollout`), so that a chain of one-child greedy steps
gives exactly the Triton rollout's tokens, log-probabilities and states:

- ``_expand_input_kernel``, grid (n, r / BLOCK_R): BLOCK_R rows of ``a = silu(hproj[seq,
  depth] + w1s @ S)`` (the rollout's input_rows);
- ``_expand_logits_kernel``, grid (vocabulary tiles,): for every node in turn
  ``L = base[seq, depth] + w2_tile @ a`` written to node_logits, with the greedy tile
  partials; each program loads its w2 tile from HBM once for the whole frontier (the
  other nodes re-read it from L1/L2), never once per node from HBM;
- ``_expand_chunk_best_kernel``, grid (n, V / CHUNK), when some node may be greedy: the
  greedy-order best min(m, 8) of one CHUNK-long slice of a node's logits row, so the whole
  GPU scans the rows (one program per node took ~450 us at V = 151936 on an H100, 2026-11-26);
- ``_expand_children_kernel``, grid (n,): the node's m children at its sequence's
  temperature (T = 0: the first min(m, 8) merged from the slices' candidates, each of the
  row's best 8 being among its own slice's best 8, any further one by an argmax pass over
  the row, the chosen excluded;
  log-probabilities from the tile partials' log-sum-exp;
  T > 0: the filtered weights (row_sampler.filter_row) into a float64 workspace row, then m
  inverse-CDF draws without replacement, then the best remaining tokens at -inf);
- ``_expand_gru_kernel``, grid (n * m, G / BLOCK_J): BLOCK_J rows of each child's GRU
  state (the rollout's gru_rows).

Sampling parameters: the scalars, or with per-sequence tensors each node those of its
sequence node_seq[f], all read as [b] tensors (:mod:`domino_ops.triton.row_params`, as the
rollout). A call with a per-sequence temperature may hold greedy and sampled nodes, and
which are which is known only on the device: it runs the greedy path's preparation for
every node (tile partials in the logits kernel, the slice kernel) and each node takes its
own path in the children kernel, so a greedy node gets exactly what a greedy call gives it.

Bytes: the CUDA kernels' (their header), plus in a call with a per-sequence temperature
the slice kernel's read of the sampled nodes' logits rows too (V floats each, one pass,
small beside the sampler's passes over the row) and their tile partials (12 bytes per 128
logits); the [b] parameters are read once per node.

A node index out of range is clamped, never an address. The float64 totals are chunked
tl.sum reductions, not the CPU's index-order sums (a draw changes only within rounding of
a CDF step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from domino_ops.triton.domino_head_rollout import (BLOCK_C, BLOCK_J, GRU_WARPS, TILE_V, choose_from_partials,
                                                   gru_rows, input_rows, logits_tile, store_tile_stats)
from domino_ops.triton.row_params import row_params
from domino_ops.triton.row_sampler import BLOCK_V, filter_row, final_weights, pick_from_weights


@triton.jit
def _node_seq(seq_ptr, f, seqs):
    """The sequence of node f, clamped into range (int64)."""
    return tl.minimum(tl.maximum(tl.load(seq_ptr + f), 0), seqs - 1)


@triton.jit
def _node_row(seq_ptr, depth_ptr, f, seqs, k):
    """The base-logit / hproj row of node f, its (sequence, depth) clamped into range (int64)."""
    depth = tl.load(depth_ptr + f)
    return _node_seq(seq_ptr, f, seqs) * k + tl.minimum(tl.maximum(depth, 0), k - 1)


@triton.jit
def _expand_input_kernel(hproj_ptr, state_ptr, seq_ptr, depth_ptr, w1s_ptr, a_ptr, seqs, k, r, G,
                         BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
    f = tl.program_id(0).to(tl.int64)
    rb = tl.program_id(1)
    row = _node_row(seq_ptr, depth_ptr, f, seqs, k)
    input_rows(hproj_ptr + row * r, state_ptr + f * G, w1s_ptr, a_ptr + f * r, rb * BLOCK_R, r, G, BLOCK_C,
               BLOCK_R)


@triton.jit
def _expand_logits_kernel(base_ptr, w2_ptr, a_ptr, seq_ptr, depth_ptr, partial_ptr, logits_ptr, n, seqs, k, V, r,
                          tiles, GREEDY: tl.constexpr, TILE: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_v = t * TILE + tl.arange(0, TILE)
    mask_v = offs_v < V
    for f0 in range(0, n):
        f = f0 + tl.zeros([], dtype=tl.int64)
        row = _node_row(seq_ptr, depth_ptr, f, seqs, k)
        L = logits_tile(base_ptr + row * V, w2_ptr, a_ptr + f * r, offs_v, mask_v, r, TILE, BLOCK_R)
        tl.store(logits_ptr + f * V + offs_v, L, mask=mask_v)
        if GREEDY:
            store_tile_stats(partial_ptr + (f * tiles + t) * 6, L, offs_v, mask_v, V)


@triton.jit
def _greedy_pick(val, idx, ok, NONE):
    """The first entry in the greedy order (the NaN of lowest index, else the maximum of
    lowest index) of the entries (val, idx) where ok: (its value, its index), or (-inf,
    NONE) when none is ok."""
    nan_idx = tl.min(tl.where(ok & (val != val), idx, NONE), 0)
    num = ok & (val == val)
    mx = tl.max(tl.where(num, val, -float("inf")), 0)
    best = tl.min(tl.where(num & (val == mx), idx, NONE), 0)
    is_nan = nan_idx < NONE
    return tl.where(is_nan, float("nan"), mx), tl.where(is_nan, nan_idx, best)


@triton.jit
def _best_remaining(row_ptr, V, taken_ptr, count, BLOCK: tl.constexpr):
    """The first token of row[0:V] in the greedy order (the first NaN, else the first
    maximum) among those not in taken[0:count]: each block's first (_greedy_pick), then
    the first of those (blocks ascend, so a later block wins only by a larger value)."""
    best_val = -float("inf")
    best_idx = V
    nan_idx = V
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf"))
        ok = offs < V
        for c in range(0, count):
            ok = ok & (offs != tl.load(taken_ptr + c))
        val, idx = _greedy_pick(x, offs, ok, V)
        is_nan = val != val  # a block with a NaN loses its numeric best, which a NaN beats anyway
        nan_idx = tl.where(is_nan, tl.minimum(nan_idx, idx), nan_idx)
        take = (~is_nan) & (idx < V) & ((val > best_val) | (best_idx == V))
        best_idx = tl.where(take, idx, best_idx)
        best_val = tl.where(take, val, best_val)
    return tl.where(nan_idx < V, nan_idx, best_idx)


# Children per greedy node taken from the slices' candidates; more take an argmax pass over
# the row each (_best_remaining), as the CUDA kernel.
ONE_PASS_CHILDREN = 8


# Logits per slice in the greedy child search: 4096 on a GPU (38 programs per node at
# V = 151936); 64 under the interpreter (CPU tensors), so the tests' small rows span several.
CHOOSE_CHUNK_GPU = 4096
CHOOSE_CHUNK_INTERPRETED = 64


def choose_chunk(device: torch.device) -> int:
    """Logits per slice of the greedy child search on ``device``."""
    return CHOOSE_CHUNK_INTERPRETED if device.type == "cpu" else CHOOSE_CHUNK_GPU


@triton.jit
def _expand_chunk_best_kernel(logits_ptr, cand_val_ptr, cand_idx_ptr, V, chunks, PER: tl.constexpr,
                              CHUNK: tl.constexpr):
    f = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    ok = offs < V
    x = tl.load(logits_ptr + f * V + offs, mask=ok, other=0.0)
    out = (f * chunks + c) * PER
    for j in tl.static_range(PER):  # the slice's best PER, each excluded once taken
        val, idx = _greedy_pick(x, offs, ok, V)
        tl.store(cand_val_ptr + out + j, val)
        tl.store(cand_idx_ptr + out + j, idx)  # V: fewer than PER entries in the slice
        ok = ok & (offs != idx)


GREEDY_CHILDREN_WARPS = 8  # the greedy argmax passes: more threads, and no spills


def children_warps(sampled: bool) -> int:
    """Warps of _expand_children_kernel without register spills on sm_80/sm_90: the argmax
    passes want more threads, the sampler's float64 scalars more registers per thread."""
    return 4 if sampled else GREEDY_CHILDREN_WARPS


@triton.jit
def _sampled_children(L_row, w_row, u_row, tok_row, lp_row, m, V, temperature, top_k, top_p, BLOCK_V: tl.constexpr):
    """m draws without replacement from the filtered law of L_row (float64 weights in w_row),
    then the best remaining tokens by L once no mass is left (log-probability -inf)."""
    xmax, no_mass, kth, cut, n_tie = filter_row(L_row, V, temperature, top_k, top_p, BLOCK_V)
    total = tl.full([], 0.0, tl.float64)
    tie_carry = tl.full([], 0, tl.int64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        w, ties = final_weights(L_row, offs, V, temperature, xmax, kth, cut, n_tie, tie_carry)
        w = tl.where(no_mass, 0.0, w)
        tl.store(w_row + offs, w, mask=offs < V)
        total += tl.sum(w, 0)
        tie_carry += ties
    tl.debug_barrier()
    for j in range(0, m):
        left = tl.full([], 0.0, tl.float64)
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            left += tl.sum(tl.load(w_row + offs, mask=offs < V, other=0.0), 0)
        if left > 0:
            target = tl.load(u_row + j) * left
            x = pick_from_weights(w_row, V, target, BLOCK_V, False).to(tl.int64)
            logprob = (tl.log(tl.load(w_row + x)) - tl.log(total)).to(tl.float32)
            tl.debug_barrier()
            tl.store(w_row + x, 0.0)
        else:  # no mass left: the best remaining token by L
            x = _best_remaining(L_row, V, tok_row, j, BLOCK_V).to(tl.int64)
            logprob = tl.full([], -float("inf"), tl.float32)
        tl.store(tok_row + j, x)
        tl.store(lp_row + j, logprob)
        tl.debug_barrier()


@triton.jit
def _greedy_children(partial_ptr, f, L_row, tok_row, lp_row, cval_row, cidx_row, m, V, tiles, n_cand, n_first,
                     BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_CAND: tl.constexpr):
    """The m best tokens of L_row in the greedy order, log-probabilities from node f's tile
    partials' log-sum-exp."""
    _, _, lse = choose_from_partials(partial_ptr, f, tiles, V, False, BLOCK_T)
    # the first n_first = min(m, 8): from the node's n_cand slice candidates
    offs_c = tl.arange(0, BLOCK_CAND)
    cval = tl.load(cval_row + offs_c, mask=offs_c < n_cand, other=0.0)
    cidx = tl.load(cidx_row + offs_c, mask=offs_c < n_cand, other=V)
    ok = cidx < V
    for j in range(0, n_first):
        _, x = _greedy_pick(cval, cidx, ok, V)
        ok = ok & (cidx != x)
        tl.store(tok_row + j, x)
        tl.store(lp_row + j, tl.load(L_row + x) - lse)
    tl.debug_barrier()
    for j in range(n_first, m):
        x = _best_remaining(L_row, V, tok_row, j, BLOCK_V).to(tl.int64)
        tl.store(tok_row + j, x)
        tl.store(lp_row + j, tl.load(L_row + x) - lse)
        tl.debug_barrier()


@triton.jit
def _expand_children_kernel(partial_ptr, logits_ptr, w_ptr, uniforms_ptr, tokens_ptr, logprobs_ptr, seq_ptr,
                            temperature_ptr, top_k_ptr, top_p_ptr, cand_val_ptr, cand_idx_ptr, m, V, seqs, tiles,
                            n_cand, n_first, GREEDY: tl.constexpr, SAMPLED: tl.constexpr, BLOCK_T: tl.constexpr,
                            BLOCK_V: tl.constexpr, BLOCK_CAND: tl.constexpr):
    """GREEDY / SAMPLED: whether some node may be greedy / may sample (both: the call has a
    per-sequence temperature, and each node branches on its sequence's)."""
    f = tl.program_id(0).to(tl.int64)
    L_row = logits_ptr + f * V
    tok_row = tokens_ptr + f * m
    lp_row = logprobs_ptr + f * m
    s = _node_seq(seq_ptr, f, seqs)
    sampled = SAMPLED
    if GREEDY and SAMPLED:  # a greedy sequence's node gets a greedy call's children
        sampled = tl.load(temperature_ptr + s) > 0
    if sampled:
        # float32 parameters, as the rollout's rows
        _sampled_children(L_row, w_ptr + f * V, uniforms_ptr + f * m, tok_row, lp_row, m, V,
                          tl.load(temperature_ptr + s), tl.load(top_k_ptr + s), tl.load(top_p_ptr + s).to(tl.float64),
                          BLOCK_V)
    else:
        _greedy_children(partial_ptr, f, L_row, tok_row, lp_row, cand_val_ptr + f * n_cand, cand_idx_ptr + f * n_cand,
                         m, V, tiles, n_cand, n_first, BLOCK_T, BLOCK_V, BLOCK_CAND)


@triton.jit
def _expand_gru_kernel(tokens_ptr, state_ptr, child_state_ptr, gru_input_ptr, w_ih_ptr, w_hh_ptr, m, G, H,
                       TABLE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_J: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)  # child c of node c // m: S_child = GRUCell(E[child], S)
    gru_rows(tl.load(tokens_ptr + c), state_ptr + (c // m) * G, child_state_ptr + c * G, gru_input_ptr, w_ih_ptr,
             w_hh_ptr, tl.program_id(1) * BLOCK_J, G, H, TABLE, BLOCK_C, BLOCK_J)


def domino_head_expand(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
                       temperature, top_k, top_p, uniforms, child_tokens, child_logprobs, child_state, node_logits,
                       w2_packed=None, w_hh_packed=None, row_temperature=None, row_top_k=None, row_top_p=None):
    """``domino_head_expand`` with the op's schema (see domino_ops.domino_head_expand)."""
    if w2_packed is not None:
        raise ValueError("w2_packed is a CPU layout (the Triton kernel reads w2 as it is): pass None")
    if w_hh_packed is not None:
        raise ValueError("w_hh_packed is a CPU layout (the Triton kernel reads w_hh as it is): pass None")
    n, m = child_tokens.shape
    if n == 0:
        return
    seqs, k, V = base_logits.shape
    r, G = w1s.shape
    H = 0 if w_ih is None else w_ih.shape[1]
    dev = base_logits.device
    # one parameter set per sequence (scalars broadcast by device fills, which a CUDA graph
    # capture accepts, unlike a host copy); node f reads its sequence's
    p = row_params(seqs, dev, temperature, top_k, top_p, row_temperature, row_top_k, row_top_p)
    sampled = p.may_sample  # some node may sample: weights workspace and uniforms
    # some node may be greedy: tile partials and slice candidates (with a per-sequence
    # temperature, for every node: which are greedy is known only on the device)
    greedy = not sampled or row_temperature is not None
    if node_logits is None:  # the kernels write the rows and read them back: a scratch tensor
        node_logits = torch.empty(n, V, dtype=torch.float32, device=dev)
    hproj = hproj.float().contiguous()
    tiles = triton.cdiv(V, TILE_V)
    a = torch.empty(n, r, dtype=torch.float32, device=dev)
    partials = torch.empty(n, tiles, 6, dtype=torch.float32, device=dev)
    weights = torch.empty(n, V, dtype=torch.float64, device=dev) if sampled else partials
    chunk = choose_chunk(dev)
    chunks, per = triton.cdiv(V, chunk), min(m, ONE_PASS_CHILDREN)
    cand_val = torch.empty(n, chunks * per, dtype=torch.float32, device=dev)
    cand_idx = torch.empty(n, chunks * per, dtype=torch.int64, device=dev)
    block_r = min(32, triton.next_power_of_2(r))
    _expand_input_kernel[(n, triton.cdiv(r, block_r))](hproj, node_state, node_seq, node_depth, w1s, a, seqs, k,
                                                       r, G, BLOCK_C=BLOCK_C, BLOCK_R=block_r)
    _expand_logits_kernel[(tiles,)](base_logits, w2, a, node_seq, node_depth, partials, node_logits, n, seqs, k, V,
                                    r, tiles, GREEDY=greedy, TILE=TILE_V, BLOCK_R=block_r)
    if greedy:
        _expand_chunk_best_kernel[(n, chunks)](node_logits, cand_val, cand_idx, V, chunks, PER=per, CHUNK=chunk)
    _expand_children_kernel[(n,)](partials, node_logits, weights, uniforms if sampled else partials, child_tokens,
                                  child_logprobs, node_seq, p.temperature, p.top_k, p.top_p, cand_val, cand_idx, m,
                                  V, seqs, tiles, chunks * per, per, GREEDY=greedy, SAMPLED=sampled,
                                  BLOCK_T=min(1024, triton.next_power_of_2(tiles)),
                                  BLOCK_V=min(BLOCK_V, triton.next_power_of_2(V)),
                                  BLOCK_CAND=triton.next_power_of_2(chunks * per), num_warps=children_warps(sampled))
    _expand_gru_kernel[(n * m, triton.cdiv(G, BLOCK_J))](
        child_tokens, node_state, child_state, gru_input, w_ih if w_ih is not None else w_hh, w_hh, m, G, H,
        TABLE=w_ih is None, BLOCK_C=BLOCK_C, BLOCK_J=BLOCK_J, num_warps=GRU_WARPS)
