"""tree_speculative_sampling_target_only on every backend (tree_backends.py: reference,
native CPU, emulated CUDA, Triton): sgl-kernel's hand-built cases, the kernels against the
reference on random trees with poisoned outputs, one-hot targets against
verify_tree_greedy, losslessness with both thresholds 1 (chi-square against the exact
distribution, with negative controls), bad input."""

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from stats import assert_matches_distribution
from tree_backends import ALL, GPU, check_direct_call_raises, check_wrapper_bad_input, params, run_guarded, tree_op, wrapper_params
from tree_backends import with_ as with_args
from tree_cases import NOT_A_TREE, NOT_A_TREE_MESSAGE, chain_tree, links, random_tree, sgl_eagle_case, sgl_verify_args, verify_outputs



def call(outs, candidates, retrive_index, next_token, next_sibling, coins, final_coins, target_probs,
         draft_probs=None, threshold_single=1.0, threshold_acc=1.0, backend="native", checked=True):
    predicts, accept_index, accept_num = outs
    tree_op(backend, "tree_speculative_sampling_target_only", checked=checked)(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
        retrive_index=retrive_index, retrive_next_token=next_token, retrive_next_sibling=next_sibling,
        uniform_samples=coins, uniform_samples_for_final_sampling=final_coins, target_probs=target_probs,
        draft_probs=draft_probs, threshold_single=threshold_single, threshold_acc=threshold_acc,
        deterministic=True)


# --- sgl-kernel's cases ----------------------------------------------------------------------

def sgl_target_probs(logits):
    """sgl-kernel/tests/speculative/test_speculative_sampling.py (sgl-project/sglang): the
    target of the tree of test_eagle_utils.py, softmax(logits / 0.01) (one-hot in float32)."""
    return F.softmax(logits / 0.01, dim=-1)


def sgl_case():
    """tree_cases.sgl_eagle_case's tree with target_probs = sgl_target_probs(logits)."""
    candidates, retrive_index, next_token, next_sibling, logits = sgl_eagle_case()
    return candidates, retrive_index, next_token, next_sibling, sgl_target_probs(logits)


SGL_CASES = [  # threshold_single, threshold_acc, predicts, accept_index, accept_token_num
    (1, 1, [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18], [[0, 3, 4, 5], [6, 10, 11, -1]], [3, 2]),
    (0, 0, [1, 2, 18, -1, -1, -1, 11, -1, -1, -1, 12, 18], [[0, 1, 2, -1], [6, 10, 11, -1]], [2, 2]),
]


@pytest.mark.parametrize("backend", params())
@pytest.mark.parametrize("draft", ["zeros", "none"])
@pytest.mark.parametrize("ts,ta,want_pred,want_index,want_num", SGL_CASES)
def test_sglang_cases(backend, draft, ts, ta, want_pred, want_index, want_num):
    candidates, retrive_index, next_token, next_sibling, target_probs = sgl_case()
    g = torch.Generator().manual_seed(ts)
    coins, final_coins = torch.rand(2, 6, generator=g), torch.rand(2, generator=g)
    outs = verify_outputs(12, 2, 4)
    draft_probs = torch.zeros_like(target_probs) if draft == "zeros" else None
    call(outs, candidates, retrive_index, next_token, next_sibling, coins, final_coins, target_probs, draft_probs,
         threshold_single=ts, threshold_acc=ta, backend=backend)
    assert outs[0].tolist() == want_pred
    assert outs[1].tolist() == want_index
    assert outs[2].tolist() == want_num
    if draft_probs is not None:
        assert not draft_probs.any()  # never written (sgl-kernel scribbles into it)


@pytest.mark.parametrize("backend", params())
def test_rejected_child_is_masked_in_final_sampling(backend):
    """sgl-kernel's rejmask test (test_speculative_sampling.py, newer releases): node 1 is
    accepted by threshold_single (0.95 >= 0.91), node 2 rejected (coin 0.99 > 0.9, 0.9 <
    0.91); the final draw at node 1 must skip the rejected token 5 (mass 0.9) and take 31."""
    candidates = torch.tensor([[0, 3, 5]])
    target_probs = torch.zeros(1, 3, 32)
    target_probs[0, 0, 0], target_probs[0, 0, 3] = 0.05, 0.95
    target_probs[0, 1, 5], target_probs[0, 1, 31] = 0.90, 0.10
    target_probs[0, 2, 0] = 1.0
    next_token, next_sibling = links([chain_tree(3)[1]])
    outs = verify_outputs(3, 1, 3)
    call(outs, candidates, torch.arange(3).view(1, 3), next_token, next_sibling, torch.tensor([[0.0, 0.99, 0.0]]),
         torch.tensor([0.5]), target_probs, threshold_single=0.91, threshold_acc=1.0, backend=backend)
    assert outs[0].tolist() == [3, 31, -1]
    assert outs[1].tolist() == [[0, 1, -1]] and outs[2].tolist() == [1]


@pytest.mark.parametrize("backend", params())
def test_chain_with_one_hot_targets(backend):
    """sgl-kernel's chain test (topk 1, nearly one-hot targets): both drafts accepted within
    num_spec_step 3, then the target's bonus token."""
    candidates = torch.tensor([[0, 3, 5, 7], [0, 4, 6, 8]])
    logits = torch.full((2, 4, 16), -10.0)
    for b in range(2):
        for i in range(3):
            logits[b, i, candidates[b, i + 1]] = 10
    next_token, next_sibling = links([chain_tree(4)[1]] * 2)
    g = torch.Generator().manual_seed(0)
    outs = verify_outputs(8, 2, 3)
    call(outs, candidates, torch.arange(8).view(2, 4), next_token, next_sibling, torch.rand(2, 4, generator=g),
         torch.rand(2, generator=g), F.softmax(logits, dim=-1), backend=backend)
    assert outs[0].tolist() == [3, 5, 7, -1, 4, 6, 8, -1]
    assert outs[1].tolist() == [[0, 1, 2], [4, 5, 6]] and outs[2].tolist() == [2, 2]


@pytest.mark.parametrize("backend", params())
def test_draft_probs_residual(backend):
    """With draft_probs: the final draw is from max(p - q, 0) with the rejected children
    zeroed; after a full acceptance draft_probs is not used."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    q = torch.tensor([0.0, 0.2, 0.0, 0.0])
    target_probs = torch.stack([p, p]).unsqueeze(0).contiguous()  # [1, 2, 4]
    draft_probs = torch.stack([q, torch.tensor([0.0, 0.0, 1.0, 0.0])]).unsqueeze(0).contiguous()
    next_token, next_sibling = links([[[1], []]])
    for final, steps, want in [(0.5, 3, [2, -1]), (0.9, 3, [3, -1]), (0.0, 3, [2, -1])]:
        outs = verify_outputs(2, 1, steps)  # coin 0.9 > p(token 0) = 0.5: rejected
        call(outs, torch.tensor([[0, 0]]), torch.arange(2).view(1, 2), next_token, next_sibling,
             torch.tensor([[0.9, 0.0]]), torch.tensor([final]), target_probs, draft_probs, backend=backend)
        assert outs[0].tolist() == want and outs[2].tolist() == [0]
    # Accepted (coin 0.3 <= 0.5) with num_spec_step 2: the bonus comes from p at node 1,
    # although q there puts all its mass on token 2; final coin 0.75 -> u = 0.75 -> token 2.
    outs = verify_outputs(2, 1, 2)
    call(outs, torch.tensor([[0, 0]]), torch.arange(2).view(1, 2), next_token, next_sibling,
         torch.tensor([[0.3, 0.0]]), torch.tensor([0.75]), target_probs, draft_probs, backend=backend)
    assert outs[0].tolist() == [0, 2] and outs[2].tolist() == [1]


# --- kernels == reference on random trees ----------------------------------------------------

@pytest.mark.parametrize("backend", params(b for b in ALL if b != "reference"))
@given(bs=st.integers(1, 3), n=st.integers(1, 16), steps=st.integers(1, 8), vocab=st.integers(1, 300),
       token_pool=st.integers(1, 6), sharp=st.sampled_from([0.0, 1.0, 8.0]), zeros=st.booleans(),
       thresholds=st.sampled_from([(1.0, 1.0), (0.0, 0.0), (0.9, 0.7), (1.0, 0.5), (0.3, 1.0)]),
       draft=st.sampled_from(["none", "zeros", "random"]), seed=st.integers(0, 2**31 - 1))
def test_kernels_match_reference(backend, bs, n, steps, vocab, token_pool, sharp, zeros, thresholds, draft, seed):
    """Exact equality (all use float32 acceptance sums and float64 residual CDFs; the GPU
    kernels sum the CDF in another order, which could only matter within ~1e-16 of a step).
    Candidates come from a small pool so that siblings repeat tokens; some probabilities are
    zero. Outputs poisoned: slots no node names stay poisoned."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    children = [random_tree(rng, n, max_children=4)[1] for _ in range(bs)]
    next_token, next_sibling = links(children)
    pool = torch.randint(0, vocab, (token_pool,), generator=g)
    candidates = pool[torch.randint(0, token_pool, (bs, n), generator=g)]
    logits = torch.randn(bs, n, vocab, generator=g) * sharp
    if zeros:
        logits[torch.rand(bs, n, vocab, generator=g) < 0.5] = float("-inf")
        logits[..., 0] = 0.0  # keep every row normalisable
    target_probs = F.softmax(logits, dim=-1)
    draft_probs = {"none": None, "zeros": torch.zeros_like(target_probs),
                   "random": F.softmax(torch.randn(bs, n, vocab, generator=g), dim=-1)}[draft]
    coins, final_coins = torch.rand(bs, n, generator=g), torch.rand(bs, generator=g)
    coins[torch.rand(bs, n, generator=g) < 0.1] = 0.0
    ridx = torch.randperm(bs * n, generator=g).view(bs, n).contiguous()
    results = []
    for be in ("reference", backend):
        outs = verify_outputs(bs * n + 2, bs, steps)
        call(outs, candidates, ridx, next_token, next_sibling, coins, final_coins, target_probs, draft_probs,
             *thresholds, backend=be)
        results.append(outs)
        assert (outs[0][ridx.view(-1)] != -7).all() and (outs[0][-2:] == -7).all()
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", params())
@given(bs=st.integers(1, 4), n=st.integers(1, 20), steps=st.integers(1, 8), vocab=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_one_hot_target_is_verify_tree_greedy(bs, n, steps, vocab, seed, backend):
    """With a one-hot target, thresholds 1 and coins > 0 the sampler accepts exactly what
    greedy verification accepts and emits the same tokens."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    children = [random_tree(rng, n)[1] for _ in range(bs)]
    next_token, next_sibling = links(children)
    candidates = torch.randint(0, vocab, (bs, n), generator=g)
    target_predict = torch.randint(0, vocab, (bs, n), generator=g)
    ridx = torch.arange(bs * n).view(bs, n)
    greedy = verify_outputs(bs * n, bs, steps)
    domino_ops.verify_tree_greedy(*greedy, candidates, ridx, next_token, next_sibling, target_predict)
    sampled = verify_outputs(bs * n, bs, steps)
    call(sampled, candidates, ridx, next_token, next_sibling, torch.rand(bs, n, generator=g).clamp_min(1e-6),
         torch.rand(bs, generator=g), F.one_hot(target_predict, vocab).float(), backend=backend)
    for a, b in zip(greedy, sampled):
        assert torch.equal(a, b)


# --- losslessness -------------------------------------------------------------------------------

V = 12
# Requests per distribution check. The GPU backends run emulated (~0.1 ms a request) or
# interpreted (~35 ms) here, so they get smaller populations: the false-failure rate stays
# ALPHA = 1e-6, and at these sizes the lossy negative control still fails with p < 1e-25
# (exactness itself is test_kernels_match_reference's job). The reference equals the
# native kernel there, so it is not sampled again.
SAMPLES = {"native": 40_000, "emulated_cuda": 4_000, "cuda": 40_000, "triton": 200}
DISTRIBUTION_BACKENDS = ("native",) + GPU


def lossless_setup(samples, seed=0):
    """Root -> nodes 1, 2, 3 (the target's three likeliest tokens at the root, in that
    order); node 1 -> nodes 4, 5 (the two likeliest at node 1). ``samples`` copies."""
    g = torch.Generator().manual_seed(seed)
    p = F.softmax(torch.randn(6, V, generator=g), dim=-1)
    top0, top1 = p[0].argsort(descending=True), p[1].argsort(descending=True)
    cand = torch.tensor([0, int(top0[0]), int(top0[1]), int(top0[2]), int(top1[0]), int(top1[1])])
    children = [[1, 2, 3], [4, 5], [], [], [], []]
    next_token, next_sibling = links([children])
    b = samples
    return dict(candidates=cand.expand(b, 6).contiguous(), retrive_index=torch.arange(b * 6).view(b, 6),
                next_token=next_token.expand(b, 6).contiguous(), next_sibling=next_sibling.expand(b, 6).contiguous(),
                coins=torch.rand(b, 6, generator=g), final_coins=torch.rand(b, generator=g),
                target_probs=p.expand(b, 6, V).contiguous(), p=p, samples=b)


def sample_tree(case, backend="native", **kw):
    b = case["samples"]
    outs = verify_outputs(b * 6, b, 3)
    call(outs, case["candidates"], case["retrive_index"], case["next_token"], case["next_sibling"], case["coins"],
         case["final_coins"], case["target_probs"], backend=backend, **kw)
    return outs


@pytest.mark.parametrize("backend", params(DISTRIBUTION_BACKENDS))
def test_lossless_with_thresholds_one(backend):
    """First token ~ p_root exactly (the accepted child or the residual draw); the second,
    given that node 1 was accepted, ~ p_node1."""
    case = lossless_setup(SAMPLES[backend])
    b = case["samples"]
    predicts, accept_index, accept_num = sample_tree(case, backend)
    view = predicts.view(b, 6)
    assert_matches_distribution(view[:, 0].numpy(), case["p"][0].double().numpy(), what="first token")
    took_1 = accept_index[:, 1] == torch.arange(b) * 6 + 1
    assert took_1.sum() > b // 40
    assert_matches_distribution(view[took_1, 1].numpy(), case["p"][1].double().numpy(), what="second token")
    if backend == "native":  # and draft_probs = zeros (what SGLang passes) is the same sampler
        again = sample_tree(case, backend, draft_probs=torch.zeros_like(case["target_probs"]))
        assert all(torch.equal(a, b) for a, b in zip((predicts, accept_index, accept_num), again))


@pytest.mark.parametrize("backend", params(DISTRIBUTION_BACKENDS))
def test_negative_control_lossy_threshold_fails(backend):
    case = lossless_setup(SAMPLES[backend])
    predicts, _, _ = sample_tree(case, backend, threshold_acc=0.5)
    with pytest.raises(AssertionError, match="chi-square"):
        assert_matches_distribution(predicts.view(case["samples"], 6)[:, 0].numpy(), case["p"][0].double().numpy())


def test_negative_control_unmasked_residual_fails():
    """A sampler that redraws from the full target after rejecting every child (not removing
    the rejected children) over-weights them: the check must catch it."""
    case = lossless_setup(SAMPLES["native"])
    b = case["samples"]
    predicts, _, accept_num = sample_tree(case)
    first = predicts.view(b, 6)[:, 0].clone()
    rejected_all = accept_num == 0
    g = torch.Generator().manual_seed(1)
    first[rejected_all] = torch.multinomial(case["p"][0], int(rejected_all.sum()), replacement=True,
                                           generator=g).int()
    with pytest.raises(AssertionError, match="chi-square"):
        assert_matches_distribution(first.numpy(), case["p"][0].double().numpy())


def test_opcheck():
    for zero_draft in (False, True):  # draft_probs None, then zeros (what SGLang passes)
        args = good_args()
        if zero_draft:
            args["draft_probs"] = torch.zeros_like(args["target_probs"])
        torch.library.opcheck(torch.ops.domino_ops.tree_speculative_sampling_target_only.default,
                              tuple(args.values()),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# --- bad input -----------------------------------------------------------------------------

def good_args():
    """sgl-kernel's case with poisoned outputs and random coins, by schema name in schema order."""
    args, logits = sgl_verify_args()
    return dict(args, uniform_samples=torch.rand(2, 6), uniform_samples_for_final_sampling=torch.rand(2),
                target_probs=sgl_target_probs(logits), draft_probs=None, threshold_single=1.0, threshold_acc=1.0,
                deterministic=True)


def with_(**over):
    return with_args(good_args, **over)


WRAPPER_CASES = [
    (with_(uniform_samples=torch.rand(2, 6, dtype=torch.float64)), TypeError, "uniform_samples must be float32"),
    (with_(uniform_samples=torch.rand(2, 5)), ValueError, r"uniform_samples must have shape \[2, 6\]"),
    (with_(uniform_samples_for_final_sampling=torch.rand(2, 1)), ValueError,
     r"uniform_samples_for_final_sampling must have shape \[2\]"),
    (with_(target_probs=torch.rand(2, 6, 20, dtype=torch.bfloat16)), TypeError, "target_probs must be float32"),
    (with_(target_probs=torch.rand(2, 5, 20)), ValueError, r"target_probs must have shape \[2, 6, vocab_size\]"),
    (with_(target_probs=torch.rand(2, 20, 6).transpose(1, 2)), ValueError, "target_probs must be contiguous"),
    (with_(draft_probs=torch.rand(2, 6, 19)), ValueError, "draft_probs must have shape"),
    (with_(draft_probs=torch.rand(2, 6, 20, dtype=torch.float64)), TypeError, "draft_probs must be float32"),
    (with_(draft_probs=1.0), TypeError, "newer sgl-kernel releases dropped draft_probs"),
    (with_(threshold_single=1.5), ValueError, r"threshold_single must be in \[0, 1\]"),
    (with_(threshold_acc=float("nan")), ValueError, r"threshold_acc must be in \[0, 1\]"),
    (with_(threshold_acc=True), TypeError, "threshold_acc must be a number"),
    (with_(deterministic=1), TypeError, "deterministic must be a bool"),
    (with_(candidates=torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 20]])), ValueError,
     r"candidates must be token ids in \[0, 20\)"),
    (with_(retrive_index=torch.full((2, 6), 12)), ValueError, r"retrive_index must be in \[0, .*12\)"),
    (with_(retrive_next_sibling=torch.full((2, 6), 7)), ValueError, "retrive_next_sibling must be -1 or a node"),
    (with_(predicts=torch.zeros(12, dtype=torch.int64)), TypeError, "predicts must be int32"),
]


@pytest.mark.parametrize("backend", wrapper_params())
@pytest.mark.parametrize("args,exc,msg", WRAPPER_CASES)
def test_wrapper_bad_input(args, exc, msg, backend):
    check_wrapper_bad_input("tree_speculative_sampling_target_only", args, exc, msg, backend)


def test_wrapper_takes_numpy_thresholds():
    """NumPy scalars pass as the thresholds they are, as everywhere else in domino_ops (they
    were refused as "must be a number")."""
    import numpy as np

    torch.manual_seed(0)
    a = good_args()
    torch.manual_seed(0)
    b = good_args()  # the same coins
    a.update(threshold_single=np.float32(0.5), threshold_acc=np.float64(0.75))
    b.update(threshold_single=0.5, threshold_acc=0.75)
    domino_ops.tree_speculative_sampling_target_only(**a)
    domino_ops.tree_speculative_sampling_target_only(**b)
    for name in ("predicts", "accept_index", "accept_token_num"):
        assert torch.equal(a[name], b[name]), name
    with pytest.raises(TypeError, match="threshold_single must be a number"):
        domino_ops.tree_speculative_sampling_target_only(**{**good_args(), "threshold_single": np.bool_(True)})


def test_wrapper_accepts_positional_sgl_signature():
    args = good_args()
    domino_ops.tree_speculative_sampling_target_only(*args.values())  # sgl-kernel's positional order
    assert args["accept_token_num"].tolist() == [3, 2]


@pytest.mark.parametrize("backend", wrapper_params())
def test_wrapper_rejects_aliasing(backend):
    args = good_args()
    args["predicts"] = args["target_probs"].view(torch.int32)[0, 0, :12]
    with pytest.raises(ValueError, match="output predicts overlaps input target_probs"):
        domino_ops.tree_speculative_sampling_target_only(**args, backend=backend)


@pytest.mark.parametrize("backend", wrapper_params())
@pytest.mark.parametrize("case", list(NOT_A_TREE))
def test_links_that_do_not_form_a_tree_raise_and_write_nothing(case, backend):
    """As verify_tree_greedy's: refused before the walk, nothing written (no child is ever
    accepted here, so a walk would loop)."""
    outputs = ("predicts", "accept_index", "accept_token_num")
    args = with_(**NOT_A_TREE[case], target_probs=F.one_hot(torch.full((2, 6), 18), 20).float())
    before = [args[k].clone() for k in outputs]
    with pytest.raises(ValueError, match=NOT_A_TREE_MESSAGE):
        domino_ops.tree_speculative_sampling_target_only(**args, backend=backend)
    check_direct_call_raises("tree_speculative_sampling_target_only", args, NOT_A_TREE_MESSAGE)
    assert all(torch.equal(args[k], b) for k, b in zip(outputs, before))


@pytest.mark.parametrize("backend", wrapper_params())
@pytest.mark.parametrize("name", ["uniform_samples", "uniform_samples_for_final_sampling"])
@pytest.mark.parametrize("bad", [-0.5, 1.5, float("nan")])
def test_uniforms_outside_the_unit_interval_raise(name, bad, backend):
    """A coin outside [0, 1] would accept a child of target probability 0 (or draw a token
    of weight 0): refused by the wrapper and the kernel, naming the argument."""
    args = good_args()
    args[name].view(-1)[1] = bad
    with pytest.raises(ValueError, match=rf"{name} must be in \[0, 1\], got"):
        domino_ops.tree_speculative_sampling_target_only(**args, backend=backend)
    check_direct_call_raises("tree_speculative_sampling_target_only", args, rf"{name} must be in \[0, 1\], got")


@pytest.mark.parametrize("backend", params())
def test_coins_of_one_are_taken_as_sgl_kernel_takes_them(backend):
    """sgl-kernel takes any coin, and ``1 - torch.rand`` gives 1 about once in 2^24 draws, so
    a coin of exactly 1 is valid input: at node 0 it accepts no child while the children's
    mass stays below 1 (tokens 3 and 5: 0.5 + 0.3), and the final coin 1 draws the last
    token of positive residual weight (token 9, past the rejected 3 and 5), never one of
    weight 0. At node 1 (request 1, whose root child 4 has mass 1) the coin 1 accepts."""
    candidates = torch.tensor([[0, 3, 5], [0, 4, 6]])
    target_probs = torch.zeros(2, 3, 12)
    target_probs[0, 0, [3, 5, 9, 1]] = torch.tensor([0.5, 0.3, 0.15, 0.05])
    target_probs[1, 0, 4] = 1.0
    target_probs[1, 1, [6, 2]] = torch.tensor([0.25, 0.75])
    target_probs[:, 2, 0] = 1.0
    next_token, next_sibling = links([[[1, 2], [], []], [[1], [2], []]])
    outs = verify_outputs(6, 2, 3)
    call(outs, candidates, torch.arange(6).view(2, 3), next_token, next_sibling, torch.ones(2, 3),
         torch.ones(2), target_probs, backend=backend)
    assert outs[0].tolist() == [9, -1, -1, 4, 2, -1]
    assert outs[1].tolist() == [[0, -1, -1], [3, 4, -1]] and outs[2].tolist() == [0, 1]


DIRECT_CASES = [
    (with_(candidates=torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 20, 12]])),
     r"candidates must be token ids in \[0, 20\), got 20 at node 4 of request 1"),
    (with_(candidates=torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, -1, 12]])), "candidates must be token ids"),
    (with_(retrive_index=torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 12]])), r"retrive_index must be in \[0, "),
    (with_(retrive_next_token=torch.tensor([[1, 2, -1, 4, 5, 6]] * 2)), "retrive_next_token must be -1 or a node"),
    (with_(threshold_single=-0.5), r"threshold_single must be in \[0, 1\]"),
    (with_(threshold_acc=2.0), r"threshold_acc must be in \[0, 1\]"),
    (with_(draft_probs=torch.zeros(2, 6, 21)), "draft_probs must have the shape of target_probs"),
    (with_(uniform_samples=torch.rand(2, 6, dtype=torch.float64)), "uniform_samples must be Float"),
    (with_(target_probs=torch.rand(2, 6, 0)), "target_probs must have shape"),
]


@pytest.mark.parametrize("args,msg", DIRECT_CASES)
def test_direct_call_bad_input_raises(args, msg):
    before = [args[k].clone() for k in ("predicts", "accept_index", "accept_token_num")]
    check_direct_call_raises("tree_speculative_sampling_target_only", args, msg)
    assert all(torch.equal(args[k], b) for k, b in zip(("predicts", "accept_index", "accept_token_num"), before))


def test_direct_call_rejects_aliasing():
    args = good_args()
    args["accept_index"] = args["uniform_samples"].view(torch.int32)[:, :4].contiguous()  # a copy: fine
    torch.ops.domino_ops.tree_speculative_sampling_target_only(*args.values())
    args = good_args()
    args["draft_probs"] = torch.zeros(2, 6, 20)
    args["accept_token_num"] = args["draft_probs"].view(torch.int32)[0, 0, :2]
    check_direct_call_raises("tree_speculative_sampling_target_only", args,
                             "output accept_token_num overlaps input draft_probs")


# --- bad index values on the GPU kernels: no error (no host sync), never out of bounds ----------

BAD_VALUES = {
    "candidates out of range": dict(candidates=torch.tensor([[0, 2**40, 2, 3, 4, 5], [7, 8, 9, 10, -5, 12]])),
    "links out of range": dict(retrive_next_token=torch.tensor([[1, 2, -1, 4, 5, 6]] * 2),
                               retrive_next_sibling=torch.tensor([[-9, 3, -1, 2**40, -1, -1]] * 2)),
    "slots out of range": dict(retrive_index=torch.tensor([[0, 1, 2, 3, 4, 2**40], [-6, 7, 8, 9, 10, 12]])),
    "sibling cycle": dict(retrive_next_sibling=torch.tensor([[-1, 3, -1, 1, -1, -1]] * 2),
                          target_probs=F.one_hot(torch.full((2, 6), 18), 20).float()),
}


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_gpu_kernels_never_go_out_of_bounds_on_bad_values(backend, case):
    """What the CPU kernel rejects, the GPU kernels must survive (tree_common.cuh): outputs
    in guarded buffers, token ids in range."""
    args = with_(**BAD_VALUES[case])
    run_guarded(backend, "tree_speculative_sampling_target_only", args, ("predicts", "accept_index", "accept_token_num"))
    assert ((args["accept_token_num"] >= 0) & (args["accept_token_num"] < 4)).all()


@pytest.mark.parametrize("backend", params())
def test_a_coin_on_a_childs_cumulative_mass_accepts_that_child(backend):
    """sgl-kernel accepts the first child whose cumulative target mass reaches the coin
    (coin <= acc): a coin of exactly 0.25 at a root whose children hold 0.25 and 0.75
    accepts the first (token 3), not the second; then the final draw at node 1 (token 7)."""
    candidates = torch.tensor([[0, 3, 5]])
    target_probs = torch.zeros(1, 3, 8)
    target_probs[0, 0, [3, 5]] = torch.tensor([0.25, 0.75])
    target_probs[0, 1, 7] = 1.0
    target_probs[0, 2, 0] = 1.0
    next_token, next_sibling = links([[[1, 2], [], []]])
    outs = verify_outputs(3, 1, 3)
    call(outs, candidates, torch.arange(3).view(1, 3), next_token, next_sibling, torch.tensor([[0.25, 0.5, 0.5]]),
         torch.tensor([0.5]), target_probs, backend=backend)
    assert outs[0].tolist() == [3, 7, -1]
    assert outs[1].tolist() == [[0, 1, -1]] and outs[2].tolist() == [1]
