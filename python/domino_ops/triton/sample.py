"""Triton kernel of ``sample``, the same contract as the CUDA kernel (csrc/cuda/sample.cu):
one program per row, greedy by :func:`row_sampler.argmax_row`, else
:func:`row_sampler.sample_row` at the caller's uniform.
"""

from __future__ import annotations

import triton
import triton.language as tl

from domino_ops.triton.row_sampler import BLOCK_V, argmax_row, sample_row


@triton.jit
def _sample_kernel(logits_ptr, uniforms_ptr, tokens_ptr, V, temperature, top_k, top_p,
                   GREEDY: tl.constexpr, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    row = logits_ptr + s * V
    if GREEDY:
        token = argmax_row(row, V, BLOCK)
    else:
        u = tl.load(uniforms_ptr + s)
        token, _ = sample_row(row, V, temperature, top_k, top_p, u, BLOCK)
    tl.store(tokens_ptr + s, token.to(tl.int64))


def sample(logits, temperature, top_k, top_p, uniforms, tokens):
    """``sample`` with the op's schema: logits [b, V] float32/bf16 contiguous, uniforms [b]
    float64 (temperature > 0), writes tokens [b] int64."""
    b, V = logits.shape
    greedy = temperature == 0
    _sample_kernel[(b,)](logits, uniforms if not greedy else tokens, tokens, V, float(temperature or 1.0),
                         int(top_k), float(top_p), GREEDY=greedy, BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
