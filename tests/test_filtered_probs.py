"""filtered_probs: the CPU kernel against the reference and an independent numpy oracle, on
random shapes and parameters, with poisoned outputs; its direct-call checks. The emulated
CUDA and Triton kernels are checked against the reference in test_kernel_backends.py."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from oracles import filtered_probs as oracle_probs

DTYPES = [torch.float32, torch.bfloat16]


def run_poisoned(logits, temperature, top_k, top_p, **rows):
    """torch.ops.domino_ops.filtered_probs on logits [n, V] with its output pre-filled with
    NaN, so that an element the kernel does not write fails any comparison."""
    probs = torch.full(logits.shape, float("nan"))
    torch.ops.domino_ops.filtered_probs(logits, temperature, top_k, top_p, probs, **rows)
    return probs


def assert_same_law(got, want):
    """Equal up to the kernel's rounding (float32 tempering before the float64
    exponentials, another summation order): the same support and ~1e-5 relative."""
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-37)


def logits_case(shape, dtype, ties, seed, scale=3.0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale
    if ties:  # halves repeat, so top-k's ">= k-th" and top-p's index-ordered ties are exercised
        x = (x * 2).round() / 2
    return x.to(dtype)


@given(b=st.sampled_from([1, 2, 5, 33]), V=st.sampled_from([1, 2, 3, 31, 1000, 4099, 49152]),
       dtype=st.sampled_from(DTYPES), temperature=st.sampled_from([0.0, 1e-30, 0.5, 1.0, 1.7]),
       top_k=st.sampled_from([0, 1, 3, 50, 2 ** 40]), top_p=st.sampled_from([1.0, 0.9, 0.3, 1e-9]),
       ties=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_kernel_matches_reference(b, V, dtype, temperature, top_k, top_p, ties, seed):
    logits = logits_case((b, V), dtype, ties, seed)
    got = run_poisoned(logits, temperature, min(top_k, V), top_p)
    want = reference.filtered_probs(logits, temperature, top_k, top_p)
    if temperature < 1e-20:  # the argmax's one-hot, exactly
        assert torch.equal(got, want)
    else:
        assert_same_law(got, want)


@given(b=st.sampled_from([1, 3, 8]), mid=st.sampled_from([(), (1,), (4,), (2, 3)]), V=st.sampled_from([7, 300, 2049]),
       dtype=st.sampled_from(DTYPES), ties=st.booleans(), seed=st.integers(0, 2 ** 31 - 1))
def test_per_row_parameters_over_middle_axes(b, mid, V, dtype, ties, seed):
    """[b] parameters apply to every row of a leading row's middle axes, each row as the
    same parameters given alone; greedy and sampled rows mix."""
    g = torch.Generator().manual_seed(seed)
    logits = logits_case((b, *mid, V), dtype, ties, seed)
    T = torch.tensor([0.0, 0.6, 1.3, 0.0, 2.0, 0.9, 1.0, 0.4])[torch.randperm(8, generator=g)[:b]]
    k = torch.randint(0, V + 2, (b,), generator=g)
    p = torch.rand(b, generator=g).clamp(min=0.05)
    got = domino_ops.filtered_probs(logits, T, k, p)
    assert got.shape == logits.shape and got.dtype == torch.float32
    assert_same_law(got, reference.filtered_probs(logits, T, k, p))
    for i in range(b):
        one = domino_ops.filtered_probs(logits[i:i + 1], float(T[i]), int(k[i]), float(p[i]))
        assert torch.equal(got[i:i + 1], one)  # a row's result does not depend on its neighbours


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0), (1.0, 3, 1.0),
                                                     (1.0, 0, 0.6), (0.8, 5, 0.7), (1.0, 1, 1.0), (1.0, 0, 0.01)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_an_independent_numpy_oracle(temperature, top_k, top_p, dtype):
    """The law the kernel writes is the exact filtered distribution (tests/oracles.py, numpy
    float64, written apart from the reference)."""
    logits = logits_case((6, 97), dtype, False, 11, scale=1.5)
    got = domino_ops.filtered_probs(logits, temperature, top_k, top_p).double().numpy()
    for row, p in zip(logits.float().numpy(), got):
        want = oracle_probs(row, temperature, top_k, top_p)
        np.testing.assert_allclose(p, want, rtol=2e-5, atol=1e-37)
        assert np.isclose(p.sum(), 1.0, rtol=1e-6)


def test_oracle_check_rejects_a_wrong_law():
    """Negative control: the same comparison fails for the law at another temperature, and
    for top-p applied in index order instead of by probability."""
    logits = logits_case((1, 97), torch.float32, False, 11, scale=1.5)
    want = oracle_probs(logits[0].numpy(), 1.0, 0, 1.0)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(domino_ops.filtered_probs(logits, 1.02)[0].double().numpy(), want, rtol=2e-5)
    p = domino_ops.filtered_probs(logits, 1.0).double()[0].numpy()
    index_order = np.where(np.cumsum(p) - p >= 0.6, 0.0, p)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(index_order / index_order.sum(), oracle_probs(logits[0].numpy(), 1.0, 0, 0.6),
                                   rtol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_rows(dtype):
    """NaN counts as -inf; a row without finite mass puts it on token 0; +inf entries share
    it evenly; the argmax limit picks the first NaN (torch.argmax): as the reference."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, nan, 3.0, 2.0], [-inf, -inf, -inf, -inf], [0.0, inf, 1.0, inf], [nan, nan, nan, nan],
                      [-inf, 2.0, -inf, nan]]).to(dtype)
    for T, k, p in [(1.0, 0, 1.0), (0.7, 2, 1.0), (1.3, 0, 0.5), (1e-40, 0, 1.0), (0.0, 3, 0.2)]:
        got, want = run_poisoned(x, T, k, p), reference.filtered_probs(x, T, k, p)
        assert_same_law(got, want)
        assert torch.equal(got[1:], want[1:]), (T, k, p)  # one-hots and halves: exact
    assert torch.equal(run_poisoned(x, 1.0, 0, 1.0)[2], torch.tensor([0, 0.5, 0, 0.5]))


def test_large_logits_do_not_overflow():
    """Logits far from 0 (1e30 apart) and a tiny temperature: no inf or NaN, the mass where
    the reference puts it."""
    x = torch.tensor([[1e30, -1e30, 1e30 - 1e24, 0.0], [3.0, 3.0 + 1e-6, -50.0, 2.0]])
    for T in (1e-19, 1e-3, 1.0, 1e10):
        got = run_poisoned(x, T, 0, 1.0)
        assert torch.isfinite(got).all()
        assert_same_law(got, reference.filtered_probs(x, T, 0, 1.0))


@pytest.mark.parametrize("top_p", [0.99999999, 1.0 - 2.0 ** -26, 1.0 - 2.0 ** -24])
def test_top_p_counts_as_its_float32_value(top_p):
    """The kernels take top_p in float32, where a top_p in (1 - 2**-25, 1) is 1 (no
    filter): the reference rounds it the same way (in float64 it had dropped a token the
    kernels kept), as a scalar and per row."""
    x = torch.tensor([[10.0, 10.0, 0.0, -12.0]])
    keeps_all = float(np.float32(top_p)) == 1.0
    for p in (top_p, torch.tensor([top_p], dtype=torch.float64)):
        got = run_poisoned(x, 1.0, 0, p)
        want = reference.filtered_probs(x, 1.0, 0, p)
        assert_same_law(got, want)
        assert bool(want[0, 3] > 0) == keeps_all, (top_p, want)


@pytest.mark.parametrize("per_row", [False, True])
def test_logits_closer_than_float32_resolves_at_z_are_a_tie_broken_by_index(per_row):
    """z = (x - max) / T is rounded to float32 in every kernel, so x = -1.2442e-6 and
    -1.2219e-6 below a max of 1 give one z (10 ulps below -1): top-p's order puts the lower
    index first. The reference rounds z the same way (with a float64 z it had kept token 2
    where the kernels keep token 1, found by a 30,000-example fuzz soak)."""
    x = torch.tensor([[1.0, -1.2442e-6, -1.2219e-6]])
    z = (x - 1.0) / 1.0
    assert z[0, 1] == z[0, 2] and (x[0, 1].double() - 1.0) < (x[0, 2].double() - 1.0)  # the premise
    T, p = (torch.tensor([1.0]), torch.tensor([0.7])) if per_row else (1.0, 0.7)
    got, want = run_poisoned(x, T, 0, p) if not per_row else run_poisoned(
        x, 0.0, 0, 1.0, row_temperature=T, row_top_p=p), reference.filtered_probs(x, T, 0, p)
    assert_same_law(got, want)
    assert (want[0] > 0).tolist() == [True, True, False]


DIRECT_CASES = [
    (dict(probs=torch.empty(2, 5, dtype=torch.float64)), "probs must be float32 of shape"),
    (dict(probs=torch.empty(2, 6)), "probs must be float32 of shape"),
    (dict(probs=torch.empty(5, 2).t()), "probs must be contiguous"),
    (dict(probs=torch.empty(10)), "probs must have 2 dimensions"),
    (dict(logits=torch.randn(2, 5, dtype=torch.float64)), "logits must be float32 or bfloat16"),
    (dict(logits=torch.randn(5, 2).t()), "logits must be contiguous"),
    (dict(logits=torch.randn(2, 0), probs=torch.empty(2, 0)), "logits must be non-empty"),
    (dict(temperature=-1.0), "temperature must be finite and >= 0"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(row_temperature=torch.tensor([0.5, -1.0])), "row_temperature must be finite and >= 0 in every row"),
    (dict(row_top_k=torch.tensor([1, 2, 3])), r"row_top_k must have shape \[2\]"),
    (dict(row_top_p=torch.tensor([0.5, 0.5], dtype=torch.float64)), "row_top_p must be Float"),
]


@pytest.mark.parametrize("over,msg", DIRECT_CASES)
def test_direct_call_checks_name_the_argument(over, msg):
    kw = dict(logits=torch.randn(2, 5), temperature=1.0, top_k=0, top_p=1.0, probs=torch.empty(2, 5))
    kw.update(over)
    rows = {name: kw.pop(name) for name in ("row_temperature", "row_top_k", "row_top_p") if name in kw}
    with pytest.raises(RuntimeError, match=msg):
        torch.ops.domino_ops.filtered_probs(kw["logits"], kw["temperature"], kw["top_k"], kw["top_p"], kw["probs"],
                                            **rows)


def test_direct_call_rejects_an_output_that_aliases_the_logits():
    x = torch.randn(2, 5)
    with pytest.raises(RuntimeError, match="must not share memory"):
        torch.ops.domino_ops.filtered_probs(x, 1.0, 0, 1.0, x)


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_the_wrapper_takes_any_leading_shape_and_backend(backend):
    """Each backend's rows against the numpy oracle, whatever the leading axes."""
    x = logits_case((2, 3, 4, 50), torch.bfloat16, True, 5)
    got = domino_ops.filtered_probs(x, 0.9, 7, 0.8, backend=backend)
    assert got.shape == x.shape and got.dtype == torch.float32
    for row, p in zip(x.float().reshape(-1, 50).numpy(), got.reshape(-1, 50).double().numpy()):
        np.testing.assert_allclose(p, oracle_probs(row, 0.9, 7, 0.8), rtol=2e-5, atol=1e-37)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_argmax_limit_starts_below_1e_20(dtype):
    """A temperature below domino_ops.sampling.GREEDY_BELOW (1e-20) is the argmax (ties: the
    first); 1e-20 itself still samples, sharing the mass between tied maxima: the reference
    and the kernel, as a scalar and per row."""
    from domino_ops.sampling import GREEDY_BELOW
    x = torch.tensor([[1.0, 1.0, 0.0]]).to(dtype)
    assert GREEDY_BELOW == 1e-20
    for T, want in ((1e-20, [0.5, 0.5, 0.0]), (0.99e-20, [1.0, 0.0, 0.0])):
        for t in (T, torch.tensor([T])):  # a scalar, one per row
            assert reference.filtered_probs(x, t, 0, 1.0).tolist() == [want], T
            assert domino_ops.filtered_probs(x, t, 0, 1.0).tolist() == [want], T
        assert run_poisoned(x, T, 0, 1.0).tolist() == [want], T


def test_top_k_of_one_less_than_the_vocabulary_drops_the_smallest():
    """top_k = V - 1 is a filter (only top_k >= V is none): the smallest logit's token gets
    no mass, scalar and per row, and sample never draws it."""
    x = torch.tensor([[3.0, 2.0, 1.0], [0.5, -4.0, 0.0]])
    for k in (2, torch.tensor([2, 2])):
        want = reference.filtered_probs(x, 1.0, k, 1.0)
        assert want[0, 2] == 0 and want[1, 1] == 0
        assert_same_law(domino_ops.filtered_probs(x, 1.0, k, 1.0), want)
    assert_same_law(run_poisoned(x, 1.0, 2, 1.0), want)
    rows = x.repeat_interleave(2000, 0)
    drawn = domino_ops.sample(rows, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert not (drawn[:2000] == 2).any() and not (drawn[2000:] == 1).any()
