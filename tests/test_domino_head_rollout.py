"""domino_head_rollout: CPU kernel and reference against an independent float64 oracle."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from stats import assert_matches_distribution
from conftest import POISON_TOKEN

WEIGHT_DTYPES = [torch.float32, torch.bfloat16]


def make_inputs(b, k, V, r, G, H, wdtype, base_dtype, table, seed):
    """Random head inputs scaled so the correction and the GRU path change the argmax."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0, dtype=wdtype):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    base = rnd(b, k, V, scale=1.5, dtype=base_dtype)
    hproj = rnd(b, k, r, dtype=torch.float32)
    state = rnd(b, G, scale=0.5, dtype=torch.float32)
    w_hh = rnd(3 * G, G, scale=1.5 / math.sqrt(G))
    w1s = rnd(r, G, scale=2.0 / math.sqrt(G))
    w2 = rnd(V, r, scale=1.5 / math.sqrt(r))
    if table:
        return base, hproj, state, rnd(V, 3 * G), None, w_hh, w1s, w2
    return base, hproj, state, rnd(V, H), rnd(3 * G, H, scale=1.0 / math.sqrt(H)), w_hh, w1s, w2


def oracle(base, hproj, state, gru_input, w_ih, w_hh, w1s, w2, forced=None):
    """float64 rollout written from the paper's equations with torch.nn.GRUCell.

    With ``forced`` [b, k] tokens the GRU is fed those instead of the argmax (to get the
    exact conditional distributions of a sampled rollout). Returns tokens, logprobs of the
    argmax, final state, final logits [b, k, V] and the top-1 margin per step.
    """
    d = torch.float64
    b, k, V = base.shape
    G = w_hh.shape[1]
    if w_ih is None:  # table mode == GRUCell over one-hot inputs with weight_ih = table.T
        cell = torch.nn.GRUCell(V, G, bias=False, dtype=d)
        cell.weight_ih.data.copy_(gru_input.to(d).T)
        embed = lambda x: F.one_hot(x, V).to(d)  # noqa: E731
    else:
        cell = torch.nn.GRUCell(w_ih.shape[1], G, bias=False, dtype=d)
        cell.weight_ih.data.copy_(w_ih.to(d))
        embed = lambda x: gru_input.to(d)[x]  # noqa: E731
    cell.weight_hh.data.copy_(w_hh.to(d))
    S = state.to(d)
    tokens, logprobs, logits, margins = [], [], [], []
    with torch.no_grad():
        for i in range(k):
            a = F.silu(hproj[:, i].to(d) + S @ w1s.to(d).T)
            L = base[:, i].to(d) + a @ w2.to(d).T
            top2 = L.topk(min(2, V), dim=-1).values
            margins.append(top2[:, 0] - top2[:, -1] if V > 1 else torch.full((b,), math.inf, dtype=d))
            x = L.argmax(-1) if forced is None else forced[:, i]
            tokens.append(x)
            logprobs.append(torch.log_softmax(L, -1).gather(-1, x[:, None])[:, 0])
            logits.append(L)
            S = cell(embed(x), S)
    return (torch.stack(tokens, 1), torch.stack(logprobs, 1), S, torch.stack(logits, 1),
            torch.stack(margins, 1))


def call_kernel_poisoned(inputs, *, write_logits=False):
    """Calls the dispatcher op directly with outputs pre-filled with garbage."""
    base, hproj, state, gru_input, w_ih, w_hh, w1s, w2 = inputs
    b, k, _ = base.shape
    tokens = torch.full((b, k), POISON_TOKEN, dtype=torch.int64)
    logprobs = torch.full((b, k), float("nan"))
    state_out = torch.full_like(state, float("nan"))
    torch.ops.domino_ops.domino_head_rollout(base, hproj, state, gru_input, w_ih, w_hh, w1s, w2, 0.0, 0, 1.0,
                                             None, write_logits, tokens, logprobs, state_out)
    return tokens, logprobs, state_out


shape_strategy = st.fixed_dictionaries({
    "b": st.sampled_from([1, 2, 3, 8, 33]),
    "k": st.sampled_from([1, 2, 5, 16]),
    "V": st.sampled_from([1, 2, 17, 100, 257, 1000, 4099]),
    "r": st.sampled_from([1, 3, 16, 33, 64]),
    "G": st.sampled_from([1, 5, 16, 40]),
    "H": st.sampled_from([1, 7, 32]),
    "wdtype": st.sampled_from(WEIGHT_DTYPES),
    "base_dtype": st.sampled_from(WEIGHT_DTYPES),
    "table": st.booleans(),
    "seed": st.integers(0, 2**31 - 1),
})

# fp32 accumulation differs from the float64 oracle by far less than this; an argmax whose
# margin is below it is a coin toss for any implementation, so such examples are skipped.
MARGIN = 1e-3


@given(shape_strategy)
def test_greedy_kernel_matches_oracle(p):
    inputs = make_inputs(**p)
    tokens_ref, lp_ref, S_ref, _, margins = oracle(*inputs)
    assume(bool((margins > MARGIN).all()))
    tokens, logprobs, state_out = call_kernel_poisoned(inputs)
    assert torch.equal(tokens, tokens_ref)
    torch.testing.assert_close(logprobs, lp_ref.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state_out, S_ref.float(), rtol=1e-4, atol=1e-5)


@given(shape_strategy)
def test_greedy_wrapper_matches_reference(p):
    """The public wrapper and the eager reference agree (reference on float64 weights)."""
    inputs = make_inputs(**p)
    _, _, _, _, margins = oracle(*inputs)
    assume(bool((margins > MARGIN).all()))
    as64 = [x.double() if x is not None and i >= 3 else x for i, x in enumerate(inputs)]
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*as64)
    t, lp, s = domino_ops.domino_head_rollout(*inputs)
    assert torch.equal(t, t_ref)
    torch.testing.assert_close(lp, lp_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)


@given(shape_strategy)
def test_write_logits_writes_final_logits(p):
    inputs = make_inputs(**p)
    _, _, _, L_ref, margins = oracle(*inputs)
    assume(bool((margins > MARGIN).all()))
    base = inputs[0].clone()
    call_kernel_poisoned((base,) + inputs[1:], write_logits=True)
    tol = 1e-4 if base.dtype == torch.float32 else 1e-2
    torch.testing.assert_close(base.double(), L_ref.to(base.dtype).double(), rtol=tol, atol=tol)


def test_without_write_logits_base_is_untouched():
    inputs = make_inputs(3, 4, 300, 8, 16, 8, torch.float32, torch.float32, True, 1)
    before = inputs[0].clone()
    domino_ops.domino_head_rollout(*inputs)
    assert torch.equal(inputs[0], before)


def test_eager_reference_in_bf16_is_close_to_oracle():
    """The reference computes in the weights' dtype (the eager baseline): close, not exact."""
    inputs = make_inputs(2, 4, 500, 16, 16, 16, torch.bfloat16, torch.float32, False, 3)
    _, lp_ref, S_ref, _, _ = oracle(*inputs)
    _, lp, S = reference.domino_head_rollout(*inputs)
    torch.testing.assert_close(S, S_ref.float(), rtol=0.05, atol=0.05)


# ---- sampling (T > 0): statistics against the exact distribution ------------------------

def filtered_probs(L, temperature, top_k, top_p):
    """Exact filtered distribution of one logit row (numpy float64), written independently."""
    z = np.asarray(L, dtype=np.float64) / temperature
    keep = np.ones_like(z, dtype=bool)
    if 0 < top_k < z.size:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-z, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        drop = np.zeros_like(keep)
        drop[order] = before >= top_p
        p = np.where(drop, 0.0, p)
        p /= p.sum()
    return p


@pytest.mark.parametrize("wdtype", WEIGHT_DTYPES)
@pytest.mark.parametrize("table", [True, False])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (1.0, 4, 0.9)])
def test_sampled_rollout_joint_distribution(wdtype, table, temperature, top_k, top_p):
    """Two steps sampled for N identical sequences: the joint law of (x0, x1) must be
    p(x0) * p(x1 | x0), where x1's distribution depends on x0 through the GRU."""
    V, N = 6, 12000
    one = make_inputs(1, 2, V, 4, 5, 3, wdtype, torch.float32, table, seed=11)
    inputs = [x.expand(N, *x.shape[1:]).contiguous() if i < 3 else x for i, x in enumerate(one)]
    gen = torch.Generator().manual_seed(5)
    tokens, logprobs, _ = domino_ops.domino_head_rollout(*inputs, temperature=temperature, top_k=top_k,
                                                         top_p=top_p, generator=gen)
    # exact joint distribution from the oracle with x0 forced to each value
    joint = np.zeros((V, V))
    forced = torch.stack([torch.arange(V), torch.zeros(V, dtype=torch.int64)], 1)
    rows = [x.expand(V, *x.shape[1:]) if i < 3 else x for i, x in enumerate(one)]
    _, _, _, L, _ = oracle(*rows, forced=forced)
    p0 = filtered_probs(L[0, 0].numpy(), temperature, top_k, top_p)
    for x0 in range(V):
        joint[x0] = p0[x0] * filtered_probs(L[x0, 1].numpy(), temperature, top_k, top_p)
    pairs = (tokens[:, 0] * V + tokens[:, 1]).numpy()
    assert_matches_distribution(pairs, joint.ravel(), what="(x0, x1)")
    # logprobs are those of the filtered distribution the token was drawn from
    lp0 = np.log(p0[tokens[:, 0].numpy()])
    np.testing.assert_allclose(logprobs[:, 0].numpy(), lp0, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("wdtype", WEIGHT_DTYPES)
def test_sampled_rollout_same_uniforms_as_reference(wdtype):
    """Same generator state: kernel and reference draw the same tokens (CDF-boundary ties
    aside, which random float inputs essentially never hit)."""
    inputs = make_inputs(64, 6, 300, 16, 16, 8, wdtype, torch.float32, True, seed=2)
    as64 = [x.double() if x is not None and i >= 3 else x for i, x in enumerate(inputs)]
    kw = dict(temperature=0.9, top_k=50, top_p=0.95)
    t, lp, s = domino_ops.domino_head_rollout(*inputs, generator=torch.Generator().manual_seed(9), **kw)
    t_ref, lp_ref, s_ref = reference.domino_head_rollout(*as64, generator=torch.Generator().manual_seed(9), **kw)
    assert (t == t_ref).float().mean() >= 0.99
    same = (t == t_ref).all(dim=1)
    torch.testing.assert_close(lp[same], lp_ref[same], rtol=1e-4, atol=1e-4)


def test_write_logits_at_temperature_gives_draft_distribution():
    """With write_logits the caller can rebuild the exact draft distribution q of each token."""
    inputs = make_inputs(4, 5, 200, 8, 8, 8, torch.float32, torch.float32, True, seed=4)
    base = inputs[0].clone()
    t, lp, _ = domino_ops.domino_head_rollout(base, *inputs[1:], temperature=0.8,
                                              generator=torch.Generator().manual_seed(0), write_logits=True)
    q = torch.log_softmax(base / 0.8, dim=-1).gather(-1, t[..., None])[..., 0]
    torch.testing.assert_close(lp, q, rtol=1e-4, atol=1e-4)


def test_generator_makes_sampling_reproducible():
    inputs = make_inputs(8, 4, 100, 8, 8, 8, torch.float32, torch.float32, True, seed=6)
    a = domino_ops.domino_head_rollout(*inputs, temperature=1.0, generator=torch.Generator().manual_seed(1))
    b = domino_ops.domino_head_rollout(*inputs, temperature=1.0, generator=torch.Generator().manual_seed(1))
    c = domino_ops.domino_head_rollout(*inputs, temperature=1.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a[0], b[0])
    assert not torch.equal(a[0], c[0])
