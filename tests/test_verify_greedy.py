"""verify_greedy: exact agreement with the reference and with a planted acceptance length."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from conftest import POISON_TOKEN


def planted(b, k, V, dtype, seed):
    """Target logits with a clear argmax, drafts that agree for a random prefix length."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, V, generator=g)
    target = torch.randint(0, V, (b, k + 1), generator=g)
    logits.scatter_(-1, target[..., None], 10.0)
    n = torch.randint(0, k + 1, (b,), generator=g)
    draft = target[:, :k].clone()
    for s in range(b):
        if n[s] < k and V > 1:
            draft[s, n[s]] = (target[s, n[s]] + 1 + torch.randint(0, V - 1, (1,), generator=g)) % V
            draft[s, n[s] + 1:] = torch.randint(0, V, (k - n[s] - 1,), generator=g)
    if V == 1:
        n[:] = k
    return draft, logits.to(dtype), target, n


@given(b=st.sampled_from([1, 2, 5, 33]), k=st.sampled_from([1, 2, 7, 16]), V=st.sampled_from([1, 2, 17, 1000, 4099]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31 - 1))
def test_matches_planted_and_reference(b, k, V, dtype, seed):
    draft, logits, target, n = planted(b, k, V, dtype, seed)
    out = torch.full((b, k + 1), POISON_TOKEN, dtype=torch.int64)
    acc = torch.full((b,), POISON_TOKEN, dtype=torch.int64)
    torch.ops.domino_ops.verify_greedy(draft, logits, out, acc)
    assert torch.equal(acc, n)
    for s in range(b):
        m = int(n[s])
        assert out[s, : m + 1].tolist() == target[s, : m + 1].tolist()
        assert (out[s, m + 1:] == -1).all()
    ref_out, ref_acc = reference.verify_greedy(draft, logits)
    assert torch.equal(out, ref_out) and torch.equal(acc, ref_acc)
    w_out, w_acc = domino_ops.verify_greedy(draft, logits)
    assert torch.equal(w_out, ref_out) and torch.equal(w_acc, ref_acc)


def test_full_acceptance_emits_bonus():
    logits = torch.zeros(1, 4, 10)
    logits[0, torch.arange(4), torch.tensor([3, 1, 4, 1])] = 1.0
    out, n = domino_ops.verify_greedy(torch.tensor([[3, 1, 4]]), logits)
    assert n.tolist() == [3] and out.tolist() == [[3, 1, 4, 1]]


def test_first_mismatch_emits_target_token():
    logits = torch.zeros(1, 4, 10)
    logits[0, torch.arange(4), torch.tensor([3, 1, 4, 1])] = 1.0
    out, n = domino_ops.verify_greedy(torch.tensor([[3, 2, 4]]), logits)
    assert n.tolist() == [1] and out.tolist() == [[3, 1, -1, -1]]


def test_non_contiguous_logits_are_accepted():
    draft, logits, target, n = planted(3, 4, 50, torch.float32, 0)
    wide = torch.cat([logits, logits], dim=-1)[..., :50]
    assert not wide.is_contiguous()
    out, acc = domino_ops.verify_greedy(draft, wide)
    assert torch.equal(acc, n)
