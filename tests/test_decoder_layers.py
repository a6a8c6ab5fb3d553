"""domino_ops.decoder_layers (csrc/cpu/decoder_layers.cpp): a causal LM's decoder layers in
one C++ call over the CPU kernels, bit for bit its reference, domino.fast_forward's loop
one kernel at a time (``_decoder_layers_in_python``), on random model shapes; writing the new
keys and values into the cache's storage and nothing past them; bad arguments named."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from domino import fast_forward
from domino.kv_cache import GrowingCache
from domino.loading import use_cpu_kernels
from test_fast_forward import PACKED, FastPathSpy, assert_same_outputs, needs_packed

ARCHITECTURES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                 "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def random_model(kind: str, dtype, *, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int,
                 layers: int, seed: int):
    """A random target of these shapes on the CPU kernels and the fast forward, its norm
    weights and biases random (HF initialises them to 1 and 0, which would hide a dropped one)."""
    config_cls, model_cls = ARCHITECTURES[kind]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=32, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                        max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
                        attention_bias=kind == "llama" and seed % 2 == 1, mlp_bias=kind == "llama" and seed % 3 == 1)
    model = model_cls(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape))
        # each norm its own eps (HF's configs give them one), so that one read for another shows
        g = torch.Generator().manual_seed(seed)

        def eps() -> float:
            return float(torch.empty(1).uniform_(1e-3, 0.5, generator=g))

        for layer in model.model.layers:
            layer.input_layernorm.variance_epsilon = eps()
            layer.post_attention_layernorm.variance_epsilon = eps()
            if kind == "qwen3":  # q's and k's share one (the fast forward's plan requires it)
                layer.self_attn.q_norm.variance_epsilon = layer.self_attn.k_norm.variance_epsilon = eps()
    model = model.to(dtype).eval()
    return use_cpu_kernels(model, small_batch_linear=True, small_batch_attention=True)


def grow_and_compare(model, prompts, mask, blocks, monkeypatch):
    """Prefill ``prompts`` [b, P] (real where ``mask``), then forward each block [b, k] in
    turn, into a GrowingCache (one decoder_layers call a forward) and a DynamicCache (the
    layers one kernel at a time): the same logits, hidden states and caches every time."""
    b, P = prompts.shape
    spy = FastPathSpy(monkeypatch)
    caches = (GrowingCache(), DynamicCache())
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    kw = dict(input_ids=prompts, attention_mask=mask.long(), position_ids=positions, use_cache=True,
              output_hidden_states=True)
    calls = 0
    with torch.inference_mode():
        for block in [None, *blocks]:
            if block is not None:
                k = block.shape[1]
                mask = torch.cat([mask, torch.ones(b, k, dtype=torch.bool)], 1)
                positions = positions[:, -1:] + 1 + torch.arange(k)[None]
                kw = dict(input_ids=block, attention_mask=mask.long(), position_ids=positions, use_cache=True,
                          output_hidden_states=True)
            ours, theirs = (model(past_key_values=c, **kw) for c in caches)
            calls += 1
            assert_same_outputs(ours, theirs, *caches)
    assert spy.one_calls == calls  # every forward into the GrowingCache ran the one call


@needs_packed
@pytest.mark.parametrize("dtype", PACKED)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_bit_identical_to_the_loop_on_random_shapes(dtype, data):
    """Random architectures and shapes (odd widths, grouped or not, 1-3 layers, biases,
    intermediate widths that split into whole gate and up panels or not), left-padded
    batches, then decode steps and verification blocks."""
    kind = data.draw(st.sampled_from(sorted(ARCHITECTURES)), label="kind")
    kv_heads = data.draw(st.integers(1, 3), label="kv heads")
    heads = kv_heads * data.draw(st.integers(1, 3), label="group")
    model = random_model(kind, dtype, hidden=heads * data.draw(st.integers(1, 27), label="hidden / heads"),
                         heads=heads, kv_heads=kv_heads,
                         head_dim=2 * data.draw(st.integers(1, 20), label="head dim / 2"),
                         # multiples of 48 (the packed panels' width) run the gate/up product and its
                         # activation in one parallel region (silu_mul.cpp's gate_up_silu_cpu)
                         intermediate=data.draw(st.one_of(st.integers(1, 90), st.sampled_from([48, 96, 144])),
                                                label="intermediate"),
                         layers=data.draw(st.integers(1, 3), label="layers"),
                         seed=data.draw(st.integers(0, 2 ** 16), label="seed"))
    b = data.draw(st.integers(1, 3), label="batch")
    lengths = data.draw(st.lists(st.integers(1, 12), min_size=b, max_size=b), label="prompt lengths")
    ks = data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3), label="blocks")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), label="token seed"))
    P = max(lengths)
    prompts = torch.randint(1, 32, (b, P), generator=g)
    mask = torch.arange(P)[None, :] >= (P - torch.tensor(lengths))[:, None]
    with pytest.MonkeyPatch.context() as mp:
        grow_and_compare(model, prompts, mask, [torch.randint(1, 32, (b, k), generator=g) for k in ks], mp)


@needs_packed
@pytest.mark.parametrize("intermediate", [960, 1000])
def test_bit_identical_to_the_loop_with_the_mlp_split_over_threads(intermediate, monkeypatch):
    """Widths where the gate/up product has enough panels for every thread (40 gate and 40
    up panels at 960, each thread the gate and up panels of its columns and their activation,
    csrc/cpu/silu_mul.cpp; 1,000 is not a multiple of 48: two calls), with biases: decode
    steps, a verification block and a prompt, the loop's bits."""
    model = random_model("llama", PACKED[0], hidden=192, heads=3, kv_heads=1, head_dim=64, intermediate=intermediate,
                         layers=2, seed=7)  # seed 7: mlp_bias on (7 % 3 == 1)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, 32, (2, 70), generator=g)
    mask = torch.ones(2, 70, dtype=torch.bool)
    mask[1, :5] = False
    grow_and_compare(model, prompts, mask, [torch.randint(1, 32, (2, k), generator=g) for k in (1, 16, 1)],
                     monkeypatch)


def small_model(kind="qwen3"):
    return random_model(kind, PACKED[0], hidden=24, heads=4, kv_heads=2, head_dim=8, intermediate=40, layers=2,
                        seed=3)


def op_args(model, T: int = 3, past: int = 5):
    """A valid call of the op for ``model`` (its plan's weights), T new positions after
    ``past`` cached ones: the argument list, as the schema orders it."""
    plan = fast_forward._current_plan(model)
    n_q, n_kv, d = plan.heads
    L, H = len(plan.layers), model.config.hidden_size
    dtype = PACKED[0]
    x = torch.randn(1, T, H).to(dtype)
    positions = torch.arange(past, past + T)[None]
    cos, sin = model.model.rotary_emb(x, position_ids=positions)
    stores = [[torch.randn(1, n_kv, past + T + 4, d).to(dtype) for _ in range(L)] for _ in range(2)]
    return [x, cos, sin, None, list(plan.flat_weights), list(plan.flat_heads), list(plan.flat_eps),
            list(plan.flat_scales), stores[0], stores[1], past, True]


@needs_packed
@pytest.mark.parametrize("kind", sorted(ARCHITECTURES))
def test_writes_the_new_positions_and_nothing_past_them(kind, monkeypatch):
    """The stores' slots after the new positions keep their poison (NaN); the new keys and
    values, and every output, are the loop's, which writes the same positions through
    GrowingCache.update."""
    model = random_model(kind, PACKED[0], hidden=24, heads=4, kv_heads=2, head_dim=8, intermediate=40, layers=2,
                         seed=4)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        cache = GrowingCache()
        model(input_ids=torch.randint(1, 32, (2, 7), generator=g), past_key_values=cache, use_cache=True)
        reference = copy.deepcopy(cache)
        for layer in cache.layers:  # poison every free slot
            layer._key_store[:, :, 7:] = float("nan")
            layer._value_store[:, :, 7:] = float("nan")
        block = torch.randint(1, 32, (2, 4), generator=g)
        ours = model(input_ids=block, past_key_values=cache, use_cache=True, output_hidden_states=True)
        monkeypatch.setattr(fast_forward, "_decoder_layers_in_one_call", fast_forward._decoder_layers_in_python)
        theirs = model(input_ids=block, past_key_values=reference, use_cache=True, output_hidden_states=True)
    assert_same_outputs(ours, theirs, cache, reference)
    for layer in cache.layers:
        assert layer.keys.shape[2] == 11
        assert layer._key_store[:, :, 11:].isnan().all() and layer._value_store[:, :, 11:].isnan().all()


@needs_packed
def test_the_op_runs_valid_arguments():
    """The baseline of the bad-argument cases below: op_args' call runs and returns a
    hidden state per layer, or the last one alone."""
    model = small_model()
    args = op_args(model)
    outs = torch.ops.domino_ops.decoder_layers.default(*args)
    assert len(outs) == 2 and all(o.shape == args[0].shape and torch.isfinite(o.float()).all() for o in outs)
    args[-1] = False
    last = torch.ops.domino_ops.decoder_layers.default(*args)
    assert len(last) == 1 and torch.equal(last[0], outs[-1])


def _drop_norm(args):
    args[4][10] = None  # layer 0's q_norm without its k_norm


BAD_ARGUMENTS = {
    "x must be a contiguous CPU tensor": lambda a: a.__setitem__(0, a[0][0]),
    "heads must be": lambda a: a.__setitem__(5, a[5][:3]),
    "value_stores must hold": lambda a: a.__setitem__(9, a[9][:1]),
    "weights must hold 12 entries per layer": lambda a: a.__setitem__(4, a[4][:-1]),
    r"weights\[3\] \(layer 0\) must be a tensor": lambda a: a[4].__setitem__(3, None),
    "q_norm and k_norm must both": _drop_norm,
    "eps must hold 3 per layer": lambda a: a.__setitem__(6, a[6][:-1]),
    "scale must hold one per layer": lambda a: a.__setitem__(7, a[7] + [1.0]),
    # the post-attention norm's and the next layer's input norm's eps (the fused add's norms)
    r"eps must be finite and >= 0 \(finite in float32\), got nan": lambda a: a[6].__setitem__(1, float("nan")),
    r"eps must be finite and >= 0 \(finite in float32\), got -1": lambda a: a[6].__setitem__(3, -1.0),
    "past must be >= 0": lambda a: a.__setitem__(10, -1),
    r"key_stores\[1\] must be a CPU tensor": lambda a: a[8].__setitem__(1, a[8][1][:, :, :6]),
    r"value_stores\[0\] must be a CPU tensor": lambda a: a[9].__setitem__(0, a[9][0].float()),
    "mask must be": lambda a: a.__setitem__(3, torch.ones(1, 1, 3, 4, dtype=torch.bool)),
    # stores written over each other, over themselves or over a weight (silent wrong answers before)
    r"(key|value)_stores\[0\] and (key|value)_stores\[0\] share memory": lambda a: a[9].__setitem__(0, a[8][0]),
    r"key_stores\[[01]\] and key_stores\[[01]\] share memory": lambda a: a[8].__setitem__(1, a[8][0]),
    r"key_stores\[0\] must not overlap itself": lambda a: a[8].__setitem__(
        0, a[8][0][:, :, :1].expand(-1, -1, a[8][0].shape[2], -1)),
    # slots one element apart: slot s + 1 holds slot s's last d - 1 values
    r"value_stores\[1\] must not overlap itself": lambda a: a[9].__setitem__(
        1, a[9][1].as_strided(a[9][1].shape, (a[9][1].stride(0), a[9][1].stride(1), 1, 1))),
    r"key_stores\[0\] must not share memory with weights\[0\]": lambda a: a[4].__setitem__(
        0, a[8][0].view(-1)[:a[4][0].numel()]),
    "heads are too large": lambda a: a.__setitem__(5, [2 ** 61, 1, 8, 12]),
    r"past must be >= 0 \(and past": lambda a: a.__setitem__(10, 2 ** 63 - 2),
    # cos, sin or the mask inside a store: layer 0 wrote its keys over them before layer 1
    # read them (a silent wrong answer before)
    r"key_stores\[0\] must not share memory with cos": lambda a: a.__setitem__(1, within(a[8][0], a[1])),
    r"value_stores\[1\] must not share memory with sin": lambda a: a.__setitem__(2, within(a[9][1], a[2])),
    r"key_stores\[1\] must not share memory with mask": lambda a: a.__setitem__(
        3, within(a[8][1], torch.zeros(1, 1, 3, 8, dtype=a[8][1].dtype))),
}


def within(store: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A tensor of ``like``'s shape, dtype and values on ``store``'s first bytes."""
    view = store.view(-1)[:like.numel()].view(like.shape)
    view.copy_(like)
    return view


@needs_packed
def test_fake_kernel():
    """Its fake kernel gives the outputs' shapes (every layer's, or the last one's), and a
    meta tensor among CPU ones is refused by name."""
    args = op_args(small_model())
    for keep_hidden in (True, False):
        args[-1] = keep_hidden
        torch.library.opcheck(torch.ops.domino_ops.decoder_layers.default, tuple(args),
                              test_utils=("test_schema", "test_faketensor"))
    args[1] = args[1].to("meta")
    with pytest.raises(RuntimeError, match="decoder_layers: every tensor must be on one device, got x on cpu, cos on meta"):
        torch.ops.domino_ops.decoder_layers.default(*args)
    # a store or a weight on meta too (the fake had returned uninitialised outputs)
    for lists, index, name in ((8, 1, r"key_stores\[1\] on meta"), (4, 1, r"weights\[1\] on meta")):
        args = op_args(small_model())
        args[lists][index] = args[lists][index].to("meta")
        with pytest.raises(RuntimeError, match="decoder_layers: every tensor must be on one device, .*" + name):
            torch.ops.domino_ops.decoder_layers.default(*args)


@needs_packed
@pytest.mark.parametrize("message", sorted(BAD_ARGUMENTS))
def test_bad_arguments_are_named(message):
    args = op_args(small_model())
    BAD_ARGUMENTS[message](args)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.domino_ops.decoder_layers.default(*args)
