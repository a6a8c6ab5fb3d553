"""The drafter's context. domino.draft_context.DraftContextCache: stores that grow in place.
Its views equal the concatenation of what was appended through regrowth, scratch written
into its room and lengths set back; drafts from a cache grown a few slots at a time, with
drafts in between, are those from the whole context appended at once; a cache filled under
inference mode is drafted from under no_grad; training's autograd runs through it.
domino_ops.draft_context (csrc/cpu/draft_context.cpp): an extension of the context in one C++
call, bit for bit its reference (extend_context's modules on the fused forwards) on random
drafters and contexts, writing only the new slots; taken only where those forwards would run
the kernels; bad arguments named."""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from domino.draft_context import DraftContextCache
from domino.fast_layers import use_fused_layers
from domino.fast_linear import undo_small_batch_linear, use_small_batch_linear
from domino.model import DominoDraftModel
from packed_paths import PACKED, needs_packed
from tiny_models import cpu_target, fused_drafter, tiny_drafter


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


# ---- domino_ops.draft_context -----------------------------------------------------------


def extend_both_ways(d, b: int, sizes: list[int], seed: int):
    """Two caches extended by slots of ``sizes`` (random features, positions with holes,
    some slots hidden), one through the op, one through the modules; the op's calls."""
    calls, op = [], torch.ops.domino_ops.draft_context.default

    def counting(*args):
        calls.append(args)
        return op(*args)

    caches = []
    for through_op in (True, False):
        g = torch.Generator().manual_seed(seed)
        cache = d.new_cache(b, "cpu", d.fc.weight.dtype)
        start = torch.zeros(b, dtype=torch.long)
        with torch.inference_mode(), mock.patch.object(torch.ops.domino_ops.draft_context, "default", counting):
            with mock.patch.object(DominoDraftModel, "_fused_context_weights",
                                   DominoDraftModel._fused_context_weights if through_op else (lambda *a: None)):
                for T in sizes:
                    features = torch.randn(b, T, d.fc.in_features, generator=g).to(d.fc.weight.dtype)
                    positions = start[:, None] + torch.randint(0, 2, (b, T), generator=g).cumsum(-1)
                    start = start + T + 1
                    valid = torch.rand(b, T, generator=g) < 0.8
                    cache.reserve(T + 7)  # room past the new slots, poisoned: the op writes the new slots alone
                    for store in cache.key_stores + cache.value_stores:
                        store[:, :, cache.length:] = float("nan")
                    d.extend_context(cache, features, positions, valid)
        caches.append(cache)
    return caches, calls


@needs_packed
@pytest.mark.parametrize("dtype", PACKED)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_the_op_is_bit_identical_to_the_modules(dtype, data):
    """Random drafters (1-3 layers, their own norm weights and eps), 1-3 sequences, three
    extensions of 0-12 slots: the same keys, values and mask, bit for bit, and one op call
    per extension."""
    d = fused_drafter(dtype, layers=data.draw(st.integers(1, 3), label="layers"),
                      seed=data.draw(st.integers(0, 999), label="seed"))
    d.hidden_norm.variance_epsilon = data.draw(st.floats(1e-3, 0.5), label="hidden eps")
    sizes = data.draw(st.lists(st.integers(0, 12), min_size=3, max_size=3), label="slots")
    (ours, theirs), calls = extend_both_ways(d, data.draw(st.integers(1, 3), label="batch"), sizes,
                                             data.draw(st.integers(0, 999), label="data seed"))
    assert len(calls) == len(sizes)
    assert ours.length == theirs.length == sum(sizes)
    assert torch.equal(ours.mask, theirs.mask)
    for a, e in zip(ours.keys + ours.values, theirs.keys + theirs.values, strict=True):
        assert torch.equal(a, e)  # NaN in a slot the op left unwritten fails here


@needs_packed
def test_drafts_from_the_op_context_are_the_modules_drafts():
    d = fused_drafter(PACKED[0], layers=2, seed=11)
    (ours, theirs), _ = extend_both_ways(d, 2, [9, 3], 12)
    anchor, anchor_pos = torch.tensor([3, 7]), torch.tensor([14, 14])
    with torch.inference_mode():
        assert torch.equal(d.draft(ours, anchor, anchor_pos).tokens, d.draft(theirs, anchor, anchor_pos).tokens)


@needs_packed
def test_the_op_is_not_taken_where_the_modules_would_not_run_the_kernels():
    """Autograd (training), an unswitched norm, a context projection off the kernel: the
    modules run."""
    d = fused_drafter(PACKED[0], layers=2, seed=5)
    f = torch.randn(1, 3, d.fc.in_features).to(d.fc.weight.dtype)
    with torch.inference_mode():
        assert d._fused_context_weights(f) is not None
    assert d._fused_context_weights(f) is None  # grad mode on and the weights require grad
    d.requires_grad_(False)
    assert d._fused_context_weights(f) is not None
    del d.layers[1].self_attn.k_norm.forward, d.layers[1].self_attn.k_norm._domino_fused_layer
    assert d._fused_context_weights(f) is None
    d = fused_drafter(PACKED[0], layers=1, seed=5).requires_grad_(False)
    undo_small_batch_linear(d.fc)
    with torch.inference_mode():
        assert d._fused_context_weights(f) is None


@needs_packed
def test_changed_weights_are_read_again():
    """A projection's weight changed in place, an eps changed: the op still equals the modules."""
    d = fused_drafter(PACKED[0], layers=2, seed=9)
    for change in (lambda: d.layers[1].self_attn.v_proj.weight.mul_(1.5), lambda: d.fc.weight.mul_(0.5),
                   lambda: setattr(d.layers[0].self_attn.k_norm, "variance_epsilon", 0.3)):
        with torch.no_grad():
            change()
        (ours, theirs), calls = extend_both_ways(d, 1, [5], 3)
        assert calls and all(torch.equal(a, e) for a, e in zip(ours.keys + ours.values, theirs.keys + theirs.values))


def op_args(d, T: int = 4):
    cache = d.new_cache(1, "cpu", d.fc.weight.dtype)
    with torch.inference_mode():
        features = torch.randn(1, T, d.fc.in_features).to(d.fc.weight.dtype)
        cos, sin = d.rotary(torch.arange(T)[None], features.dtype)
        fc, fc_bias, norm_weight, norm_eps, weights, heads, eps = d._fused_context_weights(features)
        cache.reserve(T)
    return [features, cos[:, 0], sin[:, 0], fc, fc_bias, norm_weight, norm_eps, list(cache.key_stores),
            list(cache.value_stores), 0, list(weights), list(heads), list(eps)]


OP_BAD_ARGUMENTS = {
    "features must be a contiguous CPU tensor": lambda a: a.__setitem__(0, a[0][0]),
    "heads must be": lambda a: a.__setitem__(11, a[11][:1]),
    "past must be >= 0": lambda a: a.__setitem__(9, -1),
    "value_stores must hold": lambda a: a.__setitem__(8, a[8][:1]),
    # no room for the 4 new slots past capacity - 3
    r"key_stores\[0\] must be a CPU tensor \[1, \d+, >= \d+, \d+\]": lambda a: a.__setitem__(9, a[7][0].shape[2] - 3),
    r"key_stores\[1\] must be a CPU tensor": lambda a: a[7].__setitem__(1, a[7][1][:, :1]),
    r"value_stores\[0\] must be a CPU tensor": lambda a: a[8].__setitem__(0, a[8][0].float()),
    "weights must hold 3 entries per layer": lambda a: a.__setitem__(10, a[10][:-1]),
    r"weights\[2\] \(layer 0\) must be a tensor": lambda a: a[10].__setitem__(2, None),
    "eps must hold one per layer": lambda a: a.__setitem__(12, a[12][:-1]),
    "hidden_norm_weight must be a tensor": lambda a: a.__setitem__(5, a[5][None]),
    r"weights\[0\] \(layer 0\) must be the k and v projections'": lambda a: a[10].__setitem__(0, a[3]),  # fc's panels
    r"weights\[5\] \(layer 1\), k_norm's, must be": lambda a: a[10].__setitem__(5, a[10][5][:-1]),
    r"weights\[1\] \(layer 0\) must be None or": lambda a: a[10].__setitem__(1, torch.zeros(3)),
    "fc_packed must be fc's": lambda a: a.__setitem__(3, a[10][0]),  # k/v's panels for fc's
    "fc_packed must be a CPU tensor of features' dtype": lambda a: a.__setitem__(3, a[3].float()),
    "fc_bias must be None or": lambda a: a.__setitem__(4, torch.zeros(5)),
    "hidden_norm_weight must be a contiguous CPU tensor": lambda a: a.__setitem__(5, a[5].float()),
    "cos must be a CPU tensor": lambda a: a.__setitem__(1, a[1][:, :-1]),
    "sin must be a CPU tensor": lambda a: a.__setitem__(2, a[2].float()),
    "past must be >= 0 \\(and past": lambda a: a.__setitem__(9, 2 ** 63 - 2),
    r"(key|value)_stores\[0\] and (key|value)_stores\[0\] share memory": lambda a: a[8].__setitem__(0, a[7][0]),
    r"key_stores\[0\] must not share memory with hidden_norm_weight": lambda a: a.__setitem__(
        5, a[7][0].view(-1)[:a[5].numel()]),
    "heads are too large": lambda a: a.__setitem__(11, [2 ** 61, 8]),
}


@needs_packed
@pytest.mark.parametrize("message", sorted(OP_BAD_ARGUMENTS))
def test_the_ops_bad_arguments_are_named(message):
    args = op_args(fused_drafter(PACKED[0], layers=2, seed=8))
    OP_BAD_ARGUMENTS[message](args)
    with pytest.raises(RuntimeError, match=message), torch.inference_mode():
        torch.ops.domino_ops.draft_context.default(*args)


@needs_packed
def test_extend_context_names_mismatched_slots_and_takes_a_cache_of_another_dtype():
    """valid and positions of another shape than the features' slots: a ValueError naming
    them (before, through either path); a cache of another dtype than the features (a public
    new_cache argument): the modules' path, which casts into it, as before the op."""
    d = fused_drafter(PACKED[0], layers=2, seed=6)
    f = torch.randn(1, 3, d.fc.in_features).to(d.fc.weight.dtype)
    cache = d.new_cache(1, "cpu", d.fc.weight.dtype)
    with torch.inference_mode():
        with pytest.raises(ValueError, match=r"valid must have shape \[1, 3\]"):
            d.extend_context(cache, f, torch.arange(3)[None], torch.ones(1, 5, dtype=torch.bool))
        with pytest.raises(ValueError, match=r"positions must have shape \[1, 3\]"):
            d.extend_context(cache, f, torch.arange(2)[None], torch.ones(1, 3, dtype=torch.bool))
        assert cache.length == 0
        other = torch.float32 if d.fc.weight.dtype == torch.bfloat16 else torch.bfloat16
        wide = d.new_cache(1, "cpu", other)
        d.extend_context(wide, f, torch.arange(3)[None], torch.ones(1, 3, dtype=torch.bool))
        d.extend_context(cache, f, torch.arange(3)[None], torch.ones(1, 3, dtype=torch.bool))
    assert wide.length == 3 and all(torch.equal(a.to(other), e) for a, e in zip(cache.keys, wide.keys))


@needs_packed
def test_fixed_context_weights_are_looked_up_once():
    from domino import fast_layers

    d = fused_drafter(PACKED[0], layers=2, seed=4)
    looked_up, lookup = [], fast_layers.draft_context_weights
    with mock.patch.object(fast_layers, "draft_context_weights", lambda *a: looked_up.append(a) or lookup(*a)):
        extend_both_ways(d, 1, [3, 2], 1)
        assert len(looked_up) == 2
        looked_up.clear()
        with d.weights_fixed():
            extend_both_ways(d, 1, [3, 2], 1)
        assert len(looked_up) == 1
