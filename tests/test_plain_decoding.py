"""The engine's own plain decoding loop (``DominoGenerator.generate_plain``, the sampled
speedups' baseline): greedy it is the target's own greedy decoding (HF ``generate``'s,
token for token, batched and with stops, EOS and streaming), sampled it is distributed as
the target's filtered distribution, and a seed repeats its draws."""

import numpy as np
import pytest
import torch

from domino import SamplingParams
from engine_cases import PROMPT, V, assert_distributed_as_target, assert_stops_like_the_target, prompts
from tiny_models import tiny_generator


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_is_the_targets_greedy_decoding(kind, batch):
    gen = tiny_generator(kind)
    ps = prompts(batch, seed=batch + 7)  # prompts of different lengths: a left-padded batch
    want = gen.generate_target_only(ps, max_new_tokens=30)
    got = gen.generate_plain(ps, max_new_tokens=30)
    assert got.token_ids == want.token_ids and got.text == want.text
    assert all(len(t) == 30 for t in got.token_ids)
    assert all(a == [1] * 30 for a in got.acceptance_lengths)


def test_stops_eos_and_streaming_cut_where_the_target_stops():
    gen = tiny_generator("qwen3")
    assert_stops_like_the_target(gen, gen.generate_plain)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 4, 0.9)])
def test_sampling_is_distributed_as_the_target(temperature, top_k, top_p):
    gen = tiny_generator("qwen3", vocab=V, block_size=4, seed=3)
    N = 4000
    res = gen.generate_plain([PROMPT] * N, max_new_tokens=5, temperature=temperature, top_k=top_k, top_p=top_p,
                             generator=torch.Generator().manual_seed(0))
    assert_distributed_as_target(gen, np.array(res.token_ids), temperature, top_k, top_p)


def test_a_loop_that_ignores_the_temperature_is_caught(monkeypatch):
    """Negative control: the same check fails when every token is drawn at temperature 1
    instead of 0.5."""
    import domino.generate

    sample = domino.generate.domino_ops.sample
    monkeypatch.setattr(domino.generate.domino_ops, "sample", lambda logits, **kw: sample(logits, **{
        **kw, "temperature": 1.0}))
    gen = tiny_generator("qwen3", vocab=V, block_size=4, seed=3)
    res = gen.generate_plain([PROMPT] * 4000, max_new_tokens=3, temperature=0.5,
                             generator=torch.Generator().manual_seed(0))
    with pytest.raises(AssertionError, match="chi-square"):
        assert_distributed_as_target(gen, np.array(res.token_ids), 0.5, 0, 1.0)


def test_a_seeded_request_repeats_its_draws_in_any_batch():
    gen = tiny_generator("qwen3")
    ps = prompts(3, seed=4)
    params = [SamplingParams(0.9, seed=11), SamplingParams(0.0), SamplingParams(1.2, seed=5)]
    batch = gen.generate_plain(ps, max_new_tokens=20, sampling=params)
    alone = gen.generate_plain(ps[2], max_new_tokens=20, sampling=params[2])
    assert batch.token_ids[2] == alone.token_ids
    assert batch.token_ids[1] == gen.generate_target_only(ps[1], max_new_tokens=20).token_ids


def test_bad_arguments_are_refused_as_generate_refuses_them():
    gen = tiny_generator("qwen3")
    with pytest.raises(TypeError, match="stream must be a callable"):
        gen.generate_plain([1, 2, 3], stream=3)
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        gen.generate_plain([1, 2, 3], temperature=1.0, generator=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gen.generate_plain([1, 2, 3], max_new_tokens=0)
    with pytest.raises(ValueError, match="give either sampling= or temperature"):
        gen.generate_plain([1, 2, 3], temperature=0.5, sampling=SamplingParams(0.5))


def test_a_float16_target_decodes():
    """Logits of a float16 target go to the sampler as float32 (it takes float32 or bf16)."""
    gen = tiny_generator("llama")
    gen.target.half()
    p = prompts(1, seed=3)[0]
    assert gen.generate_plain(p, max_new_tokens=8).token_ids == gen.generate_target_only(p, max_new_tokens=8).token_ids
    assert len(gen.generate_plain(p, max_new_tokens=8, temperature=0.8).token_ids) == 8


def test_the_targets_own_beam_search_runs_on_a_target_without_an_end_token():
    """generate_target_only passes HF generate's keywords on: beam search on a target with
    no end token once raised an IndexError inside HF (it got eos_token_id=[], not None)."""
    gen = tiny_generator("llama")
    assert not gen.eos_ids
    res = gen.generate_target_only(["1 2 3 4 5", "7 8"], max_new_tokens=6, num_beams=2)
    assert [len(ids) for ids in res.token_ids] == [6, 6]
