"""silu_mul: agreement with HF's ``silu(gate) * up`` (the reference) on random shapes,
every written element, elementwise (batch) invariance, every CPU build, extreme values,
bad input."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import domino_ops
from domino_ops import cpu, reference

op = torch.ops.domino_ops.silu_mul
DTYPES = [torch.float32, torch.bfloat16]


def run_op(gate, up):
    """The dispatcher op into a NaN-poisoned output, so an unwritten element fails."""
    out = torch.full(gate.shape, float("nan"), dtype=gate.dtype)
    op(gate, up, out)
    return out


def make(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype), torch.randn(shape, generator=g).to(dtype)


@settings(max_examples=80, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), dtype=st.sampled_from(DTYPES),
       scale=st.sampled_from([1e-3, 1.0, 8.0, 60.0]), seed=st.integers(0, 2 ** 16),
       isa=st.sampled_from(cpu.supported_isas()))
def test_matches_reference(shape, dtype, scale, seed, isa):
    gate, up = make(shape, dtype, seed, scale)
    with domino_ops.cpu.forced_isa(isa):
        y = run_op(gate, up)
    assert not torch.isnan(y).any(), "unwritten (NaN-poisoned) output elements"
    g = gate.double()
    act = (g * torch.sigmoid(g)).to(dtype).double()  # HF rounds the activation to the dtype
    exact = act * up.double()
    # fp32: the kernel's exp and division (a few ulp); bf16: the activation may round one
    # ulp the other way, then the product rounds.
    rel = 1e-6 if dtype == torch.float32 else 2.0 ** -7
    assert ((y.double() - exact).abs() <= rel * exact.abs() + 1e-36).all()  # silu below ~-88: ~0


@pytest.mark.parametrize("isa", cpu.supported_isas())
def test_float32_tail_below_minus_88_is_exact(isa):
    """Where exp(-g) leaves the kernel's exp range (g < -88) silu(g) is still a float
    (normal down to ~-91.8, subnormal to ~-107): the kernel keeps it to float's precision
    (relative 1e-6 in the normal range, a few subnormal ulps below), not 0."""
    gate = torch.linspace(-110.0, -80.0, 3001)
    up = torch.full_like(gate, 3.0)
    with domino_ops.cpu.forced_isa(isa):
        y = run_op(gate, up).double()
    g = gate.double()
    exact = g * torch.sigmoid(g) * 3.0
    normal = exact.abs() >= 3 * torch.finfo(torch.float32).tiny
    assert ((y - exact).abs() <= 1e-6 * exact.abs())[normal].all()
    assert ((y - exact).abs() <= 8 * 2.0 ** -149 * 3.0)[~normal].all()
    assert (y[g < -107] == 0).all() and torch.signbit(y[g < -107]).all()  # -0, as g * 0


def test_bf16_equals_hf_on_nearly_every_element_and_elements_are_independent():
    gate, up = make((16, 1536), torch.bfloat16, 1, 4.0)
    ours = run_op(gate, up)
    hf = F.silu(gate) * up
    assert (ours != hf).float().mean() < 1e-3
    for isa in cpu.supported_isas():
        with domino_ops.cpu.forced_isa(isa):
            big = run_op(gate, up)
            for m in (0, 7, 15):  # a row alone (a decode step) equals the row among others
                assert torch.equal(run_op(gate[m:m + 1].contiguous(), up[m:m + 1].contiguous()), big[m:m + 1]), isa
            assert torch.equal(run_op(gate[:, 5:].contiguous(), up[:, 5:].contiguous()), big[:, 5:]), isa  # lanes shift


def test_extreme_values():
    gate = torch.tensor([float("nan"), float("inf"), -float("inf"), -200.0, 0.0, 1.0])
    up = torch.tensor([1.0, 2.0, 3.0, 4.0, float("nan"), 5.0])
    y = run_op(gate, up)
    assert torch.isnan(y[0]) and y[1] == float("inf") and torch.isnan(y[4])
    assert y[2] == 0.0 or torch.isnan(y[2])  # -inf * 0: PyTorch gives nan, a limit gives 0
    assert abs(y[3]) < 1e-30 and torch.allclose(y[5], F.silu(gate[5]) * 5.0)


def test_in_place_wrapper_and_reference_agree():
    gate, up = make((3, 50), torch.float32, 2)
    expected = domino_ops.silu_mul(gate, up)
    g = gate.clone()
    op(g, up, g)
    assert torch.equal(g, expected)
    assert torch.allclose(domino_ops.silu_mul(gate, up, backend="reference"), reference.silu_mul(gate, up))
    assert torch.equal(domino_ops.silu_mul(gate.t().contiguous().t(), up), expected)


@pytest.mark.parametrize("args,err,msg", [
    (lambda: (1.0, torch.ones(4)), TypeError, "gate must be a torch.Tensor"),
    (lambda: (torch.ones(4, dtype=torch.float16), torch.ones(4, dtype=torch.float16)), TypeError, "gate must be float32"),
    (lambda: (torch.ones(4), torch.ones(4, dtype=torch.bfloat16)), TypeError, "up must be float32"),
    (lambda: (torch.ones(2, 4), torch.ones(2, 5)), ValueError, "up must have shape"),
    (lambda: (torch.ones(2, 4), torch.ones(4)), ValueError, "up must have 2 dimensions"),
    (lambda: (torch.ones(0, 4), torch.ones(0, 4)), ValueError, "gate must not be empty"),
])
def test_bad_input_names_the_argument(args, err, msg):
    with pytest.raises(err, match=msg):
        domino_ops.silu_mul(*args())


def test_op_checks_what_the_wrapper_skips():
    gate, up = make((2, 8), torch.float32, 0)
    with pytest.raises(RuntimeError, match="up must have gate's shape"):
        op(gate, torch.ones(2, 7), torch.empty_like(gate))
    with pytest.raises(RuntimeError, match="share a dtype"):
        op(gate, up, torch.empty(2, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="must be contiguous"):
        op(gate.t(), up.t(), torch.empty(8, 2))
    with pytest.raises(RuntimeError, match=r"out must not share memory with gate \(unless it is that very"):
        buf = torch.zeros(3, 8)
        op(buf[:2], up, buf[1:])
    with pytest.raises(RuntimeError, match=r"out must not share memory with up \(unless it is that very"):
        buf = torch.zeros(3, 8)
        op(gate, buf[1:], buf[:2])
