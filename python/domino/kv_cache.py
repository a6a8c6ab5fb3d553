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

import itertools
import operator
from typing import NamedTuple

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["GrowingCache", "GrowingLayer"]

_LENGTH = operator.attrgetter("_length")
_KEY_STORE, _VALUE_STORE = operator.attrgetter("_key_store"), operator.attrgetter("_value_store")

# Positions of headroom a layer's storage gets beyond what it must hold when it grows: a
# prompt's prefill is followed by decoding, which would otherwise regrow at the first step.
MIN_HEADROOM = 256


def grown_capacity(held: int, need: int) -> int:
    """Positions of new storage for ``need`` after ``held``: doubling, with headroom."""
    return max(2 * held, need + MIN_HEADROOM)


class _StorageView:
    """A :class:`GrowingLayer`'s ``keys`` or ``values`` [b, h, T, d]: while the layer holds a
    length (after ``_hold``), the first that many positions of its storage (``store``),
    made into a view when first read and kept; assigning it (as every ``DynamicLayer``
    method that replaces the tensors does) ends that for both (``other``, the other one,
    stays the view it is) and the layer then holds what was assigned."""

    def __init__(self, store: str, other: str):
        self.store, self.other = store, other

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, layer: GrowingLayer | None, owner: type | None = None):
        if layer is None:
            return self
        view = layer.__dict__.get(self.slot)
        if view is None and layer._length is not None:
            view = layer.__dict__[self.slot] = getattr(layer, self.store).narrow(2, 0, layer._length)
        return view

    def __set__(self, layer: GrowingLayer, tensor: torch.Tensor | None) -> None:
        if layer._length is not None:
            getattr(layer, self.other)  # made, if not yet, while the length still says what it is
            layer._length = None
        layer.__dict__[self.slot] = tensor


class GrowingLayer(DynamicLayer):
    """A full-attention ``DynamicLayer`` whose ``keys`` / ``values`` [b, h, T, d] are views
    of storage [b, h, capacity, d] (capacity >= T) that updates write into in place.

    After :meth:`_hold` the views are made when first read: a writer that fills the
    storage itself (``domino_ops.decoder_layers``) and the crops between its forwards
    then change a length, not 60 tensors (~0.5 ms a SmolLM2 forward cold). Assigning
    ``keys`` or ``values``, as every ``DynamicLayer`` method that replaces them does,
    ends that: the layer then holds what was assigned."""

    _key_store: torch.Tensor | None = None
    _value_store: torch.Tensor | None = None
    # while not None: keys and values are the storage's first _length positions
    _length: int | None = None

    keys = _StorageView("_key_store", "values")
    values = _StorageView("_value_store", "keys")

    def get_seq_length(self) -> int:
        """The positions held."""
        return self._length if self._length is not None else super().get_seq_length()

    def _owns_tensors(self) -> bool:
        """Whether ``keys`` / ``values`` are still the leading views of this layer's storage."""
        keys, values, store_k, store_v = self.keys, self.values, self._key_store, self._value_store
        return (store_k is not None and keys.dim() == 4 and keys.data_ptr() == store_k.data_ptr()
                and values.data_ptr() == store_v.data_ptr() and keys.stride() == store_k.stride()
                and values.stride() == store_v.stride() and keys.shape[:2] == store_k.shape[:2]
                and keys.shape[3] == store_k.shape[3])

    def _has_room(self, need: int, states: torch.Tensor) -> bool:
        """Whether the storage holds ``need`` positions of ``states``' dtype, device and
        (batch, heads)."""
        store = self._key_store
        return (store is not None and need <= store.shape[2] and store.dtype == states.dtype
                and store.device == states.device and store.shape[:2] == states.shape[:2])

    def _make_room(self, key_states: torch.Tensor, value_states: torch.Tensor) -> int:
        """Storage for key_states / value_states' n new positions [b, h, n, d] after the T
        held (the held ones copied into new storage when it grows); returns T. Reads only
        their shapes, dtypes and device."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        held = self.keys.numel() > 0
        if held and not self._owns_tensors():
            self._key_store = self._value_store = None  # replaced by another method: adopted below
        T = self.keys.shape[-2] if held else 0
        need = T + key_states.shape[-2]
        if not self._has_room(need, key_states):
            capacity = grown_capacity(T, need)
            b, h, _, d = key_states.shape
            new_k = key_states.new_empty(b, h, capacity, d)
            new_v = value_states.new_empty(b, h, capacity, value_states.shape[-1])
            if T:
                new_k[:, :, :T].copy_(self.keys)
                new_v[:, :, :T].copy_(self.values)
            self._key_store, self._value_store = new_k, new_v
        return T

    def _hold(self, length: int) -> None:
        """Keys and values become the storage's first ``length`` positions (the views made
        when first read)."""
        self._length = length
        self.__dict__.pop("_keys", None)
        self.__dict__.pop("_values", None)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends key_states / value_states [b, h, n, d] after the T positions held;
        returns the keys and values [b, h, T + n, d] (views of the storage)."""
        T = self._make_room(key_states, value_states)
        need = T + key_states.shape[-2]
        self._key_store[:, :, T:need].copy_(key_states)
        self._value_store[:, :, T:need].copy_(value_states)
        self._hold(need)
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
        # What the last reserve found and the last hold made: a writer's next reserve, and
        # a crop, take them as they are while every layer still holds the views hold gave it
        # (the per-layer checks of the storage cost ~0.3 ms a SmolLM2 forward, cold).
        self._room: _Room | None = None
        self._held: _Held | None = None
        # The one tensor [2 * layers, b, h, capacity, d] the layers' storage was last
        # allocated in together (:meth:`_grow_together`), and its slices as they were given.
        self._shared: tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]] | None = None

    def _held_views(self) -> _Held | None:
        """The last hold's record, while the layers are still the ones it held and each
        still holds its storage's first ``length`` positions (anything else that changes a
        layer assigns its tensors, which ends that: :class:`GrowingLayer`)."""
        held = self._held
        if (held is None or len(self.layers) != len(held.layers)
                or not all(map(operator.is_, self.layers, held.layers))
                or not all(map(operator.eq, map(_LENGTH, held.layers), itertools.repeat(held.length)))):
            return None
        return held

    def reserve(self, num_layers: int, new_states: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """Storage for ``new_states``' n new positions ([b, h, n, d]: only its shape, dtype
        and device are read) in each of the first ``num_layers`` layers (created as
        :meth:`update` creates them), for a writer that fills them itself
        (``domino_ops.decoder_layers``): returns the key and value storages [b, h,
        capacity, d] and the positions every layer holds, T; the writer puts the new
        positions at T .. T + n - 1, then :meth:`hold` makes them the layers' contents.
        Raises ValueError where the layers hold different lengths."""
        held = self._held_views()
        room = None if held is None else held.room
        if (room is not None and len(held.layers) == num_layers and held.length + new_states.shape[2] <= room.capacity
                and room.states == (new_states.dtype, new_states.device, new_states.shape[:2])):
            return room.key_stores, room.value_stores, held.length
        while len(self.layers) < num_layers:
            self.layers.append(self.layer_class_to_replicate())
        layers = self.layers[:num_layers]
        self._grow_together(layers, new_states)
        held = [layer._make_room(new_states, new_states) for layer in layers]
        if len(set(held)) != 1:
            raise ValueError(f"reserve needs layers of one length, got lengths {sorted(set(held))}")
        key_stores, value_stores = [layer._key_store for layer in layers], [layer._value_store for layer in layers]
        shared = self._shared
        together = (shared is not None and len(shared[1]) == num_layers
                    and all(map(operator.is_, key_stores, shared[1])) and all(map(operator.is_, value_stores, shared[2])))
        if not together:
            self._shared = None  # not kept alive for layers that have left it
        self._room = _Room(key_stores, value_stores, min(store.shape[2] for store in key_stores),
                           (new_states.dtype, new_states.device, new_states.shape[:2]),
                           shared[0] if together else None)
        return key_stores, value_stores, held[0]

    def _grow_together(self, layers: list[GrowingLayer], new_states: torch.Tensor) -> None:
        """Where some layer's storage lacks room for ``new_states`` [b, h, n, d] and every
        layer holds the same T positions of that shape, dtype and device, storage for all
        of them as one tensor [2 * layers, b, h, capacity, d] (layer i's keys at 2i, values
        at 2i + 1; capacity as each layer's own growth sizes it), their held
        positions copied in: a tree round's compaction then moves every layer's slots in
        two ops a sequence (:func:`domino.tree.compact_tree_cache`), not two per layer tensor. Else
        each layer keeps growing on its own."""
        b, h, n, d = new_states.shape
        lengths = set()
        for layer in layers:
            keys = layer.keys if layer.is_initialized else None
            if keys is not None and keys.numel():
                if (keys.dim() != 4 or keys.shape[:2] != (b, h) or keys.shape[3] != d or keys.dtype != new_states.dtype
                        or keys.device != new_states.device or layer.values.shape != keys.shape):
                    return
                lengths.add(keys.shape[2])
            else:
                lengths.add(0)
        if len(lengths) != 1:
            return
        T = lengths.pop()
        if all(layer._has_room(T + n, new_states) and layer._owns_tensors() for layer in layers):
            return  # room enough everywhere: nothing to grow
        capacity = grown_capacity(T, T + n)
        store = new_states.new_empty(2 * len(layers), b, h, capacity, d)
        for i, layer in enumerate(layers):
            if not layer.is_initialized:
                layer.lazy_initialization(new_states, new_states)
            if T:
                store[2 * i, :, :, :T].copy_(layer.keys)
                store[2 * i + 1, :, :, :T].copy_(layer.values)
            layer._key_store, layer._value_store = store[2 * i], store[2 * i + 1]
            layer._hold(T)
        self._shared = (store, [layer._key_store for layer in layers], [layer._value_store for layer in layers])

    def shared_storage(self) -> tuple[torch.Tensor, int] | None:
        """(the layers' storage as one tensor [2 * layers, b, h, capacity, d], the positions
        every layer holds) while every layer holds its storage's first positions in it
        (:meth:`_grow_together`), else None."""
        held = self._held_views()
        if held is None or held.room is None or held.room.shared is None:
            return None
        return held.room.shared, held.length

    def hold(self, num_layers: int, length: int) -> None:
        """The first ``num_layers`` layers' keys and values become the first ``length``
        positions of their storage (after :meth:`reserve` and the writer)."""
        layers = tuple(self.layers[:num_layers])
        for layer in layers:
            layer._hold(length)
        room = self._room  # still these layers' storage, unless something regrew one since
        if room is not None and not (len(room.key_stores) == len(layers)
                                     and all(map(operator.is_, map(_KEY_STORE, layers), room.key_stores))
                                     and all(map(operator.is_, map(_VALUE_STORE, layers), room.value_stores))):
            room = None
        self._held = _Held(layers, length, room)

    def crop(self, tokens_to_remove: int) -> None:
        """``DynamicCache.crop`` (``tokens_to_remove`` <= 0 positions dropped from every
        layer); after a :meth:`hold` of every layer, as a hold of fewer positions."""
        held = self._held_views()
        if held is None or tokens_to_remove >= 0 or -tokens_to_remove > held.length:
            super().crop(tokens_to_remove)
            return
        self.hold(len(held.layers), held.length + tokens_to_remove)


class _Room(NamedTuple):
    """What :meth:`GrowingCache.reserve` found: every layer's storage, the least capacity
    among them, the dtype, device and (batch, heads) of the states it was made for, and the
    one tensor they are slices of, if they are (:meth:`GrowingCache._grow_together`)."""
    key_stores: list[torch.Tensor]
    value_stores: list[torch.Tensor]
    capacity: int
    states: tuple
    shared: torch.Tensor | None


class _Held(NamedTuple):
    """What :meth:`GrowingCache.hold` made: the layers, the length each now holds, and the
    last reserve's :class:`_Room` while it is still the layers' storage."""
    layers: tuple
    length: int
    room: _Room | None
