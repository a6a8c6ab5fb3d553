"""Run a HF decoder's RMSNorms and gated-MLP activations on the CPU through
``domino_ops.rms_norm`` and ``domino_ops.silu_mul``.

``use_fused_layers(model)`` swaps the ``forward`` of every RMSNorm and gated MLP of the
HF classes below (the same formula in each) for one that calls the kernels: a norm is one
call instead of PyTorch's eight small ops, an MLP's ``act_fn(gate) * up`` one call
instead of two. The weights are untouched (same parameters, same ``state_dict``);
``undo_fused_layers`` restores the original forwards.

Both kernels compute in HF's rounding order (float32 math, rounded to the dtype where HF
rounds), row by row, so with :mod:`domino.fast_linear` and :mod:`domino.fast_attention` a
forward over k tokens still computes every row bit for bit as k one-token decoding steps
do. In bf16 they match HF's own modules bit for bit on most elements (the sum of squares
and the exponential are the kernels' own, so an element at a rounding boundary can land
one bf16 ulp away); a switched model is compared with HF's in tests/test_fast_layers.py.

A switched module runs HF's own forward off the CPU, for dtypes other than float32 /
bfloat16, when autograd needs a graph, or under CPU autocast. MLPs are switched only when
their activation is SiLU.
"""

from __future__ import annotations

import functools

import torch

from domino.fast_linear import cpu_kernel_applies

__all__ = ["use_fused_layers", "undo_fused_layers", "uses_fused_layers", "NORM_CLASSES", "MLP_CLASSES"]

# HF classes whose forward is exactly LlamaRMSNorm's / LlamaMLP's (checked against the
# installed transformers in tests/test_fast_layers.py).
NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
MLP_CLASSES = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")
_FLAG = "_domino_fused_layer"


def _rms_norm_forward(mod, x: torch.Tensor) -> torch.Tensor:
    w = mod.weight
    if not cpu_kernel_applies(x, w) or x.numel() == 0 or x.shape[-1] != w.shape[0]:
        return type(mod).forward(mod, x)
    x = x.contiguous()
    out = torch.empty_like(x)
    # The op itself (its C++ checks name any bad argument), not the validating wrapper:
    # ~60 calls per SmolLM2 forward.
    torch.ops.domino_ops.rms_norm.default(x, w.contiguous(), float(mod.variance_epsilon), out)
    return out


def _mlp_forward(mod, x: torch.Tensor) -> torch.Tensor:
    gate, up = mod.gate_proj(x), mod.up_proj(x)
    if not cpu_kernel_applies(gate, up) or gate.shape != up.shape or gate.numel() == 0:
        return mod.down_proj(mod.act_fn(gate) * up)
    gate, up = gate.contiguous(), up.contiguous()
    act = torch.empty_like(gate)
    torch.ops.domino_ops.silu_mul.default(gate, up, act)
    return mod.down_proj(act)


def _is_silu(act) -> bool:
    from transformers.activations import SiLUActivation

    return isinstance(act, (torch.nn.SiLU, SiLUActivation))


def use_fused_layers(model: torch.nn.Module) -> torch.nn.Module:
    """Switches the RMSNorms (:data:`NORM_CLASSES`) and SiLU gated MLPs
    (:data:`MLP_CLASSES`) of ``model`` to the fused kernels, in place; returns ``model``.
    Idempotent; other modules are left alone."""
    import domino_ops  # noqa: F401  (registers torch.ops.domino_ops)

    for mod in model.modules():
        if getattr(mod, _FLAG, False):
            continue
        name = type(mod).__name__
        if name in NORM_CLASSES:
            # a partial (not a bound method): a switched model still pickles
            mod.forward = functools.partial(_rms_norm_forward, mod)
        elif name in MLP_CLASSES and _is_silu(getattr(mod, "act_fn", None)):
            mod.forward = functools.partial(_mlp_forward, mod)
        else:
            continue
        setattr(mod, _FLAG, True)
    return model


def undo_fused_layers(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the forwards switched by :func:`use_fused_layers`."""
    for mod in model.modules():
        if getattr(mod, _FLAG, False):
            del mod.forward
            delattr(mod, _FLAG)
    return model


def uses_fused_layers(model: torch.nn.Module) -> bool:
    """Whether any module of ``model`` runs a fused kernel."""
    return any(getattr(mod, _FLAG, False) for mod in model.modules())
