"""Choosing a backend: per call (backend=...), by environment (DOMINO_OPS_BACKEND), or
automatically (native, then Triton, then the eager reference)."""

import pytest
import torch

import domino_ops
from domino_ops import select_backend
from kernel_backends import TRITON
from kernel_cases import head_rollout_inputs, verify_sampling_population
from poisoned_calls import run_verify_poisoned

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


def test_verify_sampling_with_backend_triton_is_the_triton_kernel_on_the_wrappers_uniforms():
    """Through the public wrapper (its own uniforms from the generator: u_accept [b, k], then
    u_resample [b]), the output is exactly the Triton kernel's on those uniforms, whose law
    test_kernel_backends checks against the target; uniforms drawn in another order, or
    not from the generator, give other tokens."""
    draft, q, p, _ = verify_sampling_population(V=5, N=64)
    args = [x.to(DEV) for x in (draft, q, p)]
    out, accepted = domino_ops.verify_sampling(*args, generator=torch.Generator(DEV).manual_seed(1), backend="triton")
    g = torch.Generator(DEV).manual_seed(1)
    ua, ur = domino_ops.draw_uniforms(tuple(draft.shape), DEV, g), domino_ops.draw_uniforms((draft.shape[0],), DEV, g)
    want_out, want_accepted = run_verify_poisoned(TRITON.kernel("verify_sampling"), *args, ua, ur)
    assert 0 < int(want_accepted.sum()) < draft.numel()  # both uniforms decide some rows
    assert torch.equal(out, want_out) and torch.equal(accepted, want_accepted)


TREE_OPS = ("build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
            "verify_tree_sampling")


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


def test_expand_and_tree_sampling_choose_backends_like_the_other_ops(monkeypatch):
    """domino_head_expand and verify_tree_sampling: native on the CPU, Triton where no native
    kernel exists, the reference on meta; backend="triton" runs the Triton kernel and gives
    the native result (greedy expand; a chain verified with draft = target accepts all)."""
    from tree_cases import chain_tree, links, verify_outputs
    monkeypatch.delenv("DOMINO_OPS_BACKEND", raising=False)
    for op in ("domino_head_expand", "verify_tree_sampling"):
        assert select_backend(op, "cpu") == "native"
        assert select_backend(op, "meta") == "reference"
    ran = []
    real_kernel = domino_ops.triton.kernel
    monkeypatch.setattr(domino_ops.triton, "kernel", lambda op: (ran.append(op), real_kernel(op))[1])
    base, hproj, _, gru_input, w_ih, w_hh, w1s, w2 = [
        x.to(DEV) if x is not None else None
        for x in head_rollout_inputs(2, 3, 40, 8, 8, 8, torch.float32, torch.float32, True, 2)]
    frontier = (torch.zeros(3, 8, device=DEV), torch.tensor([0, 1, 1], device=DEV), torch.tensor([0, 2, 1], device=DEV))
    got = domino_ops.domino_head_expand(base, hproj, *frontier, gru_input, w_ih, w_hh, w1s, w2, num_children=2,
                                        backend="triton")
    assert ran == ["domino_head_expand"]
    want = domino_ops.domino_head_expand(*(x.cpu() if x is not None else None for x in (
        base, hproj, *frontier, gru_input, w_ih, w_hh, w1s, w2)), num_children=2)
    assert torch.equal(got[0].cpu(), want[0])
    n = 4
    next_token, next_sibling = links([chain_tree(n)[1]])
    p = torch.softmax(torch.randn(1, n, 6, generator=torch.Generator().manual_seed(0)), -1)
    tree = [t.to(DEV) for t in (torch.tensor([[0, 1, 2, 3]]), torch.arange(n).view(1, n), next_token, next_sibling,
                                torch.rand(1, n, dtype=torch.float64), torch.rand(1, dtype=torch.float64), p, p)]
    outs = [t.to(DEV) for t in verify_outputs(n, 1, n)]
    domino_ops.verify_tree_sampling(*outs, *tree, backend="triton")
    assert ran == ["domino_head_expand", "verify_tree_sampling"] and outs[2].tolist() == [n - 1]
    monkeypatch.setattr(domino_ops.ops, "has_kernel", lambda op, dev: False)
    assert select_backend("domino_head_expand", DEV) == "triton"
    assert select_backend("verify_tree_sampling", DEV) == "triton"
