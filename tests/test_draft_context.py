"""domino.draft_context.DraftContextCache: the drafter's context in stores that grow in
place. Its views equal the concatenation of what was appended through regrowth, scratch
written into its room and lengths set back; drafts from a cache grown a few slots at a time,
with drafts in between, are those from the whole context appended at once; a cache filled
under inference mode is drafted from under no_grad; training's autograd runs through it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from domino.draft_context import DraftContextCache
from domino.fast_layers import use_fused_layers
from domino.fast_linear import use_small_batch_linear
from tiny_models import cpu_target, tiny_drafter


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_views_are_the_concatenation(data):
    """Random appends (0-300 slots, so the stores regrow), scratch written past the length
    between them and lengths set back: keys, values and mask are always the concatenation
    of what was appended and kept."""
    b, layers = data.draw(st.integers(1, 3), label="batch"), data.draw(st.integers(1, 3), label="layers")
    h, d = 2, 4
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 999), label="seed"))
    cache = DraftContextCache(b, layers, h, d, device="cpu", dtype=torch.bfloat16)
    keys = [torch.empty(b, h, 0, d, dtype=torch.bfloat16) for _ in range(layers)]
    values = [k.clone() for k in keys]
    mask = torch.zeros(b, 0, dtype=torch.bool)
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        action = data.draw(st.sampled_from(["append", "scratch", "set back"]), label="action")
        if action == "append":
            T = data.draw(st.integers(0, 300), label="slots")
            new_k = [torch.randn(b, h, T, d, generator=g).bfloat16() for _ in range(layers)]
            new_v = [torch.randn(b, h, T, d, generator=g).bfloat16() for _ in range(layers)]
            valid = torch.rand(b, T, generator=g) < 0.7
            cache.append(new_k, new_v, valid)
            keys = [torch.cat([k, n], 2) for k, n in zip(keys, new_k)]
            values = [torch.cat([v, n], 2) for v, n in zip(values, new_v)]
            mask = torch.cat([mask, valid], 1)
        elif action == "scratch":  # as draft_layers uses the room
            slots = data.draw(st.integers(1, 40), label="scratch slots")
            cache.reserve(slots)
            for store in cache.key_stores + cache.value_stores:
                store[:, :, cache.length:cache.length + slots] = float("nan")
            cache.mask_store[:, cache.length:cache.length + slots] = True
        else:
            T = data.draw(st.integers(0, cache.length), label="length")
            cache.length = T
            keys, values, mask = [k[:, :, :T] for k in keys], [v[:, :, :T] for v in values], mask[:, :T]
        assert cache.capacity >= cache.length == mask.shape[1]
        assert all(torch.equal(a, e) for a, e in zip(cache.keys, keys, strict=True))
        assert all(torch.equal(a, e) for a, e in zip(cache.values, values, strict=True))
        assert torch.equal(cache.mask, mask)


def test_regrowth_doubles():
    """Appending one slot at a time regrows the stores a logarithmic number of times."""
    cache = DraftContextCache(1, 2, 1, 2, device="cpu", dtype=torch.float32)
    stores = set()
    for _ in range(3000):
        cache.append([torch.ones(1, 1, 1, 2)] * 2, [torch.ones(1, 1, 1, 2)] * 2, torch.ones(1, 1, dtype=torch.bool))
        stores.add(cache.key_stores[0].data_ptr())
    assert len(stores) <= 6 and cache.length == 3000


def _drafter(dtype, fused: bool):
    tgt = cpu_target("qwen3", dtype)
    d = use_small_batch_linear(tiny_drafter(tgt, num_hidden_layers=2, seed=5).to(dtype).bind_target(tgt))
    return use_fused_layers(d) if fused else d


@pytest.mark.parametrize("fused", [False, True])
def test_drafts_from_a_grown_cache_are_those_of_one_append(fused):
    """A context appended a few slots at a time, drafting between the appends (the one-call
    path writes the block into the room each time), drafts what the same context appended
    at once drafts, greedy chains and trees (bit for bit: the same kernels on each slot)."""
    dtype = torch.bfloat16
    d = _drafter(dtype, fused)
    g = torch.Generator().manual_seed(2)
    T = 700  # past the first capacity (256 slots of headroom): regrowth during the rounds
    feats = torch.randn(2, T, d.fc.in_features, generator=g).to(dtype)
    valid = torch.rand(2, T, generator=g) < 0.9
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    anchor = torch.randint(0, 63, (2,), generator=g)
    with torch.inference_mode():
        grown = d.new_cache(2, "cpu", dtype)
        cut = 0
        while cut < T:
            step = min(T - cut, int(torch.randint(1, 90, (1,), generator=g)))
            d.extend_context(grown, feats[:, cut:cut + step], pos[:, cut:cut + step], valid[:, cut:cut + step])
            cut += step
            d.draft(grown, anchor, pos[:, cut - 1] + 1, num_drafts=5)
        whole = d.new_cache(2, "cpu", dtype)
        d.extend_context(whole, feats, pos, valid)
        anchor_pos = pos[:, -1] + 1
        for fn in (lambda c: d.draft(c, anchor, anchor_pos, num_drafts=6).tokens,
                   lambda c: d.draft(c, anchor, anchor_pos, num_drafts=6).vocab_logits,
                   lambda c: d.draft_tree(c, anchor, anchor_pos, topk=2, depth=3).candidates):
            assert torch.equal(fn(grown), fn(whole))
        assert all(torch.equal(a, b) for a, b in zip(grown.keys, whole.keys, strict=True))


def test_filled_in_inference_mode_drafted_under_no_grad():
    """Stores made under inference_mode are copied when first written outside it (torch
    forbids the write), with the same drafts."""
    d = _drafter(torch.bfloat16, fused=True)
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(1, 9, d.fc.in_features, generator=g).bfloat16()
    pos, valid = torch.arange(9)[None], torch.ones(1, 9, dtype=torch.bool)
    with torch.inference_mode():
        cache = d.new_cache(1, "cpu", torch.bfloat16)
        d.extend_context(cache, feats, pos, valid)
        expected = d.draft(cache, torch.tensor([4]), torch.tensor([9]), num_drafts=4).tokens
    with torch.no_grad():
        got = d.draft(cache, torch.tensor([4]), torch.tensor([9]), num_drafts=4).tokens
    assert torch.equal(got, expected) and not cache.key_stores[0].is_inference()


def test_training_gradients_reach_the_context_projection():
    """packed_draft_hidden (training) appends a context that needs a graph: the gradient
    reaches fc and the layers' k/v projections, as it did through torch.cat."""
    d = _drafter(torch.float32, fused=False)
    g = torch.Generator().manual_seed(4)
    N, Tc, B = 2, 12, d.config.block_size
    feats = torch.randn(N, Tc, d.fc.in_features, generator=g)
    block = torch.randint(0, 63, (N, B), generator=g)
    block_pos = Tc + torch.arange(B).expand(N, B)
    mask = torch.ones(N, B, Tc + B, dtype=torch.bool)
    d.packed_draft_hidden(feats, torch.ones(N, Tc, dtype=torch.bool), block, block_pos, mask).square().sum().backward()
    assert d.fc.weight.grad is not None and d.fc.weight.grad.abs().sum() > 0
    assert all(layer.self_attn.k_proj.weight.grad.abs().sum() > 0 for layer in d.layers)
