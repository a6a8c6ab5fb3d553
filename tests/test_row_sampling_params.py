"""Per-row sampling parameters (one request per row, flashinfer's convention) and extreme
values, on every backend: the native CPU kernels, the emulated CUDA kernels, the Triton
kernels and the reference. Each row with its own temperature / top-k / top-p must get what
a call with that row alone and scalar parameters gets; extreme rows (NaN, +-inf, no mass)
must follow the rules of domino_ops.sampling.filtered_weights, never crash and never
return a token outside [0, V)."""

import numpy as np
import pytest
import torch

import domino_ops
from domino_ops import reference
from kernel_backends import backend_params
from kernel_cases import head_rollout_inputs, uniforms, weights_as_float64
from oracles import filtered_probs
from poisoned_calls import run_head_poisoned, run_sample_poisoned
from stats import assert_matches_distribution

NATIVE = pytest.param(None, id="native_cpu")
# (temperature, top_k, top_p) per row: greedy, plain, top-k, top-p, both, greedy with filters
ROWS = [(0.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.6), (0.9, 5, 0.8), (0.0, 2, 0.5)]
FILTERED_OR_GREEDY = [row for row in ROWS if row[0] == 0 or row[1] > 0 or row[2] < 1]


def row_tensors(rows, device="cpu"):
    T, k, p = zip(*rows)
    return (torch.tensor(T, dtype=torch.float32, device=device), torch.tensor(k, dtype=torch.int64, device=device),
            torch.tensor(p, dtype=torch.float32, device=device))


def sample_op(backend):
    return torch.ops.domino_ops.sample if backend is None else backend.kernel("sample")


def head_op(backend):
    return torch.ops.domino_ops.domino_head_rollout if backend is None else backend.kernel("domino_head_rollout")


def device_of(backend):
    return "cpu" if backend is None else backend.device


@pytest.mark.parametrize("backend", [NATIVE] + backend_params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_rows_equal_single_row_calls(backend, dtype):
    dev = device_of(backend)
    logits = (torch.randn(len(ROWS), 300, generator=torch.Generator().manual_seed(1)) * 3).to(dtype).to(dev)
    u = uniforms((len(ROWS),), 2, dev)
    T, k, p = row_tensors(ROWS, dev)
    tokens = torch.full((len(ROWS),), -7, dtype=torch.int64, device=dev)
    sample_op(backend)(logits, 0.0, 0, 1.0, u, tokens, T, k, p)
    for i, (t, kk, pp) in enumerate(ROWS):
        one = run_sample_poisoned(sample_op(backend), logits[i:i + 1], t, kk, pp, u[i:i + 1] if t > 0 else None)
        assert int(tokens[i]) == int(one[0]), (i, ROWS[i])


def test_sample_rows_match_the_reference_given_uniforms():
    logits = torch.randn(len(ROWS), 1000, generator=torch.Generator().manual_seed(3)) * 3
    T, k, p = row_tensors(ROWS)
    got = domino_ops.sample(logits, temperature=T, top_k=k, top_p=p, generator=torch.Generator().manual_seed(5))
    want = reference.sample(logits, temperature=T, top_k=k, top_p=p, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", [NATIVE] + backend_params())
def test_sample_rows_are_distributed_as_their_own_parameters(backend):
    """Frequency test: rows of one batch alternate between two parameter sets; each set's
    tokens follow the exact filtered distribution of that set (negative control below)."""
    dev = device_of(backend)
    # The GPU backends get 160 rows (interpreted kernels cost ~0.1 s a row). The swap below is
    # caught by a zero-probability token alone (set 1 keeps 3 of the 6), so it needs few rows; the
    # exact law of one parameter set is each backend's own sampling test.
    V, N = 6, 160 if backend is not None else 20000
    row = torch.randn(V, generator=torch.Generator().manual_seed(3)) * 1.5
    sets = [(2.0, 0, 1.0), (0.8, 3, 0.9)]
    rows = [sets[i % 2] for i in range(N)]
    T, k, p = row_tensors(rows, dev)
    tokens = torch.full((N,), -7, dtype=torch.int64, device=dev)
    sample_op(backend)(row.expand(N, V).contiguous().to(dev), 0.0, 0, 1.0, uniforms((N,), 4, dev), tokens, T, k, p)
    tokens = tokens.cpu().numpy()
    for j, (t, kk, pp) in enumerate(sets):
        assert_matches_distribution(tokens[j::2], filtered_probs(row.numpy(), t, kk, pp), what=f"set {j}")
    with pytest.raises(AssertionError):  # negative control: the other set's law
        assert_matches_distribution(tokens[0::2], filtered_probs(row.numpy(), *sets[1]), what="swapped")


@pytest.mark.parametrize("backend", [NATIVE] + backend_params())
def test_head_rollout_rows_match_the_reference(backend):
    """Greedy and filtered rows of one rollout: the float64 reference's tokens, row by row
    (plain-temperature rows are left out: the GPU kernels draw them by an exponential race)."""
    b = len(FILTERED_OR_GREEDY)
    inputs = head_rollout_inputs(b, 3, 40, 8, 16, 8, torch.float32, torch.float32, True, seed=4)
    T, k, p = row_tensors(FILTERED_OR_GREEDY)
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*weights_as_float64(inputs), temperature=T, top_k=k,
                                                         top_p=p, generator=torch.Generator().manual_seed(9))
    dev = device_of(backend)
    base, *rest = [x.to(dev) if x is not None else None for x in inputs]
    tokens = torch.full((b, 3), -7, dtype=torch.int64, device=dev)
    logprobs = torch.full((b, 3), float("nan"), device=dev)
    state_out = torch.full((b, 16), float("nan"), device=dev)
    head_op(backend)(base, *rest, 0.0, 0, 1.0, uniforms((b, 3), 9, dev), False, tokens, logprobs, state_out,
                     *row_tensors(FILTERED_OR_GREEDY, dev))
    assert torch.equal(tokens.cpu(), t_ref)
    torch.testing.assert_close(logprobs.cpu(), lp_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out.cpu(), s_ref, rtol=1e-4, atol=1e-5)


def test_public_rollout_with_a_mixed_batch_runs_each_row_by_its_parameters():
    inputs = head_rollout_inputs(3, 4, 50, 8, 16, 8, torch.float32, torch.float32, False, seed=2)
    T = torch.tensor([0.0, 1.0, 0.0])
    t_mixed, lp_mixed, _ = domino_ops.domino_head_rollout(*inputs, temperature=T, top_k=torch.tensor([0, 4, 0]))
    t_greedy, lp_greedy, _ = domino_ops.domino_head_rollout(*inputs)
    assert torch.equal(t_mixed[[0, 2]], t_greedy[[0, 2]])
    torch.testing.assert_close(lp_mixed[[0, 2]], lp_greedy[[0, 2]])


@pytest.mark.parametrize("bad,match", [
    (dict(temperature=torch.tensor([1.0, -0.5])), "temperature must be finite and >= 0 in every row"),
    (dict(temperature=torch.tensor([1.0, float("nan")])), "temperature must be finite and >= 0 in every row"),
    (dict(top_p=torch.tensor([1.0, 0.0])), r"top_p must be in \(0, 1\] in every row"),
    (dict(top_p=torch.tensor([1.5, 0.5])), r"top_p must be in \(0, 1\] in every row"),
    (dict(top_k=torch.tensor([1, -1])), "top_k must be >= 0 in every row"),
    (dict(temperature=torch.tensor([1.0, 1.0, 1.0])), r"temperature as a tensor must have shape \[2\]"),
    (dict(top_k=torch.tensor([1.0, 2.0])), "top_k as a tensor must have an integer dtype"),
    (dict(temperature=torch.tensor([1, 2])), "temperature as a tensor must have a floating-point dtype"),
    (dict(top_p=torch.tensor([0.5, 0.5], device="meta")), "top_p is on meta"),
])
def test_bad_per_row_values_name_the_argument(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        domino_ops.sample(torch.randn(2, 10), **bad)


def test_direct_call_rejects_bad_row_tensors():
    x, tokens = torch.randn(2, 10), torch.empty(2, dtype=torch.int64)
    u = torch.rand(2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="row_top_p must be in"):
        torch.ops.domino_ops.sample(x, 1.0, 0, 1.0, u, tokens, None, None, torch.tensor([0.5, 0.0]))
    with pytest.raises(RuntimeError, match=r"row_temperature must have shape \[2\]"):
        torch.ops.domino_ops.sample(x, 1.0, 0, 1.0, u, tokens, torch.ones(3), None, None)
    with pytest.raises(RuntimeError, match="uniforms are required"):
        torch.ops.domino_ops.sample(x, 0.0, 0, 1.0, None, tokens, torch.ones(2), None, None)


# ---- extreme values ---------------------------------------------------------------------

INF, NAN = float("inf"), float("nan")


def extreme_rows(V=40):
    x = torch.randn(7, V, generator=torch.Generator().manual_seed(0))
    x[0, 5] = NAN            # one NaN: greedy picks it (torch.argmax), sampling ignores it
    x[1] = -INF              # no mass
    x[2] = NAN               # no mass
    x[3, [3, 17]] = INF      # +inf entries share the mass
    x[4, 9] = INF
    x[5, :V // 2] = -INF     # a half-masked vocabulary
    x[6] *= 1e30             # huge logits
    return x


@pytest.mark.parametrize("backend", [NATIVE] + backend_params())
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 3, 0.8), (1.0, 0, 1e-30),
                                                     (1e-30, 0, 1.0)])
def test_sample_extreme_rows_follow_the_reference(backend, temperature, top_k, top_p):
    dev = device_of(backend)
    x = extreme_rows().to(dev)
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    want = reference.sample(x.cpu(), temperature=temperature, top_k=top_k, top_p=top_p, generator=gen())
    if backend is None:
        got = domino_ops.sample(x, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen(), backend="native")
    else:
        T, k, p, *rows = domino_ops.sampling.kernel_sampling_args(temperature, top_k, top_p, x.shape[1])
        u = domino_ops.draw_uniforms((x.shape[0],), "cpu", gen()).to(dev) if T > 0 else None
        got = run_sample_poisoned(backend.kernel("sample"), x, T, k, p, u)
    assert torch.equal(got.cpu(), want), (got, want)


def test_sample_extreme_rows_reference_semantics():
    x = extreme_rows()
    g = reference.sample(x, temperature=0.0)
    assert g[0] == 5 and g[1] == 0 and g[2] == 0 and g[3] == 3 and g[4] == 9
    s = reference.sample(x.expand(3, 7, 40).reshape(21, 40).repeat(200, 1), temperature=1.0,
                         generator=torch.Generator().manual_seed(0)).reshape(600, 7)
    assert (s[:, 0] != 5).all() and (s[:, 1] == 0).all() and (s[:, 2] == 0).all() and (s[:, 4] == 9).all()
    assert set(s[:, 3].tolist()) == {3, 17} and (s[:, 5] >= 20).all()


@pytest.mark.parametrize("backend", [NATIVE] + backend_params())
@pytest.mark.parametrize("fill,temperature", [(NAN, 0.0), (-INF, 1.0), (NAN, 1.0), (INF, 0.7)])
def test_head_rollout_with_extreme_base_logits_stays_in_the_vocabulary(backend, fill, temperature):
    """The rollout's tokens index the GRU input: an extreme row must still give a token in
    [0, V), never a crash, and the reference's token for the same uniforms: every draw on
    the native kernel and at T = 0; on the GPU kernels at T > 0 (an exponential race, not
    the reference's inverse CDF: other draws) the draws whose law is one token (no mass:
    token 0; all the mass on one +inf entry: that entry), the others only within the mass."""
    inputs = list(head_rollout_inputs(2, 2, 40, 8, 16, 8, torch.float32, torch.float32, True, seed=1))
    inputs[0][0] = fill  # sequence 0 all extreme, sequence 1 normal but for entry 7
    inputs[0][1, :, 7] = fill
    u = uniforms((2, 2), 3) if temperature > 0 else None
    tokens, logprobs, *_ = run_head_poisoned(head_op(backend), [x.clone() if x is not None else None for x in inputs],
                                             device=device_of(backend), temperature=temperature, u=u)
    assert ((tokens >= 0) & (tokens < 40)).all(), tokens
    if fill != INF:  # NaN at T = 0: the first NaN (index 0); no mass at T > 0: token 0
        assert tokens[0].tolist() == [0, 0], tokens
    # the reference draws uniforms((2, 2), 3) from a generator seeded 3
    t_ref, lp_ref, _ = reference.domino_head_rollout(*inputs, temperature=temperature,
                                                     generator=torch.Generator().manual_seed(3))
    same = torch.ones(2, 2, dtype=torch.bool)
    if backend is not None and temperature > 0:  # raced: only the draws whose law is one token
        same[0 if fill == INF else 1] = False  # (not sequence 0 at +inf: all 40 tie; nor sequence 1 otherwise)
        if fill != INF:  # entry 7 (NaN or -inf) has no mass
            assert bool((tokens[1] != 7).all()), tokens
    assert torch.equal(tokens[same], t_ref[same]), (tokens, t_ref)
    torch.testing.assert_close(logprobs[same], lp_ref[same], rtol=1e-5, atol=1e-5, equal_nan=True)
