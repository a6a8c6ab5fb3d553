"""Triton kernels of ``domino_head_rollout``, the phases of the CUDA version's step
(csrc/cuda/domino_head_rollout.cu), 3k+1 fixed-shape launches per rollout:

- ``_head_logits_kernel``, grid (vocabulary tiles, b): ``L = base + w2_tile @ a`` for one
  sequence, reduced to a per-tile partial (max, sum exp(z - max), argmax) and, when
  sampling, the winner of an exponential race ``argmax z - log(E)``, E ~ Exp(1) from
  ``tl.rand`` (Philox) seeded with the 64 bits of the step's uniform. Logits are written
  only with write_logits (or, when some row may use top-k/top-p, to a scratch row: then
  every sampled row is sampled from it by :func:`row_sampler.sample_row` in the update
  kernel, and the race is skipped). Each row has its own temperature, top-k and top-p
  (:mod:`row_params`); a row at temperature 0 takes the argmax.
- ``_head_gru_kernel``, grid (b, G / BLOCK_J): merges the tile partials into the token and
  its log-probability and runs BLOCK_J rows of the GRU cell (S ping-pongs between two
  buffers, because every output row reads the whole old S). One program per sequence
  doing all G rows, the first design, streamed w_hh (and w_ih) through one SM: 0.75 ms
  per paper-shape step with the table and 7.7 ms with w_ih on an H100 (2026-11-23),
  against 0.08 ms for the CUDA kernels, which split the GRU the same way.
- ``_head_input_kernel``, grid (b, r / BLOCK_R): the next step's ``a``.

Bytes per step are the CUDA kernel's except that each sequence streams its own copy of
the w2 tile (b reads of V*r per step, from L2 after the first at small b); the
elementwise-multiply-and-sum GEMVs avoid ``tl.dot``, which needs M >= 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from domino_ops.triton.row_params import row_params
from domino_ops.triton.row_sampler import sample_row

TILE_V = 128  # vocabulary rows per logits program (a [128, 32] w2 chunk in registers)
BLOCK_C = 32  # columns per GEMV chunk
BLOCK_J = 32  # GRU output rows per chunk
GRU_WARPS = 8  # the GRU kernels' three [BLOCK_J, BLOCK_C] gate tiles: 4 warps spill on sm_90 (fp32 w_ih)


@triton.jit
def logits_tile(base_row, w2_ptr, a_row, offs_v, mask_v, r, TILE: tl.constexpr, BLOCK_R: tl.constexpr):
    """L = base_row[offs_v] + w2[offs_v] @ a_row (float32), in chunks of BLOCK_R columns."""
    acc = tl.zeros([TILE], dtype=tl.float32)
    for c0 in range(0, r, BLOCK_R):
        offs_c = c0 + tl.arange(0, BLOCK_R)
        mask_c = offs_c < r
        a = tl.load(a_row + offs_c, mask=mask_c, other=0.0)
        w = tl.load(w2_ptr + offs_v[:, None] * r + offs_c[None, :], mask=mask_v[:, None] & mask_c[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * a[None, :], 1)
    return tl.load(base_row + offs_v, mask=mask_v, other=0.0).to(tl.float32) + acc


@triton.jit
def store_tile_stats(out, z, offs_v, mask_v, V):
    """Stores a tile's partial (max, sum exp(z - max), argmax; NaN, NaN, first NaN if the
    tile holds one) at out[0:3]; returns z with NaN as -inf."""
    z = tl.where(mask_v, z, -float("inf"))
    is_nan = z != z
    nan_arg = tl.min(tl.where(is_nan, offs_v, V), 0)
    zn = tl.where(is_nan, -float("inf"), z)
    m = tl.max(zn, 0)
    # equal maxima count 1 each (at +inf the sum counts the +inf entries)
    sumexp = tl.sum(tl.where(zn == m, 1.0, tl.where(zn > -float("inf"), tl.exp(zn - m), 0.0)), 0)
    sumexp = tl.where(m == -float("inf"), 0.0, sumexp)
    arg = tl.min(tl.where((zn == m) & mask_v, offs_v, V), 0)
    has_nan = nan_arg < V
    tl.store(out + 0, tl.where(has_nan, float("nan"), m))
    tl.store(out + 1, tl.where(has_nan, float("nan"), sumexp))
    tl.store(out + 2, tl.where(has_nan, nan_arg, arg).to(tl.float32))
    return zn


@triton.jit
def round_to_bf16(x):
    """float32 x rounded to the nearest bf16 value, ties to even, still float32 (NaN stays
    NaN; its .to(tl.bfloat16) is then exact). By bits, because the interpreter's
    ``.to(tl.bfloat16)`` truncates where the GPU rounds to nearest even."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, rounded)


@triton.jit
def _head_logits_kernel(base_ptr, w2_ptr, a_ptr, seeds_ptr, partial_ptr, rows_ptr, temperature_ptr, top_k_ptr,
                        top_p_ptr, step, k, V, r, tiles,
                        MAY_SAMPLE: tl.constexpr, MAY_FILTER: tl.constexpr, WRITE_LOGITS: tl.constexpr,
                        TILE: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1).to(tl.int64)
    offs_v = t * TILE + tl.arange(0, TILE)
    mask_v = offs_v < V
    base_row = base_ptr + (s * k + step) * V
    L = logits_tile(base_row, w2_ptr, a_ptr + s * r, offs_v, mask_v, r, TILE, BLOCK_R)
    if WRITE_LOGITS:
        if base_ptr.dtype.element_ty == tl.bfloat16:  # to nearest even, as torch and the other kernels
            tl.store(base_row + offs_v, round_to_bf16(L).to(tl.bfloat16), mask=mask_v)
        else:
            tl.store(base_row + offs_v, L.to(base_ptr.dtype.element_ty), mask=mask_v)
    if MAY_FILTER:
        tl.store(rows_ptr + s * V + offs_v, L, mask=mask_v)
    if MAY_SAMPLE:
        temperature = tl.load(temperature_ptr + s)
    else:
        temperature = 0.0
    sampled = temperature > 0
    # greedy rows keep NaN (torch.argmax picks the first); sampled rows count it as -inf;
    # div_rn: IEEE division, as the CUDA and CPU kernels divide (Triton's / is approximate)
    z = tl.where(sampled, tl.where(L == L, tl.math.div_rn(L, tl.where(sampled, temperature, 1.0)), -float("inf")), L)
    out = partial_ptr + (s * tiles + t) * 6
    zn = store_tile_stats(out, z, offs_v, mask_v, V)
    if MAY_SAMPLE and not MAY_FILTER:  # with MAY_FILTER every sampled row is sampled from its row
        if sampled:
            # the exponential race argmax z + G (G Gumbel); +inf entries race among themselves
            seed = tl.load(seeds_ptr + s * k + step)
            u = tl.rand(seed, offs_v.to(tl.int32))
            gumbel = -tl.log(-tl.log(u))
            is_inf = zn == float("inf")
            any_inf = tl.max(is_inf.to(tl.int32), 0) > 0
            key = tl.where(is_inf, gumbel, zn + gumbel)
            key = tl.where(mask_v & (is_inf | ~any_inf) & (zn > -float("inf")), key, -float("inf"))
            best = tl.max(key, 0)
            race_arg = tl.min(tl.where((key == best) & (key > -float("inf")), offs_v, V), 0)
            race_z = tl.sum(tl.where(offs_v == race_arg, zn, 0.0), 0)
            tl.store(out + 3, best)
            tl.store(out + 4, race_arg.to(tl.float32))
            tl.store(out + 5, race_z)


@triton.jit
def _gate_rows_dot(w_ptr, x_ptr, offs_j, mj, G, n, BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr):
    """The r, z and n gate rows j of ``w [3G, n] @ x [n]`` (x float32 or the weights'
    dtype), in chunks of BLOCK_C columns: three float32 vectors [BLOCK_J]."""
    acc_r = tl.zeros([BLOCK_J], dtype=tl.float32)
    acc_z = tl.zeros([BLOCK_J], dtype=tl.float32)
    acc_n = tl.zeros([BLOCK_J], dtype=tl.float32)
    for c0 in range(0, n, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        mc = offs_c < n
        x = tl.load(x_ptr + offs_c, mask=mc, other=0.0).to(tl.float32)[None, :]
        m2 = mj[:, None] & mc[None, :]
        wp = w_ptr + offs_j[:, None] * n + offs_c[None, :]
        acc_r += tl.sum(tl.load(wp, mask=m2, other=0.0).to(tl.float32) * x, 1)
        acc_z += tl.sum(tl.load(wp + G * n, mask=m2, other=0.0).to(tl.float32) * x, 1)
        acc_n += tl.sum(tl.load(wp + 2 * G * n, mask=m2, other=0.0).to(tl.float32) * x, 1)
    return acc_r, acc_z, acc_n


@triton.jit
def gru_rows(token, s_in, s_out, gru_input_ptr, w_ih_ptr, w_hh_ptr, j0, G, H, TABLE: tl.constexpr,
             BLOCK_C: tl.constexpr, BLOCK_J: tl.constexpr):
    """s_out[j0:j0 + BLOCK_J] = those rows of GRUCell(E[token], s_in[0:G]): one program's
    share, so that the w_hh (and w_ih) rows are streamed by G / BLOCK_J programs per
    sequence, not by one."""
    offs_j = j0 + tl.arange(0, BLOCK_J)
    mj = offs_j < G
    gh_r, gh_z, gh_n = _gate_rows_dot(w_hh_ptr, s_in, offs_j, mj, G, G, BLOCK_J, BLOCK_C)
    if TABLE:
        row = gru_input_ptr + token * 3 * G
        gi_r = tl.load(row + offs_j, mask=mj, other=0.0).to(tl.float32)
        gi_z = tl.load(row + G + offs_j, mask=mj, other=0.0).to(tl.float32)
        gi_n = tl.load(row + 2 * G + offs_j, mask=mj, other=0.0).to(tl.float32)
    else:
        gi_r, gi_z, gi_n = _gate_rows_dot(w_ih_ptr, gru_input_ptr + token * H, offs_j, mj, G, H, BLOCK_J, BLOCK_C)
    rg = tl.sigmoid(gi_r + gh_r)
    zg = tl.sigmoid(gi_z + gh_z)
    n = 2.0 * tl.sigmoid(2.0 * (gi_n + rg * gh_n)) - 1.0  # tanh
    s_old = tl.load(s_in + offs_j, mask=mj, other=0.0)
    tl.store(s_out + offs_j, (1.0 - zg) * n + zg * s_old, mask=mj)


@triton.jit
def input_rows(hproj_row, s_row, w1s_ptr, a_row, r0, r, G, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
    """a_row[r0:r0 + BLOCK_R] = those rows of silu(hproj_row + w1s @ s_row)."""
    offs_r = r0 + tl.arange(0, BLOCK_R)
    mr = offs_r < r
    acc = tl.load(hproj_row + offs_r, mask=mr, other=0.0)
    for c0 in range(0, G, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        mc = offs_c < G
        sv = tl.load(s_row + offs_c, mask=mc, other=0.0)[None, :]
        w = tl.load(w1s_ptr + offs_r[:, None] * G + offs_c[None, :], mask=mr[:, None] & mc[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * sv, 1)
    tl.store(a_row + offs_r, acc * tl.sigmoid(acc), mask=mr)


@triton.jit
def choose_from_partials(partial_ptr, s, tiles, V, SAMPLED: tl.constexpr, BLOCK_T: tl.constexpr):
    """The token and log-probability of sequence s from its tile partials: at temperature 0
    the argmax (the first NaN if any, as torch.argmax), else the exponential race's winner
    (a +inf entry first; token 0 when no entry has mass, as the reference); and the row's
    log-sum-exp (NaN when the row holds a NaN)."""
    nan_arg = V
    M = -float("inf")
    for t0 in range(0, tiles, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mt = offs_t < tiles
        p = partial_ptr + (s * tiles + offs_t) * 6
        pm = tl.load(p, mask=mt, other=-float("inf"))
        pa = tl.load(p + 2, mask=mt, other=V).to(tl.int32)
        nan_arg = tl.minimum(nan_arg, tl.min(tl.where(pm != pm, pa, V), 0))
        M = tl.maximum(M, tl.max(tl.where(pm != pm, -float("inf"), pm), 0))
    total = 0.0
    arg = V
    best_key = -float("inf")
    best_inf = 0
    race_arg = V
    race_z = 0.0
    for t0 in range(0, tiles, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mt = offs_t < tiles
        p = partial_ptr + (s * tiles + offs_t) * 6
        pm = tl.load(p, mask=mt, other=-float("inf"))
        ps = tl.load(p + 1, mask=mt, other=0.0)
        pa = tl.load(p + 2, mask=mt, other=V).to(tl.int32)
        total += tl.sum(tl.where(pm == M, ps, tl.where(pm > -float("inf"), ps * tl.exp(pm - M), 0.0)), 0)
        arg = tl.minimum(arg, tl.min(tl.where(pm == M, pa, V), 0))
        if SAMPLED:
            pk = tl.load(p + 3, mask=mt, other=-float("inf"))
            pka = tl.load(p + 4, mask=mt, other=V).to(tl.int32)
            pz = tl.load(p + 5, mask=mt, other=0.0)
            p_inf = (pz == float("inf")) & (pka < V)
            c_inf = tl.max(p_inf.to(tl.int32), 0)
            pk = tl.where(p_inf | (c_inf == 0), pk, -float("inf"))
            cb = tl.max(pk, 0)
            ca = tl.min(tl.where((pk == cb) & (pka < V), pka, V), 0)
            cz = tl.sum(tl.where((pk == cb) & (pka == ca), pz, 0.0), 0)
            # strict: an earlier chunk holds lower indices
            better = (c_inf > best_inf) | ((c_inf == best_inf) & (cb > best_key) & (ca < V))
            race_arg = tl.where(better, ca, race_arg)
            race_z = tl.where(better, cz, race_z)
            best_key = tl.where(better, cb, best_key)
            best_inf = tl.maximum(best_inf, c_inf)
    lse = M + tl.log(total)
    if SAMPLED:
        token = tl.where(race_arg < V, race_arg, 0)
        logprob = tl.where(race_arg < V, tl.where(race_z == float("inf"), -tl.log(total), race_z - lse), 0.0)
    else:
        token = tl.where(nan_arg < V, nan_arg, tl.where(arg < V, arg, 0))
        logprob = tl.where(nan_arg < V, float("nan"), M - lse)
    return token, logprob, tl.where(nan_arg < V, float("nan"), lse)


@triton.jit
def _head_choose_filtered_kernel(partial_ptr, rows_ptr, uniforms_ptr, tokens_ptr, logprobs_ptr, temperature_ptr,
                                 top_k_ptr, top_p_ptr, step, k, V, tiles, BLOCK_T: tl.constexpr,
                                 BLOCK_V: tl.constexpr):
    """Grid (b,), when some row may use top-k / top-p: the token of step ``step`` of each
    sequence, the argmax from the tile partials at temperature 0, else a sample of the row
    by inverse CDF at the step's uniform (filtered or not)."""
    s = tl.program_id(0).to(tl.int64)
    temperature = tl.load(temperature_ptr + s)
    if temperature == 0:
        token, logprob, _ = choose_from_partials(partial_ptr, s, tiles, V, False, BLOCK_T)
    else:
        u = tl.load(uniforms_ptr + s * k + step)
        token, logprob = sample_row(rows_ptr + s * V, V, temperature, tl.load(top_k_ptr + s),
                                    tl.load(top_p_ptr + s).to(tl.float64), u, BLOCK_V)
    tl.store(tokens_ptr + s * k + step, token.to(tl.int64))
    tl.store(logprobs_ptr + s * k + step, logprob.to(tl.float32))


@triton.jit
def _head_gru_kernel(partial_ptr, tokens_ptr, logprobs_ptr, s_in_ptr, s_out_ptr, gru_input_ptr, w_ih_ptr, w_hh_ptr,
                     temperature_ptr, step, k, V, G, H, tiles, MAY_SAMPLE: tl.constexpr, MAY_FILTER: tl.constexpr,
                     TABLE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_J: tl.constexpr):
    """Grid (b, G / BLOCK_J): the token of step ``step - 1`` and BLOCK_J rows of the new S
    (the sequences on the grid's first axis, which has no 65535 limit)."""
    s = tl.program_id(0).to(tl.int64)
    jb = tl.program_id(1)
    # 1. the token of the previous step, by the row's own parameters (with MAY_FILTER every
    # sampled row, filtered or not, was sampled from its row by _head_choose_filtered_kernel;
    # else the exponential race of the logits kernel). Every program of the sequence merges
    # the same partials to the same token (a few KB from L2); the first one stores it.
    if MAY_FILTER:
        token = tl.load(tokens_ptr + s * k + step - 1).to(tl.int32)
    else:
        greedy = True
        if MAY_SAMPLE:
            greedy = tl.load(temperature_ptr + s) == 0
        if greedy:
            token, logprob, _ = choose_from_partials(partial_ptr, s, tiles, V, False, BLOCK_T)
        else:
            token, logprob, _ = choose_from_partials(partial_ptr, s, tiles, V, True, BLOCK_T)
        if jb == 0:
            tl.store(tokens_ptr + s * k + step - 1, token.to(tl.int64))
            tl.store(logprobs_ptr + s * k + step - 1, logprob.to(tl.float32))
    # 2. S = GRUCell(E[token], S), this program's rows
    gru_rows(token.to(tl.int64), s_in_ptr + s * G, s_out_ptr + s * G, gru_input_ptr, w_ih_ptr, w_hh_ptr,
             jb * BLOCK_J, G, H, TABLE, BLOCK_C, BLOCK_J)


@triton.jit
def _head_input_kernel(hproj_ptr, s_ptr, w1s_ptr, a_ptr, step, k, r, G, BLOCK_C: tl.constexpr,
                       BLOCK_R: tl.constexpr):
    """Grid (b, r / BLOCK_R): BLOCK_R rows of a = silu(hproj[s, step] + w1s @ S)."""
    s = tl.program_id(0).to(tl.int64)
    rb = tl.program_id(1)
    input_rows(hproj_ptr + (s * k + step) * r, s_ptr + s * G, w1s_ptr, a_ptr + s * r, rb * BLOCK_R, r, G, BLOCK_C,
               BLOCK_R)


def domino_head_rollout(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k, top_p,
                        uniforms, write_logits, tokens, logprobs, state_out, row_temperature=None, row_top_k=None,
                        row_top_p=None):
    """``domino_head_rollout`` with the op's schema (see domino_ops.domino_head_rollout)."""
    b, k, V = base_logits.shape
    r, G = w1s.shape
    H = 0 if w_ih is None else w_ih.shape[1]
    dev = base_logits.device
    p = row_params(b, dev, temperature, top_k, top_p, row_temperature, row_top_k, row_top_p)
    hproj = hproj.float().contiguous()
    tiles = triton.cdiv(V, TILE_V)
    a = torch.empty(b, r, dtype=torch.float32, device=dev)
    # per (sequence, tile): max, sum exp, argmax, race key, race argmax, race z (indices as floats)
    partials = torch.empty(b, tiles, 6, dtype=torch.float32, device=dev)
    rows = torch.empty(b, V, dtype=torch.float32, device=dev) if p.may_filter else partials
    s_bufs = torch.empty(2, b, G, dtype=torch.float32, device=dev)
    seeds = uniforms.view(torch.int64) if p.may_sample else tokens
    uni = uniforms if p.may_sample else partials
    block_r = min(32, triton.next_power_of_2(r))
    block_t, block_v = min(1024, triton.next_power_of_2(tiles)), min(1024, triton.next_power_of_2(V))
    for step in range(k + 1):
        first, last = step == 0, step == k
        if not first:
            if p.may_filter:
                _head_choose_filtered_kernel[(b,)](partials, rows, uni, tokens, logprobs, p.temperature, p.top_k,
                                                   p.top_p, step - 1, k, V, tiles, BLOCK_T=block_t, BLOCK_V=block_v)
            s_in = state if step == 1 else s_bufs[(step - 1) % 2]
            s_cur = state_out if last else s_bufs[step % 2]
            _head_gru_kernel[(b, triton.cdiv(G, BLOCK_J))](
                partials, tokens, logprobs, s_in, s_cur, gru_input, w_ih if w_ih is not None else w_hh, w_hh,
                p.temperature, step, k, V, G, H, tiles, MAY_SAMPLE=p.may_sample, MAY_FILTER=p.may_filter,
                TABLE=w_ih is None, BLOCK_T=block_t, BLOCK_C=BLOCK_C, BLOCK_J=BLOCK_J, num_warps=GRU_WARPS)
        else:
            s_cur = state
        if last:
            break
        _head_input_kernel[(b, triton.cdiv(r, block_r))](hproj, s_cur, w1s, a, step, k, r, G, BLOCK_C=BLOCK_C,
                                                         BLOCK_R=block_r)
        _head_logits_kernel[(tiles, b)](
            base_logits, w2, a, seeds, partials, rows, p.temperature, p.top_k, p.top_p, step, k, V, r, tiles,
            MAY_SAMPLE=p.may_sample, MAY_FILTER=p.may_filter, WRITE_LOGITS=bool(write_logits), TILE=TILE_V,
            BLOCK_R=block_r)
