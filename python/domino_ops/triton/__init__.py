"""Triton fallbacks of every op, with the dispatcher ops' schemas (outputs passed in).

Used by ``domino_ops.<op>(..., backend="triton")`` or ``DOMINO_OPS_BACKEND=triton``, and
automatically for CUDA tensors when the native CUDA kernels were not compiled. On a CPU
they run under Triton's interpreter (``TRITON_INTERPRET=1``), which is how the tests check
them here; :mod:`domino_ops.triton.aot` compiles each one for sm_80/sm_90 without a GPU.
These functions take arguments as the validating wrappers pass them (shapes, dtypes and
token ids checked): call the wrappers, or ``torch.ops.domino_ops.<op>``, whose C++ checks
guard a direct call, rather than these.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch

OPS = ("domino_head_rollout", "domino_head_expand", "sample", "filtered_probs", "verify_greedy", "verify_sampling",
       "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
       "verify_tree_sampling")


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("triton") is not None  # a filesystem search: once per process


def available(device) -> bool:
    """Whether the Triton kernels can run on ``device``: a CUDA device with triton
    installed, or the CPU under the interpreter (TRITON_INTERPRET=1)."""
    if not _installed():
        return False
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available()
    return kind == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def kernel(op: str):
    """The Triton implementation of ``op``, the function ``op`` of the module
    ``domino_ops.triton.<op>`` (imported on first use: triton is heavy)."""
    if op not in OPS:
        raise ValueError(f"no Triton kernel for {op!r}; the ops are {OPS}")
    return getattr(importlib.import_module(f"domino_ops.triton.{op}"), op)
