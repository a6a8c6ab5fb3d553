"""Runtime sampling helpers shared by the ops' wrappers and by engines that call them.

- :func:`draw_uniforms`: the uniforms a sampling op consumes, in the order and shapes the
  wrappers (and the references) draw them, so equal generator states give equal choices;
- :func:`filtered_probs`: the distribution the sampling ops draw from,
  ``softmax(filter(logits / temperature))``, i.e. the ``p`` / ``q`` that
  :func:`domino_ops.verify_sampling` expects;
- :func:`check_sampling_params`: the validation every sampling-aware op applies to
  ``temperature``, ``top_k`` and ``top_p``, for engines that validate up front.

The test oracle is :mod:`domino_ops.reference`; nothing here is test-only.
"""

from __future__ import annotations

import torch

from domino_ops import _checks

__all__ = ["draw_uniforms", "filtered_probs", "filtered_weights", "check_sampling_params"]


def draw_uniforms(shape, device, generator) -> torch.Tensor:
    """The uniforms [*shape] float64 in [0, 1) that a sampling op consumes."""
    return torch.rand(shape, dtype=torch.float64, device=device, generator=generator)


def filtered_weights(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Unnormalised float64 weights [n, V] of softmax(filter(logits / temperature)) for
    logits [n, V]: top-k keeps z >= the k-th largest z; top-p sorts the survivors by z
    (descending, stable) and drops a token once the mass before it reaches top_p."""
    V = logits.shape[-1]
    z = logits.float() / temperature
    if 0 < top_k < V:
        kth = z.topk(top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    w = torch.exp((z - z.max(dim=-1, keepdim=True).values).double())
    if top_p < 1.0:
        order = torch.sort(z, dim=-1, descending=True, stable=True).indices
        ws = w.gather(-1, order)
        before = torch.cumsum(ws, dim=-1) - ws
        drop_sorted = before >= top_p * ws.sum(dim=-1, keepdim=True)
        w = w.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
    return w


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution the sampling ops draw from, ``softmax(filter(logits / temperature))``
    over the last axis of ``logits`` [..., V] (float32 or bfloat16), returned as float32 of
    the same shape: the ``p`` / ``q`` that :func:`domino_ops.verify_sampling` expects."""
    w = filtered_weights(logits.reshape(-1, logits.shape[-1]), temperature, top_k, top_p)
    return (w / w.sum(dim=-1, keepdim=True)).float().reshape(logits.shape)


def check_sampling_params(temperature, top_k, top_p) -> None:
    """Raises TypeError / ValueError naming the argument unless temperature >= 0 (a number),
    top_k >= 0 (an int; 0 disables it) and top_p in (0, 1]."""
    _checks.sampling_params(temperature, top_k, top_p)
