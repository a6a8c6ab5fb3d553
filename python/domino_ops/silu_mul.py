"""``silu_mul``: a gated MLP's activation, ``silu(gate) * up``, in one pass on the CPU
instead of PyTorch's two (silu, then mul, with a temporary between them).

The C++ kernel is csrc/cpu/silu_mul.cpp (its header says what it moves and why it is
batch-invariant); the reference is :func:`domino_ops.reference.silu_mul`. There is no CUDA
or Triton kernel: it exists to make a CPU verification cheap (:mod:`domino.fast_layers`
puts it under a HF model); on other devices ``backend="auto"`` runs the reference.
"""

from __future__ import annotations

import torch

from domino_ops import _checks, reference

__all__ = ["silu_mul"]


def silu_mul(gate: torch.Tensor, up: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """``silu(gate) * up`` elementwise, in HF's rounding order.

    ``silu(g) = g / (1 + exp(-g))`` in float32, rounded to the dtype, times ``up`` in
    float32, rounded again (bf16: round to nearest even), as HF's
    ``act_fn(gate_proj(x)) * up_proj(x)`` computes it; the exponential is the kernel's own
    (within a few float32 ulps of PyTorch's). Elementwise, so batch-invariant.

    Args:
        gate, up: the same shape, float32 or bfloat16 (one dtype, one device; made
            contiguous if they are not).
        backend: "auto" (default) or "native": the C++ kernel on the CPU; "reference": the
            PyTorch reference. On other devices "auto" runs the reference and "native" raises.
    Returns:
        gate's shape and dtype. Not differentiable: inputs that require grad
        with grad mode on are refused (RuntimeError naming them).
    """
    if not isinstance(gate, torch.Tensor):
        raise TypeError(f"gate must be a torch.Tensor, got {type(gate).__name__}")
    gate = _checks.tensor("gate", gate, ndim=max(1, gate.dim()), dtypes=_checks.FLOAT_OR_BF16)
    up = _checks.tensor("up", up, ndim=gate.dim(), dtypes=(gate.dtype,), device=gate.device)
    _checks.shape("up", up, tuple(gate.shape))
    _checks.no_autograd("silu_mul", (("gate", gate), ("up", up)))
    if _checks.cpu_kernel_backend("silu_mul", backend, gate.device) == "reference":
        return reference.silu_mul(gate, up)
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    torch.ops.domino_ops.silu_mul(gate, up, out)
    return out
