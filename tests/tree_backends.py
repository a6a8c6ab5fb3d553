"""The backends every tree-op test runs (test_build_tree_kernel_efficient.py,
test_verify_tree_greedy.py, test_tree_speculative_sampling_target_only.py), in one place:

- ``reference``: the PyTorch reference (domino_ops.reference_tree), through the wrapper;
- ``native``: the C++ CPU kernel, through the wrapper;
- ``emulated_cuda``: the CUDA kernel of csrc/cuda/ under the SIMT emulator
  (torch.ops.domino_simt.<op>, the same tensor adapters as the real CUDA op; no wrapper);
- ``cuda``: the CUDA kernel built into domino_ops._C, through the wrapper, on CUDA copies of
  the arguments (skipped without a GPU and a CUDA build, ``kernel_backends.CUDA``);
- ``triton``: the Triton kernel through the wrapper (``backend="triton"``), interpreted on
  this GPU-less machine (TRITON_INTERPRET=1, conftest) or on the GPU when there is one.

``tree_op(backend, op)`` returns a callable with the wrapper's signature (positional or by
schema name) that writes its outputs in place into the caller's CPU tensors;
``checked=False`` skips the wrapper's value checks (the Triton kernel called directly).
"""

from __future__ import annotations

import functools

import pytest
import torch

import domino_ops
from domino_ops import triton as triton_ops
from kernel_backends import CUDA, TRITON, cuda_kernel, emulated_cuda_kernel

ALL = ("reference", "native", "emulated_cuda", "cuda", "triton")
CPU_KERNELS = ("reference", "native")  # the ones that raise on bad index values
GPU = ("emulated_cuda", "cuda", "triton")  # the ones that never read a bad index (no host checks)
_SKIP = {"cuda": CUDA.skip_reason, "triton": TRITON.skip_reason}


def params(backends=ALL):
    """pytest parameters for ``backend`` (the CUDA and Triton ones skipped where they cannot run)."""
    return [pytest.param(be, id=be, marks=[pytest.mark.skip(reason=_SKIP[be])] if _SKIP.get(be) else [])
            for be in backends]


def _on_device(fn, device):
    """``fn`` run on copies of its tensor arguments on ``device``, copied back after."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        moved = {}

        def to_dev(x):
            if isinstance(x, torch.Tensor):
                moved[id(x)] = (x, x.to(device))
                return moved[id(x)][1]
            return x
        fn(*[to_dev(a) for a in args], **{k: to_dev(v) for k, v in kwargs.items()})
        for host, dev in moved.values():
            host.copy_(dev)
    return run


def wrapper_params():
    """pytest parameters for the wrapper tests, which pass CPU tensors and expect the
    wrapper's checks (index values included) before the kernel: native, reference, and
    Triton where it runs on the CPU (TRITON_INTERPRET=1). With a GPU, backend="triton"
    refuses CPU tensors before any check, and on CUDA tensors index values are not read."""
    marks = [] if TRITON.device == "cpu" else [pytest.mark.skip(reason="Triton runs on the GPU here: it takes no CPU tensors")]
    return [pytest.param("native", id="native"), pytest.param("reference", id="reference"),
            pytest.param("triton", id="triton", marks=marks + ([pytest.mark.skip(reason=_SKIP["triton"])]
                                                                if _SKIP.get("triton") else []))]


def device_of(backend: str) -> str:
    """Where ``backend``'s tensors live: "cuda" for the CUDA kernels, Triton's device for
    Triton, the CPU for the rest (the emulator included)."""
    return {"cuda": "cuda", "triton": TRITON.device}.get(backend, "cpu")


def on_device_of(fn, backend: str):
    """``fn`` (taking CPU tensors, writing outputs in place) run on ``backend``'s device."""
    return fn if device_of(backend) == "cpu" else _on_device(fn, device_of(backend))


def tree_op(backend: str, op: str, *, checked: bool = True):
    """``op`` (e.g. "verify_tree_greedy") on ``backend``."""
    if backend == "emulated_cuda":
        return emulated_cuda_kernel(op)
    if backend == "cuda":  # the wrapper's native kernel for CUDA tensors, or the op itself
        fn = functools.partial(getattr(domino_ops, op), backend="native") if checked else cuda_kernel(op)
    elif backend == "triton" and not checked:
        fn = triton_ops.kernel(op)
    else:
        fn = functools.partial(getattr(domino_ops, op), backend=backend)
    return on_device_of(fn, backend)


def with_(good_args, **over):
    """``good_args()`` with some arguments replaced (the bad-input tables)."""
    args = good_args()
    args.update(over)
    return args


def check_wrapper_bad_input(op: str, args: dict, exc: type[Exception], msg: str, backend: str) -> None:
    """``domino_ops.<op>(**args, backend=backend)`` raises ``exc`` with a message matching the
    regex ``msg`` (one row of a wrapper bad-input table). Index values are checked by the
    native kernel (RuntimeError re-raised as ValueError) or by the wrapper before the
    reference runs, with the same wording."""
    with pytest.raises(exc, match=msg):
        getattr(domino_ops, op)(**args, backend=backend)


def check_direct_call_raises(op: str, args: dict, msg: str) -> None:
    """``torch.ops.domino_ops.<op>`` called with ``args``' values in order (schema order: the
    tables' dicts are built so), skipping the wrapper, raises RuntimeError matching ``msg``:
    the C++ checks refuse on their own."""
    with pytest.raises(RuntimeError, match=msg):
        getattr(torch.ops.domino_ops, op)(*args.values())


GUARD = 16  # elements poisoned on each side of a guarded output


def guarded(t: torch.Tensor):
    """A copy of ``t`` placed in the middle of a larger buffer whose margins are poisoned;
    returns (the view, a function asserting the margins are untouched): an out-of-bounds
    write next to an output shows up there."""
    fill = True if t.dtype == torch.bool else 77
    buf = torch.full((t.numel() + 2 * GUARD,), fill, dtype=t.dtype)
    view = buf[GUARD: GUARD + t.numel()].view(t.shape)
    view.copy_(t)

    def intact():
        assert (buf[:GUARD] == fill).all() and (buf[GUARD + t.numel():] == fill).all(), "write out of bounds"
    return view, intact


def run_guarded(backend: str, op: str, args: dict, outputs) -> None:
    """Runs ``op`` on ``backend`` without the wrapper's value checks, the ``outputs`` named in
    ``args`` moved into guarded buffers (updated in ``args``); asserts nothing was written
    next to them (the GPU kernels' contract for bad index values: no error, no
    out-of-bounds access)."""
    checks = []
    for name in outputs:
        args[name], intact = guarded(args[name])
        checks.append(intact)
    tree_op(backend, op, checked=False)(**args)
    for intact in checks:
        intact()
