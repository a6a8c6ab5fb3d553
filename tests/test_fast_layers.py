"""domino.fast_layers: HF RMSNorms and SiLU gated MLPs on the fused CPU kernels."""

import inspect

import pytest
import torch

from domino import fast_layers
from domino.fast_layers import (ATTENTION_CLASSES, MLP_CLASSES, NORM_CLASSES, undo_fused_layers, use_fused_layers,
                                uses_fused_layers)
from domino.fast_linear import runs_packed, use_small_batch_linear
from tiny_models import IdTokenizer, cpu_target, tiny_drafter, verify_and_step


def _hf_class(name):
    import transformers

    return getattr(transformers, name, None) or next(
        getattr(mod, name) for mod in (
            __import__(f"transformers.models.{m}.modeling_{m}", fromlist=[name])
            for m in ("llama", "mistral", "qwen2", "qwen3")) if hasattr(mod, name))


@pytest.mark.parametrize("name", NORM_CLASSES + MLP_CLASSES)
def test_switched_classes_compute_what_the_kernels_compute(name):
    """Each listed class's forward is LlamaRMSNorm's / LlamaMLP's, word for word, in the
    installed transformers: a release that changes one fails here, not silently."""
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

    model = LlamaRMSNorm if name in NORM_CLASSES else LlamaMLP
    assert inspect.getsource(_hf_class(name).forward) == inspect.getsource(model.forward)


def test_switch_keeps_weights_and_undoes():
    model = cpu_target("llama", torch.bfloat16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    use_fused_layers(model)
    use_fused_layers(model)  # idempotent
    switched = [m for m in model.modules() if getattr(m, "_domino_fused_layer", False)]
    names = {type(m).__name__ for m in switched}
    # 2 norms, the MLP and the attention a layer, the final norm
    assert names == {"LlamaRMSNorm", "LlamaMLP", "LlamaAttention"} and len(switched) == 4 * 4 + 1
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    undo_fused_layers(model)
    assert not uses_fused_layers(model) and all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_switched_model_agrees_with_hf(kind, dtype):
    model = cpu_target(kind, dtype)
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        hf = model(input_ids=ids).logits.float()
        use_fused_layers(model)
        ours = model(input_ids=ids).logits.float()
    assert uses_fused_layers(model)
    tol = 1e-4 if dtype == torch.float32 else 0.1  # bf16: rare one-ulp differences, carried through 4 layers
    assert (ours - hf).abs().max() <= tol * hf.abs().max()
    assert (ours.argmax(-1) == hf.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_verification_forward_is_bit_identical_with_every_cpu_kernel(kind, dtype):
    """With the linear, attention and fused layers switched, a forward over k tokens gives
    every position the bits of the one-token steps."""
    model = use_fused_layers(use_small_batch_linear(cpu_target(kind, dtype, attn="small_batch")))
    big, steps = verify_and_step(model, k=9)
    assert torch.equal(big, steps)


def test_falls_back_to_hf_when_autograd_needs_a_graph():
    model = use_fused_layers(cpu_target("llama", torch.float32))
    ids = torch.randint(0, 64, (1, 5))
    out = model(input_ids=ids).logits  # grad mode on, parameters require grad
    out.sum().backward()
    assert model.model.norm.weight.grad is not None and model.model.layers[0].mlp.gate_proj.weight.grad is not None


def test_load_switches_the_fused_layers_with_the_linear_and_greedy_stays_exact():
    from domino.loading import load

    tgt = cpu_target("qwen3", torch.bfloat16)
    gen = load(tgt, tiny_drafter(tgt).to(torch.bfloat16), IdTokenizer(), dtype=torch.bfloat16,
               small_batch_linear=True, small_batch_attention=True)
    assert uses_fused_layers(gen.target)
    prompt = torch.randint(2, 64, (9,), generator=torch.Generator().manual_seed(3)).tolist()
    spec = gen.generate(prompt, max_new_tokens=40)
    assert spec.token_ids == gen.generate_target_only(prompt, max_new_tokens=40).token_ids
    tgt2 = cpu_target("qwen3", torch.float32)
    assert not uses_fused_layers(load(tgt2, tiny_drafter(tgt2), IdTokenizer()).target)  # opt-in, with the linear


@pytest.mark.parametrize("name", ATTENTION_CLASSES)
def test_the_fused_attention_mirrors_the_installed_forward(name):
    """The attention forward with one q/k/v product is a copy of HF's: it is switched in
    only where the installed class's forward is, word for word, the one it copies (a
    transformers release that changes it fails here, and such a model keeps HF's forward)."""
    assert fast_layers._mirrors_hf_attention(_hf_class(name))

    class Changed(_hf_class(name)):
        def forward(self, hidden_states, *args, **kwargs):
            return super().forward(hidden_states, *args, **kwargs)

    assert not fast_layers._mirrors_hf_attention(Changed)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_projections_give_the_separate_layers_bits(kind, dtype, monkeypatch):
    """A model whose q/k/v and gate/up products run as one each (where the packed kernel
    runs) computes exactly the bits of the same model running them one by one, through
    the KV cache of a verification and of its one-token steps."""
    model = use_fused_layers(use_small_batch_linear(cpu_target(kind, dtype, attn="small_batch")))
    fused = verify_and_step(model, k=9)
    assert torch.equal(*fused)
    with monkeypatch.context() as m:
        m.setattr(fast_layers, "fused_packed_linear", lambda *args: None)
        separate = verify_and_step(model, k=9)
    assert torch.equal(fused[0], separate[0]) and torch.equal(fused[1], separate[1])
    mlp = model.model.layers[0].mlp
    attention = model.model.layers[0].self_attn
    if runs_packed(mlp.gate_proj, dtype):  # the fused paths ran
        assert "_domino_fused_packed" in vars(mlp)
        assert ("_domino_fused_packed" in vars(attention)) == (kind == "llama")
    undo_fused_layers(model)
    assert "_domino_fused_packed" not in vars(mlp) and "_domino_fused_packed" not in vars(attention)


# ---- a Domino drafter's own modules ---------------------------------------------------

def _drafter_and_context(dtype, seed=0):
    """A two-layer tiny drafter in ``dtype``, its linears on the small-batch kernel, with a
    context of two left-padded sequences; (drafter, cache, anchor [2], anchor_pos [2])."""
    tgt = cpu_target("qwen3", dtype)
    d = use_small_batch_linear(tiny_drafter(tgt, num_hidden_layers=2).to(dtype).bind_target(tgt))
    g = torch.Generator().manual_seed(seed)
    valid = torch.ones(2, 11, dtype=torch.bool)
    valid[1, :3] = False
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    cache = d.new_cache(2, "cpu", dtype)
    with torch.no_grad():
        d.extend_context(cache, torch.randn(2, 11, d.fc.in_features, generator=g).to(dtype), pos, valid)
    return d, cache, torch.randint(0, 63, (2,), generator=g), pos[:, -1] + 1


def test_switch_covers_the_drafters_modules_and_undoes():
    from domino.model import DraftAttention, DraftMLP, RMSNorm

    d, *_ = _drafter_and_context(torch.bfloat16)
    state = {k: v.clone() for k, v in d.state_dict().items()}
    use_fused_layers(d)
    switched = [m for m in d.modules() if getattr(m, "_domino_fused_layer", False)]
    kinds = [type(m) for m in switched]
    # per layer: 4 norms (input, post-attention, q, k), the MLP, the attention; the context
    # projection's norm and the final norm
    assert kinds.count(RMSNorm) == 2 * 4 + 2 and kinds.count(DraftMLP) == 2 and kinds.count(DraftAttention) == 2
    assert len(switched) == 2 * 6 + 2
    assert all(torch.equal(v, d.state_dict()[k]) for k, v in state.items())
    undo_fused_layers(d)
    assert not uses_fused_layers(d) and all("forward" not in m.__dict__ for m in switched)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [None, slice(1, 4), slice(0, 8)])
@pytest.mark.parametrize("per_query_mask", [False, True])
def test_fused_drafter_attention_matches_its_forward(dtype, rows, per_query_mask):
    """One q/k/v product and one rotary call compute exactly the bits of the module's own
    projections and rotation, and the attention on small_batch_attention is
    DraftAttention.forward's (SDPA's) up to rounding: all query rows or some, under
    generation's mask [b, 1, Tc + Q] or a per-query one [b, Q, Tc + Q] as training passes
    (norms left unswitched in all)."""
    from domino.model import DraftAttention

    d, cache, anchor, anchor_pos = _drafter_and_context(dtype)
    if not runs_packed(d.layers[0].self_attn.q_proj, dtype):
        pytest.skip(f"this CPU runs {dtype} linears unpacked: the fused product does not apply")
    block, positions = d.block_input(anchor, anchor_pos)
    Q = block.shape[1]
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, Q, d.config.hidden_size, generator=g).to(dtype)
    cos, sin = d.rotary(positions, dtype)
    mask = torch.cat([cache.mask, cache.mask.new_ones(2, Q)], dim=1)[:, None, :]
    if per_query_mask:
        mask = mask.expand(2, Q, mask.shape[-1]) & (torch.rand(2, Q, mask.shape[-1], generator=g) < 0.7)
        mask[..., -Q:] |= torch.eye(Q, dtype=torch.bool)  # each query sees itself
    for i, layer in enumerate(d.layers):
        mod = layer.self_attn
        args = (x, cos, sin, cache.keys[i], cache.values[i], mask, rows)
        with torch.no_grad():
            fused = fast_layers._draft_attention_forward(mod, *args)
            own = fast_layers._draft_attend(mod, mod.query(x, cos, sin), *mod.key_value(x, cos, sin), *args[3:])
            plain = DraftAttention.forward(mod, *args)
        assert "_domino_fused_packed" in vars(mod)  # the fused path ran
        assert fused.shape == (2, Q if rows is None else rows.stop - rows.start, x.shape[-1])
        assert torch.equal(fused, own)
        tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fused, plain, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_drafter_attention_ignores_hidden_context(dtype):
    """A sequence's block attends to its visible context alone: the same bits whatever
    hidden keys (left padding, the masked holes of earlier rounds) sit among them, and
    whatever rows are asked for; SDPA's blocked CPU kernels gave different bits here."""
    d, cache, anchor, anchor_pos = _drafter_and_context(dtype)
    block, positions = d.block_input(anchor, anchor_pos)
    Q = block.shape[1]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, Q, d.config.hidden_size, generator=g).to(dtype)
    cos, sin = d.rotary(positions[:1], dtype)
    mod = d.layers[0].self_attn
    ctx_k, ctx_v = cache.keys[0][:1], cache.values[0][:1]
    mask = torch.ones(1, 1, ctx_k.shape[2] + Q, dtype=torch.bool)
    # the same context with 7 hidden keys of garbage spread among it
    where = torch.zeros(ctx_k.shape[2] + 7, dtype=torch.bool)
    where[torch.randperm(len(where), generator=g)[:7]] = True
    holes_k = torch.randn(1, mod.kvh, len(where), mod.hd, generator=g).to(dtype)
    holes_v = torch.randn(1, mod.kvh, len(where), mod.hd, generator=g).to(dtype)
    holes_k[:, :, ~where], holes_v[:, :, ~where] = ctx_k, ctx_v
    holes_mask = torch.cat([~where, torch.ones(Q, dtype=torch.bool)])[None, None]
    with torch.no_grad():
        want = fast_layers._draft_attention_forward(mod, x, cos, sin, ctx_k, ctx_v, mask)
        got = fast_layers._draft_attention_forward(mod, x, cos, sin, holes_k, holes_v, holes_mask)
        some = fast_layers._draft_attention_forward(mod, x, cos, sin, holes_k, holes_v, holes_mask, slice(2, 5))
    assert torch.equal(got, want) and torch.equal(some, want[:, 2:5])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_switched_drafter_drafts_what_the_plain_one_drafts(dtype):
    d, cache, anchor, anchor_pos = _drafter_and_context(dtype)
    block, positions = d.block_input(anchor, anchor_pos)
    with torch.no_grad():
        plain_hidden, plain = d.backbone(cache, block, positions), d.draft(cache, anchor, anchor_pos)
        use_fused_layers(d)
        fused_hidden, fused = d.backbone(cache, block, positions), d.draft(cache, anchor, anchor_pos)
    assert uses_fused_layers(d)
    tol = 1e-5 if dtype == torch.float32 else 0.02  # bf16: the fused norm's rare one-ulp differences
    assert (fused_hidden.float() - plain_hidden.float()).abs().max() <= tol * plain_hidden.float().abs().max()
    assert torch.equal(fused.tokens, plain.tokens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fused", [False, True])
def test_backbone_rows_are_those_rows_of_the_whole_block(dtype, fused):
    """draft_block_hidden (the last layer past its attention on the n draft rows only)
    gives those rows of the whole block's backbone bit for bit: the linears are
    batch-invariant and everything after the attention is row-wise."""
    d, cache, anchor, anchor_pos = _drafter_and_context(dtype)
    if fused:
        use_fused_layers(d)
    block, positions = d.block_input(anchor, anchor_pos)
    with torch.no_grad():
        whole = d.backbone(cache, block, positions)
        for n in range(1, d.config.num_drafts + 1):
            rows = d.draft_block_hidden(cache, anchor, anchor_pos, n)
            assert rows.shape == (2, n, d.config.hidden_size) and rows.is_contiguous()
            assert torch.equal(rows, d.draft_hidden(whole, n))


def test_switched_drafter_trains_through_its_own_forwards():
    """Under autograd the switched drafter modules fall back to their own forwards."""
    d, cache, anchor, anchor_pos = _drafter_and_context(torch.float32)
    use_fused_layers(d)
    block, positions = d.block_input(anchor, anchor_pos)
    cache.key_stores = [k.detach() for k in cache.key_stores]
    cache.value_stores = [v.detach() for v in cache.value_stores]
    d.backbone(cache, block, positions).square().sum().backward()
    layer = d.layers[0]
    assert all(p.grad is not None for p in (layer.input_layernorm.weight, layer.self_attn.q_proj.weight,
                                            layer.self_attn.q_norm.weight, layer.mlp.gate_proj.weight))
