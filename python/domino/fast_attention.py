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

Off the CPU, with dropout in training, or with a logit softcap or attention sinks (which
the kernel does not compute), the layer falls back to HF's SDPA attention.
``undo_small_batch_attention`` restores the previous implementation.
"""

from __future__ import annotations

import torch

__all__ = ["ATTENTION", "use_small_batch_attention", "undo_small_batch_attention", "uses_small_batch_attention",
           "small_batch_attention_forward"]

ATTENTION = "domino_small_batch"
_PREVIOUS = "_domino_previous_attn_implementation"


def small_batch_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A HF attention function: query [b, Hq, q, d], key / value [b, Hkv, kv, d] (the cache
    included), attention_mask None, bool or additive float [b, 1, q, >= kv]; returns the
    output [b, q, Hq, d] (contiguous) and no weights."""
    # Off the CPU, dtypes the kernel lacks (float16), dropout, attention that is not
    # causal (an encoder's), or what the kernel does not compute (Gemma's logit softcap,
    # attention sinks): HF's own attention.
    if (query.device.type != "cpu" or query.dtype not in (torch.float32, torch.bfloat16)
            or (dropout and module.training) or not kwargs.get("is_causal", getattr(module, "is_causal", True))
            or kwargs.get("softcap") is not None or kwargs.get("s_aux") is not None):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, q, d = query.shape
    if attention_mask is None and q > 1 and key.shape[2] > q:
        # HF's mask function returns None for a first forward into an empty static cache
        # (q_offset 0) and means sdpa's top-left causal mask: query i sees keys 0..i, the
        # slots past the queries are empty. The kernel's no-mask rule is bottom-right
        # (the queries are the last keys), so it gets exactly the first q keys.
        key, value = key[:, :, :q], value[:, :, :q]
    mask = None if attention_mask is None else attention_mask[:, :, :, :key.shape[2]]
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


def use_small_batch_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switches a HF model's attention to :func:`small_batch_attention_forward`, in place;
    returns ``model``. Idempotent."""
    _register()
    config = model.config
    if config._attn_implementation != ATTENTION:
        setattr(model, _PREVIOUS, config._attn_implementation)
        config._attn_implementation = ATTENTION
    return model


def undo_small_batch_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the attention implementation replaced by :func:`use_small_batch_attention`."""
    previous = getattr(model, _PREVIOUS, None)
    if previous is not None:
        model.config._attn_implementation = previous
        delattr(model, _PREVIOUS)
    return model


def uses_small_batch_attention(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention runs on the small-batch attention kernel."""
    return getattr(model.config, "_attn_implementation", None) == ATTENTION
