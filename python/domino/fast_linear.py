"""Run a model's ``nn.Linear`` layers on the CPU through ``domino_ops.small_batch_linear``.

``use_small_batch_linear(model)`` swaps the ``forward`` of every ``torch.nn.Linear`` in
``model`` (attention projections, MLP, LM head; exact ``nn.Linear`` only, not subclasses)
for one that calls the batch-invariant kernel. The weights are untouched: the same
parameters, the same ``state_dict``, tied weights still tied. ``undo_small_batch_linear``
restores the original forwards.

A switched layer uses the kernel when it can, and ``torch.nn.functional.linear`` (the
original behaviour) otherwise: off the CPU, for dtypes other than float32/bfloat16, when x
and the weight differ in dtype, for a non-contiguous weight, or when autograd needs a
graph (grad mode on and x or a parameter requiring grad). So run the model under
``torch.inference_mode()`` or ``torch.no_grad()``, as the engine and HF ``generate`` do.

With the kernel, row i of a layer's output is bit-identical however many tokens the
forward carries, so a verification forward over k tokens computes its linear layers
exactly as k one-token decoding steps would. HF's attention (sdpa, eager) is not
batch-invariant across query counts (it reduces over the KV length and runs GEMMs whose
shapes follow the number of queries): :func:`domino.fast_attention.use_small_batch_attention`
closes that gap, and with both switches a verification forward is bit-identical to k
one-token forwards (tests/test_fast_linear.py).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

__all__ = ["use_small_batch_linear", "undo_small_batch_linear", "uses_small_batch_linear"]

_FLAG = "_domino_small_batch_linear"
_DTYPES = (torch.float32, torch.bfloat16)


def _small_batch_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w, b = self.weight, self.bias
    if (x.device.type != "cpu" or w.device.type != "cpu" or x.dtype != w.dtype or x.dtype not in _DTYPES
            or (b is not None and (b.dtype != w.dtype or b.device.type != "cpu"))
            or not w.is_contiguous() or x.shape[-1] != w.shape[1]
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad
                                             or (b is not None and b.requires_grad)))):
        return F.linear(x, w, b)
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], w.shape[0], dtype=x.dtype)
    if x2.shape[0]:
        torch.ops.domino_ops.small_batch_linear.default(x2, w, None if b is None else b.contiguous(), out)
    return out.view(*x.shape[:-1], w.shape[0])


def use_small_batch_linear(model: torch.nn.Module) -> torch.nn.Module:
    """Switches every ``nn.Linear`` of ``model`` (the model itself included) to the
    small-batch kernel, in place; returns ``model``. Idempotent."""
    import domino_ops  # noqa: F401  (registers torch.ops.domino_ops)

    for mod in model.modules():
        if type(mod) is torch.nn.Linear and not getattr(mod, _FLAG, False):
            mod.forward = types.MethodType(_small_batch_forward, mod)
            setattr(mod, _FLAG, True)
    return model


def undo_small_batch_linear(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the original ``nn.Linear`` forwards switched by :func:`use_small_batch_linear`."""
    for mod in model.modules():
        if getattr(mod, _FLAG, False):
            del mod.forward
            delattr(mod, _FLAG)
    return model


def uses_small_batch_linear(model: torch.nn.Module) -> bool:
    """Whether any ``nn.Linear`` of ``model`` is switched to the kernel."""
    return any(getattr(mod, _FLAG, False) for mod in model.modules())
