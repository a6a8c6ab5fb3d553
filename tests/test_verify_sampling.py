"""verify_sampling: the output is distributed as the target, whatever the draft."""

import numpy as np
import pytest
import torch

import domino_ops
from domino_ops import reference
from conftest import POISON_TOKEN
from kernel_backends import backend_params
from stats import assert_matches_distribution


def dist(V, seed, *, sharp=1.0, zeros=()):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, generator=g) * sharp, -1)
    for z in zeros:
        p[z] = 0
    return p / p.sum()


def run(p_rows, q_rows, N, seed, verifier=domino_ops.verify_sampling):
    """N independent rounds: drafts sampled from q, verified against p."""
    k = q_rows.shape[0]
    g = torch.Generator().manual_seed(seed)
    draft = torch.stack([torch.multinomial(q_rows[i], N, replacement=True, generator=g) for i in range(k)], 1)
    dp = q_rows.expand(N, *q_rows.shape).contiguous()
    tp = p_rows.expand(N, *p_rows.shape).contiguous()
    return verifier(draft, dp, tp, generator=g)


SCENARIOS = {
    "close": (lambda V: [dist(V, 1), dist(V, 2)], lambda V: [dist(V, 1, sharp=0.9), dist(V, 2, sharp=1.1)]),
    "far": (lambda V: [dist(V, 3), dist(V, 4)], lambda V: [dist(V, 5, sharp=3), dist(V, 6, sharp=3)]),
    "draft_misses_support": (lambda V: [dist(V, 7), dist(V, 8)], lambda V: [dist(V, 9, zeros=(0, 1)), dist(V, 10, zeros=(2,))]),
    "target_zeros": (lambda V: [dist(V, 11, zeros=(3, 4)), dist(V, 12, zeros=(0,))], lambda V: [dist(V, 13), dist(V, 14)]),
    "equal": (lambda V: [dist(V, 15), dist(V, 16)], lambda V: [dist(V, 15), dist(V, 16)]),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_output_distributed_as_target(scenario):
    """First emitted token ~ p0; second (when the first draft was accepted) ~ p1; bonus ~ p2."""
    V, N = 8, 40000
    mk_p, mk_q = SCENARIOS[scenario]
    p_rows = torch.stack(mk_p(V) + [dist(V, 99)])  # k = 2, plus the bonus row
    q_rows = torch.stack(mk_q(V))
    out, n = run(p_rows, q_rows, N, seed=123)
    assert_matches_distribution(out[:, 0].numpy(), p_rows[0].numpy(), what="token 0")
    second = out[n >= 1, 1].numpy()
    assert_matches_distribution(second, p_rows[1].numpy(), what="token 1")
    bonus = out[n == 2, 2].numpy()
    if bonus.size > 200:
        assert_matches_distribution(bonus, p_rows[2].numpy(), what="bonus")
    # acceptance rate of the first draft is sum(min(p, q)) (the coupling bound)
    rate = (n >= 1).float().mean().item()
    expect = min(1.0, torch.minimum(p_rows[0], q_rows[0]).sum().item())
    assert abs(rate - expect) < 5 * np.sqrt(expect * (1 - expect) / N) + 1e-9


def wrong_verifier_resamples_from_target(draft, dp, tp, generator=None):
    """A plausible bug: on rejection sample from p instead of the residual max(0, p - q)."""
    out, n = reference.verify_sampling(draft, dp, tp, generator=generator)
    rows = torch.arange(draft.shape[0])
    rejected = n < draft.shape[1]
    redo = torch.multinomial(tp[rows, n], 1, generator=generator)[:, 0]
    out[rows[rejected], n[rejected]] = redo[rejected]
    return out, n


def test_statistical_check_catches_a_biased_verifier():
    V, N = 8, 40000
    mk_p, mk_q = SCENARIOS["far"]
    p_rows = torch.stack(mk_p(V) + [dist(V, 99)])
    q_rows = torch.stack(mk_q(V))
    out, _ = run(p_rows, q_rows, N, seed=123, verifier=wrong_verifier_resamples_from_target)
    with pytest.raises(AssertionError):
        assert_matches_distribution(out[:, 0].numpy(), p_rows[0].numpy())


@pytest.mark.parametrize("b,k,V", [(1, 1, 5), (33, 16, 300), (7, 3, 4099)])
def test_kernel_matches_reference_with_same_uniforms(b, k, V):
    g = torch.Generator().manual_seed(b * 1000 + k)
    q = torch.softmax(torch.randn(b, k, V, generator=g) * 2, -1)
    p = torch.softmax(torch.randn(b, k + 1, V, generator=g) * 2, -1)
    # make some drafts likely under p too, so acceptance lengths vary
    p[:, :k] = 0.5 * p[:, :k] + 0.5 * q
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(b, k)
    out = torch.full((b, k + 1), POISON_TOKEN, dtype=torch.int64)
    acc = torch.full((b,), POISON_TOKEN, dtype=torch.int64)
    # the uniforms the reference draws from a generator seeded 7: [b, k] accept, then [b] resample
    gen = torch.Generator().manual_seed(7)
    ua = torch.rand(b, k, dtype=torch.float64, generator=gen)
    ur = torch.rand(b, dtype=torch.float64, generator=gen)
    torch.ops.domino_ops.verify_sampling(draft, q, p, ua, ur, out, acc)
    r_out, r_acc = reference.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(7))
    assert torch.equal(acc, r_acc) and torch.equal(out, r_out)  # the direct call, poisoned outputs
    w_out, w_acc = domino_ops.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(7))
    assert torch.equal(w_acc, r_acc) and torch.equal(w_out, r_out)  # the wrapper
    for s in range(b):
        m = int(acc[s])
        assert out[s, :m].tolist() == draft[s, :m].tolist()
        assert 0 <= out[s, m] < V and (out[s, m + 1:] == -1).all()


def _zero_mass_case():
    """Two rounds of two drafts: round 0's first draft has p = q = 0 (neither model can
    produce it), round 1's first draft has p = 0 < q. Returns draft, q [2, 2, 5], p [2, 3, 5]."""
    q = torch.full((2, 2, 5), 0.2)
    p = torch.full((2, 3, 5), 0.25)
    draft = torch.tensor([[4, 1], [4, 1]])
    p[:, 0, 4] = 0.0
    q[0, 0, 4], q[0, 0, 0] = 0.0, 0.4
    return draft, q, p


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_a_draft_without_target_mass_is_rejected(backend):
    """Accept when u * q(x) < p(x): a draft the target gives probability 0 is rejected, also
    where the draft gives it 0 too (0 < 0 is false) and at a uniform of 0 (torch.rand gives
    it): the wrapper with any generator, and the op with zero uniforms."""
    draft, q, p = _zero_mass_case()
    for seed in range(5):
        out, n = domino_ops.verify_sampling(draft, q, p, generator=torch.Generator().manual_seed(seed),
                                            backend=backend)
        assert n.tolist() == [0, 0] and 4 not in out[:, 0].tolist()
    if backend == "native":
        out = torch.full((2, 3), POISON_TOKEN, dtype=torch.int64)
        n = torch.full((2,), POISON_TOKEN, dtype=torch.int64)
        torch.ops.domino_ops.verify_sampling(draft, q, p, torch.zeros(2, 2, dtype=torch.float64),
                                             torch.zeros(2, dtype=torch.float64), out, n)
        assert n.tolist() == [0, 0] and 4 not in out[:, 0].tolist() and (out[:, 1:] == -1).all()


@pytest.mark.parametrize("kb", backend_params())
def test_gpu_kernels_reject_a_draft_without_target_mass(kb):
    """The same on the GPU kernels (emulated CUDA, Triton; CUDA where there is a GPU), zero
    uniforms, poisoned outputs."""
    draft, q, p = (t.to(kb.device) for t in _zero_mass_case())
    out = torch.full((2, 3), POISON_TOKEN, dtype=torch.int64, device=kb.device)
    n = torch.full((2,), POISON_TOKEN, dtype=torch.int64, device=kb.device)
    zeros = torch.zeros(2, 2, dtype=torch.float64, device=kb.device)
    kb.kernel("verify_sampling")(draft, q, p, zeros, zeros[:, 0].contiguous(), out, n)
    assert n.tolist() == [0, 0] and 4 not in out[:, 0].tolist() and (out[:, 1:] == -1).all()


def test_a_rejection_that_leaves_no_residual_resamples_from_the_target():
    """The draft (token 0) has no mass under q = p, so it is rejected, and max(0, p - q) has
    no mass: the token comes from p itself (token 2 at a resample uniform of 0.9), not from
    an empty residual (token 0, outside p's support)."""
    p = torch.tensor([[[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]])
    q = p[:, :1].clone()
    out = torch.full((1, 2), POISON_TOKEN, dtype=torch.int64)
    n = torch.full((1,), POISON_TOKEN, dtype=torch.int64)
    torch.ops.domino_ops.verify_sampling(torch.tensor([[0]]), q, p, torch.tensor([[0.3]], dtype=torch.float64),
                                         torch.tensor([0.9], dtype=torch.float64), out, n)
    assert n.tolist() == [0] and out.tolist() == [[2, -1]]
