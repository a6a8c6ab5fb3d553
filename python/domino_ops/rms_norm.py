"""``rms_norm``: HF's LlamaRMSNorm (and Qwen2 / Qwen3 / Mistral's, the same formula) over
the last dimension, in one call on the CPU instead of PyTorch's eight small ops.

The C++ kernel is csrc/cpu/rms_norm.cpp (its header says what it moves and why it is
batch-invariant); the reference is :func:`domino_ops.reference.rms_norm`. There is no CUDA
or Triton kernel: it exists to make a CPU decode step and verification cheap
(:mod:`domino.fast_layers` puts it under a HF model); on other devices ``backend="auto"``
runs the reference.
"""

from __future__ import annotations


import torch

from domino_ops import _checks, reference

__all__ = ["rms_norm"]


def rms_norm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
             backend: str | None = None) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps))`` over the last dimension, HF's rounding order.

    Float32 math; the normalized value is rounded to input's dtype before the weight
    product and the product rounded again (HF's ``self.weight * hidden.to(input_dtype)``).
    On the CPU each row's bits depend on that row alone (batch-invariant): a row normalized
    alone equals the same row among others.

    Args:
        input: [..., n] float32 or bfloat16 (made contiguous if it is not).
        weight: [n], input's dtype and device.
        eps: a number >= 0, finite in float32 (HF's ``variance_epsilon``).
        backend: "auto" (default) or "native": the C++ kernel on the CPU; "reference": the
            PyTorch reference. On other devices "auto" runs the reference and "native" raises.
    Returns:
        input's shape and dtype. Not differentiable: inputs that require grad
        with grad mode on are refused (RuntimeError naming them).
    """
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    input = _checks.tensor("input", input, ndim=max(1, input.dim()), dtypes=_checks.FLOAT_OR_BF16)
    n = input.shape[-1]
    weight = _checks.tensor("weight", weight, ndim=1, dtypes=(input.dtype,), device=input.device)
    _checks.shape("weight", weight, (n,))
    eps = _checks.number("eps", eps, lo=0.0)
    _checks.no_autograd("rms_norm", (("input", input), ("weight", weight)))
    if _checks.cpu_kernel_backend("rms_norm", backend, input.device) == "reference":
        return reference.rms_norm(input, weight, float(eps))
    input = input.contiguous()
    out = torch.empty_like(input)
    torch.ops.domino_ops.rms_norm(input, weight.contiguous(), float(eps), out)
    return out
