"""Which instruction-set build of the C++ CPU kernels runs.

The CPU kernels' vector code is compiled once per instruction set (``avx512`` =
x86-64-v4, ``avx2`` = x86-64-v3 with FMA, ``sse2`` = the x86-64 baseline; ``generic`` on
other architectures). By default every op runs the widest build the CPU supports; the
environment variable ``DOMINO_CPU_ISA`` (``auto`` or a build name) forces one for the
process. It is read once, when ``domino_ops`` is imported; an unknown name, or a build this
CPU cannot run, makes every CPU op raise ``ValueError`` naming the builds this machine runs.

:func:`forced_isa` switches builds inside one process (tests and benchmarks).

Three more switches pick a path within a kernel, each named by the environment variable
that sets it at start-up (:data:`KERNEL_SWITCHES`): ``DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH``
(``auto``, ``amx``, ``avx512_bf16``, ``avx2``), ``DOMINO_SMALL_BATCH_ATTENTION_SCORES``
(``auto``, ``amx``, ``vector``) and ``DOMINO_SMALL_BATCH_LINEAR_ISA`` (``avx512_bf16``,
``avx512``, ``avx2``, ``generic``). Each is read once, when ``domino_ops`` is imported, as
``DOMINO_CPU_ISA`` is (read at every call, with the GIL released, they cost a scan of the
environment per kernel call and raced other threads' writes to ``os.environ``: glibc's
``getenv`` against ``setenv``, a segfault); setting the variable later in the process
changes nothing. :func:`kernel_switch` changes one inside a process
(tests and benchmarks); a value is checked where the kernel uses it.
"""

from __future__ import annotations

import contextlib

from domino_ops import _C

__all__ = ["isa", "supported_isas", "compiled_isas", "model", "forced_isa", "KERNEL_SWITCHES", "kernel_switch",
           "kernel_switch_value"]

# the environment variables' names, as the kernels know them (csrc/cpu/kernel_switches.cpp)
KERNEL_SWITCHES: tuple[str, ...] = tuple(_C._kernel_switch_names())


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


def kernel_switch_value(name: str) -> str | None:
    """The value the CPU kernels take for switch ``name`` (one of :data:`KERNEL_SWITCHES`)
    now: the environment variable's at import, or what :func:`kernel_switch` set
    since; None where unset. ValueError for another name."""
    return _C._kernel_switch(name)


@contextlib.contextmanager
def kernel_switch(name: str, value: str | None):
    """Within the ``with`` block the CPU kernels take switch ``name`` (one of
    :data:`KERNEL_SWITCHES`) as ``value`` (None: as if its variable were unset), then the
    value before the block. ``value`` is checked where a kernel uses it (an op call raises
    ValueError naming the variable). Not thread-safe against ops running concurrently in
    other threads (as :func:`forced_isa`)."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"value must be a str or None, got {type(value).__name__}")
    before = _C._kernel_switch(name)
    _C._set_kernel_switch(name, value)
    try:
        yield value
    finally:
        _C._set_kernel_switch(name, before)
