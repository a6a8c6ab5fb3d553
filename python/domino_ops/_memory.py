"""CPU buffers backed by transparent huge pages, for weights that are streamed whole at
every step.

Why: a decode or verification forward reads every weight once, sequentially. In 4 KiB
pages a 270 MB stream crosses 66,000 page boundaries, each a TLB miss, and the hardware
prefetchers stop at every one of them. In 2 MiB pages the stream crosses 135.
SmolLM2-135M's packed linears, M = 1 and 16 rows, Zen 4, both pages side by side in one
run: 9.86 -> 9.16 ms and 13.92 -> 12.83 ms (benchmarks/bench_linear.py, "pages" table).
"""

from __future__ import annotations

import mmap

import torch

__all__ = ["HUGE_PAGE_BYTES", "huge_page_empty"]

HUGE_PAGE_BYTES = 2 << 20  # x86-64 and arm64 (4 KiB granule) transparent huge pages


def huge_page_empty(nbytes: int) -> torch.Tensor:
    """An uninitialised uint8 CPU tensor of ``nbytes`` bytes (a 1-D view, ``nbytes`` long).

    From 2 MiB up, on Linux: a private anonymous mapping, its start aligned to 2 MiB and
    advised ``madvise(MADV_HUGEPAGE)``, so the kernel backs it with transparent huge pages
    when its THP mode is "always" or "madvise" (and plain pages under "never", or when no
    huge page is free). The tensor keeps the mapping alive; it is unmapped when the last
    view of it dies. Below 2 MiB, or where ``mmap.MADV_HUGEPAGE`` does not exist (not
    Linux): ``torch.empty``.
    """
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
    if nbytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(nbytes, dtype=torch.uint8)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel built without THP: plain pages
        pass
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # holds a reference to the mapping
    start = -whole.data_ptr() % HUGE_PAGE_BYTES
    return whole[start:start + nbytes]
