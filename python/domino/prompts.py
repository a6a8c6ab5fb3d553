"""User prompts and request arguments, validated up front: every error names the argument.

A prompt is a string (sent through the chat template as one user message), a list of chat
messages (``{"role": str, "content": str}``), token ids (a list of ints or a 1-D tensor),
or a batch of those (a list of them, or a 2-D tensor).
"""

from __future__ import annotations

import numbers
from typing import Sequence, Union

import torch

# One prompt: a string, chat messages, or token ids (a list of ints or a 1-D tensor).
Prompt = Union[str, Sequence[dict], Sequence[int], torch.Tensor]
# One prompt or a batch of them (a list of prompts, or a 2-D tensor of token ids).
Prompts = Union[Prompt, Sequence[Prompt]]


def is_batch(prompt) -> bool:
    """Whether ``prompt`` is a batch of prompts rather than one."""
    if isinstance(prompt, torch.Tensor):
        return prompt.dim() == 2
    return isinstance(prompt, (list, tuple)) and bool(prompt) and isinstance(prompt[0], (str, list, tuple, torch.Tensor))


def check_messages(messages: list, name: str) -> None:
    """Raises TypeError/ValueError naming ``name`` and the index unless every element of
    ``messages`` is a chat message dict with a string ``role`` and ``content``."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise TypeError(f"{name}[{i}] must be a chat message dict, got {type(m).__name__}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ValueError(f"{name}[{i}] must have a string {key!r}, got {m.get(key)!r}")


def encode(tokenizer, prompt, name: str = "prompt") -> list[int]:
    """Token ids of one prompt: strings and chat messages go through the chat template
    (with the generation prompt), token ids are used as they are. Raises TypeError or
    ValueError naming ``name`` for anything else, or an empty prompt."""
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype == torch.bool:
            raise TypeError(f"{name} as a tensor must be 1-D integer token ids, got {prompt.dim()}-D {prompt.dtype}")
        ids = prompt.tolist()
    elif isinstance(prompt, str) or (isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict)):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        check_messages(messages, name)
        if tokenizer.chat_template is None:
            text = "\n".join(m["content"] for m in messages)
        else:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, numbers.Integral) and not isinstance(t, bool)
                                                   for t in prompt):
        ids = [int(t) for t in prompt]
    else:
        raise TypeError(f"{name} must be a string, a list of chat messages, token ids or a 1-D tensor, "
                        f"got {type(prompt).__name__}")
    if not ids:
        raise ValueError(f"{name} is empty: give at least one token")
    return ids


def encode_all(tokenizer, prompt, vocab_size: int) -> tuple[list[list[int]], bool]:
    """(token ids of every prompt, whether ``prompt`` was a batch); ids checked to lie in
    [0, vocab_size)."""
    batch = is_batch(prompt)
    if batch and isinstance(prompt, torch.Tensor):
        prompt = list(prompt)
    if not batch and isinstance(prompt, (list, tuple)) and not prompt:
        raise ValueError("prompt is empty: give at least one token")
    items = list(prompt) if batch else [prompt]
    if not items:
        raise ValueError("prompt is an empty batch: give at least one prompt")
    seqs = []
    for i, p in enumerate(items):
        name = f"prompt[{i}]" if batch else "prompt"
        ids = encode(tokenizer, p, name)
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got values in [{lo}, {hi}]")
        seqs.append(ids)
    return seqs, batch


def check_int(name: str, value, *, lo: int, hi: int | None = None, none: str = "") -> None:
    """Raises ValueError "<name> must be [<none>]an int >= lo" (or "in [lo, hi]") unless
    ``value`` is an integer in range: Python's or NumPy's (numbers.Integral), not a bool.
    ``none``: the message's prefix for an argument that may also be None ("None or ")."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= lo
    if not ok or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {none}an int {bounds}, got {value!r}")


def check_max_new_tokens(max_new_tokens) -> None:
    """Raises TypeError/ValueError unless ``max_new_tokens`` is an int >= 1."""
    if not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")


def check_stop(stop) -> list[str]:
    """``stop`` as a list of strings; a bare string is refused (it would be read as its
    characters)."""
    if isinstance(stop, str):
        raise TypeError(f"stop must be a list of strings, got the string {stop!r}: write stop=[{stop!r}]")
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        raise TypeError(f"stop must be a list of strings, got {stop!r}")
    return list(stop)


def check_context(seqs: list[list[int]], max_new_tokens: int, context_len: int | None, batch: bool) -> None:
    """Every prompt plus ``max_new_tokens`` fits the target's context window."""
    if context_len is None:
        return
    for i, ids in enumerate(seqs):
        if len(ids) + max_new_tokens > context_len:
            name = f"prompt[{i}]" if batch else "prompt"
            raise ValueError(f"{name} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} that exceeds the "
                             f"target's context window of {context_len} tokens: shorten it or lower max_new_tokens")


def check_rope_switch(seqs: list[list[int]], max_new_tokens: int, switch: int | None, batch: bool) -> None:
    """For a target whose rotary frequencies switch at ``switch`` tokens (a longrope
    target: :func:`domino.target.longrope_switch`; None: nothing to check), every prompt
    stays on one side of it for the whole call (all its positions below, or the prompt
    already past it), and a batch's prompts all on the same side: HF rotates a whole
    forward, every row of a batch, by its largest position."""
    if switch is None:
        return
    for i, ids in enumerate(seqs):
        if len(ids) <= switch < len(ids) + max_new_tokens:
            name = f"prompt[{i}]" if batch else "prompt"
            raise ValueError(f"{name} has {len(ids)} tokens; with max_new_tokens={max_new_tokens} the call would "
                             f"cross {switch} tokens, where this target's longrope rotary switches every position "
                             "of a forward from its short to its long factors: a verified block across it would not "
                             "decode as one token at a time does. Keep the prompt plus max_new_tokens within "
                             f"{switch} tokens, or give a prompt longer than {switch}")
    if len({len(ids) > switch for ids in seqs}) > 1:
        raise ValueError(f"prompt: the batch mixes prompts shorter and longer than {switch} tokens, where this "
                         "target's longrope rotary switches; HF rotates every row of a forward by the batch's "
                         "longest position, so the short ones would not decode as they do alone: give them "
                         "separate calls")
