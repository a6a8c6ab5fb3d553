"""Triton kernel of ``filtered_probs``, the same contract as the CUDA kernel
(csrc/cuda/filtered_probs.cu): one program per row with the row's own parameters; a greedy
row (temperature 0) writes the one-hot of :func:`row_sampler.argmax_row`, any other the
weights of :func:`row_sampler.filter_row`'s law over their float64 total.

Bytes: the row's logits read (2 or 4 B a token) and its float32 probabilities written (4 B);
the weight passes (the total, then the write; top-k / top-p add the bisection passes) read
the row again from L2.
"""

from __future__ import annotations

import triton
import triton.language as tl

from domino_ops.triton.row_params import row_params
from domino_ops.triton.row_sampler import BLOCK_V, argmax_row, filter_row, filtered_total, final_weights


@triton.jit
def _one_hot(out_ptr, V, hot, BLOCK: tl.constexpr):
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.where(offs == hot, 1.0, 0.0).to(tl.float32), mask=offs < V)


@triton.jit
def _filtered_row_probs(row, out, V, temperature, top_k, top_p, BLOCK: tl.constexpr):
    """Writes the filtered law of row[0:V] at temperature > 0 as probabilities out[0:V]."""
    xmax, no_mass, kth, cut, n_tie = filter_row(row, V, temperature, top_k, top_p, BLOCK)
    total = filtered_total(row, V, temperature, xmax, kth, cut, n_tie, BLOCK)
    tie_carry = tl.full([], 0, tl.int64)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        w, ties = final_weights(row, offs, V, temperature, xmax, kth, cut, n_tie, tie_carry)
        p = (w / total).to(tl.float32)
        # no mass (every logit -inf / NaN): all of it on token 0, as the reference
        p = tl.where(no_mass, tl.where(offs == 0, 1.0, 0.0), p)
        tl.store(out + offs, p, mask=offs < V)
        tie_carry += ties


@triton.jit
def _filtered_probs_kernel(logits_ptr, probs_ptr, temperature_ptr, top_k_ptr, top_p_ptr, V,
                           MAY_SAMPLE: tl.constexpr, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    row = logits_ptr + s * V
    out = probs_ptr + s * V
    if MAY_SAMPLE:
        temperature = tl.load(temperature_ptr + s)
        if temperature > 0:
            _filtered_row_probs(row, out, V, temperature, tl.load(top_k_ptr + s), tl.load(top_p_ptr + s).to(tl.float64),
                                BLOCK)
        else:
            _one_hot(out, V, argmax_row(row, V, BLOCK), BLOCK)
    else:
        _one_hot(out, V, argmax_row(row, V, BLOCK), BLOCK)


def filtered_probs(logits, temperature, top_k, top_p, probs, row_temperature=None, row_top_k=None, row_top_p=None):
    """``filtered_probs`` with the op's schema: logits [b, V] float32/bf16 contiguous,
    optional per-row [b] parameters; writes probs [b, V] float32."""
    b, V = logits.shape
    p = row_params(b, logits.device, temperature, top_k, top_p, row_temperature, row_top_k, row_top_p)
    _filtered_probs_kernel[(b,)](logits, probs, p.temperature, p.top_k, p.top_p, V, MAY_SAMPLE=p.may_sample,
                                 BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
