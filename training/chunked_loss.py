"""The drafter's training loss over the vocabulary, a chunk of draft positions at a time.

Teacher forcing gives every draft position its logits in one go: base ``h @ W_lm^T`` and
final ``base + a @ W2^T`` (``a`` = the head's ``SiLU(W1 [h; S])``), each [R, V] for R draft
positions. Computed whole, as autograd would, one training step of 16 x 8 blocks holds
about a dozen [1920, 49152] fp32 tensors (377 MB each: the two logit sets, their
log-softmax, the zero-filled gradients of the gather and the slice, ...), and on a CPU
every one of them is a fresh ``mmap`` that page-faults on first touch; filling and
normalising them took a third of the step. Here, as Liger-Kernel's fused linear
cross-entropy does on GPUs, the logits of ``chunk_rows`` positions are made, turned into
the weighted loss and differentiated at once, inside the forward, and only the gradients
for ``h``, ``a`` and ``W2`` are kept ([R, H], [R, r], [V, r]): each chunk's temporaries
(25 MB at the default 128 rows, under glibc's 32 MB mmap threshold) are reused from the heap and stay in cache. The loss of each
chunk is :func:`training.losses.per_token_loss`, so every loss kind has one definition.
The matrix products are the same as autograd's; the LM head is the target's and frozen.
"""

from __future__ import annotations

import torch

from training.losses import per_token_loss


class _ChunkedDraftLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, a, w2, lm_weight, kind, labels, top_ids, top_logprobs, weights, lam, chunk_rows):
        R = h.shape[0]
        grad_h, grad_a = torch.empty_like(h), torch.empty_like(a)
        grad_w2 = torch.zeros_like(w2)
        lm_weight = lm_weight.detach()
        w2_leaf = w2.detach().requires_grad_()
        total = loss_base = loss_final = h.new_zeros((), dtype=torch.float32)
        for r0 in range(0, R, chunk_rows):
            rows = slice(r0, min(R, r0 + chunk_rows))
            h_c = h[rows].detach().requires_grad_()
            a_c = a[rows].detach().requires_grad_()
            pick = (lambda t: None if t is None else t[rows, None])  # one position per "block"

            def weighted(logits):  # the chunk's weighted loss sum for logits [C, V]
                loss = per_token_loss(kind, logits[:, None], labels[rows, None], pick(top_ids), pick(top_logprobs))
                return (loss[:, 0] * weights[rows]).sum()

            with torch.enable_grad():
                base = h_c @ lm_weight.T
                final = base + a_c @ w2_leaf.T
                lb, lf = weighted(base), weighted(final)
                chunk_total = (1 - lam) * lf + lam * lb
                g_h, g_a, g_w2 = torch.autograd.grad(chunk_total, (h_c, a_c, w2_leaf))
            grad_h[rows], grad_a[rows] = g_h, g_a
            grad_w2 += g_w2
            total, loss_base, loss_final = total + chunk_total.detach(), loss_base + lb.detach(), loss_final + lf.detach()
        ctx.save_for_backward(grad_h, grad_a, grad_w2)
        ctx.mark_non_differentiable(loss_base, loss_final)
        return total, loss_base, loss_final

    @staticmethod
    def backward(ctx, g_total, _g_base, _g_final):
        grad_h, grad_a, grad_w2 = ctx.saved_tensors
        return (grad_h * g_total, grad_a * g_total, grad_w2 * g_total) + (None,) * 8


def chunked_draft_loss(kind: str, h: torch.Tensor, a: torch.Tensor, w2: torch.Tensor, lm_weight: torch.Tensor,
                       labels: torch.Tensor, top_ids: torch.Tensor | None, top_logprobs: torch.Tensor | None,
                       weights: torch.Tensor, lam: float, chunk_rows: int = 128):
    """``(loss, loss_base, loss_final)``, scalars float32, for R draft positions:
    ``loss = (1 - lam) * loss_final + lam * loss_base``, each the ``kind`` loss
    (:func:`per_token_loss`) per position times ``weights`` [R] (position decay, validity and
    the global normaliser folded in), summed. Base logits are ``h @ lm_weight^T`` (h [R, H],
    lm_weight [V, H], frozen); final logits add ``a @ w2^T`` (a [R, r], zero at positions the
    head does not correct; w2 [V, r]). labels [R] int64; top_ids / top_logprobs [R, K] or None.
    Only ``loss`` carries gradients (to h, a and w2); the two parts are for logging."""
    if h.dim() != 2 or a.dim() != 2 or a.shape[0] != h.shape[0]:
        raise ValueError(f"h and a must be [R, H] and [R, r], got {tuple(h.shape)} and {tuple(a.shape)}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    return _ChunkedDraftLoss.apply(h, a, w2, lm_weight, kind, labels, top_ids, top_logprobs, weights.float(),
                                   float(lam), int(chunk_rows))


@torch.no_grad()
def label_logprobs(h: torch.Tensor, a: torch.Tensor, w2: torch.Tensor, lm_weight: torch.Tensor, labels: torch.Tensor,
                   chunk_rows: int = 128) -> torch.Tensor:
    """[R] float32: the log-probability of each position's label under the final logits
    ``h @ lm_weight^T + a @ w2^T`` (h [R, H], a [R, r], w2 [V, r], lm_weight [V, H], labels
    [R] int64 in [0, V), as :func:`chunked_draft_loss` takes them): minus the "ce" loss of
    :func:`per_token_loss`, a chunk of positions at a time, without gradients."""
    out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
    for r0 in range(0, h.shape[0], chunk_rows):
        rows = slice(r0, min(h.shape[0], r0 + chunk_rows))
        logits = h[rows] @ lm_weight.T + a[rows] @ w2.T
        out[rows] = -per_token_loss("ce", logits[:, None], labels[rows, None], None, None)[:, 0]
    return out
