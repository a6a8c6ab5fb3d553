"""A KV cache that grows in place: HF's ``DynamicCache`` with layers that write new
positions into storage with spare room, instead of concatenating.

HF's ``DynamicLayer.update`` is ``torch.cat([keys, new])``: every forward copies the whole
cache of every layer into a fresh allocation (and, above glibc's mmap threshold, maps and
faults in new pages and unmaps the old). For SmolLM2-135M at 2,000 cached tokens that is
46 MB a forward (an ad-hoc torch-profiler run put ``aten::cat`` at 5-15 ms of a 40-50 ms
forward on the Zen 3 VM; ``benchmarks/kv_cache_ab.py`` measures the forward 1.05-1.08x faster
with this cache). A :class:`GrowingLayer` keeps its keys and values as views
``[b, h, :T]`` of storage ``[b, h, capacity]``: an update writes its positions in place
(the storage doubles when full, so the copying is amortised to a few per generation) and a
crop shortens the views. The views' bits are the concatenation's, and every reader
(``domino.fast_attention``, HF's attention functions, :func:`domino.tree.compact_tree_cache`,
which writes through them) takes strided tensors.

A method of ``DynamicLayer`` that replaces the tensors (beam reordering, batch selection,
offloading) leaves them views of nothing the layer owns; the next update sees that and
copies them into new storage, so every ``DynamicCache`` operation keeps working.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["GrowingCache", "GrowingLayer"]

# Positions of headroom a layer's storage gets beyond what it must hold when it grows: a
# prompt's prefill is followed by decoding, which would otherwise regrow at the first step.
MIN_HEADROOM = 256


class GrowingLayer(DynamicLayer):
    """A full-attention ``DynamicLayer`` whose ``keys`` / ``values`` [b, h, T, d] are views
    of storage [b, h, capacity, d] (capacity >= T) that updates write into in place."""

    _key_store: torch.Tensor | None = None
    _value_store: torch.Tensor | None = None

    def _owns_tensors(self) -> bool:
        """Whether ``keys`` / ``values`` are still the leading views of this layer's storage."""
        keys, values, store_k, store_v = self.keys, self.values, self._key_store, self._value_store
        return (store_k is not None and keys.dim() == 4 and keys.data_ptr() == store_k.data_ptr()
                and values.data_ptr() == store_v.data_ptr() and keys.stride() == store_k.stride()
                and values.stride() == store_v.stride() and keys.shape[:2] == store_k.shape[:2]
                and keys.shape[3] == store_k.shape[3])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends key_states / value_states [b, h, n, d] after the T positions held;
        returns the keys and values [b, h, T + n, d] (views of the storage)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.keys.numel() > 0
        if held and not self._owns_tensors():
            self._key_store = self._value_store = None  # replaced by another method: adopted below
        T = self.keys.shape[-2] if held else 0
        need = T + key_states.shape[-2]
        store = self._key_store
        if (store is None or need > store.shape[2] or store.dtype != key_states.dtype
                or store.device != key_states.device or store.shape[:2] != key_states.shape[:2]):
            capacity = max(2 * T, need + MIN_HEADROOM)
            b, h, _, d = key_states.shape
            new_k = key_states.new_empty(b, h, capacity, d)
            new_v = value_states.new_empty(b, h, capacity, value_states.shape[-1])
            if T:
                new_k[:, :, :T].copy_(self.keys)
                new_v[:, :, :T].copy_(self.values)
            self._key_store, self._value_store = new_k, new_v
        self._key_store[:, :, T:need].copy_(key_states)
        self._value_store[:, :, T:need].copy_(value_states)
        self.keys = self._key_store[:, :, :need]
        self.values = self._value_store[:, :, :need]
        return self.keys, self.values

    def reset(self) -> None:
        """Drops the tensors and the storage."""
        self._key_store = self._value_store = None
        super().reset()


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of :class:`GrowingLayer` s, created one per layer as the model's
    forward first updates it (full attention only: a model with sliding-window or
    linear-attention layers needs HF's own cache)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
