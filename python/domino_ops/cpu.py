"""Which instruction-set build of the C++ CPU kernels runs.

The CPU kernels' vector code is compiled once per instruction set (``avx512`` =
x86-64-v4, ``avx2`` = x86-64-v3 with FMA, ``sse2`` = the x86-64 baseline; ``generic`` on
other architectures). By default every op runs the widest build the CPU supports; the
environment variable ``DOMINO_CPU_ISA`` (``auto`` or a build name) forces one for the
process. It is read once, at the first CPU op; an unknown name, or a build this CPU cannot
run, makes every CPU op raise ``ValueError`` naming the builds this machine runs.

:func:`forced_isa` switches builds inside one process (tests and benchmarks).
"""

from __future__ import annotations

import contextlib

from domino_ops import _C

__all__ = ["isa", "supported_isas", "compiled_isas", "model", "forced_isa"]


def isa() -> str:
    """The build the CPU kernels run now (raises ValueError for a bad ``DOMINO_CPU_ISA``)."""
    return _C.cpu_isa()


def supported_isas() -> list[str]:
    """The builds this CPU can run, widest first."""
    return list(_C.cpu_isas_supported())


def compiled_isas() -> list[str]:
    """The builds compiled into this extension, widest first."""
    return list(_C.cpu_isas_compiled())


def model() -> str:
    """The CPU's brand string with its family and model numbers."""
    return _C.cpu_model()


_FORCED: list[str] = []  # the forced_isa blocks open, innermost last


@contextlib.contextmanager
def forced_isa(name: str):
    """Run the CPU kernels as build ``name`` inside the ``with`` block (ValueError if this
    CPU cannot), then go back to the enclosing block's build, or ``DOMINO_CPU_ISA`` / the
    widest one outside any. Not thread-safe against ops running concurrently in other
    threads."""
    _C._force_cpu_isa(name)
    _FORCED.append(name)
    try:
        yield name
    finally:
        _FORCED.pop()
        _C._force_cpu_isa(_FORCED[-1] if _FORCED else "")
