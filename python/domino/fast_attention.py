"""Run a HF model's attention on the CPU through ``domino_ops.small_batch_attention``.

``use_small_batch_attention(model)`` switches a HF model's attention implementation to
"domino_small_batch": each query row is computed from its query and the keys it may see,
in cache order, exactly as a one-token decoding step computes it (see
csrc/cpu/small_batch_attention.cpp). With :func:`domino.fast_linear.use_small_batch_linear`
too (the embedding, norms, rotary, activations and residuals are row-wise already), a
forward over k tokens computes every row bit for bit as k one-token decoding steps do,
so greedy speculative decoding is token-identical to plain greedy decoding in bf16 as in
fp32, for chains, trees and ragged batches alike (a hidden key contributes nothing, not
even a rounding). It is also the faster attention for decoding on the CPU (SDPA pays a
per-call setup that dwarfs a one-row attention): ``benchmarks/bench_attention.py``.

Off the CPU, where autograd needs a graph, or with dropout in training, the layer falls
back to HF's SDPA attention; where attention weights are asked for (``output_attentions``)
or the kernel does not compute what the model asks (a logit softcap, attention sinks, a
position bias: any keyword HF passes beyond the mask's), to the model's eager attention.
Only models whose attention goes through HF's attention interface can be switched
(:func:`attention_switchable`).
``undo_small_batch_attention`` restores the previous implementation.
"""

from __future__ import annotations

import sys
import warnings

import torch

from domino.fast_linear import check_module, cpu_kernel_applies

__all__ = ["ATTENTION", "attention_switchable",
           "use_small_batch_attention", "undo_small_batch_attention", "uses_small_batch_attention",
           "small_batch_attention_forward"]

ATTENTION = "domino_small_batch"
_PREVIOUS = "_domino_previous_attn_implementation"


# What HF passes an attention function besides the tensors that leaves its math to the mask
# (which this implementation receives as sdpa's): the model's forward arguments that flow
# through every layer (TransformersKwargs, the cache's), and sliding_window, which the
# mask encodes. Any other keyword given a value (a T5-style position_bias, attention sinks,
# Gemma's softcap, GPT-OSS's s_aux) is math the kernel does not compute: HF's attention.
_MASK_ONLY_KWARGS = frozenset({
    "position_ids", "cache_position", "use_cache", "past_key_values", "past_key_value", "return_dict",
    "output_hidden_states", "output_router_logits", "num_items_in_batch", "seq_idx", "sliding_window",
    "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "is_causal", "output_attentions"})
_warned: set[str] = set()


def _additive_mask(attention_mask, q: int, kv: int, query: torch.Tensor) -> torch.Tensor:
    """The mask this implementation receives (sdpa's: None, bool, or additive float) as the
    additive float mask [b or 1, 1, q, kv] of ``query``'s dtype and device that HF's eager
    attention adds to its scores. None means causal by the kernel's rule (see
    :func:`small_batch_attention_forward`): query i sees the kv - q cached keys and keys up
    to its own, or, in a first forward into an empty static cache (q > 1, kv > q), keys 0..i."""
    if attention_mask is None:
        offset = 0 if q > 1 and kv > q else kv - q
        positions = torch.arange(kv, device=query.device)
        attention_mask = (positions[None, :] <= positions[:q, None] + offset)[None, None]
    if attention_mask.dtype == torch.bool:
        zero = torch.zeros((), dtype=query.dtype, device=query.device)
        attention_mask = torch.where(attention_mask, zero, torch.finfo(query.dtype).min)
    return attention_mask


def _hf_attention(module, query, key, value, attention_mask, dropout, scaling, kwargs):
    """HF's own attention for what the kernel does not do: the model's eager attention where
    attention weights are asked for (sdpa returns none) or a keyword outside
    :data:`_MASK_ONLY_KWARGS` is given (the model's own math, e.g. Gemma 2's softcap, which
    HF's sdpa refuses), else sdpa."""
    if kwargs.get("output_attentions") or _own_math(kwargs):
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if eager is not None:
            mask = _additive_mask(attention_mask, query.shape[2], key.shape[2], query)
            return eager(module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def _own_math(kwargs: dict) -> str | None:
    """The first keyword given a value outside :data:`_MASK_ONLY_KWARGS` (math of the
    model's own that the kernel does not compute, e.g. a softcap), or None."""
    return next((name for name, v in kwargs.items() if v is not None and name not in _MASK_ONLY_KWARGS), None)


def _kernel_computes(module, query, key, value, dropout, kwargs) -> bool:
    """Whether the kernel computes this attention exactly as HF would: a causal one, on CPU
    float32 / bfloat16 tensors that need no autograd graph and no autocast, without
    dropout in training, attention weights or a keyword outside :data:`_MASK_ONLY_KWARGS`
    (warned once per keyword, so a model that loses the kernel says why)."""
    if (not cpu_kernel_applies(query, key, value) or (dropout and module.training) or kwargs.get("output_attentions")
            or not kwargs.get("is_causal", getattr(module, "is_causal", True))):
        return False
    if (name := _own_math(kwargs)) is None:
        return True
    if name not in _warned:
        _warned.add(name)
        warnings.warn(f"domino small-batch attention: {type(module).__name__} passes {name}=, which the "
                      "kernel does not compute; that attention runs on the model's eager attention", stacklevel=3)
    return False


def small_batch_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A HF attention function: query [b, Hq, q, d], key / value [b, Hkv, kv, d] (the cache
    included), attention_mask None, bool or additive float [b, 1, q, >= kv]; returns the
    output [b, q, Hq, d] (contiguous) and no weights. What the kernel does not compute
    (see :func:`_kernel_computes`) runs on HF's own attention."""
    if not _kernel_computes(module, query, key, value, dropout, kwargs):
        return _hf_attention(module, query, key, value, attention_mask, dropout, scaling, kwargs)
    b, h, q, d = query.shape
    if attention_mask is None and q > 1 and key.shape[2] > q:
        # HF's mask function returns None for a first forward into an empty static cache
        # (q_offset 0) and means sdpa's top-left causal mask: query i sees keys 0..i, the
        # slots past the queries are empty. The kernel's no-mask rule is bottom-right
        # (the queries are the last keys), so it gets exactly the first q keys.
        key, value = key[:, :, :q], value[:, :, :q]
    mask = None if attention_mask is None else attention_mask[:, :, :, :key.shape[2]]
    # The kernel reads rows of d contiguous values; HF's projections give them (a view that
    # does not is copied).
    if query.stride()[-1] != 1 or key.stride()[-1] != 1 or value.stride()[-1] != 1:
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    out = torch.empty(b, q, h, d, dtype=query.dtype)
    # The op itself (its C++ checks name any bad argument): the validating Python wrapper
    # would cost ~1 ms per 30-layer forward.
    torch.ops.domino_ops.small_batch_attention.default(
        query, key, value, mask, float(scaling if scaling is not None else d ** -0.5), out.transpose(1, 2))
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    import domino_ops  # noqa: F401  (registers torch.ops.domino_ops)

    AttentionInterface.register(ATTENTION, small_batch_attention_forward)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # bool masks, None when nothing is hidden


def attention_switchable(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a HF ``PreTrainedModel``) runs every attention through HF's
    attention interface, so that :func:`use_small_batch_attention` applies: every HF model
    class in it declares ``_supports_attention_backend``. Others (BLOOM, XGLM, MPT, ...)
    compute attention in their own code but build its mask by the implementation's name,
    and the kernel's mask function means "causal, by the kernel's rule": switched, they
    attended to later tokens silently, or raised."""
    from transformers import PreTrainedModel

    models = [m for m in model.modules() if isinstance(m, PreTrainedModel)]
    return isinstance(model, PreTrainedModel) and all(getattr(type(m), "_supports_attention_backend", False)
                                                      for m in models)


def use_small_batch_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switches a HF model's attention to :func:`small_batch_attention_forward`, in place;
    returns ``model``. Idempotent. Raises TypeError for a ``model`` that is not a HF
    ``PreTrainedModel``, ValueError for one whose attention does not go through HF's
    attention interface (:func:`attention_switchable`). The implementation is the model's
    config's: another model sharing that config object is switched too (as HF's own
    ``set_attn_implementation`` does)."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a HF transformers PreTrainedModel, got {type(model).__name__}")
    if not attention_switchable(model):
        raise ValueError(f"model: {type(model).__name__} computes its attention in its own code, not through HF's "
                         "attention interface (_supports_attention_backend is not set): the small-batch attention "
                         "cannot run under it")
    _register()
    config = model.config
    if config._attn_implementation != ATTENTION:
        setattr(model, _PREVIOUS, config._attn_implementation)
        config._attn_implementation = ATTENTION
    return model


def undo_small_batch_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the attention implementation replaced by :func:`use_small_batch_attention`."""
    check_module(model)
    previous = getattr(model, _PREVIOUS, None)
    if previous is not None:
        model.config._attn_implementation = previous
        delattr(model, _PREVIOUS)
    return model


def uses_small_batch_attention(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention runs on the small-batch attention kernel (False for a
    module without a HF config)."""
    check_module(model)
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == ATTENTION
