"""small_batch_attention: agreement with a float64 oracle on random shapes, every written
element, bit-exact batch invariance (a row alone, among others, with hidden keys moved
around), every CPU build and both score paths (vector FMAs; AMX tiles where the machine has
them), bad input."""

import contextlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import domino_ops
from domino_ops import cpu, reference

op = torch.ops.domino_ops.small_batch_attention
DTYPES = [torch.float32, torch.bfloat16]
SCORES = "DOMINO_SMALL_BATCH_ATTENTION_SCORES"


def scores_path(path):
    """The op's score path for the block: "vector", "amx" or "auto"."""
    return domino_ops.cpu.kernel_switch(SCORES, path)


def _has_amx_scores() -> bool:
    q = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16)
    try:
        with scores_path("amx"), domino_ops.cpu.forced_isa("avx512"):
            op(q, q, q, None, 1.0, torch.empty_like(q))
        return True
    except (ValueError, RuntimeError):  # no AMX, or no avx512 build
        return False


AMX = _has_amx_scores()
# (CPU build, score path): every build with the vector FMAs, and the avx512 build with AMX
# tiles where this machine has them (bf16 scores at head dims that are multiples of 32).
BUILDS = [(isa, path) for isa in cpu.supported_isas()
          for path in (["vector", "amx"] if AMX and isa == "avx512" else ["vector"])]


@contextlib.contextmanager
def build(isa, path):
    with domino_ops.cpu.forced_isa(isa), scores_path(path if path == "vector" else "auto"):
        yield


def make(B, Hq, Hkv, M, N, D, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, M, D, generator=g) * scale).to(dtype)
    k = (torch.randn(B, Hkv, N, D, generator=g) * scale).to(dtype)
    v = torch.randn(B, Hkv, N, D, generator=g).to(dtype)
    return q, k, v


def run_op(q, k, v, mask=None, scale=None):
    """The dispatcher op into a NaN-poisoned output, so an unwritten element fails."""
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    op(q, k, v, mask, 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale, out)
    return out


def assert_close_to_float64(y, q, k, v, mask):
    exact = reference.small_batch_attention(q.double(), k.double(), v.double(), mask)
    assert not torch.isnan(y).any(), "unwritten (NaN-poisoned) output elements"
    # fp32 scores, softmax and sums (~N * D terms at 2^-23) and, in bf16, one output rounding;
    # in bf16 on AMX tiles the value sums' weights are rounded to bf16 too (each by at most
    # 2^-9 of itself): up to 2^-9 of the weighted mean of |v| more, allowed twice over.
    if y.dtype == torch.float32:
        tol = 1e-5
    else:
        mean_abs_v = reference.small_batch_attention(q.double(), k.double(), v.double().abs(), mask)
        tol = 2.0 ** -8 * (exact.abs() + 0.05) + 2.0 ** -8 * mean_abs_v
    err = (y.double() - exact).abs()
    assert (err <= tol).all(), f"max error {err.max():.3g}"


def random_mask(B, Hq, M, N, kind, seed):
    if kind is None:
        return None
    g = torch.Generator().manual_seed(seed)
    visible = torch.rand(B, 1 if seed % 2 else Hq, M, N, generator=g) > 0.3
    if kind == "bool":
        return visible
    return torch.where(visible, torch.randn(visible.shape, generator=g) * 0.5, float("-inf")).to(kind)


@settings(max_examples=90, deadline=None)
@given(B=st.integers(1, 3), Hkv=st.integers(1, 3), group=st.sampled_from([1, 2, 3]), M=st.integers(1, 9),
       extra=st.integers(0, 40), D=st.sampled_from([1, 5, 16, 20, 32, 64, 96, 128, 130]),
       dtype=st.sampled_from(DTYPES), mask=st.sampled_from([None, "bool", torch.float32, torch.bfloat16]),
       seed=st.integers(0, 2 ** 16), kernels=st.sampled_from(BUILDS))
def test_matches_float64_reference(B, Hkv, group, M, extra, D, dtype, mask, seed, kernels):
    """On every CPU build this machine runs (each compiles its own attend_block), and with
    AMX tiles where it has them (the "auto" path: bf16 at D = 32, 64, 96 and 128 take the tiles)."""
    q, k, v = make(B, Hkv * group, Hkv, M, M + extra, D, dtype, seed)
    m = random_mask(B, Hkv * group, M, M + extra, mask, seed)
    with build(*kernels):
        y = run_op(q, k, v, m)
    assert_close_to_float64(y, q, k, v, m)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reads_transposed_queries_and_strided_caches_in_place(dtype):
    """HF hands over query as [b, q, h, d].transpose(1, 2) and caches that may be slices of
    a longer buffer: the op reads both through their strides."""
    B, Hq, Hkv, M, N, D = 2, 6, 2, 4, 11, 32
    q0, k0, v0 = make(B, Hq, Hkv, M, N + 5, D, dtype, 3)
    q = q0.transpose(1, 2).contiguous().transpose(1, 2)  # [b, h, q, d] view of [b, q, h, d]
    k, v = k0[:, :, :N], v0[:, :, 2:N + 2]
    out = torch.full((B, M, Hq, D), float("nan"), dtype=dtype).transpose(1, 2)
    op(q, k, v, None, D ** -0.5, out)
    assert_close_to_float64(out, q, k, v, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq,Hkv,N,D", [(9, 3, 70, 64), (16, 2, 101, 128)])
def test_a_row_alone_equals_the_row_among_others(dtype, Hq, Hkv, N, D):
    """Bit-exact: a verification over M rows gives each row the bits of a one-token step
    (q_len 1 against the cache up to that row), for every CPU build; the second shape puts
    32 query rows in a block (two blocks of AMX tile rows) and 128 columns (two passes of
    the value sums' tiles)."""
    B, M = 2, 16
    q, k, v = make(B, Hq, Hkv, M, N, D, dtype, 7, scale=2.0)
    for isa in BUILDS:
        with build(*isa):
            big = run_op(q, k, v)
            for m in range(M):
                n = N - M + m + 1
                alone = run_op(q[:, :, m:m + 1].contiguous(), k[:, :, :n].contiguous(), v[:, :, :n].contiguous())
                assert torch.equal(big[:, :, m:m + 1], alone), (isa, m)
            for h in range(Hq):  # a query head alone (not blocked with its kv head's others)
                g = h // (Hq // Hkv)
                alone = run_op(q[:, h:h + 1].contiguous(), k[:, g:g + 1].contiguous(), v[:, g:g + 1].contiguous())
                assert torch.equal(big[:, h:h + 1], alone), (isa, h)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prompts_rows_equal_their_decode_steps(dtype):
    """A prompt (from 64 rows the op runs tasks of 16 positions, 48 query rows here) with
    a left-padded sequence beside it: rows at task edges and in between give the bits of a
    one-row call over exactly their visible keys, on every CPU build."""
    B, Hq, Hkv, M, D = 2, 9, 3, 150, 64
    q, k, v = make(B, Hq, Hkv, M, M, D, dtype, 17, scale=2.0)
    visible = torch.ones(B, 1, M, M, dtype=torch.bool).tril()
    visible[1, :, :, :37] = False  # sequence 1: 37 tokens of padding
    k[1, :, :37] = v[1, :, :37] = float("nan")  # never read
    for isa in BUILDS:
        with build(*isa):
            big = run_op(q, k, v, visible)
            for b, m in [(0, 0), (0, 15), (0, 16), (0, 63), (0, 149), (1, 37), (1, 100), (1, 149)]:
                first = 37 if b else 0
                alone = run_op(q[b:b + 1, :, m:m + 1].contiguous(), k[b:b + 1, :, first:m + 1].contiguous(),
                               v[b:b + 1, :, first:m + 1].contiguous())
                assert torch.equal(big[b:b + 1, :, m:m + 1], alone), (isa, b, m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,M", [(65, 6), (300, 1), (1100, 16)])
def test_long_caches_across_key_chunks(dtype, N, M):
    """The kernel scores and sums a long cache chunk by chunk of keys (64 at head dim 64):
    caches of one chunk and a key, several, and many, with a mask whose holes and padding
    straddle chunk boundaries, agree with the float64 oracle, and each row gives the bits
    of a one-row call over exactly its visible keys (so chunk boundaries, which fall
    elsewhere in the packed call, change no bit), on every CPU build."""
    B, Hq, Hkv, D = 1, 9, 3, 64
    q, k, v = make(B, Hq, Hkv, M, N, D, dtype, N + M, scale=2.0)
    g = torch.Generator().manual_seed(N)
    visible = torch.rand(B, 1, M, N, generator=g) > 0.25
    visible[..., :N // 3] &= torch.rand(N // 3, generator=g) > 0.8  # a long, sparse stretch
    visible &= torch.ones(M, N, dtype=torch.bool).tril(N - M)
    visible[..., -M:] |= torch.eye(M, dtype=torch.bool)  # every row sees its own key
    k[:, :, ~visible.any(dim=(0, 1, 2))] = float("nan")  # never read
    for isa in BUILDS:
        with build(*isa):
            big = run_op(q, k, v, visible)
            assert_close_to_float64(big, q, k, v, visible)
            for m in sorted({0, M // 2, M - 1}):
                idx = visible[0, 0, m].nonzero().flatten()
                alone = run_op(q[:, :, m:m + 1].contiguous(), k[:, :, idx].contiguous(), v[:, :, idx].contiguous())
                assert torch.equal(big[:, :, m:m + 1], alone), (isa, m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", ["bool", "-inf", "lowest"])
def test_hidden_keys_change_no_bit(dtype, hidden):
    """A row's visible keys, wherever the hidden ones sit between them (left padding, holes,
    the other branches of a draft tree), give the bits of the same keys packed together:
    hidden by a bool mask, by -inf, or by the dtype's lowest finite value (an eager-style
    additive mask, as the engine's tree mask: such a key is scored and weighs exactly 0)."""
    Hq, Hkv, D, n = 4, 2, 64, 23
    q, k, v = make(1, Hq, Hkv, 1, n, D, dtype, 11)
    g = torch.Generator().manual_seed(1)
    N = 60
    where = torch.sort(torch.randperm(N - 1, generator=g)[:n - 1]).values
    where = torch.cat([where, torch.tensor([N - 1])])  # the row's own key is the cache's last
    k2 = torch.randn(1, Hkv, N, D, generator=g).to(dtype) * 100  # hidden keys: large garbage
    v2 = torch.randn(1, Hkv, N, D, generator=g).to(dtype) * 100
    k2[:, :, where], v2[:, :, where] = k, v
    visible = torch.zeros(1, 1, 1, N, dtype=torch.bool)
    visible[..., where] = True
    if hidden == "bool":
        mask = visible
    else:
        low = float("-inf") if hidden == "-inf" else torch.finfo(dtype).min
        mask = torch.where(visible, torch.tensor(0.0, dtype=dtype), torch.tensor(low, dtype=dtype))
    for isa in BUILDS:
        with build(*isa):
            assert torch.equal(run_op(q, k2, v2, mask), run_op(q, k, v)), isa


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["bool", "float", "per-head bool"])
def test_masked_rows_among_others_equal_their_visible_keys_alone(dtype, kind):
    """Bit-exact under a mask too: in a call of many rows (blocks of rows share key and
    value loads, and a key hidden from some rows of a block is skipped for just those), each
    (row, head) gives the bits of a one-row call over exactly its visible keys, packed
    together, with their biases. Some keys hold NaN keys and values: those hidden from every
    row, and one hidden from only some rows of a block: a row that read one it does not see
    (even weighted 0) would turn NaN, and the rows that see it must."""
    B, Hq, Hkv, M, N, D = 1, 6, 2, 11, 40, 64
    q, k, v = make(B, Hq, Hkv, M, N, D, dtype, 5, scale=2.0)
    g = torch.Generator().manual_seed(9)
    visible = torch.rand(B, Hq if kind == "per-head bool" else 1, M, N, generator=g) > 0.35
    visible &= torch.ones(M, N, dtype=torch.bool).tril(N - M)  # nothing past a row's own position
    bias = torch.randn(visible.shape, generator=g).to(dtype)
    mask = torch.where(visible, bias, float("-inf")).to(dtype) if kind == "float" else visible
    poisoned = ~visible.any(dim=(0, 1, 2))  # the keys no row sees
    poisoned[torch.randperm(N - M, generator=g)[:1]] = True  # and one that some rows see
    k[:, :, poisoned] = float("nan")
    v[:, :, poisoned] = float("nan")
    for isa in BUILDS:
        with build(*isa):
            big = run_op(q, k, v, mask)
            for m in range(M):
                for h in range(Hq):
                    idx = visible[0, h if kind == "per-head bool" else 0, m].nonzero().flatten()
                    kv_head = h // (Hq // Hkv)
                    alone_k = k[:, kv_head:kv_head + 1, idx].contiguous()
                    alone_v = v[:, kv_head:kv_head + 1, idx].contiguous()
                    alone_mask = bias[:, 0:1, m:m + 1, idx].contiguous() if kind == "float" else None
                    qr = q[:, h:h + 1, m:m + 1].contiguous()
                    if len(idx) == 0:
                        assert torch.equal(big[:, h, m], torch.zeros(B, D, dtype=dtype)), (isa, m, h)
                        continue
                    # the one-row call sees all its keys: its own position is the last of them
                    alone = run_op(qr, alone_k, alone_v, alone_mask)
                    torch.testing.assert_close(big[:, h:h + 1, m:m + 1], alone, rtol=0, atol=0, equal_nan=True,
                                               msg=f"{isa} {kind} row {m} head {h}")
            assert big.isnan().any() and not big.isnan().all()  # both kinds of row occurred


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("M", [1, 6])
def test_a_padded_static_cache_gives_the_bits_of_its_written_keys(dtype, kind, M):
    """A left-padded batch in a static cache (HF's StaticCache, as data regeneration decodes):
    each sequence's padding before its first key and the unwritten tail after its last are
    hidden by the mask and hold NaN; the call attends to the written keys alone (it never
    reads the others) and gives each sequence the bits of a call over just those keys."""
    B, Hq, Hkv, N, D = 3, 9, 3, 50, 64
    q, k, v = make(B, Hq, Hkv, M, N, D, dtype, 13, scale=2.0)
    spans = [(7, 30), (0, 44), (19, 26)]  # written keys [first, end) of each sequence
    visible = torch.zeros(B, 1, M, N, dtype=torch.bool)
    for b, (first, end) in enumerate(spans):
        for m in range(M):  # row m is the token at position end - M + m
            visible[b, 0, m, first:end - M + m + 1] = True
        k[b, :, :first] = v[b, :, :first] = float("nan")
        k[b, :, end:] = v[b, :, end:] = float("nan")
    mask = visible if kind == "bool" else torch.where(visible, 0.0, float("-inf")).to(dtype)
    for isa in BUILDS:
        with build(*isa):
            big = run_op(q, k, v, mask)
            assert not big.isnan().any(), isa
            for b, (first, end) in enumerate(spans):
                alone = run_op(q[b:b + 1].contiguous(), k[b:b + 1, :, first:end].contiguous(),
                               v[b:b + 1, :, first:end].contiguous())
                assert torch.equal(big[b:b + 1], alone), (isa, b)


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_no_visible_key_gives_zeros_and_nan_propagates(backend):
    """A row with no visible key gives zeros; a NaN score gives NaN, not zeros, in the
    kernel and in the reference (which once took a NaN row maximum for "no key")."""
    def run(q, k, v, mask=None):
        if backend == "reference":
            return domino_ops.small_batch_attention(q, k, v, mask, backend=backend)
        out = torch.full(q.shape, 12345.0)  # poisoned with a finite value: a NaN must be written
        op(q, k, v, mask, 1.0 / math.sqrt(q.shape[-1]), out)
        return out

    q, k, v = make(1, 2, 1, 2, 5, 8, torch.float32, 0)
    mask = torch.ones(1, 2, 2, 5, dtype=torch.bool)
    mask[:, 0, 1] = False
    out = run(q, k, v, mask)
    assert torch.equal(out[:, 0, 1], torch.zeros(1, 8)) and torch.isfinite(out[:, 1]).all()
    k[0, 0, 0, 0] = float("nan")
    assert torch.isnan(run(q, k, v)).all()  # every row sees key 0
    q, k, v = make(1, 2, 1, 3, 3, 8, torch.float32, 1)
    k[0, 0, 0, 0] = float("nan")
    assert torch.isnan(run(q, k, v)).all()  # row 0's only key is NaN: NaN, not zeros
    q, k, v = make(1, 1, 1, 1, 2, 4, torch.float32, 2)
    float_mask = torch.zeros(1, 1, 1, 2)
    float_mask[..., 1] = float("nan")  # a NaN added to a visible score
    assert torch.isnan(run(q, k, v, float_mask)).all()


@pytest.mark.parametrize("kind", ["causal", "bool", "float"])
def test_non_finite_values_count_only_where_their_key_is_visible(kind):
    """NaN and +-inf values in the keys a row cannot see (past the causal edge, or masked:
    a static cache's unwritten slots) change nothing in the kernel or in the reference (whose
    0 * NaN had made every row NaN); where a row sees them they propagate as IEEE sums them,
    the same in both."""
    g = torch.Generator().manual_seed(5)
    B, Hq, Hkv, M, N, D = 2, 4, 2, 3, 9, 8
    q, k, v = make(B, Hq, Hkv, M, N, D, torch.float32, 21)
    for pos, val in ((8, float("nan")), (7, float("inf")), (2, float("-inf")), (6, float("nan"))):
        v[0, 1, pos, torch.randint(D, (1,), generator=g)] = val
        v[1, 0, pos, :2] = val
    mask = None
    if kind != "causal":
        hide = torch.rand(B, 1, M, N, generator=g) < 0.4
        hide[..., -1] = False  # each row keeps a key
        mask = ~hide if kind == "bool" else torch.where(hide, float("-inf"), 0.0)
    native = domino_ops.small_batch_attention(q, k, v, mask, backend="native")
    ref = domino_ops.small_batch_attention(q, k, v, mask, backend="reference")
    assert torch.equal(native.isnan(), ref.isnan()) and torch.equal(native.isinf(), ref.isinf())
    torch.testing.assert_close(native.nan_to_num(), ref.nan_to_num(), rtol=1e-5, atol=1e-5)
    assert bool(torch.isfinite(ref[0, 0]).all())  # query heads 0-1 read kv head 0: finite in batch 0
    # the values no row sees, replaced by finite ones: the same outputs, bit for bit
    seen = torch.ones(B, 1, M, N, dtype=torch.bool).tril(N - M) & (True if mask is None else
                                                                   (mask if kind == "bool" else mask == 0))
    unseen = ~seen.any(2, keepdim=True).transpose(2, 3).expand(B, Hkv, N, D)  # no row of the batch sees the key
    clean = torch.where(unseen & ~torch.isfinite(v), 0.0, v)
    for backend, got in (("native", native), ("reference", ref)):
        again = domino_ops.small_batch_attention(q, k, clean, mask, backend=backend)
        assert torch.equal(again.nan_to_num(), got.nan_to_num()) and torch.equal(again.isnan(), got.isnan()), backend


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["native", "reference"])
def test_a_bias_at_bfloat16s_lowest_hides_a_key_as_minus_inf_does(dtype, backend):
    """A float mask hides a key with -inf and with anything at or below bfloat16's lowest
    finite value (HF's eager masks and the engine's tree mask add torch.finfo(dtype).min):
    a row whose every key is so biased gives zeros, as with -inf (not the plain average of
    its values); a bias just above that stays a visible key's bias."""
    lowest = torch.finfo(torch.bfloat16).min
    q, k, v = make(1, 3, 1, 2, 9, 64, dtype, 4)
    for bias in (float("-inf"), lowest, torch.finfo(torch.float32).min):
        mask = torch.zeros(1, 1, 2, 9, dtype=dtype)
        mask[..., 0, :] = bias  # row 0 sees nothing
        mask[..., 1, 3] = bias  # row 1 sees all its keys but key 3
        out = domino_ops.small_batch_attention(q, k, v, mask, backend=backend)
        assert torch.equal(out[:, :, 0], torch.zeros(1, 3, 64, dtype=dtype)), bias
        keep = torch.tensor([j != 3 for j in range(9)])
        alone = domino_ops.small_batch_attention(q[:, :, 1:], k[:, :, keep], v[:, :, keep], backend=backend)
        exact = {"rtol": 0, "atol": 0} if backend == "native" else {}  # the kernel: the same bits
        torch.testing.assert_close(out[:, :, 1:], alone, **exact)
    # just above the threshold: visible keys, each score absorbed into the huge bias (equal
    # weights): the plain average of the values each row sees
    mask = torch.full((1, 1, 2, 9), -1e38, dtype=dtype)
    out = domino_ops.small_batch_attention(q, k, v, mask, backend=backend)
    average = torch.stack([v[0, 0, :8].float().mean(0), v[0, 0].float().mean(0)])  # rows 0, 1 see 8, 9 keys
    torch.testing.assert_close(out[0].float(), average.expand(3, 2, 64), atol=2e-2, rtol=2e-2)


def test_wrapper_returns_hf_layout_and_backends_agree():
    q, k, v = make(2, 6, 3, 5, 12, 16, torch.float32, 5)
    mask = random_mask(2, 6, 5, 12, "bool", 2)
    out = domino_ops.small_batch_attention(q, k, v, mask, scale=0.3)
    assert out.shape == (2, 6, 5, 16) and out.transpose(1, 2).is_contiguous()
    ref = domino_ops.small_batch_attention(q, k, v, mask, scale=0.3, backend="reference")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=False,
        attn_mask=torch.ones(5, 12, dtype=torch.bool).tril(12 - 5), scale=0.3)
    torch.testing.assert_close(domino_ops.small_batch_attention(q, k, v, scale=0.3), sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("args,err,msg", [
    (dict(q=torch.zeros(2, 2, 3)), ValueError, "q must have 4 dimensions"),
    (dict(q=torch.zeros(1, 2, 3, 4, dtype=torch.float16)), TypeError, "q must be float32 or bfloat16"),
    (dict(k=torch.zeros(1, 1, 5, 4, dtype=torch.bfloat16)), TypeError, "k must be float32"),
    (dict(k=torch.zeros(1, 3, 5, 4), v=torch.zeros(1, 3, 5, 4)), ValueError, r"multiple of k's \(3\)"),
    (dict(k=torch.zeros(1, 1, 2, 4), v=torch.zeros(1, 1, 2, 4)), ValueError, "at least q's 3 positions"),
    (dict(v=torch.zeros(1, 1, 6, 4)), ValueError, "v must have shape"),
    (dict(k=torch.zeros(1, 1, 5, 8)), ValueError, "k must have shape"),
    (dict(mask=torch.ones(1, 1, 3, 4, dtype=torch.bool)), ValueError, "mask must have shape"),
    (dict(mask=torch.ones(1, 1, 3, 5, dtype=torch.int32)), TypeError, "mask must be bool"),
    (dict(scale=float("nan")), ValueError, "scale must be a finite number"),
    (dict(scale=10 ** 400), ValueError, "scale must be a finite number"),
    (dict(scale=1e39), ValueError, r"scale must be a finite number \(finite in float32\)"),
    (dict(scale="1"), TypeError, "scale must be a number"),
    (dict(backend="triton"), ValueError, "backend must be one of"),
])
def test_bad_input_names_the_argument(args, err, msg):
    kw = dict(q=torch.zeros(1, 2, 3, 4), k=torch.zeros(1, 1, 5, 4), v=torch.zeros(1, 1, 5, 4), mask=None,
              scale=None, backend=None)
    kw.update(args)
    with pytest.raises(err, match=msg):
        domino_ops.small_batch_attention(kw.pop("q"), kw.pop("k"), kw.pop("v"), kw.pop("mask"), **kw)


def test_op_checks_what_the_wrapper_skips():
    """The dispatcher op (what the HF attention function calls) raises, not crashes."""
    q, k, v = make(1, 2, 1, 3, 5, 4, torch.float32, 0)
    out = torch.empty(1, 2, 3, 4)
    with pytest.raises(RuntimeError, match="q, k, v and out must share a dtype"):
        op(q, k.bfloat16(), v, None, 0.5, out)
    with pytest.raises(RuntimeError, match="out must have q's shape"):
        op(q, k, v, None, 0.5, torch.empty(1, 2, 3, 5))
    with pytest.raises(RuntimeError, match="contiguous in its last dimension"):
        op(q, torch.zeros(1, 1, 5, 8)[..., ::2], v, None, 0.5, out)
    with pytest.raises(RuntimeError, match="scale must be finite in float32"):  # finite as a double: all NaN before
        op(q, k, v, None, 1e39, out)


def test_op_refuses_an_out_that_shares_memory():
    """out is written while q, k, v and the mask are read: a strided out over any of them,
    or a broadcast (self-overlapping) out, is refused by the op (HF's own out, a fresh
    tensor's transposed view, passes)."""
    q, k, v = make(1, 2, 1, 3, 5, 4, torch.float32, 0)
    mask = torch.zeros(1, 2, 3, 5, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="out must not share memory with q"):
        op(q, k, v, None, 0.5, q.as_strided(q.shape, (24, 4, 8, 1)))  # a strided view of q's own bytes
    with pytest.raises(RuntimeError, match="out must not share memory with mask"):
        op(q, k, v, mask, 0.5, mask.view(-1)[:24].view(1, 3, 2, 4).transpose(1, 2))
    with pytest.raises(RuntimeError, match="out must not overlap itself"):
        op(q, k, v, None, 0.5, torch.empty(1, 1, 3, 4).expand(1, 2, 3, 4))
    fresh = torch.empty(1, 3, 2, 4)
    op(q, k, v, None, 0.5, fresh.transpose(1, 2))


@pytest.mark.parametrize("name", ["q", "mask", "out"])
def test_op_refuses_a_meta_tensor_among_cpu_ones(name):
    """The dispatcher sends any call with a meta argument to the fake kernel: it refuses a
    mix rather than leave a CPU out unwritten."""
    q, k, v = make(1, 2, 1, 3, 5, 4, torch.float32, 0)
    args = dict(q=q, k=k, v=v, mask=torch.ones(1, 1, 3, 5, dtype=torch.bool), out=torch.empty(1, 2, 3, 4))
    args[name] = args[name].to("meta")
    with pytest.raises(RuntimeError, match="every tensor must be on one device"):
        op(args["q"], args["k"], args["v"], args["mask"], 0.5, args["out"])


@pytest.mark.skipif(not AMX, reason="no AMX-BF16 here: the scores run on vector FMAs only")
def test_amx_scores_round_their_own_way_and_are_the_default():
    """Where the CPU has AMX, bf16 scores and value sums at D = 64 run on the tiles by
    default: other bits than the vector path's (TDPBF16PS sums each 32 elements in its own
    order; the value sums' weights are rounded to bf16), as close to the float64 oracle as
    that rounding allows, and forcing "amx" gives the default's bits."""
    q, k, v = make(1, 9, 3, 16, 300, 64, torch.bfloat16, 21, scale=2.0)
    with build("avx512", "vector"):
        vector = run_op(q, k, v)
    with build("avx512", "amx"):
        auto = run_op(q, k, v)
    with scores_path("amx"), domino_ops.cpu.forced_isa("avx512"):
        forced = run_op(q, k, v)
    assert not torch.equal(vector, auto) and torch.equal(auto, forced)
    for y in (vector, auto):
        assert_close_to_float64(y, q, k, v, None)


def test_score_path_variable_is_checked():
    q, k, v = make(1, 2, 1, 2, 5, 64, torch.bfloat16, 0)
    with scores_path("tiles"), pytest.raises(ValueError, match="DOMINO_SMALL_BATCH_ATTENTION_SCORES must be auto, amx"):
        run_op(q, k, v)
    q, k, v = make(1, 2, 1, 2, 5, 20, torch.bfloat16, 0)  # no AMX path at D = 20 (nor without AMX)
    with scores_path("amx"), pytest.raises(ValueError, match="DOMINO_SMALL_BATCH_ATTENTION_SCORES=amx needs"):
        run_op(q, k, v)
    q, k, v = make(1, 2, 1, 2, 5, 64, torch.float32, 0)
    with scores_path("amx"):  # float32 scores are the vector path's whatever the variable says
        assert_close_to_float64(run_op(q, k, v), q, k, v, None)
    with scores_path("tiles"), pytest.raises(ValueError, match="must be auto, amx"):  # but it is checked
        run_op(q, k, v)


def test_a_value_hidden_from_one_row_never_reaches_it():
    """Key 0 is hidden from query row 1 only, and its value is NaN: rows 0 and 2 see the NaN,
    row 1 is computed from its own visible keys alone (its own per-row key classes)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 3, 4, generator=g)
    k, v = torch.randn(1, 1, 5, 4, generator=g), torch.randn(1, 1, 5, 4, generator=g)
    v[0, 0, 0] = float("nan")
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[0, 0, 1, 0] = False
    out = domino_ops.small_batch_attention(q, k, v, mask)
    assert torch.isfinite(out[0, 0, 1]).all() and out[0, 0, [0, 2]].isnan().all()
    want = domino_ops.small_batch_attention(q[:, :, 1:2], k[:, :, 1:4], v[:, :, 1:4])  # row 1's keys 1-3, causal end
    torch.testing.assert_close(out[0, 0, 1], want[0, 0, 0], rtol=1e-6, atol=1e-6)
