"""Per-request sampling parameters: SamplingParams, per-request seeds, validation."""

import pytest
import torch

from domino import SamplingParams
from tiny_models import tiny_generator

PROMPT = [3, 5, 2, 6]


@pytest.fixture(scope="module")
def gen():
    return tiny_generator("qwen3", vocab=16, block_size=4, seed=3)


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch(gen):
    """With a fixed number of drafts per round; the adaptive budget chooses one size for
    the whole batch, so there a seeded request repeats only within the same batch."""
    fixed = dict(max_new_tokens=12, num_drafts=gen.drafter.config.num_drafts)
    seeded = SamplingParams(temperature=1.0, seed=123)
    alone = gen.generate(PROMPT, sampling=seeded, **fixed).token_ids
    other = SamplingParams(temperature=1.0, seed=7)
    batch = gen.generate([[1, 2, 3], PROMPT, [4, 4]], sampling=[other, seeded, SamplingParams(temperature=1.0)],
                         **fixed).token_ids
    assert batch[1] == alone
    again = gen.generate(PROMPT, sampling=seeded, **fixed).token_ids
    assert again == alone
    different = gen.generate(PROMPT, sampling=SamplingParams(temperature=1.0, seed=124), **fixed).token_ids
    assert different != alone
    adaptive = [gen.generate(PROMPT, max_new_tokens=12, sampling=seeded).token_ids for _ in range(2)]
    assert adaptive[0] == adaptive[1]


def test_scalars_and_one_sampling_params_are_the_same_request(gen):
    a = gen.generate([PROMPT, PROMPT], max_new_tokens=8, temperature=0.9, top_k=5,
                     generator=torch.Generator().manual_seed(3)).token_ids
    b = gen.generate([PROMPT, PROMPT], max_new_tokens=8, sampling=SamplingParams(temperature=0.9, top_k=5),
                     generator=torch.Generator().manual_seed(3)).token_ids
    assert a == b


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(temperature=-1.0), ValueError, "temperature must be finite and >= 0"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), ValueError, "top_k must be >= 0"),
    (dict(top_k=1.5), TypeError, "top_k must be an int"),
    (dict(seed="x"), TypeError, "seed must be an int"),
])
def test_bad_sampling_params_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_sampling_list_must_match_the_batch(gen):
    with pytest.raises(ValueError, match="one per prompt"):
        gen.generate([PROMPT, PROMPT], max_new_tokens=4, sampling=[SamplingParams()])
    with pytest.raises(ValueError, match="not both"):
        gen.generate(PROMPT, max_new_tokens=4, temperature=1.0, sampling=SamplingParams())


def test_a_batch_mixing_greedy_and_differently_sampled_requests(gen):
    """Per-row parameters reach the kernels: the greedy request of a mixed batch decodes
    exactly as it does alone, next to requests with their own temperature / top-k / top-p."""
    greedy_alone = gen.generate(PROMPT, max_new_tokens=10).token_ids
    batch = gen.generate([[1, 2, 3], PROMPT, [4, 4]], max_new_tokens=10,
                         sampling=[SamplingParams(temperature=0.8, top_k=4), SamplingParams(),
                                   SamplingParams(temperature=1.3, top_p=0.7, seed=5)],
                         generator=torch.Generator().manual_seed(0)).token_ids
    assert batch[1] == greedy_alone
    assert all(0 <= t < 16 for row in batch for t in row)
