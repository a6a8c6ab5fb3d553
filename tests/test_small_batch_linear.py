"""small_batch_linear: agreement with float64 and F.linear on awkward shapes, every written
element, bit-exact batch invariance, every instruction-set path, bad input."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from torch_threads import torch_threads

ISA_ENV = "DOMINO_SMALL_BATCH_LINEAR_ISA"
ORDER = ["generic", "avx2", "avx512", "avx512_bf16"]


def _best_isa():
    with domino_ops.cpu.kernel_switch(ISA_ENV, None):
        return domino_ops.small_batch_linear_isa()


BEST = _best_isa()
# Every path this CPU can run: the best one and every lower one (forced by ISA_ENV).
ISAS = ORDER[: ORDER.index(BEST) + 1]
DTYPES = [torch.float32, torch.bfloat16]
M_VALUES = [1, 2, 3, 4, 5, 7, 13, 16, 17, 33, 64, 65, 130]
op = torch.ops.domino_ops.small_batch_linear


def forced_isa(isa):
    """Forces the kernel's instruction-set path for the block."""
    return domino_ops.cpu.kernel_switch(ISA_ENV, isa)


def make(M, N, K, x_dtype, w_dtype, bias, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * scale).to(x_dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(w_dtype)
    b = torch.randn(N, generator=g).to(w_dtype) if bias else None
    return x, w, b


def run_op(x, w, b):
    """Calls the dispatcher op with an output poisoned with NaN, so an element the kernel
    never writes fails the comparison."""
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=x.dtype)
    op(x, w, b, out)
    return out


def assert_close_to_float64(y, x, w, b):
    exact = reference.small_batch_linear(x.double(), w.double(), None if b is None else b.double())
    # fp32 accumulation over K terms, the bias added in fp32, then one rounding to y's dtype.
    mag = F.linear(x.double().abs(), w.double().abs(), None if b is None else b.double().abs())
    bound = mag * ((x.shape[1] + 2) * 2.0 ** -23) + 1e-30
    if y.dtype == torch.bfloat16:
        bound = bound + exact.abs() * 2.0 ** -8
    err = (y.double() - exact).abs()
    assert not torch.isnan(y).any(), "unwritten (NaN-poisoned) output elements"
    assert (err <= bound).all(), f"max error {err.max():.3g}, bound there {bound.flatten()[err.argmax()]:.3g}"


@given(M=st.sampled_from(M_VALUES), N=st.sampled_from([1, 2, 3, 5, 7, 13, 31, 64, 67]),
       K=st.sampled_from([1, 3, 8, 15, 16, 17, 31, 33, 64, 100, 257]), x_dtype=st.sampled_from(DTYPES),
       w_dtype=st.sampled_from(DTYPES), bias=st.booleans(), isa=st.sampled_from(ISAS),
       seed=st.integers(0, 2**31 - 1))
def test_matches_float64_on_awkward_shapes(M, N, K, x_dtype, w_dtype, bias, isa, seed):
    x, w, b = make(M, N, K, x_dtype, w_dtype, bias, seed)
    with forced_isa(isa):
        y = run_op(x, w, b)
    assert_close_to_float64(y, x, w, b)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,K", [(576, 576), (192, 576), (576, 1536), (4099, 64)])
def test_matches_f_linear_on_model_shapes(isa, dtype, N, K):
    x, w, b = make(17, N, K, dtype, dtype, True, N + K)
    with forced_isa(isa):
        y = domino_ops.small_batch_linear(x, w, b)
    ref = F.linear(x, w, b)
    assert y.dtype == ref.dtype and y.shape == ref.shape
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y, ref, **tol)
    assert_close_to_float64(y, x, w, b)


@given(M=st.integers(1, 70), N=st.sampled_from([1, 5, 33, 100]), K=st.sampled_from([7, 16, 40, 129]),
       x_dtype=st.sampled_from(DTYPES), w_dtype=st.sampled_from(DTYPES), bias=st.booleans(),
       isa=st.sampled_from(ISAS), seed=st.integers(0, 2**31 - 1))
def test_batch_invariant_bit_for_bit(M, N, K, x_dtype, w_dtype, bias, isa, seed):
    with forced_isa(isa):
        check_batch_invariance(M, N, K, x_dtype, w_dtype, bias, seed)


def check_batch_invariance(M, N, K, x_dtype, w_dtype, bias, seed):
    """Row i is the same bits alone (M = 1), among M - 1 others, at any position, in any
    order, whatever the other rows hold."""
    x, w, b = make(M, N, K, x_dtype, w_dtype, bias, seed, scale=3.0)
    full = run_op(x, w, b)
    alone = torch.cat([run_op(x[i:i + 1], w, b) for i in range(M)])
    assert torch.equal(full, alone)
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(run_op(x[perm].contiguous(), w, b), full[perm])
    # the same row among 63 others of a different magnitude, at every tile position
    others, _, _ = make(63, N, K, x_dtype, w_dtype, False, seed + 1, scale=1e3)
    for pos in range(0, 64, 5):
        mixed = torch.cat([others[:pos], x[:1], others[pos:]])
        assert torch.equal(run_op(mixed, w, b)[pos], full[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_invariant_across_thread_counts_and_passes(dtype):
    x, w, b = make(150, 301, 96, dtype, dtype, True, 0)  # 3 passes of <= 64 rows
    with torch_threads(1):
        one = run_op(x, w, b)
    with torch_threads(max(2, torch.get_num_threads())):
        assert torch.equal(run_op(x, w, b), one)
    assert torch.equal(run_op(x[:1], w, b)[0], one[0])
    assert torch.equal(run_op(x[100:101], w, b)[0], one[100])


def test_nan_and_inf_stay_in_their_row():
    x, w, b = make(9, 40, 50, torch.float32, torch.float32, True, 3)
    x[4, 7] = float("nan")
    x[6, 0] = float("inf")
    y = run_op(x, w, b)
    assert torch.isnan(y[4]).all()
    assert not torch.isfinite(y[6]).any()
    keep = [0, 1, 2, 3, 5, 7, 8]
    assert torch.isfinite(y[keep]).all()
    assert torch.equal(y[keep], run_op(x[keep], w, b))


def test_wrapper_flattens_leading_dims_and_handles_empty():
    x, w, b = make(6, 10, 12, torch.bfloat16, torch.bfloat16, True, 1)
    y = domino_ops.small_batch_linear(x.view(2, 3, 12), w, b)
    assert y.shape == (2, 3, 10) and y.dtype == torch.bfloat16
    assert torch.equal(y.view(6, 10), run_op(x, w, b))
    # a non-contiguous x is copied, not refused
    xt = torch.randn(12, 4).T
    assert torch.equal(domino_ops.small_batch_linear(xt, w.float()), run_op(xt.contiguous(), w.float(), None))
    assert domino_ops.small_batch_linear(torch.randn(0, 12), w.float()).shape == (0, 10)
    assert domino_ops.small_batch_linear(torch.randn(12), w.float()).shape == (10,)


def test_reference_backend_and_mixed_dtypes():
    x, w, b = make(5, 9, 20, torch.float32, torch.bfloat16, True, 2)
    y = domino_ops.small_batch_linear(x, w, b)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, domino_ops.small_batch_linear(x, w, b, backend="reference"))
    assert_close_to_float64(y, x, w, b)


@pytest.mark.skipif("avx512_bf16" not in ISAS, reason="needs a CPU with AVX512-BF16")
@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.float32)])
def test_bf16_pairs_only_for_bf16_x_and_weights(x_dtype, w_dtype):
    """The avx512_bf16 path rounds nothing: with an fp32 x or fp32 weights it runs the avx512
    path, bit for bit (multiplying bf16 pairs would round the fp32 operand to bf16)."""
    x, w, b = make(13, 70, 100, x_dtype, w_dtype, True, 5)
    with forced_isa("avx512_bf16"):
        pairs = run_op(x, w, b)
    with forced_isa("avx512"):
        assert torch.equal(pairs, run_op(x, w, b))


@pytest.mark.skipif("avx512_bf16" not in ISAS, reason="needs a CPU with AVX512-BF16")
def test_bf16_x_and_weights_take_the_bf16_pairs_path():
    """VDPBF16PS treats denormal inputs as zero, the FMA paths do not: a bf16 denormal x
    (1e-39) times 1e30 gives ~1e-9 through avx512 and exactly 0 through avx512_bf16, so
    the bf16 x and weight call really takes the pairs path."""
    x = torch.full((1, 32), 1e-39).bfloat16()
    w = torch.full((3, 32), 1e30).bfloat16()
    with forced_isa("avx512"):
        assert (run_op(x, w, None) > 0).all()
    with forced_isa("avx512_bf16"):
        assert (run_op(x, w, None) == 0).all()


def test_isa_switch():
    assert domino_ops.small_batch_linear_isa() in ORDER
    env = dict(os.environ, **{ISA_ENV: "generic"})
    code = "import domino_ops; print(domino_ops.small_batch_linear_isa())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "generic"


def test_isa_switch_refuses_unknown():
    x, w, _ = make(2, 3, 4, torch.float32, torch.float32, False, 0)
    with forced_isa("sse9"), pytest.raises(ValueError, match="must be avx512_bf16, avx512, avx2 or generic"):
        run_op(x, w, None)


@pytest.mark.skipif(len(ISAS) == len(ORDER), reason="this CPU runs every path: none to refuse")
def test_isa_switch_refuses_paths_this_cpu_cannot_run():
    x, w, _ = make(2, 3, 4, torch.float32, torch.float32, False, 0)
    for isa in ORDER[len(ISAS):]:  # the paths this CPU cannot run
        with forced_isa(isa), pytest.raises(ValueError, match="supports at most"):
            run_op(x, w, None)


def test_opcheck():
    x, w, b = make(3, 5, 20, torch.float32, torch.bfloat16, True, 0)
    torch.library.opcheck(op.default, (x, w, b, torch.empty(3, 5)),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    assert domino_ops.has_kernel("small_batch_linear", "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_falls_back_to_f_linear():
    x, w, b = (t.cuda() for t in make(3, 5, 20, torch.float32, torch.float32, True, 0))
    torch.testing.assert_close(domino_ops.small_batch_linear(x, w, b), F.linear(x, w, b))
    with pytest.raises(RuntimeError, match="CPU kernel only"):
        domino_ops.small_batch_linear(x, w, b, backend="native")


W = torch.randn(6, 8)
WRAPPER_CASES = [
    (dict(x="x"), TypeError, "x must be a torch.Tensor"),
    (dict(weight=[[1.0]]), TypeError, "weight must be a torch.Tensor"),
    (dict(x=torch.randn(3, 8, dtype=torch.float64)), TypeError, "x must be float32 or bfloat16"),
    (dict(x=torch.ones(3, 8, dtype=torch.int64)), TypeError, "x must be float32 or bfloat16"),
    (dict(x=torch.tensor(1.0)), ValueError, "x must have at least 1 dimension"),
    (dict(x=torch.randn(3, 7)), ValueError, r"x must have shape \[\.\.\., 8\]"),
    (dict(weight=torch.randn(6, 8, dtype=torch.float64)), TypeError, "weight must be float32 or bfloat16"),
    (dict(weight=torch.randn(48)), ValueError, "weight must have 2 dimensions"),
    (dict(weight=torch.randn(8, 6).T), ValueError, "weight must be contiguous"),
    (dict(weight=torch.randn(0, 8), x=torch.randn(3, 8)), ValueError, "weight must not be empty"),
    (dict(bias=torch.randn(5)), ValueError, r"bias must have shape \[6\]"),
    (dict(bias=torch.randn(6, 1)), ValueError, "bias must have 1 dimensions"),
    (dict(bias=torch.randn(6).to(torch.bfloat16)), TypeError, "bias must be float32"),
    (dict(bias=3.0), TypeError, "bias must be a torch.Tensor"),
    (dict(x=torch.randn(3, 8, device="meta")), ValueError, "x is on meta but weight is on cpu"),
    (dict(bias=torch.randn(6, device="meta")), ValueError, "bias is on meta"),
    (dict(backend="triton"), ValueError, "backend must be one of"),
    (dict(backend="fast"), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("over,exc,msg", WRAPPER_CASES)
def test_wrapper_bad_input(over, exc, msg):
    args = dict(x=torch.randn(3, 8), weight=W, bias=None)
    backend = over.pop("backend", None)
    args.update(over)
    with pytest.raises(exc, match=msg):
        domino_ops.small_batch_linear(args["x"], args["weight"], args["bias"], backend=backend)


def _base():
    return dict(x=torch.randn(3, 8), weight=torch.randn(6, 8), bias=torch.randn(6), out=torch.empty(3, 6))


buf = torch.empty(64)
DIRECT_CASES = [
    (dict(x=torch.randn(3, 2, 8)), "x must have 2 dimensions"),
    (dict(x=torch.randn(8, 3).T), "x must be contiguous"),
    (dict(x=torch.ones(3, 8, dtype=torch.int32)), "x must be float32 or bfloat16"),
    (dict(weight=torch.randn(6, 9)), r"weight must have shape \[N, 8\]"),
    (dict(weight=torch.randn(8, 6).T), "weight must be contiguous"),
    (dict(weight=torch.randn(0, 8), out=torch.empty(3, 0), bias=None), "weight must be non-empty"),
    (dict(weight=torch.randn(6, 8, dtype=torch.float64)), "weight must be float32 or bfloat16"),
    (dict(bias=torch.randn(7)), r"bias must have shape \[6\]"),
    (dict(bias=torch.randn(6).to(torch.bfloat16)), "bias must have weight's dtype"),
    (dict(out=torch.empty(3, 5)), r"out must have shape \[3, 6\]"),
    (dict(out=torch.empty(4, 6)), r"out must have shape \[3, 6\]"),
    (dict(out=torch.empty(3, 6, dtype=torch.bfloat16)), "out must have x's dtype"),
    (dict(out=torch.empty(6, 3).T), "out must be contiguous"),
    (dict(x=buf[:24].view(3, 8), out=buf[6:24].view(3, 6)), "out must not overlap x"),
    (dict(weight=buf[:48].view(6, 8), out=buf[40:58].view(3, 6)), "out must not overlap weight"),
    (dict(bias=buf[:6], out=buf[:18].view(3, 6)), "out must not overlap bias"),
]


@pytest.mark.parametrize("over,msg", DIRECT_CASES)
def test_direct_dispatcher_call_is_checked(over, msg):
    """torch.ops callers skip the wrapper; the C++ checks refuse before any access."""
    args = _base()
    args.update(over)
    with pytest.raises(RuntimeError, match=msg):
        op(args["x"], args["weight"], args["bias"], args["out"])


@pytest.mark.parametrize("isa", ISAS)
def test_an_infinity_in_one_row_stays_in_that_row(isa):
    """Row 1 holds an infinity (K = 50, not a multiple of any vector width): row 0's outputs
    stay finite and equal to row 0 computed alone, on every instruction-set path."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 50, generator=g), torch.randn(7, 50, generator=g).bfloat16()
    x[1, 0] = float("inf")
    with forced_isa(isa):
        y, alone = domino_ops.small_batch_linear(x, w), domino_ops.small_batch_linear(x[:1], w)
    assert torch.isfinite(y[0]).all() and torch.equal(y[0], alone[0])
