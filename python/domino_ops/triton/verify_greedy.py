"""Triton kernel of ``verify_greedy``, the same contract as the CUDA kernel
(csrc/cuda/verify_greedy.cu): one program per sequence. Triton has no early exit from
loops, so it reads all k+1 rows of a sequence (the CUDA kernel stops at the first
mismatch).
"""

from __future__ import annotations

import triton
import triton.language as tl

from domino_ops.triton.row_sampler import BLOCK_V, argmax_row


@triton.jit
def _verify_greedy_kernel(draft_ptr, logits_ptr, out_ptr, accepted_ptr, k, V, BLOCK: tl.constexpr):
    s = tl.program_id(0).to(tl.int64)
    n = 0
    for i in range(0, k + 1):
        target = argmax_row(logits_ptr + (s * (k + 1) + i) * V, V, BLOCK)
        alive = n == i  # every earlier draft matched
        tl.store(out_ptr + s * (k + 1) + i, tl.where(alive, target, -1).to(tl.int64))
        if i < k:
            draft = tl.load(draft_ptr + s * k + i)
            n += (alive & (draft == target)).to(tl.int32)
    tl.store(accepted_ptr + s, n.to(tl.int64))


def verify_greedy(draft_tokens, target_logits, out_tokens, num_accepted):
    """``verify_greedy`` with the op's schema (draft [b, k] int64, logits [b, k+1, V])."""
    b, k = draft_tokens.shape
    V = target_logits.shape[2]
    _verify_greedy_kernel[(b,)](draft_tokens, target_logits, out_tokens, num_accepted, k, V,
                                BLOCK=min(BLOCK_V, triton.next_power_of_2(V)))
