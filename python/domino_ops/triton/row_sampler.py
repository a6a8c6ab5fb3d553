"""The row sampler: ``@triton.jit`` helpers that sample or pick one row of logits, shared
by the Triton kernels of ``sample``, ``verify_greedy`` and ``domino_head_rollout`` (its
top-k/top-p path), as csrc/cuda/row_sampler.cuh is by the CUDA kernels.

Sampling is the inverse CDF of the filtered distribution at the caller's float64 uniform,
so given the same uniforms the tokens equal the reference's. top-k and top-p are found by
bisection over the 32-bit ordered key of z = (logits - max) / T (no sort): ~70 passes over a row
that stays in L2 after the first.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK_V = 1024  # vocabulary chunk per loop iteration


@triton.jit
def _ordered_key(z):
    """int64 whose order is the float order of z (float32), -0 and +0 one key (they tie)."""
    # From the signed bits: a negative float's key is 2^31 minus its magnitude bits, which
    # is -bits; a non-negative one's is 2^31 plus its bits. -0 and +0 both get 2^31 (the
    # CUDA float_key in csrc/cuda/common.cuh gives them one key too).
    bits = z.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(bits < 0, -bits, bits + 2147483648)


@triton.jit
def argmax_row(row_ptr, V, BLOCK: tl.constexpr):
    """First index of the maximum of row[0:V], the first NaN if there is one (torch.argmax)."""
    best_val = -float("inf")
    best_idx = 0
    nan_idx = V
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        nan_idx = tl.minimum(nan_idx, tl.min(tl.where(x != x, offs, V), 0))
        x = tl.where(x != x, -float("inf"), x)
        m = tl.max(x, 0)
        idx = tl.min(tl.where((x == m) & (offs < V), offs, V), 0)
        take = m > best_val
        best_idx = tl.where(take, idx, best_idx)
        best_val = tl.maximum(best_val, m)
    return tl.where(nan_idx < V, nan_idx, best_idx)


@triton.jit
def pick_from_weights(w_ptr, V, target, BLOCK: tl.constexpr, POSITIVE: tl.constexpr):
    """The first j whose running float64 sum of w[0:V] (max(0, w) when POSITIVE) exceeds
    target (in index order, chunked), else the last positive weight, else -1."""
    carry = tl.full([], 0.0, tl.float64)
    found = V
    last_positive = -1
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w = tl.load(w_ptr + offs, mask=offs < V, other=0.0)
        if POSITIVE:
            w = tl.where(w > 0, w, 0.0)
        cdf = carry + tl.cumsum(w, 0)
        found = tl.minimum(found, tl.min(tl.where((cdf > target) & (w > 0), offs, V), 0))
        last_positive = tl.maximum(last_positive, tl.max(tl.where(w > 0, offs, -1), 0))
        carry += tl.sum(w, 0)
    return tl.where(found < V, found, last_positive)


@triton.jit
def row_max(row_ptr, V, BLOCK: tl.constexpr):
    """The largest non-NaN value of row[0:V] (float32; -inf if there is none)."""
    xmax = -float("inf")
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
        xmax = tl.maximum(xmax, tl.max(tl.where(x != x, -float("inf"), x), 0))
    return xmax


@triton.jit
def _scaled(row_ptr, offs, V, temperature, xmax):
    """z = (row[offs] - xmax) / temperature (float32) with the extreme-value rules: NaN ->
    -inf; when xmax is +inf, 0 at the +inf entries and -inf elsewhere; -inf past V."""
    x = tl.load(row_ptr + offs, mask=offs < V, other=-float("inf")).to(tl.float32)
    inf_row = xmax == float("inf")
    # div_rn: IEEE division, as the CUDA and CPU kernels divide (Triton's / is approximate)
    z = tl.where(inf_row, tl.where(x == float("inf"), 0.0, -float("inf")), tl.math.div_rn(x - xmax, temperature))
    return tl.where((x != x) | (offs >= V), -float("inf"), z)


@triton.jit
def _topk_weights(row_ptr, offs, V, temperature, xmax, zmax, kth):
    """(w, key) for one chunk: weights exp(z - zmax) (float64) of the tokens top-k keeps
    (key >= kth), 0 elsewhere and past V, and the ordered keys of z."""
    z = _scaled(row_ptr, offs, V, temperature, xmax)
    key = _ordered_key(z)
    return tl.where((offs < V) & (key >= kth), tl.exp((z - zmax).to(tl.float64)), 0.0), key


@triton.jit
def _final_weights(row_ptr, offs, V, temperature, xmax, zmax, kth, cut, n_tie, tie_carry):
    """(w, ties) for one chunk: the filtered law's weights, i.e. top-k's, of which top-p
    keeps keys above `cut` and the first n_tie keys equal to it in index order (tie_carry
    of those lie in earlier chunks); ties counts this chunk's keys equal to `cut`."""
    w, key = _topk_weights(row_ptr, offs, V, temperature, xmax, zmax, kth)
    tie = ((key == cut) & (offs < V)).to(tl.int64)
    rank = tie_carry + tl.cumsum(tie, 0) - tie
    keep = (key > cut) | ((key == cut) & (rank < n_tie))
    return tl.where(keep, w, 0.0), tl.sum(tie, 0)


@triton.jit
def filter_row(row_ptr, V, temperature, top_k, top_p, BLOCK: tl.constexpr):
    """The filtered law of row[0:V] at temperature > 0 with top-k (0 = off) and top-p (1 =
    off): (xmax, no_mass, kth, cut, n_tie), whose weights final_weights gives chunk by chunk."""
    xmax = row_max(row_ptr, V, BLOCK)
    no_mass = xmax == -float("inf")
    xmax = tl.where(no_mass, 0.0, xmax)  # any finite value: every z is -inf
    zmax = tl.full([], 0.0, tl.float32)
    # loop-carried scalars keep one type: int64 keys and counts, float64 masses
    no_cut = tl.full([], -1, tl.int64)  # every key is above it: top-p off
    big = tl.full([], V + 1, tl.int64)
    # top-k: the largest key t with count(key >= t) >= k
    kth = tl.full([], 0, tl.int64)
    if (top_k > 0) & (top_k < V):
        lo = tl.full([], 0, tl.int64)
        hi = tl.full([], 4294967295, tl.int64)
        for _ in range(32):
            mid = lo + (hi - lo + 1) // 2
            count = tl.full([], 0, tl.int64)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                key = _ordered_key(_scaled(row_ptr, offs, V, temperature, xmax))
                count += tl.sum(((key >= mid) & (offs < V)).to(tl.int64), 0)
            ok = count >= top_k
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        kth = lo
    # top-p: the smallest key t with mass(key > t) < top_p * total; ties at t kept in
    # index order while the mass before them stays under the bound
    cut = no_cut
    n_tie = big
    if top_p < 1.0:
        total = tl.full([], 0.0, tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            w, key = _topk_weights(row_ptr, offs, V, temperature, xmax, zmax, kth)
            total += tl.sum(w, 0)
        bound = top_p * total
        lo = tl.full([], 0, tl.int64)
        hi = tl.full([], 4294967295, tl.int64)
        for _ in range(32):
            mid = lo + (hi - lo) // 2
            above = tl.full([], 0.0, tl.float64)
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                w, key = _topk_weights(row_ptr, offs, V, temperature, xmax, zmax, kth)
                above += tl.sum(tl.where(key > mid, w, 0.0), 0)
            ok = above < bound
            hi = tl.where(ok, mid, hi)
            lo = tl.where(ok, lo, mid + 1)
        cut = lo
        above = tl.full([], 0.0, tl.float64)
        w_tie = tl.full([], 0.0, tl.float64)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            w, key = _topk_weights(row_ptr, offs, V, temperature, xmax, zmax, kth)
            above += tl.sum(tl.where(key > cut, w, 0.0), 0)
            w_tie = tl.maximum(w_tie, tl.max(tl.where(key == cut, w, 0.0), 0))
        n_tie = tl.maximum(tl.ceil((bound - above) / w_tie).to(tl.int64), 1)
        n_tie = tl.where((n_tie > 1) & ~(above + (n_tie - 1) * w_tie < bound), n_tie - 1, n_tie)
        n_tie = tl.where(above + n_tie * w_tie < bound, n_tie + 1, n_tie)
    return xmax, no_mass, kth, cut, n_tie


@triton.jit
def final_weights(row_ptr, offs, V, temperature, xmax, kth, cut, n_tie, tie_carry):
    """(w, ties) for one chunk of the law filter_row describes (see _final_weights)."""
    return _final_weights(row_ptr, offs, V, temperature, xmax, tl.full([], 0.0, tl.float32), kth, cut, n_tie,
                          tie_carry)


@triton.jit
def filtered_total(row_ptr, V, temperature, xmax, kth, cut, n_tie, BLOCK: tl.constexpr):
    """The float64 total of the weights of the law filter_row describes, chunk by chunk in
    index order (the tie ranks carried across chunks)."""
    total = tl.full([], 0.0, tl.float64)
    tie_carry = tl.full([], 0, tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w, ties = final_weights(row_ptr, offs, V, temperature, xmax, kth, cut, n_tie, tie_carry)
        total += tl.sum(w, 0)
        tie_carry += ties
    return total


@triton.jit
def sample_row(row_ptr, V, temperature, top_k, top_p, u, BLOCK: tl.constexpr):
    """Samples row[0:V] at temperature > 0 with top-k (0 = off) and top-p (1 = off) by
    inverse CDF at the uniform u. Returns (token, logprob under the filtered law); a row
    with no mass (all -inf / NaN) gives token 0 with log-probability 0, as the reference."""
    xmax, no_mass, kth, cut, n_tie = filter_row(row_ptr, V, temperature, top_k, top_p, BLOCK)
    zmax = tl.full([], 0.0, tl.float32)
    # inverse CDF in index order: the first j with cumsum(w)[j] > u * total
    total = filtered_total(row_ptr, V, temperature, xmax, kth, cut, n_tie, BLOCK)
    target = u * total
    carry = tl.full([], 0.0, tl.float64)
    tie_carry = tl.full([], 0, tl.int64)
    found = V
    last_positive = -1
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w, ties = _final_weights(row_ptr, offs, V, temperature, xmax, zmax, kth, cut, n_tie, tie_carry)
        cdf = carry + tl.cumsum(w, 0)
        found = tl.minimum(found, tl.min(tl.where((cdf > target) & (w > 0), offs, V), 0))
        last_positive = tl.maximum(last_positive, tl.max(tl.where(w > 0, offs, -1), 0))
        carry += tl.sum(w, 0)
        tie_carry += ties
    token = tl.where(found < V, found, last_positive)
    token = tl.where(no_mass | (token < 0), 0, token)
    # the chosen token's weight (its tie rank does not matter: it was kept)
    z_tok = tl.max(_scaled(row_ptr, token + tl.arange(0, 1), V, temperature, xmax), 0)
    logprob = (z_tok - zmax).to(tl.float64) - tl.log(total)
    logprob = tl.where(no_mass, 0.0, logprob)
    return token, logprob.to(tl.float32)
