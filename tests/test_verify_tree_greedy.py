"""verify_tree_greedy on every backend (tree_backends.py: reference, native CPU, emulated
CUDA, Triton): sgl-kernel's hand-built case, random trees against a parent-pointer oracle
with poisoned outputs, a one-branch tree against verify_greedy, and bad input."""

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from tree_backends import GPU, check_direct_call_raises, check_wrapper_bad_input, params, run_guarded, tree_op, wrapper_params
from tree_backends import with_ as with_args
from tree_cases import NOT_A_TREE, NOT_A_TREE_MESSAGE, chain_tree, links, oracle_greedy, random_tree, sgl_eagle_case, sgl_verify_args, verify_outputs



@pytest.mark.parametrize("backend", params())
def test_sglang_case(backend):
    candidates, retrive_index, next_token, next_sibling, logits = sgl_eagle_case()
    predicts, accept_index, accept_num = verify_outputs(12, 2, 4)  # poisoned with -7: the off-path -1s must be written
    tree_op(backend, "verify_tree_greedy")(predicts, accept_index, accept_num, candidates, retrive_index, next_token,
                                           next_sibling, logits.argmax(-1))
    assert predicts.tolist() == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
    assert accept_index.tolist() == [[0, 3, 4, 5], [6, 10, 11, -1]]
    assert accept_num.tolist() == [3, 2]


@pytest.mark.parametrize("backend", params())
@given(bs=st.integers(1, 4), n=st.integers(1, 24), steps=st.integers(1, 8), vocab=st.integers(1, 4),
       permuted=st.booleans(), extra=st.integers(0, 3), seed=st.integers(0, 2**31 - 1))
def test_random_trees_match_parent_pointer_oracle(bs, n, steps, vocab, permuted, extra, seed, backend):
    """Random trees (shuffled sibling order), tiny vocabularies so that paths get accepted,
    retrive_index the identity or a permutation of the predicts slots; outputs poisoned, and
    predicts slots no node names must stay poisoned."""
    rng = random.Random(seed)
    trees = [random_tree(rng, n) for _ in range(bs)]
    children = [c for _, c in trees]
    next_token, next_sibling = links(children)
    g = torch.Generator().manual_seed(seed)
    candidates = torch.randint(0, vocab, (bs, n), generator=g)
    target_predict = torch.randint(0, vocab, (bs, n), generator=g)
    slots = torch.randperm(bs * n, generator=g) if permuted else torch.arange(bs * n)
    retrive_index = slots.view(bs, n).contiguous()
    predicts, accept_index, accept_num = verify_outputs(bs * n + extra, bs, steps)
    expected = oracle_greedy(children, candidates, retrive_index, target_predict, steps, bs * n + extra, predicts)
    tree_op(backend, "verify_tree_greedy")(predicts, accept_index, accept_num, candidates, retrive_index, next_token,
                                           next_sibling, target_predict)
    assert torch.equal(predicts, expected[0])
    assert torch.equal(accept_index, expected[1])
    assert torch.equal(accept_num, expected[2])


@pytest.mark.parametrize("backend", params())
@given(b=st.integers(1, 5), k=st.integers(1, 9), V=st.sampled_from([2, 3, 50]), seed=st.integers(0, 2**31 - 1))
def test_one_branch_tree_is_verify_greedy(b, k, V, seed, backend):
    """A chain of k drafts verified as a tree gives exactly what verify_greedy gives."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, V, generator=g)
    target = logits.argmax(-1)
    # Drafts that agree with the target for a random prefix, then random.
    draft = torch.where(torch.rand(b, k, generator=g) < 0.8, target[:, :k], torch.randint(0, V, (b, k), generator=g))
    out_tokens, num_accepted = domino_ops.verify_greedy(draft, logits)

    n = k + 1
    candidates = torch.cat([torch.zeros(b, 1, dtype=torch.int64), draft], dim=1)
    _, children = chain_tree(n)
    next_token, next_sibling = links([children] * b)
    retrive_index = torch.arange(b * n).view(b, n)
    predicts, accept_index, accept_num = verify_outputs(b * n, b, n)
    tree_op(backend, "verify_tree_greedy")(predicts, accept_index, accept_num, candidates, retrive_index, next_token,
                                           next_sibling, target)
    assert torch.equal(accept_num.long(), num_accepted)
    for s in range(b):
        m = int(num_accepted[s])
        assert predicts[s * n: s * n + m + 1].tolist() == out_tokens[s, : m + 1].tolist()
        assert (predicts[s * n + m + 1: (s + 1) * n] == -1).all()
        assert accept_index[s].tolist() == [s * n + j for j in range(m + 1)] + [-1] * (n - m - 1)


@pytest.mark.parametrize("backend", params())
def test_num_spec_step_limits_the_walk(backend):
    """A chain whose drafts all match: num_spec_step - 1 of them are accepted, the bonus is
    the target's token at the last accepted node; num_spec_step 1 takes the root's token."""
    n = 5
    candidates = torch.tensor([[9, 1, 2, 3, 4]])
    target_predict = torch.tensor([[1, 2, 3, 4, 7]])
    next_token, next_sibling = links([chain_tree(n)[1]])
    for steps, want_pred, want_num in [(1, [1, -1, -1, -1, -1], 0), (3, [1, 2, 3, -1, -1], 2),
                                       (5, [1, 2, 3, 4, 7], 4), (8, [1, 2, 3, 4, 7], 4)]:
        predicts, accept_index, accept_num = verify_outputs(n, 1, steps)
        tree_op(backend, "verify_tree_greedy")(predicts, accept_index, accept_num, candidates,
                                               torch.arange(n).view(1, n), next_token, next_sibling, target_predict)
        assert predicts.tolist() == want_pred and accept_num.tolist() == [want_num]
        assert accept_index.tolist() == [list(range(want_num + 1)) + [-1] * (steps - want_num - 1)]


@pytest.mark.parametrize("backend", params())
def test_first_matching_sibling_wins(backend):
    """Two siblings with the target's token: the first in sibling order is taken."""
    candidates = torch.tensor([[0, 5, 5, 6, 6]])
    # 0 -> [2, 1] (2 first), 2 -> 4, 1 -> 3
    next_token = torch.tensor([[2, 3, 4, -1, -1]])
    next_sibling = torch.tensor([[-1, -1, 1, -1, -1]])
    target_predict = torch.tensor([[5, 6, 6, 0, 0]])
    predicts, accept_index, accept_num = verify_outputs(5, 1, 3)
    tree_op(backend, "verify_tree_greedy")(predicts, accept_index, accept_num, candidates, torch.arange(5).view(1, 5),
                                           next_token, next_sibling, target_predict)
    assert accept_index.tolist() == [[0, 2, 4]] and predicts.tolist() == [5, -1, 6, -1, 0]


def test_opcheck():
    torch.library.opcheck(torch.ops.domino_ops.verify_tree_greedy.default, tuple(good_args().values()),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# --- bad input -----------------------------------------------------------------------------

def good_args():
    """sgl-kernel's case with poisoned outputs, by schema name in schema order."""
    args, logits = sgl_verify_args()
    return dict(args, target_predict=logits.argmax(-1))


def with_(**over):
    return with_args(good_args, **over)


TOKEN_IDS = r"target_predict must hold token ids \(predicts is int32\) in \[0, 2147483648\)"


def off_path(value):
    """sgl-kernel's case with ``value`` as the target's token at a node off every accepted
    path (request 1's node 2: its walk goes 0, 4, 5)."""
    args = good_args()
    args["target_predict"][1, 2] = value
    return args


WRAPPER_CASES = [
    (with_(predicts=torch.zeros(12, dtype=torch.int64)), TypeError, "predicts must be int32"),
    (with_(predicts=torch.zeros(12, 1, dtype=torch.int32)), ValueError, "predicts must have 1 dimension"),
    (with_(accept_index=torch.zeros(2, 0, dtype=torch.int32)), ValueError, "accept_index must have shape"),
    (with_(accept_index=torch.zeros(4, 2, dtype=torch.int32).T), ValueError, "accept_index must be contiguous"),
    (with_(accept_token_num=torch.zeros(3, dtype=torch.int32)), ValueError, r"accept_token_num must have shape \[2\]"),
    (with_(candidates=torch.zeros(2, 6, dtype=torch.int32)), TypeError, "candidates must be int64"),
    (with_(candidates=torch.zeros(2, 0, dtype=torch.int64)), ValueError, "candidates must have at least one node"),
    (with_(retrive_index=torch.zeros(2, 5, dtype=torch.int64)), ValueError, r"retrive_index must have shape \[2, 6\]"),
    (with_(retrive_next_token=torch.full((2, 6), 6)), ValueError, r"retrive_next_token must be -1 or a node in \[0, 6\)"),
    (with_(retrive_next_sibling=torch.full((2, 6), -2)), ValueError, "retrive_next_sibling must be -1 or a node"),
    (with_(retrive_index=torch.full((2, 6), 12)), ValueError, r"retrive_index must be in \[0, .*12\)"),
    (with_(predicts=torch.zeros(10, dtype=torch.int32)), ValueError, r"retrive_index must be in \[0, .*10\)"),
    (with_(target_predict=torch.zeros(2, 6, dtype=torch.int32)), TypeError, "target_predict must be int64"),
    (with_(target_predict=torch.zeros(2, 7, dtype=torch.int64)), ValueError, "target_predict must have shape"),
    (with_(target_predict=None), TypeError, "target_predict must be a torch.Tensor"),
    # every backend refuses a token a cast into int32 predicts would change, on the accepted
    # path (the reference and Triton kernels had written -5, or 2**32 + 7's low bits) or off it
    (with_(target_predict=torch.full((2, 6), -5)), ValueError, TOKEN_IDS),
    (with_(target_predict=torch.full((2, 6), 2 ** 32 + 7)), ValueError, TOKEN_IDS),
    (off_path(-1), ValueError, TOKEN_IDS),
    (off_path(2 ** 31), ValueError, TOKEN_IDS),
]


@pytest.mark.parametrize("backend", wrapper_params())
@pytest.mark.parametrize("args,exc,msg", WRAPPER_CASES)
def test_wrapper_bad_input(args, exc, msg, backend):
    check_wrapper_bad_input("verify_tree_greedy", args, exc, msg, backend)


@pytest.mark.parametrize("backend", wrapper_params())
def test_wrapper_aliasing(backend):
    args = good_args()
    buf = torch.zeros(20, dtype=torch.int32)
    args["predicts"], args["accept_token_num"] = buf[:12], buf[10:12]
    with pytest.raises(ValueError, match="output accept_token_num overlaps output predicts"):
        domino_ops.verify_tree_greedy(**args, backend=backend)
    args = good_args()
    args["accept_index"] = args["target_predict"].view(torch.int32)[0, :8].view(2, 4)
    with pytest.raises(ValueError, match="output accept_index overlaps input target_predict"):
        domino_ops.verify_tree_greedy(**args, backend=backend)


def test_wrapper_layout_and_backend():
    args = good_args()
    args["accept_token_num"] = args["accept_index"][:, 0]  # not contiguous: caught earlier
    with pytest.raises(ValueError, match="accept_token_num must be contiguous"):
        domino_ops.verify_tree_greedy(**args)
    with pytest.raises(ValueError, match="backend must be one of"):
        domino_ops.verify_tree_greedy(**good_args(), backend="cuda")
    with pytest.raises(RuntimeError, match="no verify_tree_greedy kernel for meta"):
        args = {k: v.to("meta") for k, v in good_args().items()}
        domino_ops.verify_tree_greedy(**args, backend="native")


@pytest.mark.parametrize("backend", wrapper_params())
@pytest.mark.parametrize("case", list(NOT_A_TREE))
def test_links_that_do_not_form_a_tree_raise_and_write_nothing(case, backend):
    """A cycle, or the root named as a child or sibling, is refused before the walk (by the
    kernel, and by the wrapper before the reference or Triton): nothing written."""
    outputs = ("predicts", "accept_index", "accept_token_num")
    args = with_(**NOT_A_TREE[case], target_predict=torch.full((2, 6), 17))  # nothing matches: the walk would loop
    before = [args[k].clone() for k in outputs]
    with pytest.raises(ValueError, match=NOT_A_TREE_MESSAGE):
        domino_ops.verify_tree_greedy(**args, backend=backend)
    check_direct_call_raises("verify_tree_greedy", args, NOT_A_TREE_MESSAGE)
    assert all(torch.equal(args[k], b) for k, b in zip(outputs, before))


DIRECT_CASES = [
    (with_(retrive_index=torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 12]])), r"retrive_index must be in \[0, .*12\)"),
    (with_(retrive_index=torch.tensor([[-1, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])), "retrive_index must be in"),
    (with_(predicts=torch.zeros(11, dtype=torch.int32)), r"retrive_index must be in \[0, .*11\)"),
    (with_(retrive_next_token=torch.tensor([[1, 2, -1, 4, 5, 6]] * 2)), "retrive_next_token must be -1 or a node"),
    (with_(retrive_next_sibling=torch.tensor([[-2, 3, -1, -1, -1, -1]] * 2)), "retrive_next_sibling must be -1 or a node"),
    (with_(accept_index=torch.zeros(2, 0, dtype=torch.int32)), "accept_index must have shape"),
    (with_(accept_index=torch.zeros(2, 4, dtype=torch.int64)), "accept_index must be int32"),
    (with_(candidates=torch.zeros(2, 6, dtype=torch.int64).T.contiguous().T), "candidates must be contiguous"),
    (with_(target_predict=torch.zeros(2, 5, dtype=torch.int64)), "target_predict must have shape"),
    # nothing matches: the root's token is the bonus, written into int32 predicts (a cast kept its low bits)
    (with_(target_predict=torch.full((2, 6), 2 ** 32 + 9)), TOKEN_IDS),
    (with_(target_predict=torch.full((2, 6), -3)), TOKEN_IDS),
]


@pytest.mark.parametrize("args,msg", DIRECT_CASES)
def test_direct_call_bad_input_raises(args, msg):
    check_direct_call_raises("verify_tree_greedy", args, msg)


def test_direct_call_rejects_aliasing():
    args = good_args()
    args["predicts"] = args["candidates"].view(torch.int32)[0]  # 12 int32 over request 0's candidates
    check_direct_call_raises("verify_tree_greedy", args, "output predicts overlaps input candidates")


# --- bad index values on the GPU kernels: no error (no host sync), never out of bounds ----------

BAD_VALUES = {
    "links out of range": dict(retrive_next_token=torch.tensor([[1, 2, -1, 4, 5, 6]] * 2),
                               retrive_next_sibling=torch.tensor([[-9, 3, -1, 2**40, -1, -1]] * 2)),
    "slots out of range": dict(retrive_index=torch.tensor([[0, 1, 2, 3, 4, 2**40], [-6, 7, 8, 9, 10, 12]])),
    "sibling cycle": dict(retrive_next_sibling=torch.tensor([[-1, 3, -1, 1, -1, -1], [-1, -1, -1, -1, 1, -1]]),
                          target_predict=torch.full((2, 6), 17)),
}


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_gpu_kernels_never_go_out_of_bounds_on_bad_values(backend, case):
    """What the CPU kernel rejects, the GPU kernels must survive (tree_common.cuh): outputs
    in guarded buffers, every slot in range written as in the valid case."""
    args = with_(**BAD_VALUES[case])
    run_guarded(backend, "verify_tree_greedy", args, ("predicts", "accept_index", "accept_token_num"))
    assert ((args["accept_token_num"] >= 0) & (args["accept_token_num"] < 4)).all()
