"""sample: greedy exactness and sampling statistics against the exact distribution."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from conftest import POISON_TOKEN
from oracles import filtered_probs
from stats import assert_matches_distribution


@given(b=st.sampled_from([1, 2, 7, 33, 64]), V=st.sampled_from([1, 2, 3, 31, 1000, 4099, 50257]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31 - 1))
def test_greedy_is_argmax(b, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, V, generator=g) * 4).to(dtype)
    tokens = torch.full((b,), POISON_TOKEN, dtype=torch.int64)
    torch.ops.domino_ops.sample(logits, 0.0, 0, 1.0, None, tokens)
    assert torch.equal(tokens, logits.argmax(-1))  # first index on ties, as torch.argmax
    assert torch.equal(domino_ops.sample(logits), reference.sample(logits))


def test_greedy_ties_pick_first_index():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert domino_ops.sample(logits).tolist() == [1, 0]


CASES = [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6), (0.8, 5, 0.7), (1.0, 1, 1.0),
         (1.0, 0, 0.01)]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_matches_exact_distribution(temperature, top_k, top_p, dtype):
    V, N = 12, 30000
    row = (torch.randn(V, generator=torch.Generator().manual_seed(3)) * 1.5).to(dtype)
    logits = row.expand(N, V).contiguous()
    tokens = torch.full((N,), POISON_TOKEN, dtype=torch.int64)
    u = torch.rand(N, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    torch.ops.domino_ops.sample(logits, temperature, top_k, top_p, u, tokens)
    exact = filtered_probs(row.float().numpy(), temperature, top_k, top_p)
    assert_matches_distribution(tokens.numpy(), exact, what=f"T={temperature} k={top_k} p={top_p}")


def test_statistical_check_rejects_a_wrong_distribution():
    """Negative control: the same check fails when the temperature is ignored."""
    V, N = 12, 30000
    row = torch.randn(V, generator=torch.Generator().manual_seed(3)) * 1.5
    tokens = domino_ops.sample(row.expand(N, V).contiguous(), temperature=2.0,
                               generator=torch.Generator().manual_seed(0))
    with pytest.raises(AssertionError):
        assert_matches_distribution(tokens.numpy(), filtered_probs(row.numpy(), 1.0, 0, 1.0))


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_sampling_same_uniforms_as_reference(temperature, top_k, top_p):
    """Same uniforms: the reference's token in every row (the kernel's float64 weights and
    totals differ from the reference's only by rounding, its vectorised exp and summation
    order, which could move a draw only for a uniform within ~1e-13 of a CDF or nucleus
    boundary: none of these does)."""
    logits = torch.randn(257, 1001, generator=torch.Generator().manual_seed(8)) * 3
    got = domino_ops.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                            generator=torch.Generator().manual_seed(1))
    want = reference.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                            generator=torch.Generator().manual_seed(1))
    assert torch.equal(got, want)


def test_filtered_tokens_are_never_drawn():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0, 4.5]]).expand(5000, 5).contiguous()
    tokens = domino_ops.sample(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(np.unique(tokens.numpy()).tolist()) <= {1, 4}


def test_a_uniform_of_zero_draws_the_first_token_of_positive_weight():
    """u = 0 (torch.rand gives it once in 2^53) draws the first token whose CDF exceeds 0,
    the first one the filter keeps, not token 0 when token 0 is filtered out: the reference
    (the oracle) and the kernel alike, as a scalar parameter and per row."""
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0], [-3.0, -2.0, 7.0, 6.0], [9.0, 1.0, 1.0, 1.0]])
    zeros = torch.zeros(3, dtype=torch.float64)
    want = [1, 2, 0]  # top-2 keeps {1, 2}, {2, 3} and {0, 1, 2, 3} (ties kept): the first kept
    tokens, _ = reference.sample_from_logits(logits, 1.0, 2, 1.0, zeros)
    assert tokens.tolist() == want
    out = torch.full((3,), POISON_TOKEN, dtype=torch.int64)
    torch.ops.domino_ops.sample(logits, 1.0, 2, 1.0, zeros, out)
    assert out.tolist() == want
    out.fill_(POISON_TOKEN)
    torch.ops.domino_ops.sample(logits, 1.0, 0, 1.0, zeros, out, row_top_k=torch.tensor([2, 2, 2]))
    assert out.tolist() == want
