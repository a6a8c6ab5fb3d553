"""Hostile-value fuzzing of the four core ops on one backend, in a process of its own.

tests/test_fuzz_extreme_values.py runs this script once per backend, so that a crash (a
segfault in a native kernel) fails that backend's test instead of killing the test run;
each example is printed before it runs, so the last line of a crashed run names the case.
For a longer soak run it by hand:

    .venv/bin/python tests/fuzz_extreme_values.py --backend native --examples 3000 [--shrink]

Each example builds an op's inputs with extreme values (NaN, +-inf, huge magnitudes, exact
ties, non-contiguous views) and extreme sampling parameters (temperatures from 1e-46 to
1e30, top-p down to 1e-300, top-k up to 2**63 - 1, per-row tensors); about one example in
ten (``hostile_case``) may also draw what the ops refuse: empty dimensions, invalid
parameters and, for the schema-level backends, hostile outputs (aliasing an input, wrong
length). A refusal passes, so at least half of each op's examples that are not hostile must
reach the checks of its answer, and at least a quarter of its examples must not be hostile
(``MIN_CHECKED``, ``MIN_ORDINARY``; each op's counts are printed after it). The call must
either raise a clear exception (a Python exception with a message, never a crash or a
hang) or return a valid answer: every token in [0, V), and the answer the documented rules
fix (domino_ops.sampling.filtered_weights): the argmax with NaN first when greedy, a
``+inf`` logit winning, token 0 for a row with no mass, a token of nonzero filtered
probability when sampling, and the reference's verify_greedy result exactly. (A
non-finite GRU *state* defines only the tokens' range: the kernels' saturating exp and
torch's silu differ at +-inf.)

Backends: ``reference``, ``native`` and ``triton`` (interpreted without a GPU) go through
the public wrappers (``backend=``); ``direct`` calls ``torch.ops.domino_ops.<op>`` (the
native kernel without the wrapper's checks) and ``emulated_cuda`` the CUDA kernels in the
SIMT emulator, with outputs passed in, through the same C++ argument checks a direct
``torch.ops`` call on a GPU gets. (The Triton functions in ``domino_ops.triton`` take the
arguments as the wrappers pass them, checked.)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # conftest: TRITON_INTERPRET, domino_simt's path
import conftest  # noqa: E402,F401

import domino_ops  # noqa: E402
from domino_ops import reference  # noqa: E402
from domino_ops.sampling import filtered_weights, kernel_sampling_args  # noqa: E402

WRAPPER_BACKENDS = ("reference", "native", "triton")
SCHEMA_BACKENDS = ("direct", "emulated_cuda")
NAN, INF = float("nan"), float("inf")
SPECIAL = [NAN, INF, -INF, 0.0, 1.0, -1.0, 1e30, -1e30, 3e38, -3e38]
TEMPERATURES = [0.0, 1e-46, 1e-40, 1e-30, 1e-21, 1e-19, 1e-3, 0.7, 1.0, 5.0, 1e30]
TOP_PS = [1e-300, 1e-45, 1e-10, 0.3, 0.9, 0.999999, 1.0]
# Clean exceptions: what a caller can catch. Wrappers name the argument (ValueError /
# TypeError); a schema-level call may also get the dispatcher's RuntimeError or Python's
# OverflowError for an int64 argument out of range.
WRAPPER_ERRORS = (ValueError, TypeError)
SCHEMA_ERRORS = (ValueError, TypeError, RuntimeError, OverflowError)


def schema_op(backend: str, op: str):
    if backend == "direct":
        return getattr(torch.ops.domino_ops, op)
    import domino_simt  # noqa: F401  (built by `make simt`)
    return getattr(torch.ops.domino_simt, op)


@st.composite
def hostile_rows(draw, b: int, V: int, dtype) -> torch.Tensor:
    """[b, V] logits: random normal rows with a drawn pattern of special values per row."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(b, V, generator=g) * draw(st.sampled_from([1.0, 30.0, 1e-6]))
    for i in range(b):
        kind = draw(st.sampled_from(["plain", "sprinkle", "all", "ties"]))
        if kind == "sprinkle" and V:
            for _ in range(draw(st.integers(1, 3))):
                x[i, draw(st.integers(0, V - 1))] = draw(st.sampled_from(SPECIAL))
        elif kind == "all":
            x[i] = draw(st.sampled_from(SPECIAL))
        elif kind == "ties":
            x[i] = torch.randint(0, 3, (V,), generator=g).float()
    return x.to(dtype)


@st.composite
def sampling_params(draw, b: int, V: int, hostile: bool = False):
    """(temperature, top_k, top_p): scalars, or per-row tensors; only with ``hostile`` also
    values the ops refuse (a negative, NaN or infinite temperature, top_k past int64 or
    negative, top_p outside (0, 1])."""
    if b and draw(st.booleans()):
        # a float32 tensor holds 1e-300 as 0, a top-p the ops refuse
        top_ps = TOP_PS if hostile else [p for p in TOP_PS if torch.tensor(p, dtype=torch.float32) > 0]
        return (torch.tensor([draw(st.sampled_from(TEMPERATURES)) for _ in range(b)]),
                torch.tensor([draw(st.sampled_from([0, 1, 2, V, 2**62])) for _ in range(b)]),
                torch.tensor([draw(st.sampled_from(top_ps)) for _ in range(b)], dtype=torch.float32))
    return (draw(st.sampled_from(TEMPERATURES + ([-1.0, NAN, INF] if hostile else []))),
            draw(st.sampled_from([0, 1, 2, max(V - 1, 0), V, V + 1, 2**63 - 1] + ([2**63, -1] if hostile else []))),
            draw(st.sampled_from(TOP_PS + ([0.0, -0.5, 1.5, NAN] if hostile else []))))


def row_value(param, i):
    return param[i].item() if isinstance(param, torch.Tensor) else param


def is_greedy(T) -> bool:
    return not T >= 1e-20  # below 1e-20 is the argmax limit (domino_ops.sampling)


def check_token_rule(x: torch.Tensor, token: int, T, top_k, top_p, what: str) -> None:
    """``token`` obeys the documented rules for the row ``x`` [V] (see module docstring)."""
    V = x.shape[0]
    assert 0 <= token < V, f"{what}: token {token} outside [0, {V})"
    if is_greedy(T):
        want = int(x.float().argmax())
        assert token == want, f"{what}: greedy token {token}, the argmax (NaN first) is {want}"
        return
    # A slightly looser top-p than asked: a kernel's fp32 prefix sums may keep one token
    # more than the float64 rule at the boundary, never a token outside it.
    loose_p = min(1.0, top_p * 1.001 + 1e-6) if top_p == top_p else top_p
    w = filtered_weights(x[None], T, top_k if top_k < 2**62 else 0, max(loose_p, 1e-300))[0]
    assert w[token] > 0, (f"{what}: token {token} (logit {x[token].item()}) has no filtered probability "
                          f"at T={T}, top_k={top_k}, top_p={top_p}")


SHRINK = False  # --shrink: minimise a failing case (slow: the interpreted Triton ops took 300 s)
# op -> [examples run, of them not hostile, of those the ones whose call returned and whose
# answer was checked]
TALLY: dict[str, list[int]] = {}
# At least this share of an op's examples that are not hostile must reach its answer's
# checks: a clean exception is a pass, so a fuzzer whose ordinary cases are mostly refused
# (empty shapes, invalid parameters) would check little of what the kernels compute. Judged
# over the ordinary examples alone: hypothesis derives examples from earlier ones, so the
# hostile share of a 20-example run swings from none to half (one run in a hundred above
# 0.43, measured), and a share of all examples failed a run with 13 hostile of 21.
MIN_CHECKED = 0.5
# ... and at least this share of an op's examples must be ordinary ones.
MIN_ORDINARY = 0.25
_HOSTILE = [False]  # whether the running example drew hostile_case True


def hostile_case(data) -> bool:
    """Whether this example may also draw what the ops refuse (empty shapes, invalid
    parameters, bad outputs): about one example in ten, so that most reach the kernels."""
    _HOSTILE[0] = data.draw(st.integers(0, 9), label="may be refused") == 9
    return _HOSTILE[0]


def fuzz_cases(examples: int, op: str):
    """One op's fuzz loop: ``examples`` hypothesis cases drawn inside the test (st.data()),
    no deadline, no example database (each run is fresh), and no shrinking unless --shrink
    (the case printed last before a failure names it). The test returns True when the call
    returned and its answer was checked (TALLY)."""
    phases = list(Phase) if SHRINK else [Phase.explicit, Phase.generate]
    tally = TALLY.setdefault(op, [0, 0, 0])

    def wrap(test):
        def counted(data):
            _HOSTILE[0] = False
            checked = bool(test(data))  # an example hypothesis abandons raises: not counted
            tally[0] += 1
            if not _HOSTILE[0]:
                tally[1] += 1
                tally[2] += checked
        return settings(max_examples=examples, deadline=None, database=None, phases=phases,
                        suppress_health_check=list(HealthCheck))(given(st.data())(counted))
    return wrap


def verify_shape(data, hostile: bool) -> tuple[int, int, int]:
    """(b, k, V) of a verify op's case, empty batches and blocks included when ``hostile``."""
    least = 0 if hostile else 1
    return (data.draw(st.integers(least, 3), label="b"), data.draw(st.integers(least, 4), label="k"),
            data.draw(st.sampled_from([1, 2, 9, 130]), label="V"))


def raw_or_kernel_args(data, hostile: bool, T, top_k, top_p, V: int) -> tuple:
    """A schema-level call's sampling arguments: as the wrappers pass them
    (kernel_sampling_args) or the raw values (a raw per-row tensor, which the schema
    refuses, only when ``hostile``)."""
    tensors = any(isinstance(a, torch.Tensor) for a in (T, top_k, top_p))
    if data.draw(st.booleans()) and (hostile or not tensors):
        return T, top_k, top_p
    return kernel_sampling_args(T, top_k, top_p, V)


def expect_clean(exc: BaseException, allowed) -> None:
    assert isinstance(exc, allowed) and str(exc), f"not a clear error: {type(exc).__name__}: {exc}"
    if os.environ.get("FUZZ_SHOW_REFUSALS"):
        print(f"  refused: {type(exc).__name__}: {str(exc)[:200]}", flush=True)


# ---------------------------------------------------------------------------------------- sample
def fuzz_sample(backend: str, examples: int):
    @fuzz_cases(examples, "sample")
    def run(data):
        hostile = hostile_case(data)
        b = data.draw(st.integers(0 if hostile else 1, 3), label="b")
        V = data.draw(st.sampled_from([0, 1, 2, 7, 130] if hostile else [1, 2, 7, 130]), label="V")
        dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
        x = data.draw(hostile_rows(b, V, dtype))
        T, top_k, top_p = data.draw(sampling_params(b, V, hostile))
        # a non-contiguous view of the same values (the schema-level call refuses one)
        if data.draw(st.booleans()) and V > 1 and (hostile or backend in WRAPPER_BACKENDS):
            x = torch.stack([x, x], dim=-1)[..., 0]
        print(f"sample b={b} V={V} {dtype} T={T} top_k={top_k} top_p={top_p}", flush=True)
        seed = data.draw(st.integers(0, 1000))
        try:
            if backend in WRAPPER_BACKENDS:
                tokens = domino_ops.sample(x, temperature=T, top_k=top_k, top_p=top_p,
                                           generator=torch.Generator().manual_seed(seed), backend=backend)
            else:
                tokens = torch.full((b,), -7, dtype=torch.int64)
                args = raw_or_kernel_args(data, hostile, T, top_k, top_p, V)
                u = torch.rand(b, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
                if hostile and data.draw(st.booleans()) and b > 1:
                    tokens = tokens[:-1]  # an output one row short
                schema_op(backend, "sample")(x, *args[:3], u, tokens, *args[3:])
        except Exception as exc:  # noqa: BLE001  (the contract: a clear exception is fine)
            expect_clean(exc, WRAPPER_ERRORS if backend in WRAPPER_BACKENDS else SCHEMA_ERRORS)
            return
        assert tokens.shape == (b,) and tokens.dtype == torch.int64
        for i in range(b):
            check_token_rule(x[i], int(tokens[i]), row_value(T, i), row_value(top_k, i), row_value(top_p, i),
                             f"sample row {i}")
        return True
    run()


# --------------------------------------------------------------------------------- verify_greedy
def fuzz_verify_greedy(backend: str, examples: int):
    @fuzz_cases(examples, "verify_greedy")
    def run(data):
        hostile = hostile_case(data)
        b, k, V = verify_shape(data, hostile)
        dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
        logits = data.draw(hostile_rows(b * (k + 1), V, dtype)).reshape(b, k + 1, V)
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
        draft = torch.where(torch.rand(b, k, generator=g) < 0.7, logits[:, :k].float().argmax(-1),
                            torch.randint(0, V, (b, k), generator=g))
        print(f"verify_greedy b={b} k={k} V={V} {dtype}", flush=True)
        try:
            if backend in WRAPPER_BACKENDS:
                out, acc = domino_ops.verify_greedy(draft, logits, backend=backend)
            else:
                out = torch.full((b, k + 1), -7, dtype=torch.int64)
                acc = torch.full((b,), -7, dtype=torch.int64)
                if hostile and data.draw(st.booleans()) and k > 0:
                    out = draft  # an output aliasing the drafts (and one column short)
                schema_op(backend, "verify_greedy")(draft, logits, out, acc)
        except Exception as exc:  # noqa: BLE001
            expect_clean(exc, WRAPPER_ERRORS if backend in WRAPPER_BACKENDS else SCHEMA_ERRORS)
            return
        want_out, want_acc = reference.verify_greedy(draft, logits)
        assert torch.equal(acc, want_acc), (acc, want_acc)
        assert torch.equal(out, want_out), (out, want_out)
        return True
    run()


# ------------------------------------------------------------------------------- verify_sampling
def fuzz_verify_sampling(backend: str, examples: int):
    @fuzz_cases(examples, "verify_sampling")
    def run(data):
        hostile = hostile_case(data)
        b, k, V = verify_shape(data, hostile)
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
        q = torch.softmax(torch.randn(b, k, V, generator=g) * 3, -1)
        p = torch.softmax(torch.randn(b, k + 1, V, generator=g) * 3, -1)
        draft = torch.randint(0, V, (b, k), generator=g)
        for t in (q, p):  # hostile probabilities: zero rows, NaN, inf, negative, unnormalised
            if t.numel() and data.draw(st.booleans()):
                flat = t.view(-1, V)
                flat[data.draw(st.integers(0, flat.shape[0] - 1))] = data.draw(
                    st.sampled_from([0.0, NAN, INF, -1.0, 7.0]))
        print(f"verify_sampling b={b} k={k} V={V}", flush=True)
        seed = data.draw(st.integers(0, 1000))
        try:
            if backend in WRAPPER_BACKENDS:
                out, acc = domino_ops.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(seed),
                                                      backend=backend)
            else:
                ug = torch.Generator().manual_seed(seed)
                u_acc = torch.rand(b, k, dtype=torch.float64, generator=ug)
                u_res = torch.rand(b, dtype=torch.float64, generator=ug)
                out = torch.full((b, k + 1), -7, dtype=torch.int64)
                acc = torch.full((b,), -7, dtype=torch.int64)
                schema_op(backend, "verify_sampling")(draft, q, p, u_acc, u_res, out, acc)
        except Exception as exc:  # noqa: BLE001
            expect_clean(exc, WRAPPER_ERRORS if backend in WRAPPER_BACKENDS else SCHEMA_ERRORS)
            return
        assert acc.shape == (b,) and out.shape == (b, k + 1)
        # the same uniforms as the reference's draws: the float64 accept tests and the
        # index-order residual CDF give the same tokens
        want_out, want_acc = reference.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(acc, want_acc) and torch.equal(out, want_out), (out, want_out)
        for i in range(b):
            n = int(acc[i])
            assert 0 <= n <= k, f"row {i}: {n} accepted of {k}"
            assert torch.equal(out[i, :n], draft[i, :n]), f"row {i}: accepted tokens are not the drafts"
            assert 0 <= int(out[i, n]) < V, f"row {i}: token {int(out[i, n])} outside [0, {V})"
            assert bool((out[i, n + 1:] == -1).all()), f"row {i}: not padded with -1 after the target's token"
        return True
    run()


# ---------------------------------------------------------------------------- domino_head_rollout
def fuzz_domino_head_rollout(backend: str, examples: int):
    @fuzz_cases(examples, "domino_head_rollout")
    def run(data):
        hostile = hostile_case(data)
        b = data.draw(st.integers(0 if hostile else 1, 2), label="b")
        k = data.draw(st.integers(0 if hostile else 1, 3), label="k")
        V = data.draw(st.sampled_from([1, 2, 40]), label="V")
        r, G = data.draw(st.sampled_from([1, 4])), data.draw(st.sampled_from([1, 3, 16]))
        H = data.draw(st.sampled_from([None, 0, 5] if hostile else [None, 5]))  # None: table mode
        wdt = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
        base = data.draw(hostile_rows(b * k, V, wdt)).reshape(b, k, V)
        hproj = torch.randn(b, k, r, generator=g).to(wdt)
        state = torch.randn(b, G, generator=g)
        if b and data.draw(st.booleans()):
            state[data.draw(st.integers(0, b - 1)), 0] = data.draw(st.sampled_from([NAN, INF, -INF, 1e30]))
        w = lambda *s: (torch.randn(*s, generator=g) / 4).to(wdt)  # noqa: E731
        gru_input, w_ih = (w(V, 3 * G), None) if H is None else (w(V, H), w(3 * G, H))
        weights = [gru_input, w_ih, w(3 * G, G), w(r, G), w(V, r)]
        T, top_k, top_p = data.draw(sampling_params(b, V, hostile))
        seed = data.draw(st.integers(0, 1000))
        print(f"domino_head_rollout b={b} k={k} V={V} r={r} G={G} H={H} {wdt} T={T} top_k={top_k} "
              f"top_p={top_p}", flush=True)
        inputs = [base.clone(), hproj, state] + weights
        try:
            if backend in WRAPPER_BACKENDS:
                tokens, logprobs, _ = domino_ops.domino_head_rollout(
                    *inputs, temperature=T, top_k=top_k, top_p=top_p,
                    generator=torch.Generator().manual_seed(seed), backend=backend)
            else:
                args = raw_or_kernel_args(data, hostile, T, top_k, top_p, V)
                u = torch.rand(b, k, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
                tokens = torch.full((b, k), -7, dtype=torch.int64)
                logprobs = torch.full((b, k), NAN)
                state_out = torch.full_like(state, NAN)
                kernel_inputs = list(inputs)
                if hostile and data.draw(st.booleans()):  # an output aliasing the input state
                    kernel_inputs[2] = state_out = state.clone()
                schema_op(backend, "domino_head_rollout")(*kernel_inputs, *args[:3], u, False, tokens, logprobs,
                                                          state_out, *args[3:])
        except Exception as exc:  # noqa: BLE001
            expect_clean(exc, WRAPPER_ERRORS if backend in WRAPPER_BACKENDS else SCHEMA_ERRORS)
            return
        assert tokens.shape == (b, k)
        assert bool(((tokens >= 0) & (tokens < V)).all()), f"tokens outside [0, {V}): {tokens.tolist()}"
        check_rollout_against_reference(inputs, base, tokens, logprobs, T)
        return True
    run()


def check_rollout_against_reference(inputs, base, tokens, logprobs, T) -> None:
    """Greedy rows follow the reference's steps while they agree; a disagreement must be a
    near tie of the reference's logits (the kernels round differently). Sampled rows must
    report a log-probability <= 0 (never NaN: NaN logits count as -inf when sampling)."""
    b, k = tokens.shape
    for i in range(b):
        Ti = row_value(T, i)
        if not bool(torch.isfinite(inputs[2][i]).all()):
            # A non-finite GRU state: each backend follows IEEE through its own silu and
            # sigmoid (the kernels' exp saturates, torch's silu(-inf) is NaN), so only the
            # range of the tokens is defined (checked by the caller).
            continue
        if not is_greedy(Ti):
            assert not bool(torch.isnan(logprobs[i]).any()) and bool((logprobs[i] <= 1e-4).all()), logprobs[i]
            continue
        row = [x[i:i + 1] if j < 3 else x for j, x in enumerate(inputs)]
        row[0] = base[i:i + 1].clone()
        # the reference's own greedy rollout of this row, with its logits written out
        ref_tok, _, _ = reference.domino_head_rollout(*row, write_logits=True)
        L = row[0][0].float()
        for s in range(k):
            got, want = int(tokens[i, s]), int(ref_tok[0, s])
            if got == want:
                continue
            gap = (L[s, want] - L[s, got]).item()
            assert gap == gap and abs(gap) <= 2e-2 * (1 + abs(L[s, want].item())), (
                f"row {i} step {s}: token {got}, the reference's argmax is {want} (gap {gap})")
            break  # past a near tie the two rollouts' states differ


# ----------------------------------------------------------------------------- domino_head_expand
def fuzz_domino_head_expand(backend: str, examples: int):
    @fuzz_cases(examples, "domino_head_expand")
    def run(data):
        hostile = hostile_case(data)
        b, k = data.draw(st.integers(1, 2), label="b"), data.draw(st.integers(1, 3), label="k")
        V = data.draw(st.sampled_from([1, 2, 40]), label="V")
        n = data.draw(st.integers(0 if hostile else 1, 5), label="n")
        m = data.draw(st.integers(0 if hostile else 1, min(4, V)), label="m")
        r, G = data.draw(st.sampled_from([1, 4])), data.draw(st.sampled_from([1, 16]))
        wdt = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
        g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
        base = data.draw(hostile_rows(b * k, V, wdt)).reshape(b, k, V)
        w = lambda *s: (torch.randn(*s, generator=g) / 4).to(wdt)  # noqa: E731
        node_state = torch.randn(n, G, generator=g)
        if n and data.draw(st.booleans()):
            node_state[0, 0] = data.draw(st.sampled_from([NAN, INF, -INF]))
        seq, depth = torch.randint(0, b, (n,), generator=g), torch.randint(0, k, (n,), generator=g)
        T, top_k, top_p = data.draw(sampling_params(b if hostile else 0, V, hostile))
        if isinstance(T, torch.Tensor):  # scalar parameters only: a tensor must be refused
            T = T[:1]
        args = (base, w(b, k, r).float(), node_state, seq, depth, w(V, 3 * G), None, w(3 * G, G), w(r, G), w(V, r))
        print(f"domino_head_expand b={b} k={k} V={V} n={n} m={m} T={T} top_k={top_k} top_p={top_p}", flush=True)
        seed = data.draw(st.integers(0, 1000))
        try:
            if backend in SCHEMA_BACKENDS:
                outs = (torch.full((n, m), -7, dtype=torch.int64), torch.full((n, m), NAN),
                        torch.full((n, m, G), NAN), torch.full((n, V), NAN))
                u = torch.rand(n, m, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
                schema_op(backend, "domino_head_expand")(*args, T, top_k, top_p, u, *outs)
                tokens, logprobs, _, L = outs
            else:
                tokens, logprobs, _, L = domino_ops.domino_head_expand(
                    *args, num_children=m, temperature=T, top_k=top_k, top_p=top_p,
                    generator=torch.Generator().manual_seed(seed), backend=backend)
        except Exception as exc:  # noqa: BLE001
            expect_clean(exc, WRAPPER_ERRORS if backend in WRAPPER_BACKENDS else SCHEMA_ERRORS)
            return
        assert tokens.shape == (n, m) and bool(((tokens >= 0) & (tokens < V)).all()), tokens
        for f in range(n):
            assert len(set(tokens[f].tolist())) == m, f"node {f}: children repeat {tokens[f].tolist()}"
            if is_greedy(T):  # the greedy order of the node's own logits, NaN first
                assert torch.equal(tokens[f], reference.greedy_children(L[f:f + 1], m)[0]), (tokens[f], L[f])
            else:
                for c in range(m):
                    if logprobs[f, c] > float("-inf"):
                        check_token_rule(L[f], int(tokens[f, c]), T, top_k, top_p, f"expand node {f} child {c}")
        return True
    run()


FUZZERS = {"sample": fuzz_sample, "verify_greedy": fuzz_verify_greedy, "verify_sampling": fuzz_verify_sampling,
           "domino_head_rollout": fuzz_domino_head_rollout, "domino_head_expand": fuzz_domino_head_expand}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=WRAPPER_BACKENDS + SCHEMA_BACKENDS, required=True)
    parser.add_argument("--examples", type=int, default=int(os.environ.get("DOMINO_FUZZ_EXAMPLES", 40)),
                        help="hypothesis examples per op")
    parser.add_argument("--ops", nargs="*", default=list(FUZZERS), choices=list(FUZZERS))
    parser.add_argument("--shrink", action="store_true", help="minimise a failing case before reporting it")
    args = parser.parse_args()
    global SHRINK
    SHRINK = args.shrink
    torch.set_num_threads(1)
    for op in args.ops:
        FUZZERS[op](args.backend, args.examples)
        run, ordinary, checked = TALLY[op]
        print(f"{op}: {run} examples, {run - ordinary} hostile; {checked} of the {ordinary} others returned and "
              "were checked", flush=True)
        assert ordinary >= MIN_ORDINARY * run, f"{op}: only {ordinary} of {run} examples were not hostile"
        assert checked >= MIN_CHECKED * ordinary, (
            f"{op}: only {checked} of {ordinary} ordinary examples reached the op's answer (the rest were refused)")
    print("fuzz ok", flush=True)


if __name__ == "__main__":
    main()
