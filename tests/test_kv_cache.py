"""domino.kv_cache.GrowingCache: the bits of HF's DynamicCache (logits and cache contents)
through prefills, decoding, verifications, crops and regrowth, updates written in place,
and every DynamicCache operation that replaces a layer's tensors still working."""

import copy

import pytest
import torch
from transformers import DynamicCache

from domino import kv_cache
from domino.kv_cache import GrowingCache, GrowingLayer
from domino.target import cache_kwarg
from domino.tree import compact_tree_cache
from tiny_models import cpu_target


def assert_same_contents(a, b):
    assert len(a.layers) == len(b.layers)
    for la, lb in zip(a.layers, b.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


@pytest.mark.parametrize("attn", [None, "small_batch"])
@pytest.mark.parametrize("headroom", [1, kv_cache.MIN_HEADROOM])
def test_same_bits_as_dynamic_cache(monkeypatch, attn, headroom):
    """A left-padded batch: prefill, one-token steps, verifications of 1-9 tokens cropped
    back to a random kept length, into both caches side by side: the same logits and cache
    contents at every step, with a headroom of one position (storage regrown again and
    again) and with the default."""
    monkeypatch.setattr(kv_cache, "MIN_HEADROOM", headroom)
    model = cpu_target("llama", torch.float32, attn=attn)
    kv = cache_kwarg(model.forward)
    g = torch.Generator().manual_seed(0)
    b, P = 2, 11
    ids = torch.randint(0, 64, (b, P), generator=g)
    mask = torch.ones(b, P, dtype=torch.long)
    mask[1, :4] = 0  # the second prompt is left-padded
    caches = [DynamicCache(), GrowingCache()]
    with torch.inference_mode():
        outs = [model(input_ids=ids, attention_mask=mask, **{kv: c}, use_cache=True).logits for c in caches]
        assert torch.equal(*outs)
        regrown = 0
        for step in range(12):
            k = int(torch.randint(1, 10, (), generator=g)) if step % 3 else 1
            block = torch.randint(0, 64, (b, k), generator=g)
            mask = torch.cat([mask, torch.ones(b, k, dtype=torch.long)], 1)
            store = caches[1].layers[0]._key_store
            outs = [model(input_ids=block, attention_mask=mask, **{kv: c}, use_cache=True).logits for c in caches]
            assert torch.equal(*outs), step
            assert_same_contents(*caches)
            regrown += caches[1].layers[0]._key_store is not store
            drop = int(torch.randint(0, k, (), generator=g))  # the rejected drafts
            if drop:
                for c in caches:
                    c.crop(-drop)
                mask = mask[:, :-drop]
            assert_same_contents(*caches)
        assert all(type(layer) is GrowingLayer for layer in caches[1].layers)
    if headroom == 1:
        assert regrown >= 2  # the regrowth path ran (capacity doubles: 12 -> 24 -> 48 positions)
    else:
        assert regrown == 0  # the prefill's storage held every later position


def test_updates_write_in_place():
    """Within the storage's capacity an update allocates nothing: the keys and values are
    views of the same storage before and after, and a crop only shortens them."""
    layer = GrowingLayer()
    k0, v0 = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    keys, values = layer.update(k0, v0)
    store = layer._key_store
    assert store.shape[2] >= 5 + kv_cache.MIN_HEADROOM and keys.data_ptr() == store.data_ptr()
    k1, v1 = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    keys, values = layer.update(k1, v1)
    assert layer._key_store is store and keys.data_ptr() == store.data_ptr()
    assert torch.equal(keys, torch.cat([k0, k1], 2)) and torch.equal(values, torch.cat([v0, v1], 2))
    layer.crop(-2)
    assert layer.get_seq_length() == 6 and layer.keys.data_ptr() == store.data_ptr()
    keys, _ = layer.update(k1[:, :, :1], v1[:, :, :1])
    assert layer._key_store is store
    assert torch.equal(keys, torch.cat([k0, k1[:, :, :1], k1[:, :, :1]], 2))


def test_operations_that_replace_the_tensors_keep_working():
    """Batch selection, beam reordering and repetition replace a layer's tensors with new
    ones: the next update adopts them (copies them into new storage) and appends after them,
    as a DynamicLayer would."""
    torch.manual_seed(0)
    dyn, grow = DynamicCache(), GrowingCache()
    first = [(torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8)) for _ in range(2)]
    for i, (k, v) in enumerate(first):
        dyn.update(k, v, i)
        grow.update(k, v, i)
    for op in (lambda c: c.batch_select_indices(torch.tensor([2, 0])),
               lambda c: c.reorder_cache(torch.tensor([1, 0])),
               lambda c: c.batch_repeat_interleave(2)):
        op(dyn)
        op(grow)
        b = dyn.layers[0].keys.shape[0]
        for i in range(2):
            k, v = torch.randn(b, 2, 3, 8), torch.randn(b, 2, 3, 8)
            dyn.update(k, v, i)
            grow.update(k, v, i)
        assert_same_contents(dyn, grow)
    grow.reset()
    assert grow.get_seq_length() == 0 and grow.layers[0]._key_store is None


def test_tree_compaction_matches_dynamic_cache():
    """compact_tree_cache writes through a GrowingLayer's views: the same contents as in a
    DynamicCache after compaction and the crop that follows it."""
    torch.manual_seed(1)
    dyn, grow = DynamicCache(), GrowingCache()
    for i in range(3):
        k, v = torch.randn(2, 2, 13, 4), torch.randn(2, 2, 13, 4)
        dyn.update(k, v, i)
        grow.update(k, v, i)
    path = torch.tensor([[0, 2, 5], [0, 1, 0]])  # node indices of the last 6 slots, per sequence
    for c in (dyn, grow):
        compact_tree_cache(c, path, 6)
        c.crop(-3)
    assert_same_contents(dyn, grow)
    assert grow.layers[0].keys.data_ptr() == grow.layers[0]._key_store.data_ptr()


def test_engine_and_baseline_decode_into_a_growing_cache():
    """The engine's prefill and the plain-decoding baseline use the growing cache, and the
    baseline's output is unchanged by it (the same tokens as with HF's own cache)."""
    from tiny_models import tiny_generator

    gen = tiny_generator("llama")
    seen = []
    original = gen._target_forward

    def spy(ids, mask, positions, cache, *a, **kw):
        seen.append(type(cache))
        return original(ids, mask, positions, cache, *a, **kw)

    gen._target_forward = spy
    spec = gen.generate([1, 2, 3, 4, 5], max_new_tokens=12)
    assert seen and all(t is GrowingCache for t in seen)
    seen.clear()
    forward = gen.target.forward

    def forward_spy(*a, **kw):
        seen.append(type(kw.get(gen._cache_kw)))
        return forward(*a, **kw)

    gen.target.forward = forward_spy
    plain = gen.generate_target_only([1, 2, 3, 4, 5], max_new_tokens=12)
    assert seen and all(t is GrowingCache for t in seen)
    hf_cache = gen.generate_target_only([1, 2, 3, 4, 5], max_new_tokens=12, **{gen._cache_kw: DynamicCache()})
    assert plain.token_ids == hf_cache.token_ids == spec.token_ids


def write_as_decoder_layers(cache: GrowingCache, states: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """What domino_ops.decoder_layers does with a GrowingCache: reserve, write each layer's
    new keys and values [b, h, n, d] into its storage after the T held, hold T + n."""
    n = states[0][0].shape[2]
    key_stores, value_stores, T = cache.reserve(len(states), states[0][0])
    for (k, v), ks, vs in zip(states, key_stores, value_stores):
        ks[:, :, T:T + n].copy_(k)
        vs[:, :, T:T + n].copy_(v)
    cache.hold(len(states), T + n)


def test_a_writer_that_fills_the_storage_checks_the_layers_once(monkeypatch):
    """Writes as decoder_layers makes them, crops, and the operations that replace a
    layer's tensors, into a GrowingCache and a DynamicCache side by side: the same contents
    throughout. A writer's reserve after a hold or a crop checks no layer's storage (the
    per-layer _make_room runs only when the storage must grow or something other than
    hold and crop changed a layer); the views are made when first read."""
    monkeypatch.setattr(kv_cache, "MIN_HEADROOM", 4)  # regrowth too
    made_room = []
    make_room = GrowingLayer._make_room
    monkeypatch.setattr(GrowingLayer, "_make_room", lambda self, k, v: made_room.append(self) or make_room(self, k, v))
    torch.manual_seed(3)
    dyn, grow = DynamicCache(), GrowingCache()

    def write(n, b):
        made_room.clear()
        states = [(torch.randn(b, 2, n, 8), torch.randn(b, 2, n, 8)) for _ in range(3)]
        for i, (k, v) in enumerate(states):
            dyn.update(k, v, i)
        write_as_decoder_layers(grow, states)

    write(5, b=2)
    assert len(made_room) == 3  # the first reserve creates the layers' storage (capacity 9)
    def views_made():
        return [name for layer in grow.layers for name in ("_keys", "_values") if vars(layer).get(name) is not None]

    assert not views_made()
    assert grow.get_seq_length() == 5 and not views_made()
    assert_same_contents(dyn, grow)
    for n, drop, checked in ((3, 2, 0), (1, 0, 0), (6, 4, 3), (2, 1, 0)):  # 5+3-2+1+6: past 9, regrown
        write(n, b=2)
        assert len(made_room) == checked, n
        for c in (dyn, grow):
            c.crop(-drop)
        assert_same_contents(dyn, grow)
    layer = grow.layers[1]
    assert layer.keys.data_ptr() == layer._key_store.data_ptr()  # views of the storage
    # one tensor assigned: the other stays the view it was; the next reserve checks every layer
    layer.values = layer.values.clone()
    dyn.layers[1].values = dyn.layers[1].values.clone()
    assert layer.keys.data_ptr() == layer._key_store.data_ptr() != layer.values.data_ptr()
    write(2, b=2)
    assert len(made_room) == 3
    assert_same_contents(dyn, grow)
    for op in (lambda c: c.batch_select_indices(torch.tensor([1])), lambda c: c.reorder_cache(torch.tensor([0]))):
        op(dyn)
        op(grow)
        write(3, b=1)
        assert len(made_room) == 3
        assert_same_contents(dyn, grow)
    grow.update(torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8), 0)  # one layer written alone
    with pytest.raises(ValueError, match="one length"):
        grow.reserve(3, torch.randn(1, 2, 1, 8))


@pytest.mark.parametrize("b", [1, 3])
def test_storage_grown_together_compacts_in_two_ops(monkeypatch, b):
    """A writer's reserve grows every layer's storage as slices of one tensor (adopting what
    the layers held, regrowing past capacity); a tree round's compaction then moves every
    layer's accepted slots in that tensor at once: the same contents as a DynamicCache's
    per-layer compaction, before and after the crop, with random paths (a sequence's extra
    slots copies of its root), across a regrowth. Anything that replaces a layer's tensors
    leaves it on the per-layer path, which still agrees."""
    monkeypatch.setattr(kv_cache, "MIN_HEADROOM", 4)
    torch.manual_seed(5)
    dyn, grow = DynamicCache(), GrowingCache()

    def write(n):
        states = [(torch.randn(b, 2, n, 8), torch.randn(b, 2, n, 8)) for _ in range(3)]
        for i, (k, v) in enumerate(states):
            dyn.update(k, v, i)
        write_as_decoder_layers(grow, states)

    write(7)
    shared = grow.shared_storage()
    assert shared is not None and shared[1] == 7 and shared[0].shape[:4] == (6, b, 2, 7 + 4)
    assert all(layer._key_store.data_ptr() == shared[0][2 * i].data_ptr() for i, layer in enumerate(grow.layers))
    for n in (6, 9, 5):  # the 9 regrows the storage, together again
        write(n)
        assert grow.shared_storage() is not None
        path = torch.stack([torch.randperm(n)[:3] for _ in range(b)])
        path[:, 0] = 0  # the root first
        path[-1, 2] = 0  # a sequence that kept fewer: a copy of its root
        for c in (dyn, grow):
            compact_tree_cache(c, path, n)
        assert_same_contents(dyn, grow)
        for c in (dyn, grow):
            c.crop(-(n - 3))
        assert_same_contents(dyn, grow)
    grow.batch_repeat_interleave(1)  # replaces every layer's tensors (with copies)
    dyn.batch_repeat_interleave(1)
    assert grow.shared_storage() is None
    path = torch.zeros(b, 2, dtype=torch.long)
    for c in (dyn, grow):
        compact_tree_cache(c, path, 3)
    assert_same_contents(dyn, grow)
    write(2)  # adopted: grown together again
    assert grow.shared_storage() is not None
    assert_same_contents(dyn, grow)


def test_compaction_needs_a_path_row_per_sequence():
    """A path whose rows are not the cache's sequences is refused by name, not broadcast
    or cut."""
    c = GrowingCache()
    write_as_decoder_layers(c, [(torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)) for _ in range(3)])
    assert c.shared_storage() is not None
    with pytest.raises(ValueError, match="path must have a row per sequence"):
        compact_tree_cache(c, torch.zeros(1, 2, dtype=torch.long), 3)
