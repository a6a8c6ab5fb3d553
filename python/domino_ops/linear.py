"""``small_batch_linear``: ``x @ weight.T + bias`` for a handful of rows, batch-invariant.

The CPU kernel (csrc/cpu/small_batch_linear.cpp) reads the weight once for all rows of x
and accumulates in fp32 in an order that depends only on K, the dtypes and the CPU's
instruction-set path, never on how many rows are computed together or where a row sits
among them: row i of the output is bit-identical whether it is computed alone or among
63 others. That is what makes a target verified over k tokens decide exactly as the same
target decoding one token at a time (see :mod:`domino.fast_linear`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from domino_ops import _checks, reference

__all__ = ["small_batch_linear", "small_batch_linear_isa"]

_BACKENDS = ("auto", "native", "reference")


def small_batch_linear_isa() -> str:
    """The instruction-set path the CPU kernel takes now: "avx512_bf16", "avx512", "avx2" or
    "generic" (the best the CPU has, or a lower one forced by ``DOMINO_SMALL_BATCH_LINEAR_ISA``;
    ValueError for a bad value of it, here and from the op).
    "avx512_bf16" multiplies bf16 pairs (VDPBF16PS) when x and the weight are both bf16 and
    runs the "avx512" path for any other dtypes."""
    from domino_ops import _C
    return _C.small_batch_linear_isa()


def small_batch_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                       backend: str | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``, each weight read once for all rows, batch-invariant on the CPU.

    Args:
        x: [..., K] float32 or bfloat16; the leading dimensions are flattened into M rows
            (any M; the kernel works in passes of up to 64 rows, which changes no bit).
        weight: [N, K] float32 or bfloat16, contiguous. It may differ in dtype from x: the
            kernel widens both to fp32.
        bias: None or [N] with weight's dtype.
        backend: "auto" (default) or "native": the C++ kernel on the CPU; "reference": the
            PyTorch reference. On other devices there is no kernel: "auto" falls back to
            ``torch.nn.functional.linear`` (in weight's dtype; not batch-invariant) and
            "native" raises. The process-wide ``DOMINO_OPS_BACKEND`` does not apply here
            (there is no Triton kernel, and the CPU kernel is the point of this op).
    Returns:
        [..., N] in x's dtype: fp32 sums, plus the bias in fp32, rounded once. Not
        differentiable (an inference kernel): inputs that require grad with grad mode on
        are refused (RuntimeError naming them).
    """
    # The checks cost a serving loop each call (~120 a SmolLM2 forward): plain attribute
    # reads, no copies of an x already [M, K] and contiguous
    # (benchmarks/layer_ops_wrapper_cost.py).
    if backend is not None and backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    weight = _checks.tensor("weight", weight, ndim=2, dtypes=_checks.FLOAT_OR_BF16, contiguous=True)
    N, K = weight.shape
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    shape = x.shape
    if not shape:
        raise ValueError(f"x must have at least 1 dimension ([..., K]), got shape {tuple(shape)}")
    if x.dtype not in _checks.FLOAT_OR_BF16:
        raise TypeError(f"x must be float32 or bfloat16, got {str(x.dtype).replace('torch.', '')}")
    on_cpu = weight.is_cpu  # is_cpu first: comparing two device objects costs ~0.8 us a call
    if (x.is_cpu != on_cpu) or (not on_cpu and x.device != weight.device):
        raise ValueError(f"x is on {x.device} but weight is on {weight.device}")
    if shape[-1] != K:
        raise ValueError(f"x must have shape [..., {K}] to match weight [{N}, {K}], got {list(shape)}")
    if bias is not None:
        bias = _checks.tensor("bias", bias, ndim=1, dtypes=(weight.dtype,), device=weight.device)
        _checks.shape("bias", bias, (N,))
        bias = bias.contiguous()
    _checks.no_autograd("small_batch_linear", (("x", x), ("weight", weight), ("bias", bias)))
    if backend == "reference":
        return reference.small_batch_linear(x, weight, bias)
    if not on_cpu:
        if backend == "native":
            raise RuntimeError(f"backend='native': small_batch_linear has a CPU kernel only, not {weight.device.type}")
        return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)
    flat = len(shape) == 2 and x.is_contiguous()
    x2 = x if flat else x.reshape(-1, K).contiguous()
    out = torch.empty(x2.shape[0], N, dtype=x.dtype)
    if x2.shape[0] > 0:
        torch.ops.domino_ops.small_batch_linear.default(x2, weight, bias, out)
    return out if flat else out.reshape(*shape[:-1], N)
