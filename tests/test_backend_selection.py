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
