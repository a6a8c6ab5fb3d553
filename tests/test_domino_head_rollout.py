"""domino_head_rollout: CPU kernel and reference against an independent float64 oracle."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given

import domino_ops
from domino_ops import reference
from kernel_cases import (HEAD_DTYPES, head_input_strategy, head_rollout_inputs, head_two_step_population,
                          weights_as_float64)
from kernel_backends import emulated_cuda_kernel
from oracles import ARGMAX_MARGIN, head_rollout_oracle
from poisoned_calls import run_head_poisoned
from stats import assert_matches_distribution
from torch_threads import torch_threads

shape_strategy = head_input_strategy(b=[1, 2, 3, 8, 33], k=[1, 2, 5, 16], V=[1, 2, 17, 100, 257, 1000, 4099],
                                     r=[1, 3, 16, 33, 64], G=[1, 5, 16, 40], H=[1, 7, 32])


def call_kernel_poisoned(inputs, *, write_logits=False):
    """The CPU kernel through the dispatcher (outputs passed in, pre-filled with garbage)."""
    return run_head_poisoned(torch.ops.domino_ops.domino_head_rollout, inputs, write_logits=write_logits)


@given(shape_strategy)
def test_greedy_kernel_matches_oracle(p):
    inputs = head_rollout_inputs(**p)
    tokens_ref, lp_ref, S_ref, _, margins = head_rollout_oracle(*inputs)
    assume(bool((margins > ARGMAX_MARGIN).all()))
    tokens, logprobs, state_out, _ = call_kernel_poisoned(inputs)
    assert torch.equal(tokens, tokens_ref)
    torch.testing.assert_close(logprobs, lp_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, S_ref.float(), rtol=1e-4, atol=1e-5)


@given(shape_strategy)
def test_greedy_wrapper_matches_reference(p):
    """The public wrapper and the eager reference agree (reference on float64 weights)."""
    inputs = head_rollout_inputs(**p)
    _, _, _, _, margins = head_rollout_oracle(*inputs)
    assume(bool((margins > ARGMAX_MARGIN).all()))
    as64 = weights_as_float64(inputs)
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*as64)
    t, lp, s = domino_ops.domino_head_rollout(*inputs)
    assert torch.equal(t, t_ref)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)


@given(shape_strategy)
def test_write_logits_writes_final_logits(p):
    inputs = head_rollout_inputs(**p)
    _, _, _, L_ref, margins = head_rollout_oracle(*inputs)
    assume(bool((margins > ARGMAX_MARGIN).all()))
    base = inputs[0].clone()
    call_kernel_poisoned((base,) + inputs[1:], write_logits=True)
    tol = 1e-4 if base.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(base.double(), L_ref.to(base.dtype).double(), rtol=tol, atol=tol)


def test_write_logits_rounds_bf16_logits_to_nearest():
    """Into bf16 base logits the native kernel writes each float32 logit rounded to the
    nearest bf16, ties to even (c10::BFloat16, as torch): the float64 oracle's logits rounded
    to bf16, except within float32 error of a midpoint (tests/test_kernel_backends.py checks
    the GPU backends the same way)."""
    inputs = head_rollout_inputs(2, 3, 300, 16, 16, 8, torch.float32, torch.bfloat16, True, seed=5)
    _, _, _, L_ref, margins = head_rollout_oracle(*inputs)
    assert bool((margins > ARGMAX_MARGIN).all())
    base = inputs[0].clone()
    call_kernel_poisoned((base,) + inputs[1:], write_logits=True)
    assert (base == L_ref.to(torch.bfloat16)).float().mean() >= 0.99


def test_without_write_logits_base_is_untouched():
    inputs = head_rollout_inputs(3, 4, 300, 8, 16, 8, torch.float32, torch.float32, True, 1)
    before = inputs[0].clone()
    domino_ops.domino_head_rollout(*inputs)
    assert torch.equal(inputs[0], before)


def test_eager_reference_in_bf16_is_close_to_oracle():
    """The reference computes in the weights' dtype (the eager baseline): close, not exact.
    Its bf16 products move the logits by up to ~0.03 here (bf16 rounding, 2^-8 relative),
    far below this case's top-1 margins (>= 0.24, checked), so the tokens are the oracle's;
    the log-probabilities and state are within bf16 tolerance (measured: 0.006 and 0.001)."""
    inputs = head_rollout_inputs(2, 4, 500, 16, 16, 16, torch.bfloat16, torch.float32, False, 3)
    tokens_ref, lp_ref, S_ref, _, margins = head_rollout_oracle(*inputs)
    assert bool((margins > 0.2).all())
    tokens, lp, S = reference.domino_head_rollout(*inputs)
    assert torch.equal(tokens, tokens_ref)
    torch.testing.assert_close(lp, lp_ref.float(), rtol=0.02, atol=0.02)
    torch.testing.assert_close(S, S_ref.float(), rtol=0.05, atol=0.05)


# ---- sampling (T > 0): statistics against the exact distribution ------------------------

@pytest.mark.parametrize("wdtype", HEAD_DTYPES)
@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (1.0, 4, 0.9)])
def test_sampled_rollout_joint_distribution(wdtype, table, temperature, top_k, top_p):
    """Two steps sampled for N identical sequences: the joint law of (x0, x1) must be
    p(x0) * p(x1 | x0), where x1's distribution depends on x0 through the GRU. Negative
    control: a sampler whose second step ignores its own x0 (x1 drawn as after another
    sequence's x0: the same pairs with x1 permuted across sequences, which keeps both
    marginals) must fail the same check: unfiltered with chi-square p ~ 0, filtered by
    drawing pairs outside the support (x1 past the filter at its own x0)."""
    V, N = 6, 12000
    inputs, joint, p0 = head_two_step_population(V, N, wdtype, temperature, top_k, top_p, table)
    gen = torch.Generator().manual_seed(5)
    tokens, logprobs, _ = domino_ops.domino_head_rollout(*inputs, temperature=temperature, top_k=top_k,
                                                         top_p=top_p, generator=gen)
    pairs = (tokens[:, 0] * V + tokens[:, 1]).numpy()
    assert_matches_distribution(pairs, joint, what="(x0, x1)")
    other = torch.randperm(N, generator=torch.Generator().manual_seed(6))
    with pytest.raises(AssertionError, match="chi-square|zero probability"):
        assert_matches_distribution((tokens[:, 0] * V + tokens[other, 1]).numpy(), joint, what="x1 not after x0")
    # logprobs are those of the filtered distribution the token was drawn from
    lp0 = np.log(p0[tokens[:, 0].numpy()])
    np.testing.assert_allclose(logprobs[:, 0].numpy(), lp0, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wdtype", HEAD_DTYPES)
def test_sampled_rollout_same_uniforms_as_reference(wdtype):
    """Same generator state: kernel and float64 reference draw the same tokens (a draw
    could differ only where float32 logits put a uniform within rounding of a CDF step or a
    top-k / top-p boundary: none of these 384 does), with the same log-probabilities and
    state up to float32 rounding."""
    inputs = head_rollout_inputs(64, 6, 300, 16, 16, 8, wdtype, torch.float32, True, seed=2)
    as64 = weights_as_float64(inputs)
    kw = dict(temperature=0.9, top_k=50, top_p=0.95)
    t, lp, s = domino_ops.domino_head_rollout(*inputs, generator=torch.Generator().manual_seed(9), **kw)
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*as64, generator=torch.Generator().manual_seed(9), **kw)
    assert torch.equal(t, t_ref)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)


def test_write_logits_at_temperature_gives_draft_distribution():
    """With write_logits the caller can rebuild the exact draft distribution q of each token."""
    inputs = head_rollout_inputs(4, 5, 200, 8, 8, 8, torch.float32, torch.float32, True, seed=4)
    base = inputs[0].clone()
    t, lp, _ = domino_ops.domino_head_rollout(base, *inputs[1:], temperature=0.8,
                                              generator=torch.Generator().manual_seed(0), write_logits=True)
    q = torch.log_softmax(base / 0.8, dim=-1).gather(-1, t[..., None])[..., 0]
    torch.testing.assert_close(lp, q, rtol=1e-4, atol=1e-4)


def test_generator_makes_sampling_reproducible():
    inputs = head_rollout_inputs(8, 4, 100, 8, 8, 8, torch.float32, torch.float32, True, seed=6)
    a = domino_ops.domino_head_rollout(*inputs, temperature=1.0, generator=torch.Generator().manual_seed(1))
    b = domino_ops.domino_head_rollout(*inputs, temperature=1.0, generator=torch.Generator().manual_seed(1))
    c = domino_ops.domino_head_rollout(*inputs, temperature=1.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], c[0])


def test_cuda_kernel_refuses_more_sequences_than_its_grid_takes():
    """The CUDA rollout puts the sequences on the grid's y axis, which CUDA caps at 65535
    blocks: one more is a ValueError naming base_logits, raised before any launch (the
    emulator holds launches to the same limit)."""
    inputs = head_rollout_inputs(65536, 1, 2, 1, 1, 1, torch.float32, torch.float32, True, seed=0)
    with pytest.raises(ValueError, match=r"domino_head_rollout: base_logits has 65536 rows; the CUDA kernel takes at "
                                         r"most 65535"):
        run_head_poisoned(emulated_cuda_kernel("domino_head_rollout"), inputs)


def _zero_head(V, r=4, G=4, seed=0):
    """gru_input, w_ih, w_hh, w1s, w2 of a head whose correction is 0 (w2 = 0): the tokens
    are the base logits' argmax."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, 3 * G, generator=g), None, torch.randn(3 * G, G, generator=g), torch.randn(r, G, generator=g),
            torch.zeros(V, r))


def test_a_tie_across_the_threads_vocabulary_chunks_takes_the_first_token():
    """Two threads split the vocabulary (V = 4100); the maximum is tied between a token of
    the first chunk and one of the last: greedy takes the first, as torch.argmax."""
    V = 4100
    base = torch.randn(1, 1, V, generator=torch.Generator().manual_seed(0))
    base[0, 0, 5] = base[0, 0, 4097] = 50.0
    with torch_threads(2):
        tokens, _, _ = domino_ops.domino_head_rollout(base, torch.zeros(1, 1, 4), torch.zeros(1, 4), *_zero_head(V))
    assert tokens.tolist() == [[5]]


def test_a_gru_state_split_across_threads_matches_the_oracle():
    """G = 512 splits the GRU's rows between two threads: every element of the new state,
    the ones at the split included, matches the float64 oracle."""
    inputs = head_rollout_inputs(1, 2, 100, 64, 512, 8, torch.float32, torch.float32, True, 3)
    want_tokens, _, want_state, _, _ = head_rollout_oracle(*inputs)
    with torch_threads(2):
        tokens, _, state = domino_ops.domino_head_rollout(*inputs)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(state, want_state.float(), rtol=1e-4, atol=1e-5)


def test_a_row_of_minus_infinity_gives_token_0_and_a_nan_logprob():
    """A base row with no finite logit (and no correction): token 0, the documented answer
    for a row without finite mass, and log_softmax's NaN as its log-probability, as the
    reference."""
    V = 20
    args = (torch.full((1, 1, V), float("-inf")), torch.zeros(1, 1, 4), torch.zeros(1, 4), *_zero_head(V))
    tokens, logprobs, _ = domino_ops.domino_head_rollout(*args)
    want_tokens, want_logprobs, _ = domino_ops.domino_head_rollout(*args, backend="reference")
    assert tokens.tolist() == want_tokens.tolist() == [[0]]
    assert logprobs.isnan().all() and want_logprobs.isnan().all()
