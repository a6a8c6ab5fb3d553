"""``small_batch_attention``: causal attention of a few query rows against a KV cache on
the CPU, each row computed exactly as a one-token decoding step computes it.

The C++ kernel is csrc/cpu/small_batch_attention.cpp (its header says what it moves and
why it is batch-invariant); the reference is :func:`domino_ops.reference.small_batch_attention`.
There is no CUDA or Triton kernel: on a GPU, attention is not where a decode step goes,
and HF's own attention is what a GPU target should use (``backend="auto"`` runs the
reference there). :mod:`domino.fast_attention` puts it under a HF model.
"""

from __future__ import annotations

import math

import torch

from domino_ops import _checks, reference

__all__ = ["small_batch_attention"]

_MASK_DTYPES = (torch.bool, torch.float32, torch.bfloat16)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def small_batch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None, *,
                          scale: float | None = None, backend: str | None = None) -> torch.Tensor:
    """Bottom-right causal attention with grouped-query heads, batch-invariant on the CPU.

    Query row m is the token at cache position ``N - M + m`` (the cache holds the queries'
    own keys last, as when decoding) and attends to keys ``j <= N - M + m`` that ``mask``
    leaves visible. On the CPU each row is computed from q and its visible keys alone, in
    cache order: a row gives the same bits whether it is alone (a decode step) or among
    other rows (a verification or a prefill), and wherever hidden keys (padding, holes,
    other branches of a draft tree) sit.

    Args:
        q: [B, Hq, M, D] float32 or bfloat16 (HF's layout; any strides, read in place when
            the last dimension is contiguous).
        k, v: [B, Hkv, N, D] with q's dtype, N >= M, Hq a multiple of Hkv (query head h
            reads kv head ``h // (Hq // Hkv)``).
        mask: None, or [B or 1, Hq or 1, M, N]: bool (False hides a key) or float32 /
            bfloat16 added to the scores (-inf, or anything at or below bfloat16's lowest
            finite value, ``torch.finfo(torch.bfloat16).min``, hides a key: HF's eager
            masks and the engine's tree mask add ``torch.finfo(dtype).min``).
        scale: the scores' factor, a number finite in float32 (default ``1 / sqrt(D)``).
        backend: "auto" (default) or "native": the C++ kernel on the CPU; "reference": the
            PyTorch reference. On other devices "auto" runs the reference and "native" raises.
    Returns:
        [B, Hq, M, D] in q's dtype; from the C++ kernel a view of a [B, M, Hq, D]
        contiguous tensor (so ``.transpose(1, 2)``, HF's output layout, is contiguous; the
        reference returns a plain [B, Hq, M, D] tensor): fp32 scores, softmax and
        sums, rounded once. A row with no visible key is zeros. Not differentiable:
        inputs that require grad with grad mode on are refused (RuntimeError naming them).
    """
    q = _checks.tensor("q", q, ndim=4, dtypes=_checks.FLOAT_OR_BF16)
    dev = q.device
    k = _checks.tensor("k", k, ndim=4, dtypes=(q.dtype,), device=dev)
    v = _checks.tensor("v", v, ndim=4, dtypes=(q.dtype,), device=dev)
    B, Hq, M, D = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    _checks.shape("k", k, (B, None, None, D))
    _checks.shape("v", v, tuple(k.shape))
    if Hq % Hkv:
        raise ValueError(f"q's heads ({Hq}) must be a multiple of k's ({Hkv})")
    if N < M:
        raise ValueError(f"k must hold at least q's {M} positions (the cache includes the queries), got {N}")
    if mask is not None:
        mask = _checks.tensor("mask", mask, ndim=4, dtypes=_MASK_DTYPES, device=dev)
        if mask.shape[0] not in (1, B) or mask.shape[1] not in (1, Hq) or tuple(mask.shape[2:]) != (M, N):
            raise ValueError(f"mask must have shape [{B} or 1, {Hq} or 1, {M}, {N}], got {list(mask.shape)}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    else:
        scale = _checks.number("scale", scale)
    _checks.no_autograd("small_batch_attention", (("q", q), ("k", k), ("v", v), ("mask", mask)))
    if _checks.cpu_kernel_backend("small_batch_attention", backend, dev) == "reference":
        return reference.small_batch_attention(q, k, v, mask, float(scale))
    out = torch.empty(B, M, Hq, D, dtype=q.dtype).transpose(1, 2)
    torch.ops.domino_ops.small_batch_attention(
        _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v),
        None if mask is None else _last_dim_contiguous(mask), float(scale), out)
    return out
