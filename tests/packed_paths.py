"""The products small_batch_linear_packed can run on this CPU ("avx2" FMA tiles on any CPU
with AVX2 and FMA, "avx512_bf16" vectors where it has AVX512-BF16, "amx" tiles where it has
AMX) and a switch between them for the tests of the packed kernel and of
domino_head_expand's packed w2 product: each such test runs once per path."""

import contextlib
import os

import domino_ops

ENV = "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH"


def packed_paths() -> list[str]:
    if not domino_ops.small_batch_linear_packed_supported():
        return []
    saved = os.environ.pop(ENV, None)
    try:
        best = domino_ops.small_batch_linear_packed_path()  # AMX, else AVX512-BF16, else AVX2
    finally:
        if saved is not None:
            os.environ[ENV] = saved
    return ["avx2"] + (["avx512_bf16"] if best in ("avx512_bf16", "amx") else []) + (["amx"] if best == "amx" else [])


PACKED_PATHS = packed_paths()


@contextlib.contextmanager
def packed_path(name: str):
    """The packed product runs `name` inside the block (the kernel reads ENV at every call)."""
    saved = os.environ.get(ENV)
    os.environ[ENV] = name
    try:
        assert domino_ops.small_batch_linear_packed_path() == name
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = saved
