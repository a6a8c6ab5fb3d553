"""apply_rotary_pos_emb: transformers' rotary embedding bit for bit (the reference and HF's
own function) on random shapes and strides on every instruction-set build this machine
runs, every written element, a row alone equal to the row among others, extreme values, bad
input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import domino_ops
from domino_ops import cpu, reference
from torch_threads import torch_threads

op = torch.ops.domino_ops.apply_rotary_pos_emb
DTYPES = [torch.float32, torch.bfloat16]


def run_op(q, k, cos, sin):
    """The dispatcher op into NaN-poisoned outputs, so an unwritten element fails."""
    q_out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    k_out = torch.full(k.shape, float("nan"), dtype=k.dtype)
    op(q, k, cos, sin, q_out, k_out)
    return q_out, k_out


def make(b, hq, hk, T, D, dtype, seed, *, fused=True, cos_batch=None, scale=1.0):
    """q and k as HF's attention makes them from a fused projection (transposed views of
    one [b, T, (hq + 2 hk) D] tensor; ``fused=False``: contiguous), cos / sin [b or 1, T, D]."""
    g = torch.Generator().manual_seed(seed)
    if fused:
        qkv = (torch.randn(b, T, (hq + 2 * hk) * D, generator=g) * scale).to(dtype)
        q = qkv[..., :hq * D].view(b, T, hq, D).transpose(1, 2)
        k = qkv[..., hq * D:(hq + hk) * D].view(b, T, hk, D).transpose(1, 2)
    else:
        q = (torch.randn(b, hq, T, D, generator=g) * scale).to(dtype)
        k = (torch.randn(b, hk, T, D, generator=g) * scale).to(dtype)
    cb = b if cos_batch is None else cos_batch
    angles = torch.rand(cb, T, D // 2, generator=g) * 100
    emb = torch.cat([angles, angles], -1)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


@settings(max_examples=80, deadline=None)
@given(b=st.integers(1, 3), hq=st.sampled_from([1, 2, 4, 9]), group=st.sampled_from([1, 2, 3]),
       T=st.sampled_from([1, 2, 5, 16, 17]), D=st.sampled_from([2, 6, 8, 34, 64, 128]), dtype=st.sampled_from(DTYPES),
       fused=st.booleans(), broadcast=st.booleans(), scale=st.sampled_from([1e-3, 1.0, 300.0]),
       seed=st.integers(0, 2 ** 16), isa=st.sampled_from(cpu.supported_isas()))
def test_equals_the_reference_bit_for_bit(b, hq, group, T, D, dtype, fused, broadcast, scale, seed, isa):
    """D from 2 to 128: whole vectors of the build's lanes and the partial ones around them
    (float32: a product fused into the sum by an FMA would round once and differ)."""
    hk = max(1, hq // group)
    q, k, cos, sin = make(b, hq, hk, T, D, dtype, seed, fused=fused, cos_batch=1 if broadcast else None, scale=scale)
    with cpu.forced_isa(isa):
        got = run_op(q, k, cos, sin)
    want = reference.apply_rotary_pos_emb(q, k, cos, sin)
    for g, w in zip(got, want):
        assert not g.isnan().any(), "unwritten (NaN-poisoned) output elements"
        assert g.is_contiguous() and torch.equal(g, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_transformers_own_function(dtype):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf

    q, k, cos, sin = make(2, 9, 3, 16, 64, dtype, 1)
    ours, theirs = domino_ops.apply_rotary_pos_emb(q, k, cos, sin), hf(q, k, cos, sin)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_a_position_alone_equals_the_position_among_others():
    q, k, cos, sin = make(2, 9, 3, 9, 64, torch.bfloat16, 2)
    big_q, big_k = run_op(q, k, cos, sin)
    for t in range(9):
        one_q, one_k = run_op(q[:, :, t:t + 1], k[:, :, t:t + 1], cos[:, t:t + 1], sin[:, t:t + 1])
        assert torch.equal(one_q, big_q[:, :, t:t + 1]) and torch.equal(one_k, big_k[:, :, t:t + 1])


def test_a_reference_run_and_the_wrapper_agree_and_the_wrong_rotation_fails():
    """The negative control: rotating the other way (cat(x2, -x1)) gives other bits."""
    q, k, cos, sin = make(1, 4, 2, 5, 8, torch.float32, 3)
    native = domino_ops.apply_rotary_pos_emb(q, k, cos, sin)
    ref = domino_ops.apply_rotary_pos_emb(q, k, cos, sin, backend="reference")
    assert torch.equal(native[0], ref[0]) and torch.equal(native[1], ref[1])
    h = q.shape[-1] // 2
    wrong = q * cos[:, None] + torch.cat((q[..., h:], -q[..., :h]), -1) * sin[:, None]
    assert not torch.equal(native[0], wrong)


@pytest.mark.parametrize("isa", cpu.supported_isas())
def test_extreme_values_stay_in_their_element_pair(isa):
    q, k, cos, sin = make(1, 2, 1, 3, 8, torch.float32, 4, fused=False)
    q[0, 0, 1, 2] = float("nan")
    q[0, 1, 2, 5] = float("inf")
    with cpu.forced_isa(isa):
        q_out, k_out = run_op(q, k, cos, sin)
    want_q, want_k = reference.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(q_out.isnan(), want_q.isnan()) and torch.equal(q_out.isinf(), want_q.isinf())
    finite = want_q.isfinite()
    assert torch.equal(q_out[finite], want_q[finite]) and torch.equal(k_out, want_k)
    assert q_out[0, 0, 1].isnan().sum() == 2  # element 2 and its partner 6, nothing else in the row


@pytest.mark.parametrize("args,err,msg", [
    (lambda: ("x", torch.ones(1, 1, 1, 2), torch.ones(1, 1, 2), torch.ones(1, 1, 2)), TypeError,
     "q must be a torch.Tensor"),
    (lambda: (torch.ones(1, 1, 1, 2, dtype=torch.int64), torch.ones(1, 1, 1, 2), torch.ones(1, 1, 2),
              torch.ones(1, 1, 2)), TypeError, "q must be float32 or bfloat16"),
    (lambda: (torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3), torch.ones(1, 1, 3), torch.ones(1, 1, 3)), ValueError,
     "head dimension must be even"),
    (lambda: (torch.ones(1, 2, 4, 8), torch.ones(1, 2, 3, 8), torch.ones(1, 4, 8), torch.ones(1, 4, 8)), ValueError,
     "k must have shape"),
    (lambda: (torch.ones(1, 2, 4, 8), torch.ones(1, 2, 4, 8, dtype=torch.bfloat16), torch.ones(1, 4, 8),
              torch.ones(1, 4, 8)), TypeError, "k must be float32"),
    (lambda: (torch.ones(2, 2, 4, 8), torch.ones(2, 2, 4, 8), torch.ones(3, 4, 8), torch.ones(2, 4, 8)), ValueError,
     r"cos must have shape \[2 or 1, 4, 8\]"),
    (lambda: (torch.ones(2, 2, 4, 8), torch.ones(2, 2, 4, 8), torch.ones(2, 4, 8), torch.ones(2, 4)), ValueError,
     "sin must have 3 dimensions"),
    (lambda: (torch.ones(1, 2, 0, 8), torch.ones(1, 2, 0, 8), torch.ones(1, 0, 8), torch.ones(1, 0, 8)), ValueError,
     "q must not be empty"),
])
def test_bad_input_names_the_argument(args, err, msg):
    with pytest.raises(err, match=msg):
        domino_ops.apply_rotary_pos_emb(*args())


def test_op_checks_what_the_wrapper_skips():
    q, k, cos, sin = make(1, 2, 1, 3, 8, torch.float32, 0)
    qo, ko = torch.empty(q.shape), torch.empty(k.shape)
    with pytest.raises(RuntimeError, match="k must have shape"):
        op(q, k[:, :, :2], cos, sin, qo, torch.empty(1, 1, 2, 8))
    with pytest.raises(RuntimeError, match="cos must have shape"):
        op(q, k, cos[:, :2], sin, qo, ko)
    with pytest.raises(RuntimeError, match="q_out must be contiguous"):
        op(q, k, cos, sin, torch.empty(1, 3, 2, 8).transpose(1, 2), ko)
    with pytest.raises(RuntimeError, match="share a dtype"):
        op(q, k, cos.bfloat16(), sin, qo, ko)
    with pytest.raises(RuntimeError, match="contiguous in its last dimension"):
        op(q.transpose(2, 3), k, cos, sin, qo.transpose(2, 3).contiguous(), ko)
    with pytest.raises(RuntimeError, match="even"):
        op(q[..., :3], k[..., :3], cos[..., :3], sin[..., :3], torch.empty(1, 2, 3, 3), torch.empty(1, 1, 3, 3))
    with pytest.raises(RuntimeError, match="q_out must not share memory with q"):
        qq = q.contiguous()
        op(qq, k, cos, sin, qq, ko)
    with pytest.raises(RuntimeError, match="k_out must not share memory with cos"):
        op(q, k, cos, sin, qo, cos.contiguous().view(ko.shape))  # cos [1, 3, 8] as k_out [1, 1, 3, 8]
    with pytest.raises(RuntimeError, match="k_out must not share memory with q_out"):
        op(q, k, cos, sin, qo, qo.view(-1)[:ko.numel()].view(ko.shape))


def test_cos_and_sin_whose_halves_differ():
    """HF's tables repeat the frequencies in both halves of the head dimension, but the op
    computes q * cos + rotate_half(q) * sin for any cos and sin: each half of the output
    takes its own half of the tables (bit for bit with the reference)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g)
    cos, sin = torch.randn(1, 3, 8, generator=g), torch.randn(1, 3, 8, generator=g)
    got, want = domino_ops.apply_rotary_pos_emb(q, k, cos, sin), reference.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_rows_split_across_threads_keep_their_positions():
    """A call large enough to split its rows between two threads (9 + 3 heads x 203
    positions x 64, a position count that divides no chunk): each thread's first row reads
    its own position's tables, bit for bit with the reference."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 9, 203, 64, generator=g), torch.randn(1, 3, 203, 64, generator=g)
    angles = torch.rand(1, 203, 32, generator=g) * 100
    emb = torch.cat([angles, angles], -1)
    with torch_threads(2):
        got = domino_ops.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    want = reference.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
