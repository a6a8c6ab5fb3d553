"""Choosing a backend: per call (backend=...), by environment (DOMINO_OPS_BACKEND), or
automatically (native, then Triton, then the eager reference)."""

import pytest
import torch

import domino_ops
from domino_ops import select_backend
from kernel_backends import TRITON
from kernel_cases import verify_sampling_population
from stats import assert_matches_distribution

DEV = TRITON.device
pytestmark = pytest.mark.skipif(TRITON.skip_reason is not None, reason=str(TRITON.skip_reason))


def test_backend_is_selectable_per_call_and_by_environment(monkeypatch):
    logits = torch.randn(3, 50, device=DEV)
    expected = logits.argmax(-1)
    for backend in ("native", "triton", "reference"):
        if backend == "native" and not domino_ops.has_kernel("sample", DEV):
            continue
        assert torch.equal(domino_ops.sample(logits, backend=backend), expected)
    monkeypatch.setenv("DOMINO_OPS_BACKEND", "triton")
    assert select_backend("sample", DEV) == "triton"
    monkeypatch.setenv("DOMINO_OPS_BACKEND", "bogus")
    with pytest.raises(ValueError, match="DOMINO_OPS_BACKEND must be one of"):
        select_backend("sample", DEV)
    with pytest.raises(ValueError, match="backend must be one of"):
        domino_ops.sample(logits, backend="cuda")


def test_auto_prefers_native_then_triton_then_reference(monkeypatch):
    monkeypatch.delenv("DOMINO_OPS_BACKEND", raising=False)
    assert select_backend("sample", "cpu") == "native"  # the C++ CPU kernel
    assert select_backend("sample", "meta") == "reference"
    with pytest.raises(RuntimeError, match="no sample kernel for meta"):
        select_backend("sample", "meta", "native")
    monkeypatch.setattr(domino_ops.ops, "has_kernel", lambda op, dev: False)
    assert select_backend("sample", DEV) == "triton"


def test_verify_sampling_with_backend_triton_is_distributed_as_target():
    """Through the public wrapper (its own uniforms from the generator): the first output
    token is distributed as the target p."""
    draft, q, p, target = verify_sampling_population(V=5, N=2000)
    out, _ = domino_ops.verify_sampling(draft.to(DEV), q.to(DEV), p.to(DEV),
                                        generator=torch.Generator(DEV).manual_seed(1), backend="triton")
    assert_matches_distribution(out[:, 0].cpu().numpy(), target, what="first token")


TREE_OPS = ("build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only")


def test_tree_ops_choose_backends_like_the_other_ops(monkeypatch):
    """domino_ops.tree_ops goes through select_backend: backend=, DOMINO_OPS_BACKEND, auto
    (native, then Triton, then the reference); every backend gives the same result."""
    from tree_cases import chain_tree, links, verify_outputs
    monkeypatch.delenv("DOMINO_OPS_BACKEND", raising=False)
    for op in TREE_OPS:
        assert select_backend(op, "cpu") == "native"
        assert select_backend(op, "meta") == "reference"
    ran = []
    real_kernel = domino_ops.triton.kernel
    monkeypatch.setattr(domino_ops.triton, "kernel", lambda op: (ran.append(op), real_kernel(op))[1])
    next_token, next_sibling = links([chain_tree(4)[1]])
    inputs = [t.to(DEV) for t in (torch.tensor([[0, 5, 6, 7]]), torch.arange(4).view(1, 4), next_token, next_sibling,
                                  torch.tensor([[5, 6, 9, 9]]))]

    def run(**kw):
        outs = [t.to(DEV) for t in verify_outputs(4, 1, 4)]
        domino_ops.verify_tree_greedy(*outs, *inputs, **kw)
        return [t.cpu().tolist() for t in outs]

    expected = [[5, 6, 9, -1], [[0, 1, 2, -1]], [2]]
    for backend in ("triton", "reference") + (("native",) if domino_ops.has_kernel("verify_tree_greedy", DEV) else ()):
        assert run(backend=backend) == expected
    assert ran == ["verify_tree_greedy"]
    monkeypatch.setenv("DOMINO_OPS_BACKEND", "triton")
    assert run() == expected and ran == ["verify_tree_greedy"] * 2
    monkeypatch.setenv("DOMINO_OPS_BACKEND", "bogus")
    with pytest.raises(ValueError, match="DOMINO_OPS_BACKEND must be one of"):
        run()
    monkeypatch.delenv("DOMINO_OPS_BACKEND")
    monkeypatch.setattr(domino_ops.ops, "has_kernel", lambda op, dev: False)
    for op in TREE_OPS:
        assert select_backend(op, DEV) == "triton"
