"""``apply_rotary_pos_emb``: transformers' rotary position embedding of a layer's queries
and keys (LlamaAttention and its kin), in one call on the CPU instead of PyTorch's
fourteen small ops.

The C++ kernel is csrc/cpu/apply_rotary_pos_emb.cpp (its header says what it moves and why
its bits are HF's); the reference is :func:`domino_ops.reference.apply_rotary_pos_emb`.
There is no CUDA or Triton kernel: it exists to make a CPU decode step and verification
cheap (:mod:`domino.fast_layers` puts it under a HF model's attention); on other devices
``backend="auto"`` runs the reference.
"""

from __future__ import annotations

import torch

from domino_ops import _checks, reference

__all__ = ["apply_rotary_pos_emb"]


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
                         backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x * cos + rotate_half(x) * sin`` for the queries and the keys, HF's rounding order.

    ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``; cos and sin are shared by every
    head (HF's ``unsqueeze_dim=1``). Each product and the sum are rounded to the dtype as
    PyTorch's elementwise ops round them, so the result has the bits of transformers'
    ``apply_rotary_pos_emb`` (NaN payloads aside); every element depends on its own inputs
    alone (batch-invariant).

    Args:
        q: [b, Hq, T, D] float32 or bfloat16, D even; any strides with the last dimension
            contiguous (HF's transposed view of the projection is read in place).
        k: [b, Hk, T, D], q's dtype and device, the same b, T and D.
        cos, sin: [b or 1, T, D], q's dtype (HF's rotary embedding output; a batch of 1
            serves every sequence).
        backend: "auto" (default) or "native": the C++ kernel on the CPU; "reference": the
            PyTorch reference. On other devices "auto" runs the reference and "native" raises.
    Returns:
        (q', k'): q's and k's shapes and dtype, contiguous from the C++ kernel (the
        reference keeps the inputs' layout). Not differentiable: inputs
        that require grad with grad mode on are refused (RuntimeError naming them).
    """
    q = _checks.tensor("q", q, ndim=4, dtypes=_checks.FLOAT_OR_BF16)
    b, _, T, D = q.shape
    if D % 2:
        raise ValueError(f"q's head dimension must be even, got shape {list(q.shape)}")
    k = _checks.tensor("k", k, ndim=4, dtypes=(q.dtype,), device=q.device)
    _checks.shape("k", k, (b, None, T, D))
    for name, t in (("cos", cos), ("sin", sin)):
        t = _checks.tensor(name, t, ndim=3, dtypes=(q.dtype,), device=q.device)
        if t.shape[0] not in (1, b) or tuple(t.shape[1:]) != (T, D):
            raise ValueError(f"{name} must have shape [{b} or 1, {T}, {D}], got {list(t.shape)}")
    _checks.no_autograd("apply_rotary_pos_emb", (("q", q), ("k", k), ("cos", cos), ("sin", sin)))
    if _checks.cpu_kernel_backend("apply_rotary_pos_emb", backend, q.device) == "reference":
        return reference.apply_rotary_pos_emb(q, k, cos, sin)
    q, k, cos, sin = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, cos, sin))
    q_out, k_out = torch.empty(q.shape, dtype=q.dtype), torch.empty(k.shape, dtype=k.dtype)
    torch.ops.domino_ops.apply_rotary_pos_emb(q, k, cos, sin, q_out, k_out)
    return q_out, k_out
