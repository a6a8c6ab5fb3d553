"""What the engine and the data pipeline read off a HF transformers target: the drafter's
context features, the special token ids, the KV-cache keyword, its attention window and
where its rotary frequencies switch; and HF ``generate`` without the checkpoint's own
logits processors."""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager
from typing import Sequence

import torch


def cache_kwarg(fn) -> str:
    """The keyword under which the HF callable ``fn`` (a model's ``forward``, its
    ``generate``) takes its KV cache: ``cache`` from transformers 5.24 on (there
    ``past_key_values`` is deprecated, to be removed in 5.40), else ``past_key_values``.
    Read it once per model: inspecting a signature costs tens of microseconds."""
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"


def target_features(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """The drafter's context features [b, T, n*H]: the outputs of the target layers
    ``layer_ids`` (0-based), concatenated, from HF ``hidden_states`` (embeddings first, so
    layer i's output is ``hidden_states[i + 1]``)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def sliding_window(config) -> int | None:
    """The window of a target some of whose layers attend only to the last ``window``
    positions (Mistral, Gemma 2/3, Qwen2 with ``use_sliding_window``), else None. HF builds
    that window from KV-cache slots, not positions, so the engine's tree masks and the
    masked holes a batched round leaves in the cache would widen or shift it."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return None if getattr(config, "use_sliding_window", True) is False else window


def longrope_switch(config) -> int | None:
    """The length at which a target with ``rope_type`` "longrope" (Phi-3 and Phi-3.5 128k,
    ...) switches its rotary frequencies: its ``original_max_position_embeddings`` (the
    smallest over layer types), else None. HF rotates every position of a forward with the
    long factors once the forward's largest position reaches it (``max(position_ids) + 1 >
    original``) and with the short ones below, so a verification block that straddles it
    would rotate its earlier positions unlike decoding one token at a time (and Phi-3's
    ``generate`` recomputes its cache there). "dynamic" rotary changes its frequencies only
    past ``max_position_embeddings``, which the engine never feeds (every verified position
    stays inside the context window)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return None
    # one dict, or one per layer type ({"full_attention": {...}, "sliding_attention": {...}})
    per_type = [params] if not all(isinstance(v, dict) for v in params.values()) else list(params.values())
    switches = [p.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
                for p in per_type if p.get("rope_type", p.get("type")) == "longrope"]
    switches = [int(s) for s in switches if s]
    return min(switches) if switches else None


def special_token_ids(target, tokenizer) -> tuple[list[int], int]:
    """(eos_ids, pad_id): every EOS id of the target's generation config and tokenizer,
    sorted; the tokenizer's pad id, else the smallest EOS id. A pad id the target cannot
    embed (a tokenizer given a pad token without the model's embeddings resized) pads as
    the smallest EOS id the target embeds, or 0: padded slots are masked, so any id the
    target embeds pads the same, where that one raised an IndexError in a batch."""
    eos = target.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        eos.append(tokenizer.eos_token_id)
    eos_ids = sorted(set(eos))
    vocab = target.get_input_embeddings().num_embeddings
    pad = tokenizer.pad_token_id
    if pad is not None and 0 <= pad < vocab:
        return eos_ids, pad
    if pad is None and not eos_ids:
        raise ValueError("the target has no EOS token and the tokenizer no pad token: set one of them")
    return eos_ids, next((e for e in eos_ids if 0 <= e < vocab), 0)


# model id -> (blocks open on it, its own generation config), for bare_generation_config
_BARE: dict[int, tuple[int, object]] = {}
_BARE_LOCK = threading.Lock()


@contextmanager
def bare_generation_config(model):
    """Within the block, ``model.generation_config`` is an empty one, so HF ``generate``
    applies none of the checkpoint's own generation defaults (a repetition penalty, a
    no-repeat n-gram size, suppressed tokens, a minimum length: Qwen2.5-Instruct ships a
    repetition penalty). Decoding then follows the model's own distribution, as
    speculation does and verifies against; the caller passes every argument it means
    (EOS, padding, sampling). Blocks may nest and overlap across threads: the first to
    open swaps the config out, the last to close puts the model's own back (two threads
    each restoring what it had found left the empty one in place for good)."""
    from transformers import GenerationConfig

    key = id(model)
    with _BARE_LOCK:
        depth, saved = _BARE.get(key, (0, None))
        if depth == 0:
            saved = model.generation_config
            model.generation_config = GenerationConfig()
        _BARE[key] = (depth + 1, saved)
    try:
        yield model
    finally:
        with _BARE_LOCK:
            depth, saved = _BARE.pop(key)
            if depth == 1:
                model.generation_config = saved
            else:
                _BARE[key] = (depth - 1, saved)
