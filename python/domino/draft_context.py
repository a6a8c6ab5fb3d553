"""The drafter's context cache: its layers' keys and values of the target's committed
positions, and which of those slots are real tokens.

Generation extends it every round by the positions the round kept, and every draft reads
all of it. Held as per-layer tensors grown by ``torch.cat``, each extension copied the
whole context, and so did every draft (the attention read the context concatenated with
the block per layer): at 4,000 slots a 6-token draft took 3.77 ms and an extension by 3
slots 0.79 ms on the 2-core Xeon VM, against 3.40 and 0.46 ms in place
(``benchmarks/engine_speed.py drafter``). Here the keys and values live in stores with room
past the context, grown by doubling as :class:`domino.kv_cache.GrowingCache` grows the
target's: an extension writes its slots in place, and the backbone's one-call CPU path
(``domino_ops.draft_layers``) writes a block's keys and values into the room as scratch,
so the attention reads the context where it lies. ``keys``, ``values`` and ``mask`` are
views of the first ``length`` slots, with the bits the concatenation had.
"""

from __future__ import annotations

import torch

from domino.kv_cache import grown_capacity

__all__ = ["DraftContextCache"]


class DraftContextCache:
    """Per-layer context keys/values [b, kvh, T, hd] and which context slots are real
    [b, T] (bool), T = ``length``, held in stores [b, kvh, capacity, hd] and [b, capacity].

    Slots past ``length`` are room: :meth:`append` writes there, and so does a caller that
    uses the room as scratch (``domino_ops.draft_layers``); setting ``length`` back to an
    earlier value forgets what was appended since (the slots before it are never
    written)."""

    def __init__(self, batch_size: int, layers: int, kv_heads: int, head_dim: int, *,
                 device: torch.device | str, dtype: torch.dtype):
        """An empty cache for ``batch_size`` sequences of a drafter with ``layers`` layers of
        ``kv_heads`` key/value heads of ``head_dim``, keys and values of ``dtype``."""
        self.key_stores = [torch.zeros(batch_size, kv_heads, 0, head_dim, device=device, dtype=dtype)
                           for _ in range(layers)]
        self.value_stores = [torch.zeros_like(s) for s in self.key_stores]
        self.mask_store = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.length = 0

    @property
    def keys(self) -> list[torch.Tensor]:
        """Each layer's keys [b, kvh, length, hd] (views of the stores)."""
        return [s[:, :, :self.length] for s in self.key_stores]

    @property
    def values(self) -> list[torch.Tensor]:
        """Each layer's values [b, kvh, length, hd] (views of the stores)."""
        return [s[:, :, :self.length] for s in self.value_stores]

    @property
    def mask(self) -> torch.Tensor:
        """Which slots are real tokens [b, length] (bool; a view of the store)."""
        return self.mask_store[:, :self.length]

    @property
    def capacity(self) -> int:
        """Slots the stores hold, ``length`` of them the context."""
        return self.mask_store.shape[1]

    def commit(self, valid: torch.Tensor) -> None:
        """Makes the T slots past ``length`` context, their keys and values already written
        into the room by a caller (``domino_ops.draft_context``, after :meth:`reserve`);
        ``valid`` [b, T] (bool): which of them are real tokens."""
        if valid.dim() != 2 or valid.shape[0] != self.mask_store.shape[0]:
            raise ValueError(f"valid must have shape [{self.mask_store.shape[0]}, slots], got {list(valid.shape)}")
        T = valid.shape[1]
        if self.length + T > self.capacity:
            raise ValueError(f"commit of {T} slots past {self.length}: reserve them first (capacity {self.capacity})")
        self.mask_store[:, self.length:self.length + T] = valid
        self.length += T

    def reserve(self, slots: int) -> None:
        """Makes room for ``slots`` slots past ``length`` to be written (the stores grow by
        doubling, the context copied once into the new ones). Stores made under
        ``torch.inference_mode`` are copied into ordinary tensors first when written outside
        it (torch forbids writing to inference tensors there: a cache filled in inference
        mode, then drafted from under ``no_grad``)."""
        need = self.length + slots
        writable = torch.is_inference_mode_enabled() or not self.mask_store.is_inference()
        if need <= self.capacity and writable:
            return
        capacity = grown_capacity(self.length, need) if need > self.capacity else self.capacity
        self.key_stores = [self._grown(s, capacity) for s in self.key_stores]
        self.value_stores = [self._grown(s, capacity) for s in self.value_stores]
        self.mask_store = self._grown(self.mask_store, capacity)

    def _grown(self, store: torch.Tensor, capacity: int) -> torch.Tensor:
        """A zeroed store of ``capacity`` slots (its dimension -2 for keys and values, -1 for
        the mask) holding ``store``'s first ``length``."""
        dim = 2 if store.dim() == 4 else 1
        grown = store.new_zeros(*store.shape[:dim], capacity, *store.shape[dim + 1:])
        grown.narrow(dim, 0, self.length).copy_(store.narrow(dim, 0, self.length))
        return grown

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keeps the sequences ``rows`` [b'] (int64 indices) of the batch, in that order (a
        batch whose other sequences have finished): their context, in stores of the same
        capacity."""
        self.key_stores = [s.index_select(0, rows) for s in self.key_stores]
        self.value_stores = [s.index_select(0, rows) for s in self.value_stores]
        self.mask_store = self.mask_store.index_select(0, rows)

    def append(self, keys: list[torch.Tensor], values: list[torch.Tensor], valid: torch.Tensor) -> None:
        """Appends T slots: each layer's keys and values [b, kvh, T, hd] and which of the
        slots are real [b, T] (bool)."""
        T = valid.shape[1]
        self.reserve(T)
        new = slice(self.length, self.length + T)
        for store, k in zip(self.key_stores, keys, strict=True):
            store[:, :, new] = k
        for store, v in zip(self.value_stores, values, strict=True):
            store[:, :, new] = v
        self.mask_store[:, new] = valid
        self.length += T
