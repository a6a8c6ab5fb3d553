"""The kernel contracts, checked on every GPU backend (kernel_backends.BACKENDS: the CUDA
kernels under the SIMT emulator, the Triton kernels) against the references: greedy
exactly, sampling exactly given the same uniforms (inverse-CDF paths) or statistically (the
head's exponential race). Outputs are pre-filled with garbage (poisoned_calls), so an
unwritten element fails. Each backend runs its own shape tables (kernel_backends)."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from kernel_backends import EMULATED_CUDA, backend_params
from kernel_cases import (head_input_strategy, head_rollout_inputs, head_two_step_population,
                          sample_case, uniforms, verify_greedy_case, verify_sampling_case, verify_sampling_population,
                          weights_as_float64)
from oracles import ARGMAX_MARGIN, head_rollout_oracle
from poisoned_calls import run_head_poisoned, run_sample_poisoned, run_verify_poisoned
from stats import assert_matches_distribution, first_token_resampled_from_target

DTYPES = [torch.float32, torch.bfloat16]  # the logits dtypes the kernels take
# Each example launches hundreds of interpreted Triton programs: few examples.
# Hypothesis settings hold per test function, not per backend parameter, so both backends
# run the larger of the two former suites' counts (emulated CUDA 12, Triton 10).
KERNEL_EXAMPLES = settings(max_examples=12)


def draw_sizes(data, sizes):
    """One value from each list of ``sizes`` (a dict of name -> list), labelled by name."""
    return {name: data.draw(st.sampled_from(values), label=name) for name, values in sizes.items()}


def run_head(backend, inputs, **kwargs):
    """The backend's head rollout (see poisoned_calls.run_head_poisoned): CPU outputs."""
    return run_head_poisoned(backend.kernel("domino_head_rollout"), inputs, device=backend.device, **kwargs)


# ---- verify_greedy --------------------------------------------------------------------

@pytest.mark.parametrize("backend", backend_params())
@KERNEL_EXAMPLES
@given(data=st.data(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_verify_greedy(backend, data, dtype, seed):
    s = draw_sizes(data, backend.verify_greedy_sizes)
    draft, logits = (x.to(backend.device) for x in verify_greedy_case(s["b"], s["k"], s["V"], dtype, seed))
    out, acc = run_verify_poisoned(backend.kernel("verify_greedy"), draft, logits)
    r_out, r_acc = reference.verify_greedy(draft, logits)
    assert torch.equal(acc, r_acc) and torch.equal(out, r_out)


# ---- sample ---------------------------------------------------------------------------

@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_greedy_is_argmax_with_lowest_index_ties(backend, dtype):
    logits = torch.randn(6, 300).to(dtype)
    logits[0, 5] = logits[0, 250] = 100.0  # tie: torch.argmax takes the first
    logits = logits.to(backend.device)
    tokens = run_sample_poisoned(backend.kernel("sample"), logits, 0.0, 0, 1.0, None)
    assert torch.equal(tokens, logits.float().argmax(-1))


@pytest.mark.parametrize("backend", backend_params())
@KERNEL_EXAMPLES
@given(data=st.data(), b=st.sampled_from([1, 3]), dtype=st.sampled_from(DTYPES),
       temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]), top_k=st.sampled_from([0, 1, 3, 50]),
       top_p=st.sampled_from([1.0, 0.9, 0.3]), ties=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_sample_matches_reference_given_uniforms(backend, data, b, dtype, temperature, top_k, top_p, ties, seed):
    """Inverse CDF with the row's uniform, top-k by value threshold, top-p with ties in
    index order: the same token as the reference for the same uniforms (the argmax at T = 0,
    where the uniforms are ignored)."""
    V = data.draw(st.sampled_from(backend.sample_vocab), label="V")
    logits = sample_case(b, V, dtype, ties, seed).to(backend.device)
    u = uniforms((b,), seed, backend.device)
    tokens = run_sample_poisoned(backend.kernel("sample"), logits, temperature, top_k, top_p, u)
    if temperature == 0:
        expected = logits.float().argmax(-1)
    else:
        expected, _ = reference.sample_from_logits(logits.float(), temperature, top_k, top_p, u)
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("row", [[-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0, 0.0]])
@pytest.mark.parametrize("top_k,top_p", [(0, 0.3), (1, 1.0), (2, 0.4)])
def test_sample_signed_zeros_tie(backend, row, top_k, top_p):
    """-0 and +0 are equal logits: a tie, kept in index order by top-p and both kept by
    top-k's ">= k-th" (on the GPU, (x - max) / T is -0 for x = -0 and +0 for x = +0, and a
    key that told them apart ranked +0 first)."""
    logits = torch.tensor([row] * 4).to(backend.device)
    u = torch.tensor([0.1, 0.4, 0.6, 0.9], dtype=torch.float64, device=backend.device)
    tokens = run_sample_poisoned(backend.kernel("sample"), logits, 0.5, top_k, top_p, u)
    expected, _ = reference.sample_from_logits(logits.float(), 0.5, top_k, top_p, u)
    assert torch.equal(tokens, expected)


# ---- filtered_probs -------------------------------------------------------------------

def run_filtered_probs(backend, logits, temperature, top_k, top_p, **rows):
    """The backend's filtered_probs with its output pre-filled with NaN: CPU probabilities."""
    probs = torch.full(logits.shape, float("nan"), device=backend.device)
    backend.kernel("filtered_probs")(logits, temperature, top_k, top_p, probs, **rows)
    return probs.cpu()


@pytest.mark.parametrize("backend", backend_params())
@KERNEL_EXAMPLES
@given(data=st.data(), b=st.sampled_from([1, 3]), dtype=st.sampled_from(DTYPES),
       temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]), top_k=st.sampled_from([0, 1, 3, 50]),
       top_p=st.sampled_from([1.0, 0.9, 0.3]), ties=st.booleans(), per_row=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_filtered_probs_matches_reference(backend, data, b, dtype, temperature, top_k, top_p, ties, per_row, seed):
    """The law `sample` draws from, written out: the argmax's one-hot exactly; sampled rows
    equal to the reference up to rounding (float32 tempering, float64 weights summed in
    another order), with the same support. Per-row parameters mix greedy and sampled rows."""
    V = data.draw(st.sampled_from(backend.sample_vocab), label="V")
    logits = sample_case(b, V, dtype, ties, seed)
    rows, T, k, p = {}, temperature, top_k, top_p
    if per_row:
        g = torch.Generator().manual_seed(seed)
        T = torch.tensor([temperature, 0.0, 0.8])[:b]
        k = torch.randint(0, 5, (b,), generator=g)
        p = torch.tensor([top_p, 1.0, 0.5])[:b]
        rows = dict(row_temperature=T.to(backend.device), row_top_k=k.to(backend.device),
                    row_top_p=p.to(backend.device))
    got = run_filtered_probs(backend, logits.to(backend.device), temperature, top_k, top_p, **rows)
    want = reference.filtered_probs(logits, T, k, p)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-37)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_filtered_probs_extreme_rows(backend, dtype):
    """NaN as -inf, no finite mass -> token 0, +inf entries sharing the mass, the argmax
    limit taking the first NaN: exactly the reference's (every value here is 0, 1/2 or 1)."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -inf, -inf, -inf], [0.0, inf, 1.0, inf], [nan, nan, nan, nan], [-inf, 2.0, -inf, nan],
                      [1.0, nan, 3.0, 2.0]]).to(dtype)
    for T, k, p in [(1.0, 0, 1.0), (0.7, 2, 1.0), (1.3, 0, 0.5), (0.0, 3, 0.2)]:
        got = run_filtered_probs(backend, x.to(backend.device), T, k, p)
        want = reference.filtered_probs(x, T, k, p)
        rows = slice(None) if T == 0.0 else slice(0, 4)  # the last row's finite values: up to rounding
        assert torch.equal(got[rows], want[rows]), (T, k, p)


# ---- verify_sampling ------------------------------------------------------------------

@pytest.mark.parametrize("backend,b,k,V", backend_params("verify_sampling_shapes"))
def test_verify_sampling_matches_reference_given_uniforms(backend, b, k, V):
    dev = backend.device
    draft, q, p = (x.to(dev) for x in verify_sampling_case(b, k, V))
    gen = torch.Generator(dev).manual_seed(7)
    ua, ur = reference.draw_uniforms((b, k), dev, gen), reference.draw_uniforms((b,), dev, gen)
    out, acc = run_verify_poisoned(backend.kernel("verify_sampling"), draft, q, p, ua, ur)
    r_out, r_acc = reference.verify_sampling(draft, q, p, generator=torch.Generator(dev).manual_seed(7))
    assert torch.equal(acc, r_acc) and torch.equal(out, r_out)


@pytest.mark.parametrize("backend", backend_params())
def test_verify_sampling_is_distributed_as_target(backend):
    """Drafts from q, verified against p: the first output token is distributed as p.
    Negative control: a verifier that resamples a rejected draft from p itself instead of
    the residual max(0, p - q), on the same population and uniforms, must fail the same
    check (at N = 1200, the smallest population here, it would pass with probability ~5e-9)."""
    dev = backend.device
    draft, q, p, target = verify_sampling_population(V=5, N=backend.target_population)
    ua, ur = uniforms(draft.shape, 1, dev), uniforms(draft.shape[:1], 2, dev)
    out, _ = run_verify_poisoned(backend.kernel("verify_sampling"), draft.to(dev), q.to(dev), p.to(dev), ua, ur)
    assert_matches_distribution(out[:, 0].cpu().numpy(), target, what="first token")
    wrong = first_token_resampled_from_target(draft, q, p, ua.cpu(), ur.cpu())
    with pytest.raises(AssertionError, match="chi-square"):
        assert_matches_distribution(wrong, target, what="first token resampled from p")


# ---- domino_head_rollout ----------------------------------------------------------------

@pytest.mark.parametrize("backend", backend_params())
@KERNEL_EXAMPLES
@given(data=st.data())
def test_head_rollout_greedy_matches_oracle(backend, data):
    inputs = head_rollout_inputs(**data.draw(head_input_strategy(**backend.head_sizes), label="head inputs"))
    tokens_ref, lp_ref, S_ref, L_ref, margins = head_rollout_oracle(*inputs)
    assume(bool((margins > ARGMAX_MARGIN).all()))
    tokens, logprobs, state_out, base = run_head(backend, (inputs[0].clone(),) + inputs[1:], write_logits=True)
    assert torch.equal(tokens, tokens_ref)
    torch.testing.assert_close(logprobs, lp_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, S_ref.float(), rtol=1e-4, atol=1e-5)
    tol = 1e-4 if base.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(base.double(), L_ref.to(base.dtype).double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", backend_params())
def test_head_rollout_writes_bf16_logits_rounded_to_nearest(backend):
    """write_logits into bf16 base logits rounds each float32 logit to the nearest bf16, ties
    to even (as torch and c10::BFloat16; the GPU backends here, the native kernel in
    test_domino_head_rollout.py): the written rows equal the float64 oracle's logits
    rounded to bf16 except where a logit lies within float32 error of a midpoint (a handful
    in 1,800; truncating, as the Triton interpreter's own conversion does, misses half)."""
    inputs = head_rollout_inputs(2, 3, 300, 16, 16, 8, torch.float32, torch.bfloat16, True, seed=5)
    *_, L_ref, margins = head_rollout_oracle(*inputs)
    assert bool((margins > ARGMAX_MARGIN).all())  # the same tokens, so the same logits at every step
    *_, base = run_head(backend, (inputs[0].clone(),) + inputs[1:], write_logits=True)
    assert (base == L_ref.to(torch.bfloat16)).float().mean() >= 0.99


@pytest.mark.parametrize("backend", backend_params())
def test_head_rollout_leaves_base_untouched_without_write_logits(backend):
    inputs = head_rollout_inputs(2, 3, 300, 8, 16, 8, torch.float32, torch.float32, True, 1)
    before = inputs[0].clone()
    *_, base = run_head(backend, inputs)
    assert torch.equal(base, before) and torch.equal(inputs[0], before)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 3, 1.0), (1.2, 0, 0.7), (1.0, 5, 0.9)])
def test_head_rollout_filtered_sampling_matches_reference_given_uniforms(backend, table, temperature, top_k, top_p):
    """top-k / top-p sample a full logit row by inverse CDF, like `sample`: the same tokens
    as the float64 reference rollout for the same uniforms."""
    inputs = head_rollout_inputs(3, 3, 40, 8, 16, 8, torch.float32, torch.float32, table, seed=4)
    *_, L_ref, _ = head_rollout_oracle(*inputs)
    assert L_ref.sort(-1).values.diff(dim=-1).min() > 1e-5  # no near-ties whose order float rounding could flip
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*weights_as_float64(inputs), temperature=temperature,
                                                         top_k=top_k, top_p=top_p,
                                                         generator=torch.Generator().manual_seed(9))
    tokens, logprobs, state_out, _ = run_head(backend, inputs, temperature=temperature, top_k=top_k, top_p=top_p,
                                              u=uniforms((3, 3), 9))
    assert torch.equal(tokens, t_ref)
    torch.testing.assert_close(logprobs, lp_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, s_ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend,V,N,wdtype", backend_params("race_cases"))
def test_head_rollout_exponential_race_joint_distribution(backend, V, N, wdtype):
    """Plain temperature sampling uses the fused exponential race (Philox keyed by the
    uniforms' bits): N identical sequences, the joint law of (x0, x1) must be
    p(x0) * p(x1 | x0), and each logprob that of the drawn token under p.

    The logprob check pins only the temperature the kernel reports log-probabilities at; the
    temperature it samples at rests on the joint check. At T = 2 a race that ignores the
    temperature is far off: N pairs drawn at T = 1 (the native kernel's inverse CDF, the law
    a T = 1 race has) must fail the same check (negative control; at the interpreted
    backend's N = 400 such a race passes with probability ~2e-10). A temperature off by
    20 % (1.6 for 2) needs thousands of sequences: at N >= 4000 (the emulated and CUDA
    backends) pairs drawn at T = 1.6 must fail too (at N = 4000 they pass with probability
    ~2e-10); the interpreted backend (~0.05 s a sequence) does not resolve it."""
    temperature = 2.0
    inputs, joint, p0 = head_two_step_population(V, N, wdtype, temperature)
    tokens, logprobs, _, _ = run_head(backend, inputs, temperature=temperature, u=uniforms((N, 2), 5))
    assert_matches_distribution((tokens[:, 0] * V + tokens[:, 1]).numpy(), joint, what="(x0, x1)")
    np.testing.assert_allclose(logprobs[:, 0].numpy(), np.log(p0[tokens[:, 0].numpy()]), rtol=1e-3, atol=1e-3)
    for wrong_temperature in (1.0, 1.6) if N >= 4000 else (1.0,):
        wrong, _, _ = domino_ops.domino_head_rollout(*inputs, temperature=wrong_temperature,
                                                     generator=torch.Generator().manual_seed(6))
        with pytest.raises(AssertionError, match="chi-square"):
            assert_matches_distribution((wrong[:, 0] * V + wrong[:, 1]).numpy(), joint,
                                        what=f"(x0, x1) drawn at T = {wrong_temperature}")


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r", [1539, 1544])
def test_emulated_cuda_head_rollout_takes_a_rank_of_any_size(wdtype, r):
    """The CUDA logits kernel stages a's columns in shared memory a chunk at a time (64
    columns under the emulator), so a rank over the old [8, r]-floats limit of 1536 still
    matches the oracle: 1539 through the scalar loads, 1544 (a whole number of 16-byte
    vectors in both dtypes, a partial last chunk of 8 columns) through the vector loads,
    four in flight, then single ones."""
    inputs = head_rollout_inputs(3, 1, 17, r, 4, 4, wdtype, torch.float32, True, 0)
    tokens_ref, lp_ref, S_ref, _, margins = head_rollout_oracle(*inputs)
    assert bool((margins > ARGMAX_MARGIN).all())
    tokens, logprobs, state_out, _ = run_head(EMULATED_CUDA, inputs)
    assert torch.equal(tokens, tokens_ref)
    torch.testing.assert_close(logprobs, lp_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, S_ref.float(), rtol=1e-4, atol=1e-5)
