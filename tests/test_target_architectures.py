"""Targets whose attention or logits differ from Llama's, and what the engine does with them
(tiny random models built here, no download):

- sliding-window attention (Mistral; Gemma 3's mixed layers): HF counts the window in KV
  cache slots, which the engine's tree masks and a batch's masked cache slots would widen
  or shift, so trees fall back to chains ("auto") or are refused, and batches are refused;
  a single sequence decoded past its window is still exactly the target's greedy decoding.
- logits transformed after lm_head (Gemma 2's soft-capping): speculative sampling must draw
  from the target's own, transformed, distribution.
- rotary frequencies that depend on a forward's longest position (HF "dynamic": past the
  context window; "longrope", Phi-3 128k: past original_max_position_embeddings), which
  HF picks per forward for every row: no verified position (a finished row's included)
  reaches the window or a longrope switch from below, and calls across a switch are refused.
"""

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3TextConfig, Gemma3ForCausalLM, MistralConfig
from transformers import LlamaConfig, LlamaForCausalLM, MistralForCausalLM, Phi3Config

from domino import DominoGenerator, TreeShape
from domino.target import longrope_switch, sliding_window
from engine_cases import V, check, cheap_verification, prompts
from tiny_models import IdTokenizer, RiggedDrafts, tiny_drafter, tiny_target

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


# ---- rotaries that depend on a forward's longest position -------------------------------

ORIG = 32  # a longrope target's switch (original_max_position_embeddings)
DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": ORIG,
            "short_factor": [1.0] * 8, "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]}


def rotary_target(rope: dict, window: int) -> DominoGenerator:
    """A tiny Llama with ``rope`` and a ``window``-token context, its queries and keys
    scaled up so that its greedy tokens follow the rotary (a random init attends almost
    uniformly, whatever the positions)."""
    gen = tiny(LlamaForCausalLM, LlamaConfig(**{**COMMON, "max_position_embeddings": window},
                                             tie_word_embeddings=False, rope_parameters=rope))
    with torch.no_grad():
        for layer in gen.target.model.layers:
            layer.self_attn.q_proj.weight.mul_(10.0)
            layer.self_attn.k_proj.weight.mul_(10.0)
    return gen


class FedPositions:
    """Records the largest position of every target forward of ``gen``."""

    def __init__(self, gen):
        self.gen, self.largest, self.original = gen, [], gen._target_forward

        def spy(ids, mask, positions, cache, **kw):
            self.largest.append(int(positions.max()))
            return self.original(ids, mask, positions, cache, **kw)

        gen._target_forward = spy

    def restore(self):
        self.gen._target_forward = self.original


def rigged_generate(gen, prompt, max_new_tokens, full, **kw):
    """``gen.generate`` with every draft right (``full``: each sequence's target greedy
    continuation, past the end of the call), and the largest position fed to the target."""
    rig, fed = RiggedDrafts(gen, full), FedPositions(gen)
    try:
        res = gen.generate(prompt, max_new_tokens=max_new_tokens, num_drafts=gen.drafter.config.num_drafts,
                           tree=None, **kw)
    finally:
        rig.restore()
        fed.restore()
    return res.token_ids, max(fed.largest)


def test_longrope_switch_is_read_from_the_config():
    assert longrope_switch(LlamaConfig(**COMMON, rope_parameters=LONGROPE)) == ORIG
    assert longrope_switch(LlamaConfig(**COMMON, rope_parameters=DYNAMIC)) is None
    assert longrope_switch(LlamaConfig(**COMMON)) is None
    phi3 = Phi3Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      max_position_embeddings=1024, original_max_position_embeddings=256,
                      rope_parameters={"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8})
    assert longrope_switch(phi3) == 256  # Phi-3 keeps it beside rope_parameters


def test_dynamic_rope_target_decodes_to_the_end_of_its_window_exactly():
    """prompt + max_new_tokens = the window, every draft right: the last rounds' drafts are
    cut at the window, where a block running past it had rescaled the whole forward's
    rotary (HF "dynamic"): 1 of these 12 prompts decoded other tokens than the target."""
    window = 48
    gen = rotary_target(DYNAMIC, window)
    for seed in range(12):
        p = torch.randint(2, V, (3 + seed % 8,), generator=torch.Generator().manual_seed(seed)).tolist()
        want = gen.generate_target_only(p, max_new_tokens=window - len(p)).token_ids
        got, largest = rigged_generate(gen, p, window - len(p), [p + want])
        assert got == want, seed
        assert largest < window


def test_a_finished_sequence_keeps_nothing_and_its_positions_stay():
    """A batch row that ends early (EOS) rides along in every round but keeps no slot: the
    shared cache grows by what the live row keeps (it had grown by the finished row's whole
    block every round), and its positions stay where it ended, so under a "dynamic" rotary
    the live row decodes as the target does (6 of 6 batches had differed, from about new
    token 13 on, once the finished row's positions passed the window)."""
    window, N = 96, 40
    gen = rotary_target(DYNAMIC, window)
    slots, commit = [], gen._commit

    def spy(st, *args):
        commit(st, *args)
        slots.append(st.cache_mask.shape[1])

    gen._commit = spy
    checked = 0
    for seed in range(20):
        if checked == 4:
            break
        ps = prompts(2, seed=seed, vocab=V)
        gen.eos_ids = []
        long0 = gen.generate_target_only(ps[0], max_new_tokens=window - len(ps[0])).token_ids
        first1 = gen.generate_target_only(ps[1], max_new_tokens=N).token_ids
        eos = next((t for t in long0[1:6] if t not in first1), None)
        if eos is None:
            continue
        gen.eos_ids = [eos]
        want = gen.generate_target_only(ps, max_new_tokens=N).token_ids
        assert len(want[0]) < 6 and len(want[1]) == N
        slots.clear()
        got, largest = rigged_generate(gen, ps, N, [ps[0] + long0, [0] * window])  # row 1: every draft wrong
        assert got == want, seed
        assert largest < window
        # row 1 keeps one token a round; row 0 keeps nothing once finished
        assert slots[-1] <= max(len(p) for p in ps) + N + 6
        checked += 1
    assert checked == 4


@pytest.mark.parametrize("side", ["below", "above"])
def test_longrope_target_decodes_on_either_side_of_its_switch_exactly(side):
    """Below the switch (prompt + max_new_tokens = the switch, every draft right) the
    drafts are cut so that no block reaches it: a block that did rotated its earlier
    positions with the long factors (10 of 12 prompts differed from the target, crossing
    calls included); a prompt past it decodes with the long factors throughout."""
    gen = rotary_target(LONGROPE, 128)
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        p = torch.randint(2, V, ((3 + seed % 8) if side == "below" else ORIG + 1 + seed,), generator=g).tolist()
        N = ORIG - len(p) if side == "below" else 40
        want = gen.generate_target_only(p, max_new_tokens=N).token_ids
        assert gen.generate_plain(p, max_new_tokens=N).token_ids == want
        got, largest = rigged_generate(gen, p, N, [p + want])
        assert got == want, seed
        assert (largest < ORIG) if side == "below" else (largest >= ORIG)


def test_longrope_target_refuses_a_call_across_its_switch():
    gen = rotary_target(LONGROPE, 128)
    below, above = [5] * (ORIG - 4), [5] * (ORIG + 1)
    for method in (gen.generate, gen.generate_plain, gen.generate_target_only):
        with pytest.raises(ValueError, match=rf"prompt has {ORIG - 4} tokens; with max_new_tokens=5 the call would "
                                             rf"cross {ORIG} tokens, where this target's longrope rotary switches"):
            method(below, max_new_tokens=5)
        method(below, max_new_tokens=4)  # up to the switch: fine
        with pytest.raises(ValueError, match=rf"prompt: the batch mixes prompts shorter and longer than {ORIG} "):
            method([below, above], max_new_tokens=2)
