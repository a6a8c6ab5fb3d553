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
