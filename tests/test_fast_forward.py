"""domino.fast_forward: a Llama / Qwen2 / Qwen3 target's forward as one loop over the CPU
kernels, bit for bit the switched HF forward."""

import copy
import functools
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from domino import fast_forward
from domino.fast_attention import use_small_batch_attention
from domino.fast_forward import undo_fast_forward, use_fast_forward, uses_fast_forward
from domino.fast_layers import use_fused_layers
from domino.fast_linear import use_small_batch_linear
from packed_paths import PACKED, needs_packed  # noqa: F401  (test_decoder_layers imports them from here)
from tiny_models import IdTokenizer, cpu_target, tiny_drafter

# The dtypes whose linears run the packed kernel on this CPU: the fast forward's domain.


def switched_target(kind="llama", dtype=torch.bfloat16, seed=0):
    """A tiny target on every CPU kernel (as domino.loading.use_cpu_kernels sets it up)."""
    model = cpu_target(kind, dtype, attn="small_batch", seed=seed)
    return use_fast_forward(use_fused_layers(use_small_batch_linear(model)))


KINDS = ["llama", "qwen2", "qwen3"]  # Qwen2: biased q/k/v; Qwen3: q and k normalised per head


@functools.cache
def shared_target(kind, dtype):
    return switched_target(kind, dtype)


class FastPathSpy:
    """Counts the layers the fast path computed (its packed products: in Python, or 4 a
    layer in one ``domino_ops.decoder_layers`` call, counted in ``one_calls``), so a test
    knows it compared the fast path and not HF's forward with itself."""

    def __init__(self, monkeypatch):
        self.products = 0
        self.one_calls = 0
        product, one_call = fast_forward._product, fast_forward._decoder_layers_in_one_call

        def counting(*args):
            self.products += 1
            return product(*args)

        def counting_call(plan, *args):
            self.one_calls += 1
            self.products += 4 * len(plan.layers)
            return one_call(plan, *args)

        monkeypatch.setattr(fast_forward, "_product", counting)
        monkeypatch.setattr(fast_forward, "_decoder_layers_in_one_call", counting_call)


def hf_forward(model, **kw):
    return type(model).forward(model, **kw)


def assert_same_outputs(a, b, cache_a, cache_b):
    assert torch.equal(a.logits, b.logits)
    assert (a.hidden_states is None) == (b.hidden_states is None)
    if a.hidden_states is not None:
        assert len(a.hidden_states) == len(b.hidden_states)
        assert all(torch.equal(x, y) for x, y in zip(a.hidden_states, b.hidden_states))
    assert len(cache_a.layers) == len(cache_b.layers)
    for la, lb in zip(cache_a.layers, cache_b.layers):
        assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def prefilled(model, prompts: torch.Tensor, mask: torch.Tensor, static_len: int = 0, growing: bool = False):
    """A cache holding ``prompts`` [b, P] (real where ``mask``), computed by HF's forward:
    a DynamicCache, a StaticCache of ``static_len`` slots, or with ``growing`` a
    domino.kv_cache.GrowingCache (the engine's: the fast path then runs its layers as one
    ``domino_ops.decoder_layers`` call)."""
    from transformers import DynamicCache, StaticCache

    from domino.kv_cache import GrowingCache

    cache = (StaticCache(config=model.config, max_cache_len=static_len) if static_len
             else GrowingCache() if growing else DynamicCache())
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        hf_forward(model, input_ids=prompts, attention_mask=mask.long(), position_ids=positions, cache=cache,
                   use_cache=True)
    return cache


def test_mirrored_forwards_are_the_installed_ones():
    """The forwards copied are, word for word, the installed transformers' (a release that
    changes one fails here, and such a model keeps HF's forward)."""
    import importlib

    for family in ("llama", "qwen2", "qwen3"):
        hf = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
        for part in ("ForCausalLM", "Model", "DecoderLayer", "Attention"):
            assert fast_forward._mirrors_hf(getattr(hf, prefix + part)), prefix + part

    from transformers.models.llama import modeling_llama as hf

    class LlamaModel(hf.LlamaModel):  # the same name, another forward
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    assert not fast_forward._mirrors_hf(LlamaModel)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_switched_only_where_every_layer_runs_the_kernels(dtype):
    from transformers import MistralConfig, MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM

    for kind in KINDS:
        assert uses_fast_forward(switched_target(kind, dtype)) == (dtype in PACKED)
    # another architecture, sliding-window layers, or a target without the attention
    # kernel: HF's forward stays
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16)
    for model in (MistralForCausalLM(MistralConfig(**common)),
                  Qwen3ForCausalLM(Qwen3Config(**common, use_sliding_window=True, sliding_window=8,
                                               layer_types=["sliding_attention", "full_attention"]))):
        model = model.to(dtype).eval()
        use_small_batch_attention(model)
        assert not uses_fast_forward(use_fast_forward(use_fused_layers(use_small_batch_linear(model))))
    assert not uses_fast_forward(use_fast_forward(use_fused_layers(use_small_batch_linear(cpu_target("llama", dtype)))))
    assert not uses_fast_forward(use_fast_forward(use_small_batch_attention(cpu_target("llama", dtype))))


@needs_packed
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", PACKED)
@given(data=st.data())
def test_bit_identical_to_the_switched_hf_forward(kind, dtype, data):
    """Random batches (left-padded prompts of random lengths), blocks of 1-17 tokens after
    them, every logits_to_keep, with or without hidden states, into a DynamicCache, a
    StaticCache or a GrowingCache (whose layers run as one ``domino_ops.decoder_layers``
    call): the logits, every hidden state and the updated cache are HF's bits."""
    model = shared_target(kind, dtype)
    b = data.draw(st.integers(1, 3), label="batch")
    lengths = data.draw(st.lists(st.integers(1, 12), min_size=b, max_size=b), label="prompt lengths")
    k = data.draw(st.integers(1, 17), label="block")
    keep = data.draw(st.sampled_from([0, 1, k, k + 3]), label="logits_to_keep")
    hidden = data.draw(st.booleans(), label="output_hidden_states")
    cache_kind = data.draw(st.sampled_from(["dynamic", "static", "growing"]), label="cache")
    static = cache_kind == "static"  # the data generator's
    seed = data.draw(st.integers(0, 2 ** 31 - 1), label="seed")
    g = torch.Generator().manual_seed(seed)
    P = max(lengths)
    prompts = torch.randint(1, 64, (b, P), generator=g)
    mask = torch.arange(P)[None, :] >= (P - torch.tensor(lengths))[:, None]  # left padding
    cache_hf = prefilled(model, prompts, mask, static_len=P + k + 3 if static else 0, growing=cache_kind == "growing")
    cache_fast = copy.deepcopy(cache_hf)
    block = torch.randint(1, 64, (b, k), generator=g)
    full = torch.cat([mask, torch.ones(b, k, dtype=torch.bool)], 1)
    positions = torch.tensor(lengths)[:, None] + torch.arange(k)[None, :]
    kw = dict(input_ids=block, attention_mask=full.long(), position_ids=positions, use_cache=True,
              output_hidden_states=hidden, logits_to_keep=keep)
    with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
        spy = FastPathSpy(mp)
        ours = model(cache=cache_fast, **kw)
        theirs = hf_forward(model, cache=cache_hf, **kw)
    assert spy.products == 4 * 4 + 1, (spy.products, cache_kind, b, k)  # 4 layers of q/k/v, o, gate/up, down; the LM head
    assert spy.one_calls == (cache_kind == "growing")
    assert ours.logits.shape == (b, keep if 0 < keep <= k else k, 64)
    assert_same_outputs(ours, theirs, cache_fast, cache_hf)


@needs_packed
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", PACKED)
@pytest.mark.parametrize("growing", [False, True])
def test_tree_mask_bit_identical(kind, dtype, growing, monkeypatch):
    """A 4D additive mask (the engine's tree rounds: each node sees the cache, its
    ancestors and itself) is taken as HF takes it, by the layers one kernel at a time (a
    DynamicCache) and in one ``decoder_layers`` call (a GrowingCache)."""
    model = shared_target(kind, dtype)
    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(1, 64, (1, 9), generator=g)
    cache_hf = prefilled(model, prompts, torch.ones(1, 9, dtype=torch.bool), growing=growing)
    cache_fast = copy.deepcopy(cache_hf)
    parents = [-1, 0, 0, 1, 1, 2, 3, 5]  # a small tree
    n = len(parents)
    visible = torch.zeros(n, n, dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        visible[i, i] = True
        if p >= 0:
            visible[i] |= visible[p]
        depth.append(0 if p < 0 else depth[p] + 1)
    mask = torch.zeros(1, 1, n, 9 + n, dtype=dtype)
    mask[0, 0, :, 9:] = torch.where(visible, 0.0, float("-inf"))
    kw = dict(input_ids=torch.randint(1, 64, (1, n), generator=g), attention_mask=mask,
              position_ids=9 + torch.tensor([depth]), use_cache=True, output_hidden_states=True)
    spy = FastPathSpy(monkeypatch)
    with torch.inference_mode():
        ours = model(cache=cache_fast, **kw)
        theirs = hf_forward(model, cache=cache_hf, **kw)
    assert spy.products == 17 and spy.one_calls == growing
    assert_same_outputs(ours, theirs, cache_fast, cache_hf)


@needs_packed
def test_a_changed_plan_is_caught(monkeypatch):
    """Negative control: the comparison above sees a one-layer change (a norm's epsilon)."""
    dtype = PACKED[0]
    model = switched_target("llama", dtype)
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(1, 64, (1, 6), generator=g)
    cache_hf = prefilled(model, prompts, torch.ones(1, 6, dtype=torch.bool))
    cache_fast = copy.deepcopy(cache_hf)
    plan = model.__dict__[fast_forward._PLAN]
    layers = list(plan.layers)
    layers[2] = fast_forward._Layer(**{**vars(layers[2]), "post_eps": layers[2].post_eps * 1e4})
    monkeypatch.setitem(model.__dict__, fast_forward._PLAN, fast_forward._Plan(**{**vars(plan), "layers": tuple(layers)}))
    kw = dict(input_ids=torch.randint(1, 64, (1, 4), generator=g), use_cache=True)
    with torch.inference_mode():
        ours = model(cache=cache_fast, **kw)
        theirs = hf_forward(model, cache=cache_hf, **kw)
    assert not torch.equal(ours.logits, theirs.logits)


@needs_packed
def test_hf_generate_gives_the_same_tokens_faster_path(monkeypatch):
    """HF generate (plain decoding, the baseline) calls the switched forward and decodes
    the same tokens, greedy and with prompt lookup."""
    dtype = PACKED[0]
    model = switched_target("llama", dtype)
    ids = torch.randint(1, 64, (2, 7), generator=torch.Generator().manual_seed(4))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False, pad_token_id=0)
    spy = FastPathSpy(monkeypatch)
    with torch.inference_mode():
        fast = model.generate(input_ids=ids, **kw)
        lookup = model.generate(input_ids=ids[:1], **{**kw, "attention_mask": kw["attention_mask"][:1]},
                                prompt_lookup_num_tokens=3)
        assert spy.products > 0
        undo_fast_forward(model)
        assert not uses_fast_forward(model) and "forward" not in vars(model)
        products = spy.products
        hf = model.generate(input_ids=ids, **kw)
        hf_lookup = model.generate(input_ids=ids[:1], **{**kw, "attention_mask": kw["attention_mask"][:1]},
                                   prompt_lookup_num_tokens=3)
        assert spy.products == products  # undone: HF's forward only
    assert torch.equal(fast, hf) and torch.equal(lookup, hf_lookup)


@needs_packed
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tree", ["auto", None])
def test_engine_uses_it_and_stays_exact(kind, tree, monkeypatch):
    """domino.load switches a Llama, Qwen2 or Qwen3 target to it; speculative greedy
    decoding (tree and chain) gives the target's own greedy tokens."""
    from domino.loading import load

    dtype = PACKED[0]
    tgt = cpu_target(kind, dtype)
    gen = load(tgt, tiny_drafter(tgt).to(dtype), IdTokenizer(), dtype=dtype, small_batch_linear=True,
               small_batch_attention=True)
    assert uses_fast_forward(gen.target)
    spy = FastPathSpy(monkeypatch)
    prompt = torch.randint(2, 64, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    spec = gen.generate(prompt, max_new_tokens=40, tree=tree, num_drafts=None if tree else 4)
    assert spy.products > 0
    assert spec.token_ids == gen.generate_target_only(prompt, max_new_tokens=40).token_ids


@needs_packed
def test_what_it_does_not_handle_runs_hf_forward(monkeypatch):
    """inputs_embeds, labels, output_attentions, no cache, a grad-mode call with parameters
    that require grad: HF's own forward, the same results (and gradients flow; attention
    weights where asked for)."""
    from transformers import DynamicCache

    model = switched_target("llama", PACKED[0])
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    spy = FastPathSpy(monkeypatch)
    with torch.inference_mode():
        embeds = model.get_input_embeddings()(ids)
        a = model(inputs_embeds=embeds, use_cache=False).logits
        b = model(input_ids=ids, labels=ids, use_cache=False)
        c = model(input_ids=ids, cache=DynamicCache(), output_attentions=True)
        d = model(input_ids=ids, use_cache=False).logits
    assert spy.products == 0
    assert torch.equal(a, d) and torch.equal(b.logits, d) and b.loss is not None
    # attention weights come from the model's eager attention (the kernel forms none), so
    # those logits carry eager's rounding
    assert len(c.attentions) == len(model.model.layers) and c.attentions[0].shape == (1, 4, 6, 6)
    torch.testing.assert_close(c.logits, d, atol=0.05, rtol=0.05)
    out = model(input_ids=ids, use_cache=False).logits  # grad mode on
    assert spy.products == 0
    out.float().sum().backward()
    assert model.model.layers[0].mlp.gate_proj.weight.grad is not None
    with torch.inference_mode():  # and the fast path for the plain call with a cache, as a control
        e = model(input_ids=ids, past_key_values=DynamicCache()).logits
    assert spy.products > 0 and torch.equal(e, d)


def compare_with_hf(model, monkeypatch, fast: bool, **kw):
    """The model's output for ``kw`` and HF's forward's, equal bit for bit (logits, hidden
    states); ``fast``: whether the fast path must have run (else HF's forward alone)."""
    with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
        spy = FastPathSpy(mp)
        ours = model(**kw)
        ran = spy.products
        theirs = hf_forward(model, **kw)
    assert (ran > 0) == fast, f"the fast path {'did not run' if fast else 'ran'}"
    assert ours.logits.shape == theirs.logits.shape and torch.equal(ours.logits, theirs.logits)
    assert (ours.hidden_states is None) == (theirs.hidden_states is None)
    if ours.hidden_states is not None:
        assert all(torch.equal(a, b) for a, b in zip(ours.hidden_states, theirs.hidden_states, strict=True))
    return ours


IDS = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(6))


@needs_packed
def test_changed_weights_are_read_again(monkeypatch):
    """A weight changed in place, or replaced, is noticed at the next call: the fast
    forward computes with the new weight, as HF's does."""
    model = switched_target("llama", PACKED[0])
    before = compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(2.0)
    changed = compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits
    assert not torch.equal(before, changed)
    attn = model.model.layers[3].self_attn
    attn.v_proj.weight = torch.nn.Parameter(attn.v_proj.weight.detach() * 0.5)
    replaced = compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits
    assert not torch.equal(replaced, changed)


@needs_packed
def test_changed_eps_scaling_and_activation_are_read_again(monkeypatch):
    """A norm's eps or an attention's scaling set again, or an MLP's act_fn replaced, after
    a forward: the next forward computes with the new one, as HF's does (the plan had kept
    the old eps and scale, and the switched MLP SiLU, silently)."""
    model = switched_target("llama", PACKED[0])
    before = compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits
    model.model.layers[1].post_attention_layernorm.variance_epsilon = 0.5
    eps = compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits
    model.model.norm.variance_epsilon = 0.25
    final_eps = compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits
    model.model.layers[2].self_attn.scaling = 0.05
    scaling = compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits
    assert not any(torch.equal(a, b) for a, b in ((before, eps), (eps, final_eps), (final_eps, scaling)))
    mlp = model.model.layers[0].mlp
    mlp.act_fn = torch.nn.GELU()
    compare_with_hf(model, monkeypatch, False, input_ids=IDS)  # the op computes SiLU: HF's forward
    x = torch.randn(1, 5, mlp.gate_proj.in_features, generator=torch.Generator().manual_seed(3)).to(PACKED[0])
    with torch.inference_mode():  # the switched MLP's own forward: GELU too
        assert torch.equal(mlp(x), mlp.down_proj(torch.nn.functional.gelu(mlp.gate_proj(x)) * mlp.up_proj(x)))


@needs_packed
def test_the_plans_products_lie_back_to_back_in_forward_order(monkeypatch):
    """The plan's packed products (the fused q/k/v and gate/up ones made for it among them)
    are placed in one buffer in the order the forward reads them, with the bits HF's
    switched forward computes; after a weight changes, the new plan's are placed again."""
    model = switched_target("llama", PACKED[0])

    def products():
        plan = fast_forward._current_plan(model)
        return [w for w in plan.flat_weights if w is not None and w.dim() == 4] + [plan.lm_head.data]

    compare_with_hf(model, monkeypatch, True, input_ids=IDS)
    for _ in range(2):
        data = products()
        assert len(data) == 4 * len(model.model.layers) + 1
        assert len({d.untyped_storage().data_ptr() for d in data}) == 1
        assert all(a.data_ptr() < b.data_ptr() for a, b in zip(data, data[1:]))
        # the buffer holds these products and nothing else (no copy a fused one replaced)
        held = data[0].untyped_storage().nbytes()
        assert held <= sum(d.numel() * d.element_size() + 128 for d in data)
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(2.0)
        compare_with_hf(model, monkeypatch, True, input_ids=IDS)


@needs_packed
def test_replaced_modules_are_read_again(monkeypatch):
    """A module replaced (an LM head, an MLP, resized embeddings) or a layer removed: the
    plan is made again from what the model now holds."""
    dtype = PACKED[0]
    model = switched_target("llama", dtype)
    compare_with_hf(model, monkeypatch, True, input_ids=IDS)
    head = torch.nn.Linear(64, 64, bias=False).to(dtype)
    model.lm_head = use_small_batch_linear(head)
    compare_with_hf(model, monkeypatch, True, input_ids=IDS)
    mlp = copy.deepcopy(model.model.layers[1].mlp)
    with torch.no_grad():
        mlp.up_proj.weight.mul_(-1.0)
    model.model.layers[1].mlp = mlp
    compare_with_hf(model, monkeypatch, True, input_ids=IDS)
    model.resize_token_embeddings(96)
    use_fused_layers(use_small_batch_linear(model))
    assert compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits.shape[-1] == 96
    del model.model.layers[3]
    model.config.num_hidden_layers = 3
    compare_with_hf(model, monkeypatch, True, input_ids=IDS, output_hidden_states=True)


@needs_packed
def test_hooks_undone_switches_and_configs_run_hf_forward(monkeypatch):
    """What HF's forward would do differently: forward hooks (on a module the fast path
    stands in for, or global), a switch under it undone, a bidirectional config, training
    mode; and the configs it follows: the un-normed last hidden state, an explicit
    output_hidden_states=None."""
    model = switched_target("llama", PACKED[0])
    handle = model.model.layers[2].mlp.register_forward_hook(lambda mod, args, out: out * 0)
    compare_with_hf(model, monkeypatch, False, input_ids=IDS)
    handle.remove()
    compare_with_hf(model, monkeypatch, True, input_ids=IDS)
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: None)
    try:
        compare_with_hf(model, monkeypatch, False, input_ids=IDS)
    finally:
        handle.remove()
    model.config.is_causal = False
    compare_with_hf(model, monkeypatch, False, input_ids=IDS)
    del model.config.is_causal
    model.train()
    compare_with_hf(model, monkeypatch, False, input_ids=IDS)
    model.eval()
    model.config.tie_last_hidden_states = False
    compare_with_hf(model, monkeypatch, True, input_ids=IDS, output_hidden_states=True)
    model.config.tie_last_hidden_states = True
    model.config.output_hidden_states = True
    compare_with_hf(model, monkeypatch, True, input_ids=IDS)
    compare_with_hf(model, monkeypatch, False, input_ids=IDS, output_hidden_states=None)
    model.config.output_hidden_states = False
    from domino.fast_linear import undo_small_batch_linear

    undo_small_batch_linear(model.model.layers[0])
    compare_with_hf(model, monkeypatch, False, input_ids=IDS)


@needs_packed
def test_a_plan_that_cannot_be_made_is_tried_again_only_now_and_then(monkeypatch):
    """A switch under the model undone: HF's forward runs, and the plan (a walk of the whole
    model) is attempted once every _RETRY_AFTER calls, not at every call; switched back, the
    fast path returns within that many calls."""
    from domino.fast_linear import undo_small_batch_linear

    model = switched_target("llama", PACKED[0])
    builds = []
    build = fast_forward._build_plan
    monkeypatch.setattr(fast_forward, "_build_plan", lambda m: builds.append(1) or build(m))
    layer = model.model.layers[1]
    undo_small_batch_linear(layer)
    n = fast_forward._RETRY_AFTER
    for _ in range(2 * n + n // 2):  # attempts at calls 1 and n + 1, 2n + 1
        compare_with_hf(model, monkeypatch, False, input_ids=IDS)
    assert len(builds) == 3
    use_small_batch_linear(layer)
    runs = []
    for _ in range(n):
        with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
            spy = FastPathSpy(mp)
            model(input_ids=IDS)
            runs.append(spy.products > 0)
    # HF's forward until the next attempt (call 3n + 1), then the fast path
    assert not runs[0] and runs[-1] and runs == sorted(runs) and len(builds) == 4
    compare_with_hf(model, monkeypatch, True, input_ids=IDS)


@needs_packed
def test_a_model_moved_to_another_dtype_is_computed_in_it(monkeypatch):
    """model.to(dtype) keeps each parameter (its data swapped): the plan is made again for
    the new dtype where its linears are packed (both dtypes packed here, as on an AVX-512
    CPU: the float32 panels also run on AVX2), HF's forward runs where they are not."""
    from domino import fast_linear

    both = (torch.bfloat16, torch.float32)
    for packs, fast in ((both, True), ((PACKED[0],), False)):
        with monkeypatch.context() as mp:
            mp.setattr(fast_linear, "_cpu_packs", lambda: packs)
            model = switched_target("llama", PACKED[0])
        other = torch.float32 if PACKED[0] == torch.bfloat16 else torch.bfloat16
        compare_with_hf(model, monkeypatch, True, input_ids=IDS)
        model.to(other)
        assert compare_with_hf(model, monkeypatch, fast, input_ids=IDS).logits.dtype == other


@needs_packed
def test_switch_is_idempotent_keeps_weights_and_pickles(monkeypatch):
    model = switched_target("llama", PACKED[0])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    use_fast_forward(model)
    assert uses_fast_forward(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    clone = pickle.loads(pickle.dumps(model))
    assert torch.equal(compare_with_hf(clone, monkeypatch, True, input_ids=IDS).logits,
                       compare_with_hf(model, monkeypatch, True, input_ids=IDS).logits)
    undo_fast_forward(model)
    assert not uses_fast_forward(model) and fast_forward._PLAN not in vars(model)


@needs_packed
@pytest.mark.parametrize("kind", KINDS)
def test_the_cache_is_returned_as_hf_returns_it(kind, monkeypatch):
    """Llama's body returns the cache it was given even with use_cache=False; Qwen2's and
    Qwen3's only with use_cache. Without positions, they count from the cache's length."""
    from transformers import DynamicCache

    model = shared_target(kind, PACKED[0])
    for use_cache in (True, False, None):
        caches = [DynamicCache(), DynamicCache()]
        with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
            spy = FastPathSpy(mp)
            ours = model(input_ids=IDS, cache=caches[0], use_cache=use_cache)
            assert spy.products > 0
            theirs = hf_forward(model, input_ids=IDS, cache=caches[1], use_cache=use_cache)
            assert (ours.cache is None) == (theirs.cache is None)
            assert torch.equal(ours.logits, theirs.logits)
            # the next block after the cached one, positions and mask left out
            more = IDS.flip(1)
            assert torch.equal(model(input_ids=more, cache=caches[0]).logits,
                               hf_forward(model, input_ids=more, cache=caches[1]).logits)


@needs_packed
def test_a_fixed_model_is_checked_once(monkeypatch):
    """Inside model_fixed the plan and the hooks are checked on entry only: forwards take
    the fast path with the plan checked then (and a hook added inside is not seen: the
    caller promised no change); blocks nest; when the outermost ends, the next forward
    checks again and sees the hook. The engine's loops hold their target fixed."""
    model = switched_target("llama", PACKED[0])
    checks = []
    is_current = fast_forward._plan_is_current
    monkeypatch.setattr(fast_forward, "_plan_is_current", lambda plan: checks.append(plan) or is_current(plan))
    with fast_forward.model_fixed(model):
        assert len(checks) == 1
        compare_with_hf(model, monkeypatch, True, input_ids=IDS)
        with fast_forward.model_fixed(model):
            handle = model.model.layers[2].mlp.register_forward_hook(lambda mod, args, out: out * 0)
            with pytest.MonkeyPatch.context() as mp, torch.inference_mode():
                spy = FastPathSpy(mp)
                model(input_ids=IDS[:, :3])
            assert spy.products > 0  # the promise broken: the hook is not seen (HF's forward would run it)
        assert len(checks) == 1
    compare_with_hf(model, monkeypatch, False, input_ids=IDS)  # the hook seen: HF's forward
    assert len(checks) == 2
    handle.remove()
    with fast_forward.model_fixed(model):  # a model hooked on entry stays on HF's forward inside
        handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: None)
    try:
        with fast_forward.model_fixed(model):
            compare_with_hf(model, monkeypatch, False, input_ids=IDS)
    finally:
        handle.remove()
    with fast_forward.model_fixed(model):
        compare_with_hf(model, monkeypatch, True, input_ids=IDS)
    assert fast_forward._FIXED not in vars(model)
    hf_model = cpu_target("llama", PACKED[0])  # not switched: a no-op
    with fast_forward.model_fixed(hf_model) as held:
        assert held is hf_model and fast_forward._FIXED not in vars(hf_model)


@needs_packed
def test_the_engine_holds_its_target_fixed(monkeypatch):
    """generate, generate_plain and generate_target_only check the target's plan once per
    call, not once per forward, and decode the same tokens; generate looks the drafter's
    layer weights up once (DominoDraftModel.weights_fixed); the budget's cost measurement
    holds both fixed too."""
    from domino import fast_layers
    from domino.loading import load

    dtype = PACKED[0]
    tgt = cpu_target("llama", dtype)
    gen = load(tgt, tiny_drafter(tgt).to(dtype), IdTokenizer(), dtype=dtype, small_batch_linear=True,
               small_batch_attention=True)
    checks = []
    is_current = fast_forward._plan_is_current
    monkeypatch.setattr(fast_forward, "_plan_is_current", lambda plan: checks.append(plan) or is_current(plan))
    looked_up = []
    lookup = fast_layers.draft_layer_weights
    monkeypatch.setattr(fast_layers, "draft_layer_weights", lambda *a: looked_up.append(a) or lookup(*a))
    spy = FastPathSpy(monkeypatch)
    outs = []
    for call, kw in ((gen.generate, dict(tree=None, num_drafts=4)), (gen.generate_plain, {}),
                     (gen.generate_target_only, {})):
        checks.clear()
        products = spy.products
        outs.append(call([1, 2, 3, 4, 5], max_new_tokens=12, **kw).token_ids)
        assert len(checks) == 1 and spy.products > products, call.__name__
    assert len(looked_up) == 1 and outs[0] == outs[1] == outs[2]
    from domino import budget

    checks.clear()
    looked_up.clear()
    budget.measure_round_costs(gen, 1, contexts=(8, 16), repeats=1)  # timed as the rounds run
    assert len(checks) == 1 and len(looked_up) == 1


@given(data=st.data())
def test_padding_mask_is_hfs(data):
    """The 2D attention mask expanded as HF's create_causal_mask expands it (with the
    attention's sdpa_mask interface) for a DynamicCache or GrowingCache of ``past``
    positions: None in the same cases, else the same bool mask. Left padding, holes
    anywhere, masks shorter (padded as hidden) or longer (cut) than past + T, long, bool
    and float masks."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    from domino.kv_cache import GrowingCache

    model = shared_target("llama", torch.float32)
    b = data.draw(st.integers(1, 3), label="batch")
    past = data.draw(st.one_of(st.just(0), st.integers(1, 9)), label="past")  # 0: a prefill
    T = data.draw(st.one_of(st.just(1), st.integers(2, 6)), label="new tokens")  # 1: a decode step
    length = data.draw(st.one_of(st.just(past + T), st.integers(1, past + T + 2)), label="mask length")
    holes = data.draw(st.sampled_from(["none", "left", "random"]), label="holes")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1), label="seed"))
    mask = torch.ones(b, length, dtype=torch.bool)
    if holes == "left":
        mask &= torch.arange(length)[None, :] >= torch.randint(0, length, (b, 1), generator=g)
    elif holes == "random":
        mask &= torch.rand(b, length, generator=g) < 0.7
    mask = mask.to(data.draw(st.sampled_from([torch.bool, torch.long, torch.float32]), label="dtype"))
    cache = data.draw(st.sampled_from([DynamicCache, GrowingCache]), label="cache")()
    for i in range(model.config.num_hidden_layers):
        if past:
            cache.update(torch.randn(b, 2, past, 16), torch.randn(b, 2, past, 16), i)
    x = torch.zeros(b, T, model.config.hidden_size)
    theirs = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=mask, cache=cache,
                                position_ids=past + torch.arange(T)[None].expand(b, -1))
    ours = fast_forward._padding_causal_mask(mask, T, cache.get_seq_length())
    assert (ours is None) == (theirs is None)
    if ours is not None:
        assert ours.shape == theirs.shape == (b, 1, T, past + T) and ours.dtype == theirs.dtype == torch.bool
        assert torch.equal(ours, theirs)
