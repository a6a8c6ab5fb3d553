"""Targets whose attention or logits differ from Llama's, and what the engine does with them
(tiny random models built here, no download):

- sliding-window attention (Mistral; Gemma 3's mixed layers): HF counts the window in KV
  cache slots, which the engine's tree masks and a batch's masked cache slots would widen
  or shift, so trees fall back to chains ("auto") or are refused, and batches are refused;
  a single sequence decoded past its window is still exactly the target's greedy decoding.
- logits transformed after lm_head (Gemma 2's soft-capping): speculative sampling must draw
  from the target's own, transformed, distribution.
"""

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3TextConfig, Gemma3ForCausalLM, MistralConfig
from transformers import MistralForCausalLM

from domino import DominoGenerator, TreeShape
from domino.target import sliding_window
from engine_cases import V, check, cheap_verification, prompts
from tiny_models import IdTokenizer, tiny_drafter, tiny_target

COMMON = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, pad_token_id=0, bos_token_id=None,
              eos_token_id=None)
WINDOW = 8  # shorter than the generations below


def tiny(model_cls, config):
    torch.manual_seed(0)
    model = model_cls(config)
    with torch.no_grad():  # sharp logits: stable greedy paths
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return DominoGenerator(model.eval(), tiny_drafter(model), IdTokenizer())


def sliding_targets():
    return {
        "mistral": lambda: tiny(MistralForCausalLM, MistralConfig(**COMMON, sliding_window=WINDOW)),
        "gemma3": lambda: tiny(Gemma3ForCausalLM, Gemma3TextConfig(
            **COMMON, sliding_window=WINDOW,
            layer_types=["sliding_attention"] * 3 + ["full_attention"])),
    }


def test_sliding_window_is_read_from_the_config():
    assert sliding_window(MistralConfig(sliding_window=8)) == 8
    assert sliding_window(MistralConfig(sliding_window=None)) is None
    assert sliding_window(Gemma3TextConfig(num_hidden_layers=2, sliding_window=16, layer_types=["sliding_attention", "full_attention"])) == 16
    assert sliding_window(Gemma3TextConfig(num_hidden_layers=2, sliding_window=16, layer_types=["full_attention"] * 2)) is None
    assert sliding_window(tiny_target().config) is None  # Qwen3: use_sliding_window=False


@pytest.mark.parametrize("kind", list(sliding_targets()))
def test_sliding_window_target_decodes_past_its_window_exactly(kind):
    """tree="auto" falls back to chains, which verify several tokens a round and still give
    the target's greedy tokens well past the window (the tree's mask had diverged at the
    window's first overflow: new token 7 of a 3-token prompt)."""
    gen = sliding_targets()[kind]()
    cheap_verification(gen, 1)
    for p in prompts(3, seed=3, vocab=V):
        res = gen.generate(p, max_new_tokens=24)
        assert res.token_ids == gen.generate_target_only(p, max_new_tokens=24).token_ids
        assert max(res.verified_lengths) > 1  # multi-token rounds ran
    assert gen._default_tree([], None) is None


@pytest.mark.parametrize("kind", list(sliding_targets()))
def test_sliding_window_target_refuses_trees_and_batches(kind):
    gen = sliding_targets()[kind]()
    p = prompts(2, seed=3, vocab=V)
    with pytest.raises(ValueError, match=rf"tree: .*sliding window \({WINDOW} positions\)"):
        gen.generate(p[0], max_new_tokens=4, tree=TreeShape(2, 3))
    with pytest.raises(ValueError, match=rf"prompt: .*sliding window \({WINDOW} positions\).*one prompt per call"):
        gen.generate(p, max_new_tokens=4, tree=None)


def test_logits_soft_capping_target_samples_its_own_distribution():
    """Gemma 2 soft-caps its logits after lm_head (tanh(x / c) * c): the verification must
    use the capped logits, or the sampled tokens follow another distribution (chi-square
    p = 0 when the engine took lm_head's output). Full attention in every layer here, so
    the statistical check may run its batch."""
    config = Gemma2Config(**COMMON, final_logit_softcapping=2.0, layer_types=["full_attention"] * 4)
    gen = tiny(Gemma2ForCausalLM, config)
    with torch.inference_mode():  # the cap matters here: lm_head's raw logits are other
        ids = torch.tensor([[3, 5, 2, 6]])
        capped = gen.target(ids).logits[0, -1]
        raw = gen.target.lm_head(gen.target.model(ids).last_hidden_state)[0, -1]
    assert (capped - raw).abs().max() > 0.5
    check(gen, 1.0, 0, 1.0, N=4000)
