"""Every CUDA kernel in csrc/cuda/, executed on this GPU-less machine by the host SIMT
emulator (torch.ops.domino_simt.*: same kernel sources, same tensor adapters as the real
CUDA ops), against the references: greedy exactly, sampling exactly given the same
uniforms (inverse-CDF paths) or statistically (the head's exponential race).

The emulator runs one OS thread per CUDA thread, so shapes here are small; vocabularies
above 256 still span several of the emulated logits kernel's tiles (4 x 64 rows)."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import domino_simt  # noqa: F401  (registers torch.ops.domino_simt; see conftest.py)
from domino_ops import reference
from conftest import POISON_TOKEN
from stats import assert_matches_distribution
from kernel_cases import (race_population, run_head_poisoned, verify_greedy_case, verify_sampling_case,
                          verify_sampling_population)
from test_domino_head_rollout import MARGIN, make_inputs, oracle

simt = torch.ops.domino_simt
DTYPES = [torch.float32, torch.bfloat16]
EMULATED = settings(max_examples=12)  # each example launches hundreds of emulated blocks


def uniforms(shape, seed):
    return torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# ---- verify_greedy --------------------------------------------------------------------

@EMULATED
@given(b=st.sampled_from([1, 2, 33]), k=st.sampled_from([1, 3, 7]), V=st.sampled_from([1, 17, 300]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_verify_greedy(b, k, V, dtype, seed):
    draft, logits = verify_greedy_case(b, k, V, dtype, seed)
    out = torch.full((b, k + 1), POISON_TOKEN, dtype=torch.int64)
    acc = torch.full((b,), POISON_TOKEN, dtype=torch.int64)
    simt.verify_greedy(draft, logits, out, acc)
    r_out, r_acc = reference.verify_greedy(draft, logits)
    assert torch.equal(acc, r_acc) and torch.equal(out, r_out)


# ---- sample ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_greedy_is_argmax_with_lowest_index_ties(dtype):
    logits = torch.randn(6, 300).to(dtype)
    logits[0, 5] = logits[0, 250] = 100.0  # tie: torch.argmax takes the first
    tokens = torch.full((6,), POISON_TOKEN, dtype=torch.int64)
    simt.sample(logits, 0.0, 0, 1.0, None, tokens)
    assert torch.equal(tokens, logits.float().argmax(-1))


@EMULATED
@given(b=st.sampled_from([1, 3]), V=st.sampled_from([1, 2, 17, 300]), dtype=st.sampled_from(DTYPES),
       temperature=st.sampled_from([0.5, 1.0, 1.7]), top_k=st.sampled_from([0, 1, 3, 50]),
       top_p=st.sampled_from([1.0, 0.9, 0.3]), ties=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_sample_matches_reference_given_uniforms(b, V, dtype, temperature, top_k, top_p, ties, seed):
    """Inverse CDF with the row's uniform, top-k by value threshold, top-p with ties in
    index order: the same token as the reference for the same uniforms."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, V, generator=g)
    if ties:  # repeated values exercise top-k's ">= k-th" and top-p's index-ordered ties
        logits = (logits * 2).round() / 2
    logits = logits.to(dtype)
    u = uniforms((b,), seed)
    tokens = torch.full((b,), POISON_TOKEN, dtype=torch.int64)
    simt.sample(logits, temperature, top_k, top_p, u, tokens)
    expected, _ = reference.sample_from_logits(logits.float(), temperature, top_k, top_p, u)
    assert torch.equal(tokens, expected)


# ---- verify_sampling ------------------------------------------------------------------

@pytest.mark.parametrize("b,k,V", [(1, 1, 5), (4, 5, 300), (3, 2, 17)])
def test_verify_sampling_matches_reference_given_uniforms(b, k, V):
    draft, q, p = verify_sampling_case(b, k, V)
    out = torch.full((b, k + 1), POISON_TOKEN, dtype=torch.int64)
    acc = torch.full((b,), POISON_TOKEN, dtype=torch.int64)
    gen = torch.Generator().manual_seed(7)
    ua, ur = reference.draw_uniforms((b, k), "cpu", gen), reference.draw_uniforms((b,), "cpu", gen)
    simt.verify_sampling(draft, q, p, ua, ur, out, acc)
    r_out, r_acc = reference.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(7))
    assert torch.equal(acc, r_acc) and torch.equal(out, r_out)


def test_verify_sampling_is_distributed_as_target():
    """Drafts from q, verified against p: the first output token is distributed as p."""
    draft, q, p, target = verify_sampling_population(V=5, N=1500)
    out = torch.empty(draft.shape[0], 2, dtype=torch.int64)
    acc = torch.empty(draft.shape[0], dtype=torch.int64)
    simt.verify_sampling(draft, q, p, uniforms(draft.shape, 1), uniforms(draft.shape[:1], 2), out, acc)
    assert_matches_distribution(out[:, 0].numpy(), target, what="first token")


# ---- domino_head_rollout ----------------------------------------------------------------

head_shapes = st.fixed_dictionaries({
    "b": st.sampled_from([1, 2, 9, 33]),  # 9, 33: more than one group of 8 accumulators
    "k": st.sampled_from([1, 3]),
    "V": st.sampled_from([1, 17, 257, 700]),
    "r": st.sampled_from([1, 3, 16, 33]),
    "G": st.sampled_from([1, 5, 16]),
    "H": st.sampled_from([1, 8]),
    "wdtype": st.sampled_from(DTYPES),
    "base_dtype": st.sampled_from(DTYPES),
    "table": st.booleans(),
    "seed": st.integers(0, 2**31 - 1),
})


def run_head(inputs, **kwargs):
    return run_head_poisoned(simt.domino_head_rollout, inputs, **kwargs)


@EMULATED
@given(head_shapes)
def test_head_rollout_greedy_matches_oracle(p):
    inputs = make_inputs(**p)
    tokens_ref, lp_ref, S_ref, L_ref, margins = oracle(*inputs)
    assume(bool((margins > MARGIN).all()))
    base = inputs[0].clone()
    tokens, logprobs, state_out = run_head((base,) + inputs[1:], write_logits=True)
    assert torch.equal(tokens, tokens_ref)
    torch.testing.assert_close(logprobs, lp_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, S_ref.float(), rtol=1e-4, atol=1e-5)
    tol = 1e-4 if base.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(base.double(), L_ref.to(base.dtype).double(), rtol=tol, atol=tol)


def test_head_rollout_leaves_base_untouched_without_write_logits():
    inputs = make_inputs(2, 3, 300, 8, 16, 8, torch.float32, torch.float32, True, 1)
    before = inputs[0].clone()
    run_head(inputs)
    assert torch.equal(inputs[0], before)


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 3, 1.0), (1.2, 0, 0.7), (1.0, 5, 0.9)])
def test_head_rollout_filtered_sampling_matches_reference_given_uniforms(table, temperature, top_k, top_p):
    """top-k / top-p sample a full logit row by inverse CDF, like `sample`: the same tokens
    as the float64 reference rollout for the same uniforms."""
    inputs = make_inputs(3, 3, 40, 8, 16, 8, torch.float32, torch.float32, table, seed=4)
    *_, L_ref, _ = oracle(*inputs)
    gaps = L_ref.sort(-1).values.diff(dim=-1)
    assert gaps.min() > 1e-5  # no near-ties whose order float rounding could flip
    u = uniforms((3, 3), 9)
    as64 = [x.double() if x is not None and i >= 3 else x for i, x in enumerate(inputs)]
    gen = torch.Generator().manual_seed(9)
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*as64, temperature=temperature, top_k=top_k,
                                                         top_p=top_p, generator=gen)
    tokens, logprobs, state_out = run_head(inputs, temperature=temperature, top_k=top_k, top_p=top_p, u=u)
    assert torch.equal(tokens, t_ref)
    torch.testing.assert_close(logprobs, lp_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, s_ref, rtol=1e-4, atol=1e-5)


def test_head_rollout_exponential_race_joint_distribution():
    """Plain temperature sampling uses the fused exponential race (Philox keyed by the
    uniforms' bits): N identical sequences, the joint law of (x0, x1) must be
    p(x0) * p(x1 | x0), and each logprob exactly that of the drawn token (which pins the
    temperature). Emulated blocks cost ~0.1 s per sequence, hence the modest N."""
    V, N, temperature = 4, 400, 1.3
    inputs, joint, p0 = race_population(V, N, temperature, torch.bfloat16)
    tokens, logprobs, _ = run_head(inputs, temperature=temperature, u=uniforms((N, 2), 5))
    assert_matches_distribution((tokens[:, 0] * V + tokens[:, 1]).numpy(), joint, what="(x0, x1)")
    np.testing.assert_allclose(logprobs[:, 0].numpy(), np.log(p0[tokens[:, 0].numpy()]), rtol=1e-3, atol=1e-3)


def test_head_rollout_rejects_a_rank_over_the_shared_memory_limit():
    inputs = make_inputs(1, 1, 17, 1537, 4, 4, torch.float32, torch.float32, True, 0)
    with pytest.raises(RuntimeError, match="rank r = 1537"):
        run_head(inputs)
