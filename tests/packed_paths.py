"""The products small_batch_linear_packed can run on this CPU ("avx2" FMA tiles on any CPU
with AVX2 and FMA, "avx512_bf16" vectors where it has AVX512-BF16, "amx" tiles where it has
AMX) and a switch between them for the tests of the packed kernel and of
domino_head_expand's packed w2 product: each such test runs once per path."""

import contextlib

import domino_ops
from env_var import env_var

ENV = "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH"


def packed_paths() -> list[str]:
    if not domino_ops.small_batch_linear_packed_supported():
        return []
    with env_var(ENV, None):
        best = domino_ops.small_batch_linear_packed_path()  # AMX, else AVX512-BF16, else AVX2
    return ["avx2"] + (["avx512_bf16"] if best in ("avx512_bf16", "amx") else []) + (["amx"] if best == "amx" else [])


PACKED_PATHS = packed_paths()


@contextlib.contextmanager
def packed_path(name: str):
    """The packed product runs `name` inside the block (the kernel reads ENV at every call)."""
    with env_var(ENV, name):
        assert domino_ops.small_batch_linear_packed_path() == name
        yield
