"""small_batch_linear_packed: the packing round trip, agreement with float64 on awkward
shapes with every output element written, the exact summation order of each product (which
is what makes it batch-invariant: VDPBF16PS pairs on the avx512_bf16 path, one FMA per
column on the avx2 path), bit-exact batch invariance, the switch in domino.fast_linear, bad
input. The kernel tests run once per product this CPU has (AVX2 FMA tiles; AVX512-BF16
vectors; AMX tiles where the CPU has AMX: tests/packed_paths.py). The float32 panels get
the same tests, their order oracle being one FMA per column."""
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from packed_paths import ENV, PACKED_PATHS, packed_path
from torch_threads import torch_threads

SUPPORTED = domino_ops.small_batch_linear_packed_supported()
needs_cpu = pytest.mark.skipif(not SUPPORTED, reason="this CPU has neither AVX2 + FMA nor AVX512-BF16")
needs_vdpbf16ps = pytest.mark.skipif("avx512_bf16" not in PACKED_PATHS, reason="this CPU has no AVX512-BF16")
needs_f32 = pytest.mark.skipif(not domino_ops.small_batch_linear_packed_supported(torch.float32),
                               reason="this CPU has neither AVX2 + FMA nor AVX-512F (with BW, VL)")
needs_avx512f = pytest.mark.skipif(domino_ops.small_batch_linear_isa() not in ("avx512", "avx512_bf16"),
                                   reason="this CPU has no AVX-512F")
op = torch.ops.domino_ops.small_batch_linear_packed
OUT_DTYPES = [torch.bfloat16, torch.float32]
each_path = pytest.mark.parametrize("path", PACKED_PATHS)


def make(M, N, K, bias, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * scale).bfloat16()
    w = (torch.randn(N, K, generator=g) / K ** 0.5).bfloat16()
    b = torch.randn(N, generator=g) if bias else None
    return x, w, b


def run_op(x, packed, b, out_dtype):
    """The dispatcher op with an output poisoned with NaN: an unwritten element fails."""
    out = torch.full((x.shape[0], packed.out_features), float("nan"), dtype=out_dtype)
    op(x, packed.data, packed.out_features, b, out)
    return out


def vdpbf16ps_order(x, w, b):
    """The kernel's arithmetic, step by step in fp32: each output starts at +0 and takes one
    column pair at a time, the odd column's product added first, then the even one's (both
    exact in fp32; each addition rounds), then + bias. [M, N] float32."""
    if x.shape[1] % 2:
        x, w = F.pad(x, (0, 1)), F.pad(w, (0, 1))
    xf, wf = x.float(), w.float()
    acc = torch.zeros(x.shape[0], w.shape[0])
    for k in range(0, xf.shape[1], 2):
        acc = acc + xf[:, k + 1, None] * wf[None, :, k + 1]
        acc = acc + xf[:, k, None] * wf[None, :, k]
    return acc if b is None else acc + b.float()


@given(N=st.integers(1, 150), K=st.integers(1, 140), seed=st.integers(0, 2**31 - 1))
def test_pack_round_trip_and_zero_padding(N, K, seed):
    _, w, _ = make(1, N, K, False, seed)
    p = domino_ops.pack_small_batch_linear_weight(w)
    assert p.data.shape == (-(-N // 48), -(-K // 2), 48, 2) and p.data.dtype == torch.bfloat16
    assert (p.out_features, p.in_features) == (N, K)
    assert torch.equal(reference.unpack_small_batch_linear_weight(p.data, N, K), w)
    full = p.data.permute(0, 2, 1, 3).reshape(-1, p.data.shape[1] * 2)
    assert not full[N:].any() and not full[:, K:].any()  # padding is zeros


@needs_cpu
@given(M=st.sampled_from([1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 24, 33, 70]), N=st.sampled_from([1, 5, 16, 47, 48, 49, 97, 200]),
       K=st.sampled_from([1, 2, 3, 15, 16, 33, 64, 129]), bias=st.booleans(), out_dtype=st.sampled_from(OUT_DTYPES),
       seed=st.integers(0, 2**31 - 1))
@each_path
def test_matches_float64_and_writes_every_element(path, M, N, K, bias, out_dtype, seed):
    """M past 16 and not a multiple of it, K past 32 and not a multiple of it: the AMX path's
    padded row blocks and its partial last chunk of column pairs."""
    x, w, b = make(M, N, K, bias, seed)
    with packed_path(path):
        y = run_op(x, domino_ops.pack_small_batch_linear_weight(w), b, out_dtype)
    assert_close_to_float64(y, x, w, b)


def assert_close_to_float64(y, x, w, b):
    """Every element written (the output was NaN-poisoned) and within fp32 summation
    error of the float64 product (plus one bf16 rounding for a bf16 output)."""
    assert not torch.isnan(y).any(), "unwritten (NaN-poisoned) output elements"
    exact = F.linear(x.double(), w.double(), None if b is None else b.double())
    mag = F.linear(x.double().abs(), w.double().abs(), None if b is None else b.double().abs())
    bound = mag * ((x.shape[1] + 2) * 2.0 ** -23) + 1e-30
    if y.dtype == torch.bfloat16:
        bound = bound + exact.abs() * 2.0 ** -8
    err = (y.double() - exact).abs()
    assert (err <= bound).all(), f"max error {err.max():.3g}"


@needs_vdpbf16ps
# N up to 5 panels: at one row a thread takes its panels two at a time, then any one left
@given(M=st.one_of(st.integers(1, 20), st.sampled_from([65, 70])), N=st.sampled_from([3, 48, 61, 150, 200]),
       K=st.sampled_from([1, 7, 32, 77, 300, 384]), bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_bit_exact_vdpbf16ps_order(M, N, K, bias, seed):
    """The vector path: each output is the one fixed sequence of fp32 additions over K:
    nothing about M (past 64: nine tiles), the tile (9 rows: tiles of 4 and 5), the K blocks
    its tiles take turns by (K = 300: blocks of 96 and 54 column pairs, the accumulators kept
    in memory between them; K = 384: two whole blocks) or the thread enters it,
    which is the batch invariance. (The
    AMX path sums inside a chunk of 16 column pairs in the hardware's own order, which no
    simple sequence of fp32 additions reproduces; it is checked against float64 and for
    batch invariance directly.)"""
    x, w, b = make(M, N, K, bias, seed, scale=3.0)
    p = domino_ops.pack_small_batch_linear_weight(w)
    expect = vdpbf16ps_order(x, w, b)
    with packed_path("avx512_bf16"):
        assert torch.equal(run_op(x, p, b, torch.float32), expect)
        assert torch.equal(run_op(x, p, b, torch.bfloat16), expect.bfloat16())  # one rounding, to nearest even


@needs_cpu
@given(M=st.integers(1, 20), N=st.sampled_from([3, 48, 61, 100]), K=st.sampled_from([1, 7, 32, 77]),
       bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_avx2_bit_exact_fma_order(M, N, K, bias, seed):
    """The avx2 path: each output is one FMA chain over the columns in order (each pair's
    even column, then its odd one) on the weights and x widened to float32: the float32
    panels' chain, whatever M, the tile (1-2-row passes over the whole panel, 3-5-row
    passes over a third of it) or the thread."""
    x, w, b = make(M, N, K, bias, seed, scale=3.0)
    p = domino_ops.pack_small_batch_linear_weight(w)
    expect, unsure = fma_order(x.float(), w.float(), b)
    assert unsure.float().mean() < 0.05
    with packed_path("avx2"):
        assert torch.equal(run_op(x, p, b, torch.float32)[~unsure], expect[~unsure])
        assert torch.equal(run_op(x, p, b, torch.bfloat16)[~unsure], expect.bfloat16()[~unsure])


@needs_cpu
def test_avx2_order_oracle_has_teeth():
    """The FMA oracle tells the avx2 path's order apart from VDPBF16PS's (the odd column of a
    pair first) and from the columns in reverse. (A multiply and an add rounded apart would
    not differ: the product of two bf16 is exact in float32.)"""
    x, w, _ = make(8, 48, 64, False, 1, scale=3.0)
    with packed_path("avx2"):
        y = run_op(x, domino_ops.pack_small_batch_linear_weight(w), None, torch.float32)
    expect, unsure = fma_order(x.float(), w.float(), None)
    assert torch.equal(y[~unsure], expect[~unsure])
    assert not torch.equal(y, vdpbf16ps_order(x, w, None))
    assert not torch.equal(y, fma_order(x.flip(1).float(), w.flip(1).float(), None)[0])


@needs_vdpbf16ps
def test_order_oracle_has_teeth():
    """The order oracle tells the kernel's order apart: the even-first order, or one rounding
    per pair, differ from it somewhere on random data."""
    x, w, _ = make(8, 48, 64, False, 1, scale=3.0)
    with packed_path("avx512_bf16"):
        y = run_op(x, domino_ops.pack_small_batch_linear_weight(w), None, torch.float32)
    xf, wf = x.float(), w.float()
    even_first = torch.zeros(8, 48)
    for k in range(0, 64, 2):
        even_first = even_first + xf[:, k, None] * wf[None, :, k]
        even_first = even_first + xf[:, k + 1, None] * wf[None, :, k + 1]
    assert not torch.equal(y, even_first)


@needs_cpu
# K = 64 and 96: whole chunks of 16 column pairs, where AMX takes one row two panels at a time
# K = 250: two K blocks where the tiles take turns (more than 8 rows)
@given(M=st.integers(1, 40), N=st.sampled_from([1, 50, 100, 150]), K=st.sampled_from([7, 40, 64, 96, 129, 250]),
       bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
@each_path
def test_batch_invariant_bit_for_bit(path, M, N, K, bias, seed):
    """Row i is the same bits alone, among others at any position, whatever they hold
    (others up to 1e3 times larger, NaN and inf among them)."""
    x, w, b = make(M, N, K, bias, seed, scale=3.0)
    others, _, _ = make(23, N, K, False, seed + 1, scale=1e3)
    with packed_path(path):
        assert_batch_invariant(x, domino_ops.pack_small_batch_linear_weight(w), b, others, torch.bfloat16)


def assert_batch_invariant(x, p, b, others, out_dtype):
    """Each row of x gives the same bits alone as among x's rows, and x[0] the same bits at
    any position among 23 others (NaN and -inf put among them)."""
    K = x.shape[1]
    others[3, 0], others[11, K - 1] = float("nan"), float("-inf")
    full = run_op(x, p, b, out_dtype)
    assert torch.equal(torch.cat([run_op(x[i:i + 1], p, b, out_dtype) for i in range(x.shape[0])]), full)
    for pos in range(0, 24, 5):
        mixed = torch.cat([others[:pos], x[:1], others[pos:]])
        assert torch.equal(run_op(mixed, p, b, out_dtype)[pos], full[0])


@needs_cpu
@each_path
def test_a_prompt_sized_product_gives_rows_their_bits_alone(path):
    """Many rows (a prefill) run in groups of rows and of panels that stay in cache (the AMX
    path: ~0.5 MB each, so at K = 1536 groups of 160 rows and 3 panels): rows in every group
    and at group edges give the bits they give alone."""
    x, w, b = make(400, 1000, 1536, True, 3)
    p = domino_ops.pack_small_batch_linear_weight(w)
    with packed_path(path):
        full = run_op(x, p, b, torch.bfloat16)
        for i in (0, 159, 160, 161, 319, 320, 399):
            assert torch.equal(run_op(x[i:i + 1], p, b, torch.bfloat16), full[i:i + 1]), i


@needs_cpu
@each_path
def test_invariant_across_thread_counts(path):
    x, w, b = make(30, 1000, 96, True, 0)
    with packed_path(path):
        assert_same_bits_on_one_thread(x, domino_ops.pack_small_batch_linear_weight(w), b)


def assert_same_bits_on_one_thread(x, p, b):
    with torch_threads(1):
        one = run_op(x, p, b, torch.float32)
    with torch_threads(max(2, torch.get_num_threads())):
        assert torch.equal(run_op(x, p, b, torch.float32), one)


@needs_cpu
@each_path
def test_nan_and_inf_stay_in_their_row(path):
    x, w, _ = make(5, 60, 32, False, 0)
    x[2, 3] = float("nan")
    x[4, 0] = float("inf")
    with packed_path(path):
        y = run_op(x, domino_ops.pack_small_batch_linear_weight(w), None, torch.bfloat16)
    assert torch.isnan(y[2]).all() and not torch.isnan(y[[0, 1, 3]]).any()
    assert torch.isinf(y[4]).any() or torch.isnan(y[4]).any()


@pytest.mark.skipif("amx" not in PACKED_PATHS, reason="this CPU (or OS) has no AMX-BF16")
def test_amx_is_the_default_where_the_cpu_has_it_and_differs_from_the_vector_path():
    """AMX runs unless the variable says otherwise, and it is another summation than the
    vector path's (so a test passing on both paths ran two different products)."""
    assert os.environ.get(ENV) is None and domino_ops.small_batch_linear_packed_path() == "amx"
    x, w, _ = make(16, 96, 576, False, 5, scale=3.0)
    p = domino_ops.pack_small_batch_linear_weight(w)
    with packed_path("avx512_bf16"):
        vec = run_op(x, p, None, torch.float32)
    assert not torch.equal(run_op(x, p, None, torch.float32), vec)


@needs_cpu
@pytest.mark.parametrize("value,msg", [
    ("avx3", "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH must be auto, amx, avx512_bf16 or avx2, got 'avx3'"),
    ("amx", "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH=amx but this CPU"),
    ("avx512_bf16", "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH=avx512_bf16 but this CPU has no AVX512-BF16"),
])
def test_a_bad_path_is_refused_by_name(value, msg):
    if value in PACKED_PATHS:
        pytest.skip(f"this CPU has {value}: asking for it is valid")
    with domino_ops.cpu.kernel_switch(ENV, value):
        with pytest.raises(ValueError, match=msg):
            domino_ops.small_batch_linear_packed_path()
        x, w, _ = make(2, 5, 8, False, 0)
        with pytest.raises(ValueError, match=msg):
            run_op(x, domino_ops.pack_small_batch_linear_weight(w), None, torch.float32)


@pytest.mark.parametrize("make_args,exc,msg", [
    (lambda p: (p.data, 97, 9), ValueError, r"data must have shape \[3, 5, 48, 2\] to hold a packed \[97, 9\]"),
    (lambda p: (p.data, 50, 8), ValueError, r"data must have shape \[2, 4, 48, 2\]"),
    (lambda p: (p.data.float(), 50, 9), ValueError, r"data must have shape \[2, 9, 48, 1\]"),
    (lambda p: (p.data, 50.0, 9), TypeError, "out_features must be an int"),
    (lambda p: (p.data, 50, 0), ValueError, "in_features must be >= 1"),
    (lambda p: (None, 50, 9), TypeError, "data must be a torch.Tensor"),
    (lambda p: (p.data[0], 50, 9), ValueError, "data must have 4 dimensions"),
    (lambda p: (p.data.transpose(0, 1).contiguous().transpose(0, 1), 50, 9), ValueError, "data must be contiguous"),
])
def test_a_hand_made_packed_weight_is_checked(make_args, exc, msg):
    """A PackedLinearWeight built by hand whose data does not match its sizes is refused
    at construction (the reference used to read the panels by the sizes given: a wrong
    shape, a truncated weight)."""
    packed = domino_ops.pack_small_batch_linear_weight(torch.randn(50, 9))
    with pytest.raises(exc, match=msg):
        domino_ops.PackedLinearWeight(*make_args(packed))


def test_reference_is_not_differentiable():
    """Both backends of both linears are inference kernels ("Not differentiable", as
    documented): a weight that requires grad is refused in grad mode (the result would
    not track it) and taken under no_grad, where the result tracks nothing."""
    x, w = torch.randn(3, 9), torch.randn(5, 9, requires_grad=True)
    with pytest.raises(RuntimeError, match="small_batch_linear: weight requires grad and grad mode is on"):
        domino_ops.small_batch_linear(x, w, backend="reference")
    with torch.no_grad():
        assert not domino_ops.small_batch_linear(x, w, backend="reference").requires_grad
        packed = domino_ops.pack_small_batch_linear_weight(w)
    xb = x.bfloat16().requires_grad_()
    with pytest.raises(RuntimeError, match="small_batch_linear_packed: x requires grad"):
        domino_ops.small_batch_linear_packed(xb, packed, backend="reference")
    with torch.no_grad():
        assert not domino_ops.small_batch_linear_packed(xb, packed, backend="reference").requires_grad
    # panels made by hand from a tensor that requires grad (pack_ makes them without)
    tracked = domino_ops.PackedLinearWeight(packed.data.detach().clone().requires_grad_(), 5, 9)
    for backend in ("reference", "native"):
        with pytest.raises(RuntimeError, match="small_batch_linear_packed: weight's data requires grad"):
            domino_ops.small_batch_linear_packed(x.bfloat16(), tracked, backend=backend)


@needs_cpu
def test_wrapper_matches_reference_backend_and_flattens():
    x, w, b = make(6, 70, 40, True, 3)
    p = domino_ops.pack_small_batch_linear_weight(w)
    y = domino_ops.small_batch_linear_packed(x.view(2, 3, 40), p, b, out_dtype=torch.float32)
    ref = domino_ops.small_batch_linear_packed(x.view(2, 3, 40), p, b, out_dtype=torch.float32, backend="reference")
    assert y.shape == (2, 3, 70)
    torch.testing.assert_close(y, ref, atol=1e-4, rtol=1e-4)
    assert domino_ops.small_batch_linear_packed(x[:0], p).shape == (0, 70)
    # 1-D x, and a non-contiguous 2-D x (copied, not refused): the rows a contiguous x gives
    flat = domino_ops.small_batch_linear_packed(x, p, b)
    assert torch.equal(domino_ops.small_batch_linear_packed(x[4], p, b), flat[4])
    xt = x.T.contiguous().T
    assert not xt.is_contiguous()
    assert torch.equal(domino_ops.small_batch_linear_packed(xt, p, b), flat)


@needs_cpu
def test_opcheck():
    x, w, b = make(3, 5, 20, True, 0)
    p = domino_ops.pack_small_batch_linear_weight(w)
    torch.library.opcheck(op.default, (x, p.data, 5, b, torch.empty(3, 5)),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


P = domino_ops.pack_small_batch_linear_weight(torch.randn(6, 8))
WRAPPER_CASES = [
    (dict(x="x"), TypeError, "x must be a torch.Tensor"),
    (dict(weight=torch.randn(6, 8)), TypeError, "weight must be a PackedLinearWeight"),
    (dict(x=torch.randn(3, 8)), TypeError, "x must be bfloat16"),
    (dict(x=torch.tensor(1.0).bfloat16()), ValueError, "x must have at least 1 dimension"),
    (dict(x=torch.randn(3, 7).bfloat16()), ValueError, r"x must have shape \[\.\.\., 8\]"),
    (dict(x=torch.randn(3, 8, device="meta").bfloat16()), ValueError, "x must be on the CPU"),
    (dict(bias=torch.randn(5)), ValueError, r"bias must have shape \[6\]"),
    (dict(bias=torch.randn(6).double()), TypeError, "bias must be float32 or bfloat16"),
    (dict(out_dtype=torch.float16), TypeError, "out_dtype must be bfloat16 or float32"),
    (dict(backend="triton"), ValueError, "backend must be one of"),
]


@pytest.mark.parametrize("over,exc,msg", WRAPPER_CASES)
def test_wrapper_bad_input(over, exc, msg):
    args = dict(x=torch.randn(3, 8).bfloat16(), weight=P, bias=None, out_dtype=None, backend=None)
    args.update(over)
    with pytest.raises(exc, match=msg):
        domino_ops.small_batch_linear_packed(args["x"], args["weight"], args["bias"], out_dtype=args["out_dtype"],
                                             backend=args["backend"])


def test_pack_bad_input():
    with pytest.raises(TypeError, match="weight must be float32 or bfloat16"):
        domino_ops.pack_small_batch_linear_weight(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="weight must have 2 dimensions"):
        domino_ops.pack_small_batch_linear_weight(torch.randn(4))
    with pytest.raises(ValueError, match="weight must be on the CPU"):
        domino_ops.pack_small_batch_linear_weight(torch.randn(3, 4, device="meta"))


P32 = domino_ops.pack_small_batch_linear_weight(torch.randn(6, 8), dtype=torch.float32)
buf = torch.empty(64, dtype=torch.bfloat16)
DIRECT_CASES = [
    (dict(x=torch.randn(3, 2, 8).bfloat16()), "x must have 2 dimensions"),
    (dict(x=torch.randn(8, 3).bfloat16().T), "x must be contiguous"),
    (dict(x=torch.randn(3, 8)), r"x must be bfloat16 \(packed_weight is bfloat16\)"),
    (dict(packed=P.data.half()), "packed_weight must be bfloat16 or float32"),
    (dict(packed=P.data.float()), r"x must be float32 \(packed_weight is float32\)"),
    (dict(x=torch.randn(3, 8), packed=P32.data.view(1, 8, 48)), "packed_weight must have 4 dimensions"),
    (dict(x=torch.randn(3, 8), packed=torch.zeros(1, 4, 48, 2)), r"packed_weight must have shape \[1, 8, 48, 1\]"),
    (dict(x=torch.randn(3, 8), packed=P32.data, N=49), r"packed_weight must have shape \[2, 8, 48, 1\]"),
    (dict(packed=P.data[..., :1]), "packed_weight must be contiguous|packed_weight must have shape"),
    (dict(packed=torch.zeros(1, 5, 48, 2, dtype=torch.bfloat16)), r"packed_weight must have shape \[1, 4, 48, 2\]"),
    (dict(N=49), r"packed_weight must have shape \[2, 4, 48, 2\]"),
    (dict(N=0), "out_features must be positive"),
    (dict(bias=torch.randn(7)), r"bias must have shape \[6\]"),
    (dict(bias=torch.randn(6).double()), "bias must be bfloat16 or float32"),
    (dict(out=torch.empty(3, 5)), r"out must have shape \[3, 6\]"),
    (dict(out=torch.empty(3, 6, dtype=torch.float16)), "out must be bfloat16 or float32"),
    (dict(x=buf[:24].view(3, 8), out=buf[6:24].view(3, 6)), "out must not overlap x"),
]


@pytest.mark.parametrize("over,msg", DIRECT_CASES)
def test_direct_dispatcher_call_is_checked(over, msg):
    """torch.ops callers skip the wrapper; the C++ checks refuse before any access."""
    args = dict(x=torch.randn(3, 8).bfloat16(), packed=P.data, N=6, bias=torch.randn(6), out=torch.empty(3, 6))
    args.update(over)
    with pytest.raises(RuntimeError, match=msg):
        op(args["x"], args["packed"], args["N"], args["bias"], args["out"])


@needs_cpu
def test_fast_linear_runs_packed_and_repacks_a_changed_weight():
    from domino.fast_linear import packed_weight, runs_packed, undo_small_batch_linear, use_small_batch_linear

    lin = torch.nn.Linear(40, 100).bfloat16()
    use_small_batch_linear(lin)
    assert runs_packed(lin)
    x = torch.randn(5, 40).bfloat16()
    with torch.no_grad():
        y = lin(x)
        assert torch.equal(y, domino_ops.small_batch_linear_packed(x, packed_weight(lin), lin.bias))
        lin.weight.mul_(2)  # in place: the cached packed copy is stale and must be rebuilt
        assert torch.equal(lin(x), domino_ops.small_batch_linear_packed(
            x, domino_ops.pack_small_batch_linear_weight(lin.weight), lin.bias))
        lin.weight = torch.nn.Parameter(torch.randn(100, 40).bfloat16())  # replaced
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=5e-2, rtol=5e-2)
    assert "weight" in dict(lin.named_parameters()) and len(lin.state_dict()) == 2  # no packed copy in it
    undo_small_batch_linear(lin)
    assert not runs_packed(lin) and "_domino_packed" not in lin.__dict__


@needs_cpu
def test_fast_linear_repacks_a_new_weight_at_the_old_ones_address():
    """A replaced weight can land at the freed address of the packed one with the same
    version (0, as every fresh tensor): the cache knows the tensor itself, not its address.
    64 MiB weights: each its own mmap, so the allocator hands the freed range straight back."""
    from domino.fast_linear import use_small_batch_linear

    N, K = 4096, 8192
    lin = torch.nn.Linear(1, 1, bias=False)
    lin.weight = torch.nn.Parameter(torch.randn(N, K, dtype=torch.bfloat16))
    use_small_batch_linear(lin)  # packs it
    lin.weight = torch.nn.Parameter(torch.zeros(N, K, dtype=torch.bfloat16))  # the first one freed
    lin.weight = torch.nn.Parameter(torch.full((N, K), 3.0, dtype=torch.bfloat16))
    x = torch.ones(2, K, dtype=torch.bfloat16)
    with torch.no_grad():
        assert (lin(x) == 3.0 * K).all()


@needs_cpu
def test_fast_linear_switches_inference_and_empty_weights_and_pickles():
    """Weights made under inference_mode (no version counter) switch and run; an empty
    layer falls back to F.linear; a switched model survives torch.save / torch.load."""
    import io

    from domino.fast_linear import uses_small_batch_linear, use_small_batch_linear

    with torch.inference_mode():
        lin = torch.nn.Linear(40, 100).bfloat16()
    use_small_batch_linear(lin)
    x = torch.randn(3, 40).bfloat16()
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=5e-2, rtol=5e-2)
    for k, n in ((0, 5), (5, 0)):
        empty = use_small_batch_linear(torch.nn.Linear(k, n).bfloat16())
        xe = torch.randn(2, k).bfloat16()
        with torch.no_grad():
            assert torch.equal(empty(xe), F.linear(xe, empty.weight, empty.bias))
    model = use_small_batch_linear(torch.nn.Sequential(torch.nn.Linear(8, 4)))
    buf = io.BytesIO()
    torch.save(model, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert uses_small_batch_linear(back)
    with torch.no_grad():
        xx = torch.randn(2, 8)
        assert torch.equal(back(xx), model(xx))


def test_fast_linear_follows_cpu_autocast():
    from domino.fast_linear import use_small_batch_linear

    lin = use_small_batch_linear(torch.nn.Linear(16, 8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(torch.randn(2, 16)).dtype == torch.bfloat16  # as nn.Linear under autocast


# --- float32 panels ------------------------------------------------------------------------------

def make32(M, N, K, bias, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * scale
    w = torch.randn(N, K, generator=g) / K ** 0.5
    b = torch.randn(N, generator=g) if bias else None
    return x, w, b


def pack32(w):
    return domino_ops.pack_small_batch_linear_weight(w, dtype=torch.float32)


def fma_order(x, w, b):
    """The float32 panels' arithmetic: each output from +0, one FMA per column k in order
    (acc = round(acc + x[k] w[k]), one rounding), then + bias in fp32. Emulated in float64:
    the product of two floats is exact there, and TwoSum gives the float64 sum's exact
    error, which decides the fp32 rounding where the float64 sum falls on an fp32 midpoint
    (a double rounding); such steps are rare and marked rather than resolved. Returns the
    [M, N] float32 result and the mask of outputs whose chain met one."""
    M, N = x.shape[0], w.shape[0]
    acc = torch.zeros(M, N)
    unsure = torch.zeros(M, N, dtype=torch.bool)
    inf = torch.tensor(float("inf"))
    for k in range(x.shape[1]):
        a = acc.double()
        p = x[:, k, None].double() * w[None, :, k].double()
        s = a + p
        bb = s - a
        err = (a - (s - bb)) + (p - bb)
        r = s.float()
        rd = r.double()
        nb = torch.nextafter(r, torch.where(s > rd, inf, -inf))
        unsure |= (s != rd) & (s == (rd + nb.double()) / 2) & (err != 0)
        acc = r
    return (acc if b is None else acc + b), unsure


@given(N=st.integers(1, 150), K=st.integers(1, 140), seed=st.integers(0, 2**31 - 1))
def test_pack_f32_round_trip_and_zero_padding(N, K, seed):
    _, w, _ = make32(1, N, K, False, seed)
    p = pack32(w)
    assert p.data.shape == (-(-N // 48), K, 48, 1) and p.data.dtype == torch.float32
    assert (p.out_features, p.in_features) == (N, K)
    assert torch.equal(reference.unpack_small_batch_linear_weight(p.data, N, K), w)
    assert not p.data.permute(0, 2, 1, 3).reshape(-1, K)[N:].any()  # padding rows are zeros
    assert torch.equal(pack32(w.bfloat16()).data, pack32(w.bfloat16().float()).data)  # bf16 widened exactly


@needs_f32
@given(M=st.sampled_from([1, 2, 3, 5, 7, 8, 9, 13, 16, 17, 24, 33, 70]), N=st.sampled_from([1, 5, 16, 47, 48, 49, 97, 200]),
       K=st.sampled_from([1, 2, 3, 15, 16, 33, 64, 129]), bias=st.booleans(), out_dtype=st.sampled_from(OUT_DTYPES),
       seed=st.integers(0, 2**31 - 1))
def test_f32_matches_float64_and_writes_every_element(M, N, K, bias, out_dtype, seed):
    x, w, b = make32(M, N, K, bias, seed)
    assert_close_to_float64(run_op(x, pack32(w), b, out_dtype), x, w, b)


@needs_f32
# N up to 5 panels: at one row a thread takes its panels two at a time, then any one left
@given(M=st.one_of(st.integers(1, 20), st.sampled_from([65, 70])), N=st.sampled_from([3, 48, 61, 150, 200]),
       K=st.sampled_from([1, 7, 32, 77, 300]), bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
@each_path
def test_f32_bit_exact_fma_order(path, M, N, K, bias, seed):
    """Each output is the one fixed chain of FMAs over K: nothing about M, the tile, the K
    blocks the AVX-512 tiles take turns by (K = 300: three of 96 columns and one of 12) or
    the thread enters it, which
    is the batch invariance; the AVX2 tiles (path avx2) and the
    AVX-512 ones (any other path) compute the same chain."""
    x, w, b = make32(M, N, K, bias, seed, scale=3.0)
    expect, unsure = fma_order(x, w, b)
    assert unsure.float().mean() < 0.05
    with packed_path(path):
        y = run_op(x, pack32(w), b, torch.float32)
        yb = run_op(x, pack32(w), b, torch.bfloat16)
    assert torch.equal(y[~unsure], expect[~unsure])
    assert torch.equal(yb[~unsure], expect.bfloat16()[~unsure])  # one rounding, to nearest even


@needs_f32
def test_f32_order_oracle_has_teeth():
    """The FMA oracle tells the kernel's order apart: a multiply and an add rounded apart,
    or the columns in reverse, differ from it somewhere on random data."""
    x, w, _ = make32(8, 48, 64, False, 1, scale=3.0)
    y = run_op(x, pack32(w), None, torch.float32)
    expect, unsure = fma_order(x, w, None)
    assert torch.equal(y[~unsure], expect[~unsure])
    two_roundings = torch.zeros(8, 48)
    for k in range(64):
        two_roundings = two_roundings + x[:, k, None] * w[None, :, k]
    assert not torch.equal(y, two_roundings)
    assert not torch.equal(y, fma_order(x.flip(1), w.flip(1), None)[0])


@needs_f32
# K = 250: three K blocks where the tiles take turns (more than 8 rows)
@given(M=st.integers(1, 40), N=st.sampled_from([1, 50, 100]), K=st.sampled_from([7, 40, 129, 250]),
       bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_f32_batch_invariant_bit_for_bit(M, N, K, bias, seed):
    """Row i is the same bits alone, among others at any position, whatever they hold
    (others up to 1e3 times larger, NaN and inf among them)."""
    x, w, b = make32(M, N, K, bias, seed, scale=3.0)
    others, _, _ = make32(23, N, K, False, seed + 1, scale=1e3)
    assert_batch_invariant(x, pack32(w), b, others, torch.float32)


@needs_f32
def test_f32_invariant_across_thread_counts_and_nan_stays_in_its_row():
    x, w, b = make32(30, 1000, 96, True, 0)
    p = pack32(w)
    assert_same_bits_on_one_thread(x, p, b)
    x[2, 3] = float("nan")
    y = run_op(x, p, b, torch.float32)
    assert torch.isnan(y[2]).all() and not torch.isnan(y[[0, 1, 3]]).any()


@needs_f32
def test_f32_wrapper_and_opcheck():
    x, w, b = make32(6, 70, 40, True, 3)
    p = pack32(w)
    y = domino_ops.small_batch_linear_packed(x.view(2, 3, 40), p, b)
    assert y.shape == (2, 3, 70) and y.dtype == torch.float32
    ref = domino_ops.small_batch_linear_packed(x.view(2, 3, 40), p, b, backend="reference")
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    assert domino_ops.small_batch_linear_packed(x, p, b, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(TypeError, match=r"x must be float32 \(the packed weight's dtype\), got bfloat16"):
        domino_ops.small_batch_linear_packed(x.bfloat16(), p)
    torch.library.opcheck(op.default, (x[:3], p.data, 70, b, torch.empty(3, 70)),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_pack_refuses_other_panel_dtypes():
    with pytest.raises(TypeError, match="dtype must be torch.bfloat16 or torch.float32"):
        domino_ops.pack_small_batch_linear_weight(torch.randn(3, 4), dtype=torch.float16)
    with pytest.raises(TypeError, match="dtype must be torch.bfloat16 or torch.float32"):
        domino_ops.small_batch_linear_packed_supported(torch.float16)


@needs_avx512f
def test_fast_linear_runs_float32_layers_on_float32_panels():
    """A float32 layer switched on an AVX-512F CPU runs the float32 panels (unless a lower
    path is forced), as bit-exact as the op itself, and repacks a changed weight."""
    from domino.fast_linear import packed_weight, runs_packed, undo_small_batch_linear, use_small_batch_linear

    lin = use_small_batch_linear(torch.nn.Linear(40, 100))
    assert runs_packed(lin, torch.float32)
    assert packed_weight(lin).data.dtype == torch.float32
    x = torch.randn(5, 40)
    with torch.no_grad():
        assert torch.equal(lin(x), domino_ops.small_batch_linear_packed(x, pack32(lin.weight), lin.bias))
        lin.weight.mul_(2)
        assert torch.equal(lin(x), domino_ops.small_batch_linear_packed(x, pack32(lin.weight), lin.bias))
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), atol=1e-5, rtol=1e-5)
    undo_small_batch_linear(lin)
    assert not runs_packed(lin, torch.float32)


@needs_f32
def test_fast_linear_forced_avx2_path_packs_nothing():
    from domino.fast_linear import runs_packed, use_small_batch_linear

    with domino_ops.cpu.kernel_switch("DOMINO_SMALL_BATCH_LINEAR_ISA", "avx2"):
        lin = use_small_batch_linear(torch.nn.Linear(40, 100))
        assert not runs_packed(lin, torch.float32)
        x = torch.randn(3, 40)
        with torch.no_grad():
            assert torch.equal(lin(x), domino_ops.small_batch_linear(x, lin.weight, lin.bias))


@pytest.mark.parametrize("path", PACKED_PATHS)
def test_an_odd_k_call_after_an_even_k_call_reads_no_stale_column(path):
    """An odd K pads each row's bf16 pairs with one zero column in the thread's activation
    buffer: a previous call's value there (a NaN at column 3 of a K = 4 call) must not reach
    a K = 3 call's outputs."""
    g = torch.Generator().manual_seed(4)
    with packed_path(path), torch_threads(1):
        w4 = domino_ops.pack_small_batch_linear_weight(torch.randn(5, 4, generator=g).bfloat16())
        x4 = torch.tensor([[1.0, 1.0, 1.0, float("nan")]]).bfloat16()
        domino_ops.small_batch_linear_packed(x4, w4)
        w3 = torch.randn(5, 3, generator=g).bfloat16()
        y = domino_ops.small_batch_linear_packed(torch.ones(1, 3).bfloat16(), domino_ops.pack_small_batch_linear_weight(w3))
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), (torch.ones(1, 3) @ w3.float().T), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("path", PACKED_PATHS)
def test_one_row_writes_nothing_past_its_outputs(path):
    """N = 68 (a whole panel and a partial one), one row, one thread (two weight streams):
    the output is the first 68 elements of a longer buffer, whose tail stays untouched."""
    N, K = 68, 32
    g = torch.Generator().manual_seed(6)
    w = domino_ops.pack_small_batch_linear_weight(torch.randn(N, K, generator=g).bfloat16())
    x = torch.randn(1, K, generator=g).bfloat16()
    buf = torch.full((N + 64,), -7.0, dtype=torch.bfloat16)
    with packed_path(path), torch_threads(1):
        op(x, w.data, N, None, buf[:N].view(1, N))
    assert (buf[N:] == -7.0).all()
    want = x.float() @ reference.unpack_small_batch_linear_weight(w.data, N, K).float().T
    torch.testing.assert_close(buf[:N].float(), want[0], rtol=2e-2, atol=2e-2)
