"""Regression tests for extreme but valid values (issue: robustness). Each case that used
to crash the process runs in a subprocess, so a segfault fails one test, not the run."""

import subprocess
import sys
import textwrap

import pytest
import torch

import domino_ops
from domino_ops import reference


def run_isolated(code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter; a crash shows as a negative return code."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def head_args(G: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, k, V, r = 1, 2, 64, 8
    return [torch.randn(b, k, V, generator=g), torch.randn(b, k, r, generator=g), torch.zeros(b, G),
            torch.randn(V, 3 * G, generator=g), None, torch.randn(3 * G, G, generator=g),
            torch.randn(r, G, generator=g), torch.randn(V, r, generator=g)]


def test_tiny_top_p_in_the_rollout_does_not_crash_and_keeps_the_top_token():
    proc = run_isolated('''
        import torch, domino_ops
        g = torch.Generator().manual_seed(0)
        b, k, V, r, G = 1, 2, 64, 8, 2048
        a = [torch.randn(b, k, V, generator=g), torch.randn(b, k, r, generator=g), torch.zeros(b, G),
             torch.randn(V, 3 * G, generator=g), None, torch.randn(3 * G, G, generator=g),
             torch.randn(r, G, generator=g), torch.randn(V, r, generator=g)]
        t, lp, _ = domino_ops.domino_head_rollout(*a, temperature=1.0, top_p=1e-300)
        t0, lp0, _ = domino_ops.domino_head_rollout(*a, temperature=0.0)
        assert torch.equal(t, t0), (t, t0)          # only the top token survives: the argmax
        assert torch.equal(lp, torch.zeros_like(lp)), lp  # with probability 1
        print("ok")
    ''')
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_tiny_top_p_keeps_exactly_the_top_token(backend):
    x = torch.randn(16, 100)
    t = domino_ops.sample(x, temperature=1.0, top_p=1e-300, generator=torch.Generator().manual_seed(0),
                          backend=backend)
    assert torch.equal(t, x.argmax(-1))


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("temperature", [1e-40, 1e-30, 1e-46])
def test_vanishing_temperature_is_the_argmax(backend, temperature):
    x = torch.randn(16, 100) * 10
    t = domino_ops.sample(x, temperature=temperature, generator=torch.Generator().manual_seed(0), backend=backend)
    assert torch.equal(t, x.argmax(-1))


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_huge_top_k_is_no_filter(backend):
    x = torch.randn(8, 50)
    kw = dict(temperature=1.0, backend=backend)
    a = domino_ops.sample(x, top_k=2 ** 63, generator=torch.Generator().manual_seed(1), **kw)
    b = domino_ops.sample(x, top_k=0, generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(a, b)


def test_filtered_probs_extreme_rows():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1.0, nan, 3.0, 2.0], [-inf, -inf, -inf, -inf], [0.0, inf, 1.0, inf], [nan, nan, nan, nan]])
    p = domino_ops.filtered_probs(x, 1.0)
    assert torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(4))
    assert p[0, 1] == 0  # NaN counts as -inf
    assert torch.equal(p[1], torch.tensor([1.0, 0, 0, 0]))  # no finite mass: token 0
    assert torch.equal(p[2], torch.tensor([0, 0.5, 0, 0.5]))  # +inf wins, shared evenly
    assert torch.equal(p[3], torch.tensor([1.0, 0, 0, 0]))
    # the argmax limit is torch.argmax, NaN first: what the target's own greedy decoding picks
    assert torch.equal(domino_ops.filtered_probs(x[:1], 1e-40), torch.tensor([[0.0, 1, 0, 0]]))
    assert torch.equal(domino_ops.filtered_probs(x[:1, [0, 2, 3]], 1e-40), torch.tensor([[0.0, 1, 0]]))


def test_per_row_parameters_in_filtered_probs_match_row_by_row():
    x = torch.randn(3, 5, 40)
    T, k, p = torch.tensor([0.0, 0.7, 1.3]), torch.tensor([0, 5, 0]), torch.tensor([1.0, 0.9, 0.5])
    rows = domino_ops.filtered_probs(x, T, k, p)
    for i in range(3):
        one = domino_ops.filtered_probs(x[i:i + 1], float(T[i]), int(k[i]), float(p[i]))
        torch.testing.assert_close(rows[i:i + 1], one)


def test_direct_calls_reject_outputs_that_alias_inputs():
    x = torch.randn(4, 10)
    u = torch.rand(4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="must not share memory"):
        torch.ops.domino_ops.sample(x, 1.0, 0, 1.0, u, u.view(torch.int64))
    draft = torch.randint(0, 10, (2, 3))
    logits = torch.randn(2, 4, 10)
    with pytest.raises(RuntimeError, match="must not share memory"):
        torch.ops.domino_ops.verify_greedy(draft, logits, torch.empty(2, 4, dtype=torch.int64), draft.view(-1)[:2])
    a = head_args(G=4)
    tokens = torch.empty(1, 2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="must not share memory"):
        torch.ops.domino_ops.domino_head_rollout(*a, 0.0, 0, 1.0, None, False, tokens, a[2].view(1, 4)[:, :2],
                                                 torch.empty(1, 4))


def test_direct_call_with_an_empty_embedding_is_refused():
    a = head_args(G=4)
    a[3] = torch.randn(64, 0)  # the embedding [V, 0] ...
    a[4] = torch.randn(12, 0)  # ... with w_ih [3G, 0]: not the table, and nothing to read
    with pytest.raises(RuntimeError, match="at least one column"):
        torch.ops.domino_ops.domino_head_rollout(*a, 0.0, 0, 1.0, None, False, torch.empty(1, 2, dtype=torch.int64),
                                                 torch.empty(1, 2), torch.empty(1, 4))


def test_reference_and_native_agree_on_tiny_top_p_in_the_rollout_at_small_G():
    a = head_args(G=16, seed=3)
    kw = dict(temperature=1.0, top_p=1e-300)
    t, _, _ = domino_ops.domino_head_rollout(*a, generator=torch.Generator().manual_seed(0), **kw)
    t_ref, _, _ = reference.domino_head_rollout(*a, generator=torch.Generator().manual_seed(0), **kw)
    assert torch.equal(t, t_ref)


@pytest.mark.parametrize("backend", ["native", "reference", "triton", "emulated_cuda"])
def test_a_target_row_without_mass_gives_token_0_in_verify_sampling(backend):
    """Zeros, NaN and negatives are not a distribution: the resampled (or bonus) token is 0,
    the rule of a sampled row with no mass, in every backend (it used to raise natively
    and return -1 from the GPU kernels)."""
    b, k, V = 3, 2, 7
    q = torch.softmax(torch.randn(b, k, V), -1)
    p = torch.softmax(torch.randn(b, k + 1, V), -1)
    p[0, 0], p[1, 0], p[2, 0] = 0.0, float("nan"), -1.0  # every first draft is rejected (p(x) <= 0)
    draft = torch.randint(0, V, (b, k))
    if backend == "emulated_cuda":
        from kernel_backends import emulated_cuda_kernel
        from poisoned_calls import run_verify_poisoned
        out, acc = run_verify_poisoned(emulated_cuda_kernel("verify_sampling"), draft, q, p,
                                       torch.rand(b, k, dtype=torch.float64), torch.rand(b, dtype=torch.float64))
    else:
        out, acc = domino_ops.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(0),
                                              backend=backend)
    assert acc.tolist() == [0, 0, 0]
    assert out[:, 0].tolist() == [0, 0, 0]


@pytest.mark.parametrize("backend", ["native", "reference", "triton", "emulated_cuda"])
def test_a_sampled_rollout_row_of_nan_gives_token_0_with_logprob_0(backend):
    """NaN logits count as -inf when sampling; a row with no mass gives token 0 at
    log-probability 0 (the CUDA race used to rank a -inf key and report NaN; found by the
    fuzzer: V = 1, per-row temperature)."""
    a = head_args(G=4)
    a[0] = torch.full((1, 2, 1), float("nan"))
    a[3], a[7] = torch.randn(1, 12), torch.randn(1, 8)  # V = 1: table [1, 3G], w2 [1, r]
    T = torch.tensor([5.0])
    if backend == "emulated_cuda":
        from kernel_backends import emulated_cuda_kernel
        from domino_ops.sampling import kernel_sampling_args
        args = kernel_sampling_args(T, 0, 1.0, 1)
        tokens, logprobs = torch.full((1, 2), -7), torch.full((1, 2), float("nan"))
        emulated_cuda_kernel("domino_head_rollout")(*a, *args[:3], torch.rand(1, 2, dtype=torch.float64), False,
                                                    tokens, logprobs, torch.empty(1, 4), *args[3:])
    else:
        tokens, logprobs, _ = domino_ops.domino_head_rollout(*a, temperature=T, generator=torch.Generator().manual_seed(0),
                                                             backend=backend)
    assert tokens.tolist() == [[0, 0]]
    assert logprobs.tolist() == [[0.0, 0.0]]


def leading_minus_inf_head(V: int = 9300, finite: int = 80):
    """Head inputs (head_args' shapes, r = 8, G = 4) whose base rows are -inf except their
    last ``finite`` entries: many whole vocabulary tiles (and, at V = 9300, chunks) of -inf
    come before the first finite logit, and the correction is zero (w2 = 0) so they stay -inf."""
    a = head_args(G=4)
    g = torch.Generator().manual_seed(1)
    base = torch.full((1, 2, V), float("-inf"))
    base[..., V - finite:] = torch.randn(1, 2, finite, generator=g)
    a[0], a[3], a[7] = base, torch.randn(V, 12, generator=g), torch.zeros(V, 8)
    return a


@pytest.mark.parametrize("backend", ["native", "reference", "triton", "emulated_cuda"])
def test_greedy_logprobs_after_tiles_of_minus_inf_are_finite(backend):
    """Merging two all -inf tiles' statistics computed 0 * exp(-inf - -inf) = NaN in the CPU
    kernels, so a greedy log-probability came out NaN when a row began with two or more
    tiles of -inf (found by review): every backend must give log_softmax's finite value."""
    a = leading_minus_inf_head()
    want_t, want_lp, _ = domino_ops.domino_head_rollout(a[0].clone(), *a[1:], backend="reference")
    assert bool(torch.isfinite(want_lp).all())
    if backend == "emulated_cuda":
        from kernel_backends import emulated_cuda_kernel
        from poisoned_calls import run_head_poisoned
        t, lp = run_head_poisoned(emulated_cuda_kernel("domino_head_rollout"), [a[0].clone(), *a[1:]])[:2]
    else:
        t, lp, _ = domino_ops.domino_head_rollout(a[0].clone(), *a[1:], backend=backend)
    assert torch.equal(t, want_t)
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_tree_children_logprobs_after_tiles_of_minus_inf_are_finite(packed):
    """The same for the tree step's children (native; with w2 packed on an AVX512-BF16 CPU)."""
    if packed and not domino_ops.small_batch_linear_packed_supported():
        pytest.skip("no packed bf16 kernel runs on this CPU (it needs AVX2 and FMA, or AVX512-BF16)")
    a = leading_minus_inf_head()
    if packed:
        a = [x.bfloat16() if x is not None and i >= 3 else x for i, x in enumerate(a)]
    frontier = (torch.randn(3, 4), torch.zeros(3, dtype=torch.long), torch.tensor([0, 1, 1]))
    kw = dict(num_children=3, w2_packed=domino_ops.pack_small_batch_linear_weight(a[7]) if packed else None)
    t, lp, _, L = domino_ops.domino_head_expand(a[0], a[1], *frontier, *a[3:], **kw)
    assert torch.equal(t, reference.greedy_children(L, 3))
    torch.testing.assert_close(lp, torch.log_softmax(L, -1).gather(-1, t), atol=1e-5, rtol=1e-5)
    assert bool(torch.isfinite(lp).all())


def test_a_per_row_temperature_is_thresholded_at_its_float32_value_in_rollout_and_expand():
    """The kernels take a per-row temperature in float32, where the float64 9.99999999e-21
    is 1e-20, at the argmax threshold's sampling side: the references of the rollout and the
    expand threshold that float32 value too, so both sample between two tied maxima (the
    references had taken the argmax, token 2, every time)."""
    b, k, V, r, G = 1, 1, 8, 2, 4
    base = torch.zeros(b, k, V)
    base[0, 0, 2] = base[0, 0, 5] = 5.0  # two tied maxima: a sampled row picks either
    head = [torch.zeros(b, k, r), torch.zeros(b, G), torch.zeros(V, 3 * G), None, torch.zeros(3 * G, G),
            torch.zeros(r, G), torch.zeros(V, r)]
    T = torch.tensor([9.99999999e-21], dtype=torch.float64)
    assert bool(T < 1e-20) and not bool(T.float() < 1e-20)  # the premise: the threshold's two sides
    picks = {"native": [], "reference": []}
    for seed in range(8):
        for name, op in (("native", domino_ops.domino_head_rollout), ("reference", reference.domino_head_rollout)):
            extra = {"backend": "native"} if name == "native" else {}
            tokens, _, _ = op(base.clone(), *head, temperature=T, generator=torch.Generator().manual_seed(seed), **extra)
            picks[name].append(int(tokens))
    assert picks["native"] == picks["reference"] and set(picks["native"]) == {2, 5}
    node = (torch.zeros(1, G), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    expand_head = head[2:]
    for seed in range(4):
        got = domino_ops.domino_head_expand(base.clone(), head[0], *node, *expand_head, num_children=2, temperature=T,
                                            generator=torch.Generator().manual_seed(seed), backend="native")
        want = reference.domino_head_expand(base.clone(), head[0], *node, *expand_head, num_children=2,
                                            temperature=T, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got[0], want[0]) and torch.allclose(got[1], want[1])
