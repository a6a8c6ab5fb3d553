"""domino_ops.draft_layers (csrc/cpu/draft_layers.cpp): a Domino drafter's backbone layers in
one C++ call, bit for bit its reference, the layers' fused Python forwards
(domino.fast_layers), on random drafter shapes, contexts with hidden slots, row ranges and
per-query masks; taken only where those forwards would run the kernels; bad arguments named."""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from domino.fast_linear import use_small_batch_linear
from domino.model import DominoDraftModel
from packed_paths import PACKED, needs_packed
from tiny_models import fused_drafter



def context(d, b: int, T: int, seed: int):
    """A context cache of T slots per sequence, some hidden (left padding, holes)."""
    g = torch.Generator().manual_seed(seed)
    valid = torch.rand(b, T, generator=g) < 0.8
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    cache = d.new_cache(b, "cpu", d.fc.weight.dtype)
    with torch.inference_mode():
        d.extend_context(cache, torch.randn(b, T, d.fc.in_features, generator=g).to(d.fc.weight.dtype), pos, valid)
    anchor_pos = pos[:, -1] + 1 if T else torch.zeros(b, dtype=torch.long)
    return cache, torch.randint(0, 63, (b,), generator=g), anchor_pos


def poison_room(cache, slots: int) -> None:
    """NaN in the stores' room past the context (the op must write every slot it reads)."""
    with torch.inference_mode():
        cache.reserve(slots)
        for store in cache.key_stores + cache.value_stores:
            store[:, :, cache.length:] = float("nan")


def both_paths(d, fn):
    """fn() through the one call and through the layers' Python forwards."""
    with torch.inference_mode():
        ours = fn()
        with mock.patch.object(DominoDraftModel, "_fused_layer_weights", lambda *a: None):
            theirs = fn()
    return ours, theirs


@needs_packed
@pytest.mark.parametrize("dtype", PACKED)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_bit_identical_to_the_layers_on_random_drafters(dtype, data):
    """Random drafters (1-3 layers, block 3-16) and contexts (0-40 slots, some hidden,
    1-3 sequences), every range of draft rows, generation's mask and a per-query one."""
    layers = data.draw(st.integers(1, 3), label="layers")
    block = data.draw(st.integers(3, 16), label="block")
    d = fused_drafter(dtype, layers=layers, seed=data.draw(st.integers(0, 999), label="seed"), block_size=block)
    b = data.draw(st.integers(1, 3), label="batch")
    T = data.draw(st.integers(0, 40), label="context")
    cache, anchor, anchor_pos = context(d, b, T, data.draw(st.integers(0, 999), label="context seed"))
    start = data.draw(st.integers(0, block - 1), label="first row")
    rows = data.draw(st.sampled_from([None, slice(start, data.draw(st.integers(start + 1, block), label="end"))]),
                     label="rows")
    block_ids, positions = d.block_input(anchor, anchor_pos)
    mask = torch.cat([cache.mask, cache.mask.new_ones(b, block)], dim=1)[:, None, :]
    if data.draw(st.booleans(), label="per-query mask (training's)"):
        g = torch.Generator().manual_seed(T)
        mask = mask.expand(b, block, T + block) & (torch.rand(b, block, T + block, generator=g) < 0.7)
        mask[..., T:] |= torch.eye(block, dtype=torch.bool)
    calls = []
    op = torch.ops.domino_ops.draft_layers.default

    def counting(*args):
        calls.append(args)
        return op(*args)

    poison_room(cache, 2 * block)
    context_before = [t.clone() for t in cache.keys + cache.values]
    with mock.patch.object(torch.ops.domino_ops.draft_layers, "default", counting):
        ours, theirs = both_paths(d, lambda: d.backbone(cache, block_ids, positions, mask, rows))
    assert len(calls) == 1  # the one call ran (and the reference did not)
    # the context's slots untouched (the block went into the room)
    assert all(torch.equal(a, e) for a, e in zip(cache.keys + cache.values, context_before, strict=True))
    assert ours.shape == theirs.shape == (b, block if rows is None else rows.stop - rows.start, d.config.hidden_size)
    assert torch.equal(ours, theirs)


@needs_packed
def test_drafts_are_the_layers_drafts():
    """Chains and trees drafted through the one call are the Python layers' (greedy)."""
    d = fused_drafter(PACKED[0], layers=2, seed=3)
    cache, anchor, anchor_pos = context(d, 2, 13, 4)
    for fn in (lambda: d.draft(cache, anchor, anchor_pos, num_drafts=5).tokens,
               lambda: d.draft_tree(cache, anchor, anchor_pos, topk=2, depth=3).candidates):
        ours, theirs = both_paths(d, fn)
        assert torch.equal(ours, theirs)


@needs_packed
def test_not_taken_where_the_layers_would_not_run_the_kernels():
    """Autograd (training), a float mask, an unswitched module: the Python layers run."""
    d = fused_drafter(PACKED[0], layers=2, seed=5)
    cache, anchor, anchor_pos = context(d, 1, 6, 6)
    block_ids, positions = d.block_input(anchor, anchor_pos)
    x = d.embed_tokens(block_ids).to(d.fc.weight.dtype)
    mask = torch.cat([cache.mask, cache.mask.new_ones(1, block_ids.shape[1])], dim=1)[:, None, :]
    with torch.inference_mode():
        assert d._fused_layer_weights(x, mask, None) is not None
        assert d._fused_layer_weights(x, mask.float(), None) is None
        assert d._fused_layer_weights(x, mask, slice(0, 8, 2)) is None
    xd = x.detach()
    assert d._fused_layer_weights(xd, mask, None) is None  # grad mode on and the layers' weights require grad
    d.fc.requires_grad_(False)  # a frozen context projection: the layers still train
    assert d._fused_layer_weights(xd, mask, None) is None
    d.layers.requires_grad_(False)
    assert d._fused_layer_weights(x, mask, None) is None  # x itself needs a graph (the embedding trains)
    assert d._fused_layer_weights(xd, mask, None) is not None  # nothing needs one
    del d.layers[1].mlp.forward  # one module back on its own forward
    del d.layers[1].mlp._domino_fused_layer
    with torch.inference_mode():
        assert d._fused_layer_weights(x, mask, None) is None


def op_args(d, T: int = 5):
    cache, anchor, anchor_pos = context(d, 1, T, 7)
    block_ids, positions = d.block_input(anchor, anchor_pos)
    with torch.inference_mode():
        x = d.embed_tokens(block_ids).to(d.fc.weight.dtype)
        cos, sin = d.rotary(positions, x.dtype)
        mask = torch.cat([cache.mask, cache.mask.new_ones(1, block_ids.shape[1])], dim=1)[:, None, :]
        weights, heads, eps = d._fused_layer_weights(x, mask, None)
        cache.reserve(2 * block_ids.shape[1] - 1)
    return [x, cos[:, 0], sin[:, 0], mask, list(cache.key_stores), list(cache.value_stores), cache.length,
            list(weights), list(heads), list(eps), 1, 5]


BAD_ARGUMENTS = {
    "x must be a contiguous CPU tensor": lambda a: a.__setitem__(0, a[0][0]),
    "value_stores must hold": lambda a: a.__setitem__(5, a[5][:1]),
    # no room for the block's 8 keys and 7 hidden zeros past the context's 5 slots
    r"key_stores\[1\] must be a CPU tensor \[1, \d+, >= 20, \d+\]": lambda a: a[4].__setitem__(1, a[4][1][:, :, :19]),
    r"value_stores\[0\] must be a CPU tensor": lambda a: a[5].__setitem__(0, a[5][0].float()),
    "past must be >= 0": lambda a: a.__setitem__(6, -1),
    "weights must hold 12 entries per layer": lambda a: a.__setitem__(7, a[7][:-1]),
    "q_norm and k_norm must be given": lambda a: (a[7].__setitem__(10, None), a[7].__setitem__(11, None)),
    "eps must hold 3 per layer": lambda a: a.__setitem__(9, a[9][:-1]),
    # the post-attention norm's and the next layer's input norm's eps (the fused add's norms)
    r"eps must be finite and >= 0 \(finite in float32\), got nan": lambda a: a[9].__setitem__(1, float("nan")),
    r"eps must be finite and >= 0 \(finite in float32\), got -1": lambda a: a[9].__setitem__(3, -1.0),
    "row_start and row_stop": lambda a: a.__setitem__(11, 99),
    "mask must be a CPU bool tensor": lambda a: a.__setitem__(3, a[3].float()),
    "heads must be": lambda a: a.__setitem__(8, a[8][:3]),
    r"(key|value)_stores\[0\] and (key|value)_stores\[0\] share memory": lambda a: a[5].__setitem__(0, a[4][0]),
    "heads are too large": lambda a: a.__setitem__(8, [2 ** 61, 1, 8, 12]),
    r"past must be >= 0 \(and past": lambda a: a.__setitem__(6, 2 ** 63 - 2),
    # cos, sin or the mask inside a store: layer 0 wrote its keys over them before layer 1
    # read them (a silent wrong answer before)
    r"key_stores\[0\] must not share memory with cos": lambda a: a.__setitem__(1, within(a[4][0], a[1])),
    r"value_stores\[1\] must not share memory with sin": lambda a: a.__setitem__(2, within(a[5][1], a[2])),
    r"key_stores\[1\] must not share memory with mask": lambda a: a.__setitem__(
        3, within(a[4][1].view(torch.uint8), a[3].view(torch.uint8)).view(torch.bool)),
}


def within(store: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s shape, dtype and values on ``store``'s first bytes."""
    with torch.inference_mode():  # the stores are the drafter's cache's inference tensors
        view = store.view(-1)[:like.numel()].view(like.shape)
        view.copy_(like)
    return view


@needs_packed
def test_the_op_runs_valid_arguments():
    args = op_args(fused_drafter(PACKED[0], layers=2, seed=8))
    with torch.inference_mode():
        out = torch.ops.domino_ops.draft_layers.default(*args)
    assert out.shape == (1, 4, args[0].shape[-1]) and torch.isfinite(out.float()).all()


@needs_packed
def test_fake_kernel():
    """Its fake kernel gives the block rows' shape, and a meta tensor among CPU ones is
    refused by name."""
    args = op_args(fused_drafter(PACKED[0], layers=2, seed=8))
    with torch.inference_mode():
        torch.library.opcheck(torch.ops.domino_ops.draft_layers.default, tuple(args),
                              test_utils=("test_schema", "test_faketensor"))
        sin, args[2] = args[2], args[2].to("meta")
        with pytest.raises(RuntimeError, match="draft_layers: every tensor must be on one device, got x on cpu, cos on cpu, sin on meta"):
            torch.ops.domino_ops.draft_layers.default(*args)
        args[2] = sin
        args[5][0] = args[5][0].to("meta")  # a value store (the fake had returned an uninitialised block)
        with pytest.raises(RuntimeError, match=r"draft_layers: every tensor must be on one device, .*value_stores\[0\] on meta"):
            torch.ops.domino_ops.draft_layers.default(*args)


@needs_packed
@pytest.mark.parametrize("message", sorted(BAD_ARGUMENTS))
def test_bad_arguments_are_named(message):
    args = op_args(fused_drafter(PACKED[0], layers=2, seed=8))
    BAD_ARGUMENTS[message](args)
    with pytest.raises(RuntimeError, match=message), torch.inference_mode():
        torch.ops.domino_ops.draft_layers.default(*args)


@needs_packed
def test_changed_weights_and_switches_are_read_again():
    """A weight changed in place, a module replaced, an eps changed, an activation replaced
    or a switch undone is seen at the next call (the one call still equals the layers, or
    the layers run)."""
    d = fused_drafter(PACKED[0], layers=2, seed=9)
    cache, anchor, anchor_pos = context(d, 1, 9, 10)
    block_ids, positions = d.block_input(anchor, anchor_pos)

    def check():
        ours, theirs = both_paths(d, lambda: d.backbone(cache, block_ids, positions))
        assert torch.equal(ours, theirs)
        return ours

    first = check()
    with torch.no_grad():
        d.layers[1].self_attn.o_proj.weight.mul_(1.5)
    assert not torch.equal(check(), first)
    down = d.layers[0].mlp.down_proj
    d.layers[0].mlp.down_proj = use_small_batch_linear(torch.nn.Linear(down.in_features, down.out_features,
                                                                       bias=False).to(down.weight.dtype))
    check()
    d.layers[0].post_attention_layernorm.variance_epsilon *= 3
    silu = check()
    d.layers[1].mlp.act_fn = torch.nn.GELU()  # the op computes SiLU: the layers run, GELU
    assert not torch.equal(check(), silu)
    del d.layers[0].input_layernorm.forward, d.layers[0].input_layernorm._domino_fused_layer
    x = d.embed_tokens(block_ids).to(d.fc.weight.dtype)
    mask = torch.cat([cache.mask, cache.mask.new_ones(1, block_ids.shape[1])], dim=1)[:, None, :]
    with torch.inference_mode():
        assert d._fused_layer_weights(x, mask, None) is None


@needs_packed
def test_fixed_weights_are_looked_up_once():
    """Inside weights_fixed the layers' weights are looked up once per dtype, not at every
    backbone forward, and the drafts are the same; blocks nest; a change made inside is
    seen after the outermost block (the generator holds its drafter fixed for one call)."""
    from domino import fast_layers

    d = fused_drafter(PACKED[0], layers=2, seed=4)
    cache, anchor, anchor_pos = context(d, 2, 11, 4)
    looked_up = []
    lookup = fast_layers.draft_layer_weights

    def draft():
        return d.draft_tree(cache, anchor, anchor_pos, topk=2, depth=3).candidates

    with mock.patch.object(fast_layers, "draft_layer_weights", lambda *a: looked_up.append(a) or lookup(*a)):
        free = [draft() for _ in range(3)]
        assert len(looked_up) == 3
        looked_up.clear()
        with d.weights_fixed():
            fixed = [draft() for _ in range(2)]
            with d.weights_fixed():
                fixed.append(draft())
                with torch.no_grad():
                    d.layers[1].mlp.down_proj.weight.mul_(3.0)  # not seen inside (the promise broken)
            fixed.append(draft())
        assert len(looked_up) == 1
        assert all(torch.equal(a, b) for a, b in zip(free + free[:1], fixed, strict=True))
        changed = draft()
    assert len(looked_up) == 2 and "_domino_weights_fixed" not in vars(d)
    assert not torch.equal(changed, fixed[0])
