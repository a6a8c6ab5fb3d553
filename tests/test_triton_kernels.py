"""The Triton kernels (python/domino_ops/triton/) against the references: on this GPU-less
machine under Triton's interpreter (TRITON_INTERPRET=1, set in conftest), greedy exactly,
sampling exactly given the uniforms (inverse CDF) or statistically (the head's race), plus
an ahead-of-time compile of every kernel for sm_80 and sm_90."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

import domino_ops  # noqa: E402
from domino_ops import reference, select_backend  # noqa: E402
from domino_ops import triton as triton_ops  # noqa: E402
from conftest import POISON_TOKEN  # noqa: E402
from stats import assert_matches_distribution  # noqa: E402
from kernel_cases import (  # noqa: E402
    race_population, run_head_poisoned, verify_greedy_case, verify_sampling_case, verify_sampling_population)
from test_domino_head_rollout import MARGIN, make_inputs, oracle  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
INTERPRETED = settings(max_examples=10)
pytestmark = pytest.mark.skipif(not triton_ops.available(DEV), reason="Triton cannot run here")
kern = triton_ops.kernel


def uniforms(shape, seed):
    return torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(DEV)


@INTERPRETED
@given(b=st.sampled_from([1, 3, 33]), k=st.sampled_from([1, 4]), V=st.sampled_from([1, 17, 1500]),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_verify_greedy(b, k, V, dtype, seed):
    draft, logits = verify_greedy_case(b, k, V, dtype, seed)
    logits, draft = logits.to(DEV), draft.to(DEV)
    out = torch.full((b, k + 1), POISON_TOKEN, dtype=torch.int64, device=DEV)
    acc = torch.full((b,), POISON_TOKEN, dtype=torch.int64, device=DEV)
    kern("verify_greedy")(draft, logits, out, acc)
    r_out, r_acc = reference.verify_greedy(draft, logits)
    assert torch.equal(acc, r_acc) and torch.equal(out, r_out)


@INTERPRETED
@given(b=st.sampled_from([1, 3]), V=st.sampled_from([1, 2, 17, 1500]), dtype=st.sampled_from(DTYPES),
       temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]), top_k=st.sampled_from([0, 1, 3, 50]),
       top_p=st.sampled_from([1.0, 0.9, 0.3]), ties=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_sample_matches_reference_given_uniforms(b, V, dtype, temperature, top_k, top_p, ties, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, V, generator=g)
    if ties:
        logits = (logits * 2).round() / 2
    logits = logits.to(dtype).to(DEV)
    u = uniforms((b,), seed)
    tokens = torch.full((b,), POISON_TOKEN, dtype=torch.int64, device=DEV)
    kern("sample")(logits, temperature, top_k, top_p, u, tokens)
    if temperature == 0:
        expected = logits.float().argmax(-1)
    else:
        expected, _ = reference.sample_from_logits(logits.float(), temperature, top_k, top_p, u)
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("b,k,V", [(1, 1, 5), (4, 5, 300), (3, 2, 1500)])
def test_verify_sampling_matches_reference_given_uniforms(b, k, V):
    draft, q, p = verify_sampling_case(b, k, V)
    q, p, draft = q.to(DEV), p.to(DEV), draft.to(DEV)
    out = torch.full((b, k + 1), POISON_TOKEN, dtype=torch.int64, device=DEV)
    acc = torch.full((b,), POISON_TOKEN, dtype=torch.int64, device=DEV)
    gen = torch.Generator(DEV).manual_seed(7)
    ua, ur = reference.draw_uniforms((b, k), DEV, gen), reference.draw_uniforms((b,), DEV, gen)
    kern("verify_sampling")(draft, q, p, ua, ur, out, acc)
    r_out, r_acc = reference.verify_sampling(draft, q, p, generator=torch.Generator(DEV).manual_seed(7))
    assert torch.equal(acc, r_acc) and torch.equal(out, r_out)


def test_verify_sampling_is_distributed_as_target():
    draft, q, p, target = verify_sampling_population(V=5, N=2000)
    out, acc = domino_ops.verify_sampling(draft.to(DEV), q.to(DEV), p.to(DEV),
                                          generator=torch.Generator(DEV).manual_seed(1), backend="triton")
    assert_matches_distribution(out[:, 0].cpu().numpy(), target, what="first token")


head_shapes = st.fixed_dictionaries({
    "b": st.sampled_from([1, 3, 33]),
    "k": st.sampled_from([1, 3]),
    "V": st.sampled_from([1, 17, 300]),  # 300: three 128-row tiles, the last partial
    "r": st.sampled_from([1, 3, 33]),  # 33: two 32-column chunks
    "G": st.sampled_from([1, 5, 40]),  # 40: two 32-row GRU chunks
    "H": st.sampled_from([1, 8]),
    "wdtype": st.sampled_from(DTYPES),
    "base_dtype": st.sampled_from(DTYPES),
    "table": st.booleans(),
    "seed": st.integers(0, 2**31 - 1),
})


def run_head(inputs, **kwargs):
    inputs = [x.to(DEV) if x is not None else None for x in inputs]
    out = run_head_poisoned(kern("domino_head_rollout"), inputs, **kwargs)
    return tuple(x.cpu() for x in out) + (inputs[0].cpu(),)


@INTERPRETED
@given(head_shapes)
def test_head_rollout_greedy_matches_oracle(p):
    inputs = make_inputs(**p)
    tokens_ref, lp_ref, S_ref, L_ref, margins = oracle(*inputs)
    assume(bool((margins > MARGIN).all()))
    tokens, logprobs, state_out, base = run_head(inputs, write_logits=True)
    assert torch.equal(tokens, tokens_ref)
    torch.testing.assert_close(logprobs, lp_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, S_ref.float(), rtol=1e-4, atol=1e-5)
    tol = 1e-4 if base.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(base.double(), L_ref.to(base.dtype).double(), rtol=tol, atol=tol)


def test_head_rollout_leaves_base_untouched_without_write_logits():
    inputs = make_inputs(2, 3, 300, 8, 16, 8, torch.float32, torch.float32, True, 1)
    _, _, _, base = run_head(inputs)
    assert torch.equal(base, inputs[0])


@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.8, 3, 1.0), (1.2, 0, 0.7), (1.0, 5, 0.9)])
def test_head_rollout_filtered_sampling_matches_reference_given_uniforms(table, temperature, top_k, top_p):
    inputs = make_inputs(3, 3, 40, 8, 16, 8, torch.float32, torch.float32, table, seed=4)
    *_, L_ref, _ = oracle(*inputs)
    assert L_ref.sort(-1).values.diff(dim=-1).min() > 1e-5  # no near-ties for rounding to flip
    as64 = [x.double() if x is not None and i >= 3 else x for i, x in enumerate(inputs)]
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*as64, temperature=temperature, top_k=top_k, top_p=top_p,
                                                         generator=torch.Generator().manual_seed(9))
    tokens, logprobs, state_out, _ = run_head(inputs, temperature=temperature, top_k=top_k, top_p=top_p,
                                              u=uniforms((3, 3), 9))
    assert torch.equal(tokens, t_ref)
    torch.testing.assert_close(logprobs, lp_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, s_ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("wdtype", DTYPES)
def test_head_rollout_exponential_race_joint_distribution(wdtype):
    V, N, temperature = 5, 800, 1.3
    inputs, joint, p0 = race_population(V, N, temperature, wdtype)
    tokens, logprobs, _, _ = run_head(inputs, temperature=temperature, u=uniforms((N, 2), 5))
    assert_matches_distribution((tokens[:, 0] * V + tokens[:, 1]).numpy(), joint, what="(x0, x1)")
    np.testing.assert_allclose(logprobs[:, 0].numpy(), np.log(p0[tokens[:, 0].numpy()]), rtol=1e-3, atol=1e-3)


# ---- backend selection ------------------------------------------------------------------

def test_backend_is_selectable_per_call_and_by_environment(monkeypatch):
    logits = torch.randn(3, 50, device=DEV)
    expected = logits.argmax(-1)
    for backend in ("native", "triton", "reference"):
        if backend == "native" and not domino_ops.has_kernel("sample", DEV):
            continue
        assert torch.equal(domino_ops.sample(logits, backend=backend), expected)
    monkeypatch.setenv("DOMINO_OPS_BACKEND", "triton")
    assert select_backend("sample", DEV) == "triton"
    monkeypatch.setenv("DOMINO_OPS_BACKEND", "bogus")
    with pytest.raises(ValueError, match="DOMINO_OPS_BACKEND must be one of"):
        select_backend("sample", DEV)
    with pytest.raises(ValueError, match="backend must be one of"):
        domino_ops.sample(logits, backend="cuda")


def test_auto_prefers_native_then_triton_then_reference(monkeypatch):
    monkeypatch.delenv("DOMINO_OPS_BACKEND", raising=False)
    assert select_backend("sample", "cpu") == "native"  # the C++ CPU kernel
    assert select_backend("sample", "meta") == "reference"
    with pytest.raises(RuntimeError, match="no sample kernel for meta"):
        select_backend("sample", "meta", "native")
    monkeypatch.setattr(domino_ops.ops, "has_kernel", lambda op, dev: False)
    assert select_backend("sample", DEV) == "triton"


# ---- ahead-of-time compile for the GPUs --------------------------------------------------

def test_every_kernel_compiles_for_sm80_and_sm90_without_spills():
    """Runs python -m domino_ops.triton.aot without the interpreter (an interpreted kernel
    cannot be compiled): a kernel that would not compile for the GPU fails here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "domino_ops.triton.aot", "--capability", "80", "90"],
                         capture_output=True, text=True, env=env, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = re.findall(r"^(sm_\d+)\s+(\S+)\s+regs\s+(\d+)\s+spill bytes\s+(\d+)", out.stdout, re.M)
    print(out.stdout)
    from domino_ops.triton import aot
    assert len(rows) == 2 * len(aot._specs()), out.stdout  # every variant for both architectures
    spilled = [(arch, name) for arch, name, _, spills in rows if int(spills) > 0]
    assert not spilled, f"register spills: {spilled}"
