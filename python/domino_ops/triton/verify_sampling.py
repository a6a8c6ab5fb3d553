"""Triton kernel of ``verify_sampling``, the same contract as the CUDA kernel
(csrc/cuda/verify_sampling.cu): one program per sequence; the resample is the inverse CDF
of the residual (or target) distribution at the caller's float64 uniform.
"""

from __future__ import annotations

import triton
import triton.language as tl

from domino_ops.triton.row_sampler import BLOCK_V


@triton.jit
def _resample_weights(p_row, q_row, offs, V, has_q, use_residual):
    """One chunk of the resampling weights (float64): the residual max(p - q, 0) where
    ``use_residual``, else the target max(p, 0); q is 0 on the bonus row (no draft there),
    where the two agree."""
    m = offs < V
    p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float64)
    q = tl.load(q_row + offs, mask=m & has_q, other=0.0).to(tl.float64)
    return tl.where(use_residual, tl.maximum(p - q, 0.0), tl.maximum(p, 0.0))


@triton.jit
def _verify_sampling_kernel(draft_ptr, q_ptr, p_ptr, ua_ptr, ur_ptr, out_ptr, accepted_ptr, k, V,
                            BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    n = 0
    alive = tl.full([], 1, tl.int1)
    for i in range(0, k):
        x = tl.load(draft_ptr + s * k + i)
        px = tl.load(p_ptr + (s * (k + 1) + i) * V + x).to(tl.float64)
        qx = tl.load(q_ptr + (s * k + i) * V + x).to(tl.float64)
        accept = tl.load(ua_ptr + s * k + i) * qx < px
        alive = alive & accept
        n += alive.to(tl.int32)
    p_row = p_ptr + (s * (k + 1) + n) * V
    q_row = q_ptr + (s * k + n) * V
    has_q = n < k
    residual = tl.full([], 0.0, tl.float64)
    for start in range(0, V, BLOCK):
        residual += tl.sum(_resample_weights(p_row, q_row, start + tl.arange(0, BLOCK), V, has_q, True), 0)
    use_residual = residual > 0
    total = tl.full([], 0.0, tl.float64)
    for start in range(0, V, BLOCK):
        total += tl.sum(_resample_weights(p_row, q_row, start + tl.arange(0, BLOCK), V, has_q, use_residual), 0)
    target = tl.load(ur_ptr + s) * total
    carry = tl.full([], 0.0, tl.float64)
    found = V
    last_positive = -1
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w = _resample_weights(p_row, q_row, offs, V, has_q, use_residual)
        cdf = carry + tl.cumsum(w, 0)
        found = tl.minimum(found, tl.min(tl.where((cdf > target) & (w > 0), offs, V), 0))
        last_positive = tl.maximum(last_positive, tl.max(tl.where(w > 0, offs, -1), 0))
        carry += tl.sum(w, 0)
    token = tl.where(found < V, found, tl.maximum(last_positive, 0))  # no positive mass: token 0
    for i in range(0, k + 1):
        d = tl.load(draft_ptr + s * k + i, mask=i < k, other=0)
        tl.store(out_ptr + s * (k + 1) + i, tl.where(i < n, d, tl.where(i == n, token, -1)).to(tl.int64))
    tl.store(accepted_ptr + s, n.to(tl.int64))


def verify_sampling(draft_tokens, draft_probs, target_probs, uniforms_accept, uniforms_resample, out_tokens,
                    num_accepted):
    """``verify_sampling`` with the op's schema (probabilities float32)."""
    b, k = draft_tokens.shape
    V = target_probs.shape[2]
    _verify_sampling_kernel[(b,)](draft_tokens, draft_probs, target_probs, uniforms_accept, uniforms_resample,
                                  out_tokens, num_accepted, k, V, BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
