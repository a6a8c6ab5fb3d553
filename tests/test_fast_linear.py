"""domino.fast_linear: HF models' nn.Linear layers on the batch-invariant CPU kernel.

What holds, precisely (and what these tests check):
- the switch changes no weight and no state_dict entry, and a switched layer returns
  exactly the kernel's output (rounding differs from F.linear, values agree);
- every switched layer of a bf16 target is batch-invariant inside the model: in a
  verification forward over k tokens, each token's row of each layer output has the bits
  that layer gives for that row alone;
- HF's own attention (sdpa, eager) is *not* batch-invariant across query counts (it
  reduces over the KV length and calls GEMMs whose shapes follow the number of queries),
  so a verification forward over k tokens equals k one-token forwards only up to the
  attention's rounding, and in bf16 that is enough for greedy speculation to pick another
  token than plain decoding now and then (seen here with a tiny Qwen3 target);
- with ``domino.fast_attention.use_small_batch_attention`` (each query row computed from
  its visible keys alone, as a one-token step computes it) the verification forward is
  bit-identical to k one-token forwards in bf16 and fp32: everything else (embedding,
  RMSNorm, rotary, SiLU, residuals, LM head) is then row-wise invariant with the linear
  switch on;
- so greedy speculative generation with both switches gives exactly the tokens of plain
  greedy decoding with both switches (target and drafter switched, as ``domino.load``
  does for the linear layers).
"""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino.fast_attention import undo_small_batch_attention, use_small_batch_attention
from domino.fast_linear import (fused_packed_linear, packed_weight, runs_packed, undo_small_batch_linear,
                                use_small_batch_linear, uses_small_batch_linear)
from engine_cases import assert_mostly_multi_token, cheap_verification
from packed_paths import PACKED_PATHS, packed_path
from tiny_models import IdTokenizer, cpu_target, tiny_drafter, verify_and_step


def linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def layer_kernel(lin, x):
    """What a switched layer computes for x: the packed kernel where it packs x's dtype
    (float32 panels on AVX-512F CPUs, bf16 ones on AVX512-BF16 CPUs), else the row-major one."""
    if runs_packed(lin, x.dtype):
        return domino_ops.small_batch_linear_packed(x, packed_weight(lin), lin.bias)
    return domino_ops.small_batch_linear(x, lin.weight, lin.bias)


def test_switch_keeps_weights_and_state_dict_and_undoes():
    model = cpu_target("qwen3", torch.float32)
    before = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    assert use_small_batch_linear(model) is model
    assert uses_small_batch_linear(model)
    assert all("forward" in vars(m) for m in linears(model)) and len(linears(model)) == 4 * 7 + 1
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(after[k].data_ptr() == before[k][0] and torch.equal(after[k], before[k][1]) for k in before)
    assert [id(p) for p in model.parameters()] == params
    use_small_batch_linear(model)  # idempotent
    undo_small_batch_linear(model)
    assert not uses_small_batch_linear(model)
    assert not any("forward" in vars(m) for m in linears(model))


def test_tied_weights_stay_tied():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)).eval()
    use_small_batch_linear(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 64, (1, 5))
    with torch.inference_mode():
        out = model(ids).logits
        hidden = model.model(ids).last_hidden_state
    assert torch.equal(out, layer_kernel(model.lm_head, hidden))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_switched_layer_is_the_kernel_and_model_agrees_with_pytorch(dtype):
    model = cpu_target("llama", dtype)
    ids = torch.randint(0, 64, (2, 7))
    with torch.inference_mode():
        ref = model(ids).logits.float()
        use_small_batch_linear(model)
        lin = model.model.layers[0].mlp.down_proj
        x = torch.randn(2, 7, lin.in_features).to(dtype)
        assert torch.equal(lin(x), layer_kernel(lin, x))
        got = model(ids).logits.float()
    tol = 1e-4 if dtype == torch.float32 else 0.15
    assert (got - ref).abs().max() <= tol * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_falls_back_to_f_linear_when_autograd_needs_a_graph():
    model = use_small_batch_linear(cpu_target("qwen3", torch.float32))
    lin = model.lm_head
    x = torch.randn(3, lin.in_features, requires_grad=True)
    y = lin(x)  # grad mode on, parameters require grad: F.linear, differentiable
    assert y.grad_fn is not None
    y.sum().backward()
    assert x.grad is not None and lin.weight.grad is not None
    with torch.no_grad():
        assert torch.equal(lin(x), layer_kernel(lin, x.detach()))
    # a dtype mismatch keeps F.linear's behaviour (an error), not a silent cast
    with torch.no_grad(), pytest.raises(RuntimeError):
        lin(torch.randn(3, lin.in_features, dtype=torch.bfloat16))


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_layer_is_batch_invariant_inside_the_model(kind, dtype):
    """In a verification forward over k tokens, each switched layer's output row equals,
    bit for bit, that layer applied to the row alone."""
    model = use_small_batch_linear(cpu_target(kind, dtype))
    seen = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.append((mod, inp[0].clone(), out.clone())))
             for m in linears(model)]
    verify_and_step(model, k=9)
    for h in hooks:
        h.remove()
    assert len(seen) >= len(linears(model))
    with torch.inference_mode():
        for mod, x, y in seen:
            if x.shape[1] < 2:
                continue
            rows = torch.cat([mod(x[:, i:i + 1]) for i in range(x.shape[1])], 1)
            assert torch.equal(rows, y)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_verification_forward_is_bit_identical_with_small_batch_attention(kind, dtype):
    model = use_small_batch_linear(cpu_target(kind, dtype, attn="small_batch"))
    big, steps = verify_and_step(model, k=9)
    assert torch.equal(big, steps)


def test_hf_attention_is_the_part_that_is_not_batch_invariant():
    """Documents the limit: with HF's sdpa attention the same comparison differs (by the
    attention's rounding) even with every linear layer switched."""
    model = use_small_batch_linear(cpu_target("llama", torch.float32, attn="sdpa"))
    big, steps = verify_and_step(model, k=9)
    assert not torch.equal(big, steps)
    torch.testing.assert_close(big, steps, atol=1e-4, rtol=1e-4)


@pytest.mark.filterwarnings("ignore:domino small-batch attention")
def test_small_batch_attention_leaves_softcap_and_sinks_to_hf(monkeypatch):
    """What the kernel does not compute goes to HF's own attention, not silently wrong."""
    import transformers.integrations.sdpa_attention as sdpa

    from domino.fast_attention import small_batch_attention_forward

    calls = []
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **kw: calls.append(kw) or ("hf", None))
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    module = torch.nn.Module()
    assert small_batch_attention_forward(module, q, k, k, None, softcap=30.0)[0] == "hf"
    assert small_batch_attention_forward(module, q, k, k, None, s_aux=torch.zeros(2))[0] == "hf"
    out, _ = small_batch_attention_forward(module, q, k, k, None, scaling=0.3)
    assert len(calls) == 2 and out.shape == (1, 3, 2, 8)


def test_small_batch_attention_leaves_non_causal_and_float16_to_hf(monkeypatch):
    """An encoder's (is_causal False) or a float16 attention is HF's, not made causal or
    refused by the kernel."""
    import transformers.integrations.sdpa_attention as sdpa

    from domino.fast_attention import small_batch_attention_forward

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **kw: ("hf", None))
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    module = torch.nn.Module()
    assert small_batch_attention_forward(module, q, k, k, None, is_causal=False)[0] == "hf"
    module.is_causal = False
    assert small_batch_attention_forward(module, q, k, k, None)[0] == "hf"
    assert small_batch_attention_forward(torch.nn.Module(), q.half(), k.half(), k.half(), None)[0] == "hf"


def test_small_batch_attention_leaves_unknown_keywords_to_hf(monkeypatch):
    """A keyword beyond the mask's (a T5-style position_bias, sinks) is math the kernel
    does not compute: HF's sdpa gets it, with one warning naming it; the forward
    arguments HF passes every layer (position_ids, use_cache, ...) keep the kernel."""
    import transformers.integrations.sdpa_attention as sdpa

    from domino import fast_attention

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **kw: ("hf", kw))
    monkeypatch.setattr(fast_attention, "_warned", set())
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    module = torch.nn.Module()
    with pytest.warns(UserWarning, match="passes position_bias=, which the kernel does not compute"):
        out, kw = fast_attention.small_batch_attention_forward(module, q, k, k, None, position_bias=torch.zeros(3, 3))
    assert out == "hf" and "position_bias" in kw
    with pytest.warns(UserWarning, match="passes sinks="):
        assert fast_attention.small_batch_attention_forward(module, q, k, k, None, sinks=torch.zeros(2))[0] == "hf"
    out, _ = fast_attention.small_batch_attention_forward(module, q, k, k, None, position_ids=torch.arange(3)[None],
                                                          use_cache=True, sliding_window=None, position_bias=None)
    assert out.shape == (1, 3, 2, 8)


def test_small_batch_attention_keeps_gradients():
    """Where autograd needs a graph (a model being trained) the kernel, which has no
    backward, gives way to HF's attention: every gradient equals the unswitched model's
    (the kernel once returned a tensor without a graph: q/k/v projections got no grad and
    the rest wrong ones, with the same loss)."""
    own = cpu_target("llama", torch.float32, attn="sdpa")
    switched = use_small_batch_attention(cpu_target("llama", torch.float32, attn="sdpa"))
    switched.load_state_dict(own.state_dict())
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    for m in (own, switched):
        m(ids, labels=ids).loss.backward()
    for (name, p), q in zip(own.named_parameters(), switched.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_small_batch_attention_gives_attention_weights_through_eager():
    """``output_attentions=True`` asks for weights the kernel does not form: the model's
    eager attention gives them, as the unswitched eager model does (they once came back
    empty, silently)."""
    own = cpu_target("llama", torch.float32, attn="eager")
    switched = use_small_batch_attention(cpu_target("llama", torch.float32, attn="eager"))
    switched.load_state_dict(own.state_dict())
    ids = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        ref, got = own(ids, output_attentions=True), switched(ids, output_attentions=True)
    assert len(got.attentions) == len(ref.attentions) > 0
    for a, b in zip(got.attentions, ref.attentions):
        torch.testing.assert_close(a, b)


def test_small_batch_attention_takes_keys_not_contiguous_in_their_last_dimension():
    """A key whose rows are not contiguous (a model that transposes after the projection)
    is copied for the kernel, not refused by it."""
    from domino.fast_attention import small_batch_attention_forward

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    k_strided = k.transpose(2, 3).contiguous().transpose(2, 3)  # same values, stride(-1) == 4
    out, _ = small_batch_attention_forward(torch.nn.Module(), q, k_strided, v, None, scaling=0.5)
    want, _ = small_batch_attention_forward(torch.nn.Module(), q, k, v, None, scaling=0.5)
    assert torch.equal(out, want)


def test_small_batch_attention_with_a_static_cache_equals_sdpa():
    """HF gives no mask to a first forward into an empty static cache and means sdpa's
    top-left causal mask (the slots past the prompt are empty): greedy generation with the
    static cache gives sdpa's tokens (the kernel's bottom-right rule once let the prompt
    see the empty slots: other tokens, no error)."""
    model = cpu_target("qwen3", torch.float32)
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model.generate(ids, max_new_tokens=8, do_sample=False, cache_implementation="static")
        use_small_batch_attention(model)
        got = model.generate(ids, max_new_tokens=8, do_sample=False, cache_implementation="static")
        undo_small_batch_attention(model)
    assert torch.equal(got, ref)


def test_small_batch_attention_matches_sdpa_and_undoes():
    model = cpu_target("qwen3", torch.float32)
    ids = torch.randint(0, 64, (1, 12))
    with torch.inference_mode():
        ref = model(ids).logits
        use_small_batch_attention(model)
        assert model.config._attn_implementation == "domino_small_batch"
        torch.testing.assert_close(model(ids).logits, ref, atol=1e-5, rtol=1e-5)
        undo_small_batch_attention(model)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_speculative_equals_plain_greedy_in_bf16(kind):
    from domino import DominoGenerator

    tgt = cpu_target(kind, torch.bfloat16, attn="small_batch")
    drafter = tiny_drafter(tgt).to(torch.bfloat16)
    gen = DominoGenerator(use_small_batch_linear(tgt), use_small_batch_linear(drafter), IdTokenizer())
    cheap_verification(gen, 1)  # the default (adaptive) path, drafting every round
    prompt = torch.randint(2, 64, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    spec = gen.generate(prompt, max_new_tokens=48)
    plain = gen.generate_target_only(prompt, max_new_tokens=48)
    assert spec.token_ids == plain.token_ids and len(spec.token_ids) == 48
    assert_mostly_multi_token(spec)  # verification forwards over several tokens made it
    assert uses_small_batch_linear(gen.target) and uses_small_batch_linear(gen.drafter)


@pytest.mark.parametrize("batch,tree", [(3, None), (1, (3, 3)), (3, (2, 4))])
def test_bf16_trees_and_ragged_batches_equal_plain_greedy(batch, tree):
    """With both switches a hidden key contributes nothing, so a tree node's row is its
    path's one-token step and a padded row its sequence's: bf16 trees and ragged batches
    give exactly plain greedy decoding's tokens (plain decoding switched alike)."""
    from domino import DominoGenerator, TreeShape

    tgt = cpu_target("qwen3", torch.bfloat16, attn="small_batch")
    drafter = tiny_drafter(tgt).to(torch.bfloat16)
    gen = DominoGenerator(use_small_batch_linear(tgt), use_small_batch_linear(drafter), IdTokenizer())
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(2, 64, (int(n),), generator=g).tolist() for n in torch.randint(3, 12, (batch,), generator=g)]
    shape = None if tree is None else TreeShape(*tree, TreeShape(*tree).max_nodes)
    chain = dict(num_drafts=drafter.config.num_drafts) if tree is None else {}  # fixed: every round verifies many
    spec = gen.generate(prompts, max_new_tokens=40, tree=shape, **chain)
    assert spec.token_ids == gen.generate_target_only(prompts, max_new_tokens=40).token_ids
    assert_mostly_multi_token(spec)
    for p, row in zip(prompts, spec.token_ids):  # and each row is that prompt decoded alone
        assert row == gen.generate_target_only(p, max_new_tokens=40).token_ids


def test_load_switches_target_and_drafter_on_cpu_when_asked():
    from domino.loading import load

    tgt = cpu_target("qwen3", torch.float32)
    gen = load(tgt, tiny_drafter(tgt), IdTokenizer(), small_batch_linear=True, small_batch_attention=True)
    assert uses_small_batch_linear(gen.target) and uses_small_batch_linear(gen.drafter)
    assert gen.target.config._attn_implementation == "domino_small_batch"
    tgt2 = cpu_target("qwen3", torch.float32)
    gen2 = load(tgt2, tiny_drafter(tgt2), IdTokenizer())  # opt-in for now
    assert not uses_small_batch_linear(gen2.target) and not uses_small_batch_linear(gen2.drafter)


def _owner_of(layers):
    owner = torch.nn.Module()
    owner.layers = torch.nn.ModuleList(layers)
    return use_small_batch_linear(owner)


FUSED_DTYPES = [d for d in (torch.bfloat16, torch.float32) if runs_packed(_owner_of([torch.nn.Linear(2, 2).to(d)]).layers[0], d)]


@pytest.mark.skipif(not FUSED_DTYPES, reason="this CPU runs no packed kernel")
@given(M=st.sampled_from([1, 2, 5, 16, 33, 64]), Ns=st.lists(st.integers(1, 130), min_size=2, max_size=3),
       K=st.sampled_from([1, 3, 16, 47, 100]), bias=st.booleans(), three_d=st.booleans(),
       dtype=st.sampled_from(FUSED_DTYPES or [torch.float32]), path=st.sampled_from(PACKED_PATHS or ["avx2"]),
       seed=st.integers(0, 2**31 - 1))
def test_fused_packed_linear_gives_the_separate_layers_bits(M, Ns, K, bias, three_d, dtype, path, seed):
    """Layers concatenated at any split (N not a multiple of the 48-column panel, so later
    layers' columns land at other places in their panels) give each column the bits of its
    own layer, on every packed path (every element compared, so none can go unwritten)."""
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(K, N, bias=bias).to(dtype) for N in Ns]
    owner = _owner_of(layers)
    x = torch.randn(M, K).to(dtype)
    x = x.view(1, M, K) if three_d else x
    context = packed_path(path) if dtype == torch.bfloat16 else contextlib.nullcontext()
    with torch.inference_mode(), context:
        expected = torch.cat([lin(x) for lin in layers], -1)
        got = fused_packed_linear(owner, tuple(layers), x)
    assert got.shape == expected.shape and torch.equal(got, expected)


@pytest.mark.skipif(torch.bfloat16 not in FUSED_DTYPES, reason="this CPU runs no bf16 packed kernel")
def test_fused_packed_linear_keeps_one_copy_and_follows_the_weights():
    layers = [torch.nn.Linear(40, n).bfloat16() for n in (50, 30)]
    owner = _owner_of(layers)
    x = torch.randn(3, 40).bfloat16()
    with torch.inference_mode():
        first = fused_packed_linear(owner, tuple(layers), x)
    assert all("_domino_packed" not in vars(lin) for lin in layers)  # the layers' own copies dropped
    with torch.no_grad():
        layers[1].weight.mul_(2)  # in place: the concatenation is packed again
        layers[0].bias.add_(1)
    with torch.inference_mode():
        again = fused_packed_linear(owner, tuple(layers), x)
        assert torch.equal(again, torch.cat([lin(x) for lin in layers], -1)) and not torch.equal(again, first)
    undo_small_batch_linear(owner)
    assert "_domino_fused_packed" not in vars(owner)


@pytest.mark.skipif(torch.bfloat16 not in FUSED_DTYPES, reason="this CPU runs no bf16 packed kernel")
def test_fused_packed_linear_declines_what_it_does_not_compute():
    layers = [torch.nn.Linear(8, 8).bfloat16(), torch.nn.Linear(8, 8).bfloat16()]
    owner = _owner_of(layers)
    x = torch.randn(2, 8).bfloat16()
    with torch.inference_mode():
        assert fused_packed_linear(owner, tuple(layers), x.half()) is None  # a dtype no panel holds
        assert fused_packed_linear(owner, tuple(layers), x.float()) is None  # not the weights' dtype
        mixed = _owner_of([torch.nn.Linear(8, 8).bfloat16(), torch.nn.Linear(8, 8, bias=False).bfloat16()])
        assert fused_packed_linear(mixed, tuple(mixed.layers), x) is None
        plain = (torch.nn.Linear(8, 8).bfloat16(), layers[1])  # one layer not switched
        assert fused_packed_linear(owner, plain, x) is None
    assert fused_packed_linear(owner, tuple(layers), x.requires_grad_()) is None  # autograd needs a graph


SWITCHED = torch.ops.domino_ops.switched_linear.default


@given(lead=st.sampled_from([(), (0,), (1,), (5,), (2, 8), (1, 70)]), N=st.sampled_from([1, 47, 48, 100]),
       K=st.sampled_from([1, 3, 64, 77]), bias=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       packed=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_switched_linear_op_is_the_kernel_where_it_applies(lead, N, K, bias, dtype, packed, seed):
    """The op behind a switched layer's forward: the packed product on the panels it is
    given, else the row-major one, bit for bit, any leading shape (empty ones too)."""
    torch.manual_seed(seed)
    w = torch.randn(N, K).to(dtype)
    b = torch.randn(N).to(dtype) if bias else None
    x = torch.randn(*lead, K).to(dtype)
    rows = x.reshape(-1, K)
    with torch.inference_mode():
        if packed and domino_ops.small_batch_linear_packed_supported(dtype):
            p = domino_ops.pack_small_batch_linear_weight(w, dtype=dtype)
            got = SWITCHED(x, w, b, p.data)
            expected = domino_ops.small_batch_linear_packed(rows, p, b) if rows.shape[0] else rows.new_empty(0, N)
        else:
            got = SWITCHED(x, w, b, None)
            expected = domino_ops.small_batch_linear(rows, w, b) if rows.shape[0] else rows.new_empty(0, N)
    assert got.shape == (*lead, N) and got.dtype == dtype
    assert torch.equal(got, expected.view(*lead, N))


def _fallback_cases():
    w, b, x = torch.randn(6, 8), torch.randn(6), torch.randn(3, 8)
    return {
        "float16": (x.half(), w.half(), b.half()),
        "float64": (x.double(), w.double(), b.double()),
        "a transposed weight": (x, torch.randn(8, 6).t(), b),
        "a broadcast bias": (x, w, torch.randn(1)),
        "the meta device": (x.to("meta"), w.to("meta"), b.to("meta")),
    }


@pytest.mark.parametrize("case", list(_fallback_cases()))
def test_switched_linear_op_is_f_linear_where_the_kernels_do_not_apply(case):
    x, w, b = _fallback_cases()[case]
    with torch.inference_mode():
        got = SWITCHED(x, w, b, None)
        expected = F.linear(x, w, b)
    assert got.shape == expected.shape and got.dtype == expected.dtype and got.device == expected.device
    if got.device.type != "meta":
        assert torch.equal(got, expected)


def test_switched_linear_op_raises_what_f_linear_raises():
    w, x = torch.randn(6, 8), torch.randn(3, 7)
    with torch.inference_mode():
        with pytest.raises(RuntimeError) as expected:
            F.linear(x, w)
        with pytest.raises(RuntimeError) as got:
            SWITCHED(x, w, None, None)
    assert str(got.value) == str(expected.value)


def test_switched_linear_op_under_autograd_and_autocast_is_f_linear():
    w = torch.randn(6, 8, requires_grad=True)
    x = torch.randn(3, 8, requires_grad=True)
    y = SWITCHED(x, w, None, None)
    assert y.grad_fn is not None and torch.equal(y, F.linear(x, w))
    y.square().sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    F.linear(x, w).square().sum().backward()
    assert torch.equal(gx, x.grad) and torch.equal(gw, w.grad)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's dtype rules, as F.linear
        got = SWITCHED(x, w, None, None)
        expected = F.linear(x, w)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_switched_linear_op_checks_the_panels_it_is_given():
    w, x = torch.randn(6, 8), torch.randn(3, 8)
    if not domino_ops.small_batch_linear_packed_supported(torch.float32):
        pytest.skip("this CPU runs no float32 panels")
    wrong = domino_ops.pack_small_batch_linear_weight(torch.randn(6, 9), dtype=torch.float32).data
    with torch.inference_mode(), pytest.raises(RuntimeError, match="packed_weight must have shape"):
        SWITCHED(x, w, None, wrong)


@pytest.mark.skipif(not FUSED_DTYPES, reason="this CPU runs no packed kernel")
@pytest.mark.parametrize("dtype", FUSED_DTYPES or [torch.float32])
def test_packed_copies_lie_back_to_back_in_forward_order_with_their_bits(dtype):
    from domino.fast_linear import place_packed_weights

    model = cpu_target("llama", dtype)
    layers = linears(model)
    ids = torch.randint(0, 64, (2, 7))
    with torch.inference_mode():
        loose = {id(m): domino_ops.pack_small_batch_linear_weight(m.weight, dtype=dtype).data for m in layers}
        use_small_batch_linear(model)
    assert place_packed_weights(model)
    data = [packed_weight(m).data for m in layers]
    assert all(torch.equal(d, loose[id(m)]) for d, m in zip(data, layers))  # the same panels, moved
    assert len({d.untyped_storage().data_ptr() for d in data}) == 1
    ends = [d.data_ptr() + d.numel() * d.element_size() for d in data]
    assert all(end <= d.data_ptr() and d.data_ptr() % 64 == 0 for end, d in zip(ends, data[1:]))  # in order, apart
    assert not place_packed_weights(model)  # already placed: nothing moves
    with torch.no_grad():
        layers[3].weight.mul_(2)  # packed again on its own, then placed again with the rest
    with torch.inference_mode():
        x = torch.randn(3, layers[3].in_features).to(dtype)
        assert torch.equal(layers[3](x), layer_kernel(layers[3], x))
    assert packed_weight(layers[3]).data.untyped_storage().data_ptr() != data[0].untyped_storage().data_ptr()
    assert place_packed_weights(model)
    moved = [packed_weight(m).data for m in layers]
    assert len({d.untyped_storage().data_ptr() for d in moved}) == 1
    with torch.inference_mode():
        assert torch.equal(layers[3](x), layer_kernel(layers[3], x))
        logits = model(ids).logits
        undo_small_batch_linear(model)
        use_small_batch_linear(model)  # packs afresh, each copy where the allocator puts it: the same logits
        assert torch.equal(model(ids).logits, logits)


def test_switched_layer_returns_its_own_tensor_as_f_linear_does():
    """Not a view: a result made under no_grad can be changed in place later with autograd
    on (a view made under no_grad cannot; F.linear's 2-D result is no view either), for 1-,
    2- and 3-dimensional inputs."""
    lin = use_small_batch_linear(torch.nn.Linear(8, 6))
    p = torch.randn(6, requires_grad=True)
    for shape in ((8,), (3, 8), (2, 3, 8)):
        with torch.no_grad():
            y = lin(torch.randn(shape))
        assert y._base is None
        y.add_(p)  # autograd on, p requires grad
        assert y.grad_fn is not None


@pytest.mark.skipif(not FUSED_DTYPES, reason="this CPU runs no packed kernel")
def test_no_packed_copy_outlives_its_use_once_layers_are_fused():
    """A model on the fused layers without the fast forward (HF's forward, or a drafter):
    the fused q/k/v and gate/up copies replace the layers' own, and no memory keeps the
    replaced ones (a buffer of placed copies did, while any copy placed with them lived)."""
    from domino.fast_layers import use_fused_layers

    dtype = FUSED_DTYPES[0]
    model = use_fused_layers(use_small_batch_linear(cpu_target("llama", dtype)))
    with torch.inference_mode():
        model(torch.randint(0, 64, (1, 5)))
    copies = [entry[2].data for mod in model.modules() for key in ("_domino_packed", "_domino_fused_packed")
              if (entry := mod.__dict__.get(key)) is not None]
    assert any("_domino_fused_packed" in vars(m) for m in model.modules())
    held = {d.untyped_storage().data_ptr(): d.untyped_storage().nbytes() for d in copies}
    assert sum(held.values()) <= sum(d.numel() * d.element_size() + 128 for d in copies)


def test_small_batch_attention_refuses_models_with_their_own_attention_code():
    """BLOOM computes attention in its own code but builds its mask by the implementation's
    name: switched, it silently attended to later tokens (the kernel's mask function says
    "causal, by the kernel's rule"). It is refused by name, and use_cpu_kernels leaves its
    attention as it was, with a warning, still causal."""
    import transformers

    from domino.fast_attention import attention_switchable, uses_small_batch_attention
    from domino.loading import use_cpu_kernels

    torch.manual_seed(0)
    cfg = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    assert not attention_switchable(model) and attention_switchable(cpu_target("llama", torch.float32))
    with pytest.raises(ValueError, match="BloomForCausalLM computes its attention in its own code"):
        use_small_batch_attention(model)
    with pytest.warns(UserWarning, match="BloomForCausalLM computes attention in its own code"):
        use_cpu_kernels(model, small_batch_linear=False, small_batch_attention=True)
    assert not uses_small_batch_attention(model)
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % 64
    with torch.inference_mode():
        a, b = model(ids).logits, model(changed).logits
    assert torch.equal(a[:, :-1], b[:, :-1])  # no position sees the last token


def test_small_batch_attention_runs_gemma2_softcap_on_its_eager_attention():
    """Gemma 2 passes a logit softcap the kernel does not compute: that attention runs on the
    model's own eager attention (it fell back to HF's sdpa, which refuses softcap: the
    switched model raised where the unswitched one ran)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    attn_logit_softcapping=30.0, attn_implementation="eager")
    own = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    switched = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    switched.load_state_dict(own.state_dict())
    use_small_batch_attention(switched)
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(switched(ids).logits, own(ids).logits)


@pytest.mark.parametrize("bad", [None, "model", 3, torch.zeros(2)])
def test_kernel_switches_name_a_bad_model_argument(bad):
    """Every switch refuses what is not a module with a TypeError naming ``model`` (some
    failed on an attribute deep inside, some returned the argument as if switched);
    use_small_batch_attention also wants a HF model."""
    from domino import fast_attention, fast_forward, fast_layers, fast_linear

    switches = [getattr(mod, f"{verb}_{what}") for mod, what in [(fast_linear, "small_batch_linear"),
                                                                 (fast_layers, "fused_layers"),
                                                                 (fast_forward, "fast_forward"),
                                                                 (fast_attention, "small_batch_attention")]
                for verb in ("use", "undo", "uses")]
    for switch in switches:
        with pytest.raises(TypeError, match="model must be a"):
            switch(bad)
    with pytest.raises(TypeError, match="model must be a HF transformers PreTrainedModel, got Sequential"):
        use_small_batch_attention(torch.nn.Sequential())
