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
batch-invariant across query counts: it reduces over the KV length and runs GEMMs whose
shapes follow the number of queries, so with it a verification equals k decoding steps
only up to the attention's rounding, and a bf16 greedy speculation can (rarely) pick a
different token than plain decoding. ``use_rowwise_attention(model)`` closes that gap
for one unpadded sequence at a time: each query row is computed with exactly the shapes
of a one-token step (a Python loop over the queries: slower, opt-in). With both switches
the embedding, norms, rotary, activations and residuals are row-wise already, and a
verification forward is bit-identical to k one-token forwards (tests/test_fast_linear.py).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

__all__ = ["use_small_batch_linear", "undo_small_batch_linear", "uses_small_batch_linear",
           "use_rowwise_attention", "undo_rowwise_attention", "rowwise_attention"]

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


ROWWISE = "domino_rowwise"
_ATTN_FLAG = "_domino_previous_attn_implementation"


def _row_mask(mask: torch.Tensor | None, i: int, n: int) -> torch.Tensor | None:
    """Row i's mask over its first n keys, or None when it hides nothing (as a one-token
    step's mask would be), so both take the same SDPA path."""
    if mask is None:
        return None
    m = mask[:, :, i:i + 1, :n]
    if m.dtype == torch.bool:
        return None if bool(m.all()) else m
    return None if not bool(m.any()) else m  # additive float mask: 0 where visible


def rowwise_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """HF attention function ("domino_rowwise"): causal attention computed one query row at
    a time with the shapes of a one-token decoding step (query [b, h, 1, d] against the
    row's first ``kv_len - q_len + i + 1`` keys, contiguous), so a row's bits do not depend
    on how many queries the forward carries. Assumes the KV cache holds no holes (one
    sequence, or a batch decoded without the engine's per-sequence cropping)."""
    if dropout and module.training:
        raise ValueError("rowwise_attention is for inference (dropout must be 0)")
    q_len, kv_len = query.shape[2], key.shape[2]
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, 1)
        value = value.repeat_interleave(groups, 1)
    rows = []
    for i in range(q_len):
        n = kv_len - q_len + i + 1
        rows.append(F.scaled_dot_product_attention(
            query[:, :, i:i + 1].contiguous(), key[:, :, :n].contiguous(), value[:, :, :n].contiguous(),
            attn_mask=_row_mask(attention_mask, i, n), scale=scaling))
    return torch.cat(rows, 2).transpose(1, 2).contiguous(), None


def _register_rowwise() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ROWWISE, rowwise_attention)
    AttentionMaskInterface.register(ROWWISE, sdpa_mask)


def use_rowwise_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switches a HF model's attention to :func:`rowwise_attention`, in place (opt-in: a
    Python loop over the query rows of every layer; a prefill pays it per prompt token)."""
    _register_rowwise()
    config = model.config
    if config._attn_implementation != ROWWISE:
        setattr(model, _ATTN_FLAG, config._attn_implementation)
        config._attn_implementation = ROWWISE
    return model


def undo_rowwise_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the attention implementation replaced by :func:`use_rowwise_attention`."""
    previous = getattr(model, _ATTN_FLAG, None)
    if previous is not None:
        model.config._attn_implementation = previous
        delattr(model, _ATTN_FLAG)
    return model
