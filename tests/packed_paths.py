"""The products small_batch_linear_packed can run on this CPU ("avx2" FMA tiles on any CPU
with AVX2 and FMA, "avx512_bf16" vectors where it has AVX512-BF16, "amx" tiles where it has
AMX) and a switch between them for the tests of the packed kernel and of
domino_head_expand's packed w2 product: each such test runs once per path. And the dtypes
whose switched layers run the packed product here (PACKED), with a mark for the tests of
what needs one (the fast forward, the layer and context ops)."""

import contextlib

import pytest
import torch

import domino_ops
import domino_ops.cpu  # noqa: F401  (kernel_switch; not imported by the package itself)
from domino.fast_linear import runs_packed, use_small_batch_linear

ENV = "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH"


def packed_paths() -> list[str]:
    if not domino_ops.small_batch_linear_packed_supported():
        return []
    with domino_ops.cpu.kernel_switch(ENV, None):
        best = domino_ops.small_batch_linear_packed_path()  # AMX, else AVX512-BF16, else AVX2
    return ["avx2"] + (["avx512_bf16"] if best in ("avx512_bf16", "amx") else []) + (["amx"] if best == "amx" else [])


PACKED_PATHS = packed_paths()


@contextlib.contextmanager
def packed_path(name: str):
    """The packed product runs `name` inside the block (domino_ops.cpu.kernel_switch)."""
    with domino_ops.cpu.kernel_switch(ENV, name):
        assert domino_ops.small_batch_linear_packed_path() == name
        yield


PACKED = [dt for dt in (torch.bfloat16, torch.float32)
          if runs_packed(use_small_batch_linear(torch.nn.Linear(4, 4).to(dt)), dt)]
needs_packed = pytest.mark.skipif(not PACKED, reason="this CPU runs no packed linear kernel")
