"""verify_tree_sampling: a chain gives exactly verify_sampling's result; the native kernel
equals the reference on random trees; losslessness of the first token and of the first two
(chi-square, over trees whose children are drawn without replacement), with negative
controls that a subtly wrong sampler fails; bad input."""

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference_tree
from stats import assert_matches_distribution
from tree_cases import chain_tree, links, random_tree, verify_outputs

BACKENDS = ["native", "reference"]


def call(outs, candidates, retrive_index, next_token, next_sibling, coins, final_coins, target_probs, draft_probs,
         backend=None):
    predicts, accept_index, accept_num = outs
    domino_ops.verify_tree_sampling(predicts, accept_index, accept_num, candidates, retrive_index, next_token,
                                    next_sibling, coins, final_coins, target_probs, draft_probs, backend=backend)


def random_probs(g, *shape, sharpness=1.0, zeros=False):
    p = F.softmax(torch.randn(*shape, generator=g) * sharpness, dim=-1)
    if zeros:  # some tokens impossible
        p = p * (torch.rand(*shape, generator=g) < 0.6)
        p[..., 0] += 1e-3
        p = p / p.sum(-1, keepdim=True)
    return p


# --- a chain is verify_sampling ------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@given(b=st.integers(1, 4), k=st.integers(1, 6), V=st.integers(1, 70), sharpness=st.sampled_from([0.5, 3.0, 30.0]),
       same=st.booleans(), zeros=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_chain_is_verify_sampling(backend, b, k, V, sharpness, same, zeros, seed):
    g = torch.Generator().manual_seed(seed)
    p = random_probs(g, b, k + 1, V, sharpness=sharpness, zeros=zeros)
    q = p[:, :k].clone() if same else random_probs(g, b, k, V, sharpness=sharpness, zeros=zeros)
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(b, k)
    u_accept = torch.rand(b, k, dtype=torch.float64, generator=g)
    u_resample = torch.rand(b, dtype=torch.float64, generator=g)
    out = torch.full((b, k + 1), -7, dtype=torch.int64)
    acc = torch.full((b,), -7, dtype=torch.int64)
    torch.ops.domino_ops.verify_sampling(draft, q, p, u_accept, u_resample, out, acc)

    n = k + 1
    _, children = chain_tree(n)
    next_token, next_sibling = links([children] * b)
    candidates = torch.cat([torch.zeros(b, 1, dtype=torch.long), draft], dim=1)
    coins = torch.cat([torch.rand(b, 1, dtype=torch.float64, generator=g), u_accept], dim=1)
    draft_probs = torch.cat([q, torch.rand(b, 1, V, generator=g)], dim=1)  # the leaf's row is never read
    outs = verify_outputs(b * n, b, n)
    ridx = torch.arange(b * n).view(b, n)
    call(outs, candidates, ridx, next_token, next_sibling, coins, u_resample, p, draft_probs, backend=backend)
    predicts, accept_index, accept_num = outs
    assert torch.equal(accept_num.long(), acc)
    for s in range(b):
        m = int(acc[s])
        assert torch.equal(predicts[ridx[s, :m + 1]].long(), out[s, :m + 1])
        assert torch.equal(accept_index[s].long(), torch.cat([ridx[s, :m + 1], torch.full((k - m,), -1)]))
        assert bool((predicts[ridx[s, m + 1:]] == -1).all())


# --- native == reference ---------------------------------------------------------------------

@given(bs=st.integers(1, 3), n=st.integers(1, 14), steps=st.integers(1, 6), V=st.integers(1, 40),
       sharpness=st.sampled_from([0.5, 3.0, 30.0]), zeros=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_native_matches_reference(bs, n, steps, V, sharpness, zeros, seed):
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    trees = [random_tree(rng, n, max_children=min(V, 3)) for _ in range(bs)]
    next_token, next_sibling = links([children for _, children in trees])
    q = random_probs(g, bs, n, V, sharpness=sharpness)  # full support: a node's children are distinct draws
    p = random_probs(g, bs, n, V, sharpness=sharpness, zeros=zeros)
    candidates = torch.zeros(bs, n, dtype=torch.long)
    for b, (_, children) in enumerate(trees):  # each node's children: distinct draws from q at the node
        for u, kids in enumerate(children):
            if kids:
                drawn = torch.multinomial(q[b, u], len(kids), replacement=False, generator=g)
                candidates[b, kids] = drawn
    coins = torch.rand(bs, n, dtype=torch.float64, generator=g)
    final = torch.rand(bs, dtype=torch.float64, generator=g)
    ridx = torch.randperm(bs * n, generator=g).view(bs, n)  # any slot layout
    results = []
    for backend in BACKENDS:
        outs = verify_outputs(bs * n + 2, bs, steps)
        call(outs, candidates, ridx, next_token, next_sibling, coins, final, p, q, backend=backend)
        results.append(outs)
    for got, want in zip(*results):
        assert torch.equal(got, want), (got, want)
    predicts = results[0][0]
    assert bool((predicts[bs * n:] == -7).all())  # slots no retrive_index names are left alone


# --- losslessness --------------------------------------------------------------------------------

V = 5


def lossless_tables(seed=0):
    """Target P1 [V] at the root and P2 [V, V] after each first token; draft Q1, Q2 peaked
    away from the target, so that the draft's children are often rejected."""
    g = torch.Generator().manual_seed(seed)
    P1, P2 = random_probs(g, V, sharpness=1.5), random_probs(g, V, V, sharpness=1.5)
    Q1, Q2 = random_probs(g, V, sharpness=2.5), random_probs(g, V, V, sharpness=2.5)
    return P1, P2, Q1, Q2


def draws_without_replacement(q: torch.Tensor, m: int, g) -> torch.Tensor:
    """[rows, m] tokens drawn from each row of q [rows, V] without replacement, in draw
    order (Gumbel-top-k)."""
    gumbel = -torch.log(-torch.log(torch.rand(q.shape, generator=g, dtype=torch.float64)))
    return (q.double().log() + gumbel).topk(m, dim=-1).indices


def two_level_round(root_p, root_q, child_p_of, child_q_of, g, backend):
    """One round on ``rows`` trees: root -> nodes 1, 2 (two draws from root_q without
    replacement); node 1 -> 3, 4 and node 2 -> 5, 6 (two draws from the child's draft).
    root_p, root_q [rows, V]; child_*_of(tokens [rows]) -> [rows, V]. Returns the emitted
    tokens [rows, 3] (-1 past the end) and accept counts [rows]."""
    rows = root_p.shape[0]
    n = 7
    first = draws_without_replacement(root_q, 2, g)  # nodes 1, 2
    cand = torch.zeros(rows, n, dtype=torch.long)
    cand[:, 1:3] = first
    tp = torch.empty(rows, n, V)
    dp = torch.empty(rows, n, V)
    tp[:, 0], dp[:, 0] = root_p, root_q
    for j, node in enumerate((1, 2)):
        tp[:, node], dp[:, node] = child_p_of(first[:, j]), child_q_of(first[:, j])
        kids = (3, 4) if node == 1 else (5, 6)
        cand[:, list(kids)] = draws_without_replacement(dp[:, node], 2, g)
    tp[:, 3:] = 1.0 / V  # the bonus after two acceptances: not part of the statistic
    dp[:, 3:] = 1.0 / V
    children = [[1, 2], [3, 4], [5, 6], [], [], [], []]
    next_token, next_sibling = links([children])
    outs = verify_outputs(rows * n, rows, 3)
    ridx = torch.arange(rows * n).view(rows, n)
    call(outs, cand, ridx, next_token.expand(rows, n).contiguous(), next_sibling.expand(rows, n).contiguous(),
         torch.rand(rows, n, dtype=torch.float64, generator=g), torch.rand(rows, dtype=torch.float64, generator=g),
         tp, dp, backend=backend)
    predicts, accept_index, accept_num = outs
    emitted = torch.full((rows, 3), -1, dtype=torch.long)
    for j in range(3):
        slot = accept_index[:, j].long()
        emitted[:, j] = torch.where(slot >= 0, predicts[slot.clamp(min=0)].long(), -1)
    return emitted, accept_num.long()


def first_two_tokens(rows, seed, backend):
    """The first two tokens generation emits, over ``rows`` independent generations: from
    the first round, or the second round's first token when the first emitted only one."""
    P1, P2, Q1, Q2 = lossless_tables()
    g = torch.Generator().manual_seed(seed)
    emitted, acc = two_level_round(P1.expand(rows, V), Q1.expand(rows, V), lambda t: P2[t], lambda t: Q2[t], g,
                                   backend)
    t1, t2 = emitted[:, 0], emitted[:, 1].clone()
    again = acc == 0
    if bool(again.any()):
        t = t1[again]
        emitted2, _ = two_level_round(P2[t], Q2[t], lambda s: P2[s], lambda s: Q2[s], g, backend)
        t2[again] = emitted2[:, 0]
    return t1, t2, acc, (P1, P2)


def assert_lossless(t1, t2, P1, P2):
    assert_matches_distribution(t1.numpy(), P1.double().numpy(), what="first token")
    joint = (P1[:, None] * P2).double().reshape(-1)
    assert_matches_distribution((t1 * V + t2).numpy(), joint.numpy(), what="first two tokens")


def test_lossless_first_token_and_first_two():
    t1, t2, acc, (P1, P2) = first_two_tokens(60_000, seed=1, backend="native")
    assert 0.2 < float((acc == 0).float().mean()) < 0.9 and bool((acc == 2).any())  # every path is exercised
    assert_lossless(t1, t2, P1, P2)


@pytest.mark.parametrize("wrong", ["draft_keeps_rejected_token", "target_not_residual"])
def test_negative_controls_fail(monkeypatch, wrong):
    """A sampler that forgets that siblings are drawn without replacement (the next sibling
    verified against q itself), or that verifies every sibling against the original target
    (no residual), is biased: the same check must catch it."""
    if wrong == "draft_keeps_rejected_token":
        monkeypatch.setattr(reference_tree, "next_draft", lambda q, x: (q, float(q.sum())))
    else:
        monkeypatch.setattr(reference_tree, "next_target", lambda p, pn, q, qn: (p, pn))
    t1, t2, _, (P1, P2) = first_two_tokens(6_000, seed=2, backend="reference")
    with pytest.raises(AssertionError, match="chi-square|zero probability"):
        assert_lossless(t1, t2, P1, P2)


def test_the_correct_reference_passes_the_negative_controls_check():
    t1, t2, _, (P1, P2) = first_two_tokens(6_000, seed=2, backend="reference")
    assert_lossless(t1, t2, P1, P2)


# --- bad input ----------------------------------------------------------------------------------

def good_args(b=2, n=3, V=5):
    next_token, next_sibling = links([[[1, 2], [], []]] * b)
    p = torch.full((b, n, V), 1.0 / V)
    return dict(predicts=torch.zeros(b * n, dtype=torch.int32), accept_index=torch.zeros(b, 2, dtype=torch.int32),
                accept_token_num=torch.zeros(b, dtype=torch.int32), candidates=torch.tensor([[0, 1, 2]] * b),
                retrive_index=torch.arange(b * n).view(b, n), retrive_next_token=next_token,
                retrive_next_sibling=next_sibling, uniform_samples=torch.rand(b, n, dtype=torch.float64),
                uniform_samples_for_final_sampling=torch.rand(b, dtype=torch.float64), target_probs=p,
                draft_probs=p.clone())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("over,exc,msg", [
    (dict(uniform_samples=torch.rand(2, 3)), TypeError, "uniform_samples must be float64"),
    (dict(uniform_samples_for_final_sampling=torch.rand(3, dtype=torch.float64)), ValueError,
     "uniform_samples_for_final_sampling must have shape"),
    (dict(draft_probs=None), TypeError, "draft_probs must be a torch.Tensor"),
    (dict(draft_probs=torch.rand(2, 3, 4)), ValueError, "draft_probs must have shape"),
    (dict(target_probs=torch.rand(2, 3, 5, dtype=torch.float64)), TypeError, "target_probs must be float32"),
    (dict(candidates=torch.tensor([[0, 1, 9]] * 2)), ValueError, "candidates must be token ids"),
    (dict(retrive_next_sibling=torch.tensor([[-1, 2, 1]] * 2),  # both children rejected: the walk loops
          target_probs=F.one_hot(torch.zeros(2, 3, dtype=torch.long), 5).float()), ValueError, "cycle"),
])
def test_wrapper_bad_input(over, exc, msg, backend):
    args = good_args()
    args.update(over)
    with pytest.raises(exc, match=msg):
        domino_ops.verify_tree_sampling(**args, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrapper_rejects_aliasing(backend):
    args = good_args()
    args["accept_token_num"] = args["predicts"][:2]
    with pytest.raises(ValueError, match="output accept_token_num overlaps output predicts"):
        domino_ops.verify_tree_sampling(**args, backend=backend)


def test_direct_call_checks_values_before_writing():
    args = good_args()
    args["candidates"] = torch.tensor([[0, -1, 2]] * 2)
    before = args["predicts"].clone()
    with pytest.raises(RuntimeError, match="candidates must be token ids"):
        torch.ops.domino_ops.verify_tree_sampling(*args.values())
    assert torch.equal(args["predicts"], before)


def test_opcheck():
    torch.library.opcheck(torch.ops.domino_ops.verify_tree_sampling.default, tuple(good_args().values()),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_child_without_draft_mass_is_rejected(backend):
    """A child the draft gives probability 0 (draft_tree's filler past the filtered
    support) could not have been drawn: it is never accepted, whatever the target says."""
    args = good_args()
    args["draft_probs"] = F.one_hot(torch.full((2, 3), 1), 5).float()  # only token 1 (node 1) has mass
    args["uniform_samples"] = torch.zeros(2, 3, dtype=torch.float64)  # accept whatever can be accepted
    domino_ops.verify_tree_sampling(**args, backend=backend)
    # node 1 (token 1, q = 1, p = 0.2) accepted at coin 0; node 2 (token 2, q = 0) is never tried first
    assert args["accept_token_num"].tolist() == [1, 1]
    args = good_args()
    args["draft_probs"] = F.one_hot(torch.full((2, 3), 3), 5).float()  # neither child has draft mass
    args["uniform_samples"] = torch.zeros(2, 3, dtype=torch.float64)
    domino_ops.verify_tree_sampling(**args, backend=backend)
    assert args["accept_token_num"].tolist() == [0, 0]
