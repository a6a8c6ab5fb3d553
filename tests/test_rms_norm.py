"""rms_norm: agreement with HF's formula (the reference) on random shapes, every written
element, bit-exact batch invariance, every CPU build, extreme values, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import domino_ops
from domino_ops import cpu, reference

op = torch.ops.domino_ops.rms_norm
DTYPES = [torch.float32, torch.bfloat16]


def run_op(x, w, eps):
    """The dispatcher op into a NaN-poisoned output, so an unwritten element fails."""
    out = torch.full(x.shape, float("nan"), dtype=x.dtype)
    op(x, w, eps, out)
    return out


def make(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).to(dtype)
    w = torch.randn(shape[-1], generator=g).to(dtype)
    return x, w


@settings(max_examples=80, deadline=None)
@given(lead=st.lists(st.integers(1, 5), min_size=0, max_size=2), n=st.sampled_from([1, 3, 8, 16, 17, 64, 100, 576, 1000]),
       dtype=st.sampled_from(DTYPES), scale=st.sampled_from([1e-3, 1.0, 50.0]), eps=st.sampled_from([0.0, 1e-6, 1e-5]),
       seed=st.integers(0, 2 ** 16), isa=st.sampled_from(cpu.supported_isas()))
def test_matches_reference(lead, n, dtype, scale, eps, seed, isa):
    """Within rounding of HF's formula in float64 (the normalized value rounded to the
    dtype, then the weight product), on every CPU build."""
    x, w = make((*lead, n), dtype, seed, scale)
    with domino_ops.cpu.forced_isa(isa):
        y = run_op(x, w, eps)
    assert not torch.isnan(y).any(), "unwritten (NaN-poisoned) output elements"
    exact = reference.rms_norm(x.double(), w.double(), eps)
    # fp32: the sum of squares and rsqrt (~n terms at 2^-24) then two roundings; bf16: the
    # normalized value may round one ulp the other way, then the product rounds.
    rel = 1e-5 if dtype == torch.float32 else 2.0 ** -7
    assert ((y.double() - exact).abs() <= rel * exact.abs() + 1e-30).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_alone_equals_the_row_among_others(dtype):
    x, w = make((2, 9, 576), dtype, 1, 3.0)
    for isa in cpu.supported_isas():
        with domino_ops.cpu.forced_isa(isa):
            big = run_op(x, w, 1e-5)
            for b in range(2):
                for m in range(9):
                    assert torch.equal(run_op(x[b, m:m + 1].contiguous(), w, 1e-5), big[b, m:m + 1]), (isa, b, m)


def test_bf16_equals_hf_llama_rmsnorm_on_nearly_every_element():
    """HF's module, bit for bit, except where the kernel's sum of squares lands the
    normalized value on the other side of a bf16 rounding boundary (rare)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(576, eps=1e-5).to(torch.bfloat16)
    x, w = make((64, 576), torch.bfloat16, 2, 2.0)
    with torch.no_grad():
        norm.weight.copy_(w)
        hf = norm(x)
    ours = domino_ops.rms_norm(x, w, 1e-5)
    assert (ours != hf).float().mean() < 1e-3
    assert ((ours.float() - hf.float()).abs() <= 2.0 ** -7 * hf.float().abs()).all()


def test_in_place_and_wrapper_agree():
    x, w = make((4, 100), torch.bfloat16, 3)
    expected = domino_ops.rms_norm(x, w, 1e-6)
    y = x.clone()
    op(y, w, 1e-6, y)
    assert torch.equal(y, expected)
    assert torch.equal(domino_ops.rms_norm(x.t().contiguous().t(), w, 1e-6), expected)  # strided input
    ref = domino_ops.rms_norm(x, w, 1e-6, backend="reference")
    assert ((ref.float() - expected.float()).abs() <= 2.0 ** -7 * ref.float().abs()).all()


def test_extreme_values_stay_in_their_row():
    x, w = make((4, 32), torch.float32, 4)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3] = 0.0
    y = run_op(x, w, 1e-6)
    assert torch.isnan(y[1]).all() and torch.isnan(y[2]).any()  # inf / inf
    assert torch.equal(y[3], torch.zeros(32))  # 0 * rsqrt(eps)
    assert torch.equal(y[0], run_op(x[:1].contiguous(), w, 1e-6)[0]) and torch.isfinite(y[0]).all()


@pytest.mark.parametrize("args,err,msg", [
    (lambda: ("x", torch.ones(4)), TypeError, "input must be a torch.Tensor"),
    (lambda: (torch.ones(2, 4, dtype=torch.int64), torch.ones(4)), TypeError, "input must be float32 or bfloat16"),
    (lambda: (torch.ones(2, 4), torch.ones(5)), ValueError, "weight must have shape"),
    (lambda: (torch.ones(2, 4), torch.ones(4, dtype=torch.bfloat16)), TypeError, "weight must be float32"),
    (lambda: (torch.ones(2, 4), torch.ones(4), -1.0), ValueError, "eps must be a finite number"),
    (lambda: (torch.ones(2, 4), torch.ones(4), float("nan")), ValueError, "eps must be a finite number"),
    (lambda: (torch.ones(2, 4), torch.ones(4), 10 ** 400), ValueError, "eps must be a finite number"),
    (lambda: (torch.ones(2, 4), torch.ones(4), None), TypeError, "eps must be a number"),
    (lambda: (torch.ones(2, 0), torch.ones(0)), ValueError, "input must not be empty"),
])
def test_bad_input_names_the_argument(args, err, msg):
    with pytest.raises(err, match=msg):
        domino_ops.rms_norm(*args())


def test_op_checks_what_the_wrapper_skips():
    x, w = make((2, 8), torch.float32, 0)
    with pytest.raises(RuntimeError, match="weight must have shape"):
        op(x, torch.ones(7), 1e-6, torch.empty_like(x))
    with pytest.raises(RuntimeError, match="out must have input's shape"):
        op(x, w, 1e-6, torch.empty(3, 8))
    with pytest.raises(RuntimeError, match="must be contiguous"):
        op(x.t(), torch.ones(2), 1e-6, torch.empty(8, 2))
    with pytest.raises(RuntimeError, match="eps must be finite"):
        op(x, w, float("inf"), torch.empty_like(x))
    with pytest.raises(RuntimeError, match=r"eps must be finite and >= 0 \(finite in float32\)"):
        op(x, w, 1e39, torch.empty_like(x))  # inf in float32: every row had come out 0
    with pytest.raises(RuntimeError, match="share a dtype"):
        op(x, w.bfloat16(), 1e-6, torch.empty_like(x))
    with pytest.raises(RuntimeError, match=r"out must not share memory with input \(unless it is that very"):
        big = torch.zeros(3, 8)
        op(big[:2], w, 1e-6, big[1:])
    with pytest.raises(RuntimeError, match="out must not share memory with weight"):
        buf = torch.ones(16)
        op(x, buf[:8], 1e-6, buf.view(2, 8))  # the weight is out's first row
    y = x.clone()
    op(y, w, 1e-6, y)  # in place: out is input itself
    assert torch.equal(y, run_op(x, w, 1e-6))
