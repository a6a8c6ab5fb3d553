"""Triton kernel of ``sample``, the same contract as the CUDA kernel (csrc/cuda/sample.cu):
one program per row with the row's own parameters, greedy (temperature 0) by
:func:`row_sampler.argmax_row`, else :func:`row_sampler.sample_row` at the row's uniform.
"""

from __future__ import annotations

import triton
import triton.language as tl

from domino_ops.triton.row_sampler import BLOCK_V, argmax_row, sample_row
from domino_ops.triton.row_params import row_params


@triton.jit
def _sample_kernel(logits_ptr, uniforms_ptr, tokens_ptr, temperature_ptr, top_k_ptr, top_p_ptr, V,
                   MAY_SAMPLE: tl.constexpr, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    row = logits_ptr + s * V
    if MAY_SAMPLE:
        temperature = tl.load(temperature_ptr + s)
        if temperature > 0:
            u = tl.load(uniforms_ptr + s)
            token, _ = sample_row(row, V, temperature, tl.load(top_k_ptr + s), tl.load(top_p_ptr + s).to(tl.float64),
                                  u, BLOCK)
        else:
            token = argmax_row(row, V, BLOCK)
    else:
        token = argmax_row(row, V, BLOCK)
    tl.store(tokens_ptr + s, token.to(tl.int64))


def sample(logits, temperature, top_k, top_p, uniforms, tokens, row_temperature=None, row_top_k=None,
           row_top_p=None):
    """``sample`` with the op's schema: logits [b, V] float32/bf16 contiguous, uniforms [b]
    float64 (when some row samples), optional per-row [b] parameters; writes tokens [b] int64."""
    b, V = logits.shape
    p = row_params(b, logits.device, temperature, top_k, top_p, row_temperature, row_top_k, row_top_p)
    _sample_kernel[(b,)](logits, uniforms if p.may_sample else tokens, tokens, p.temperature, p.top_k, p.top_p, V,
                         MAY_SAMPLE=p.may_sample, BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
