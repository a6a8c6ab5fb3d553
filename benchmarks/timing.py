"""The one timing loop the benchmarks share: warm-up calls excluded, then the median of
``repeats`` timed calls; and the machine's copy bandwidth, printed beside timings that
depend on it (a benchmark script imports them as ``from timing import ...``; the script's
own folder is on sys.path)."""

from __future__ import annotations

import statistics
import time

import torch


def median_seconds(fn, repeats: int, warmup: int = 1, clock=time.perf_counter) -> float:
    """Median seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones, read from
    ``clock`` (time.perf_counter, or time.thread_time for one thread's CPU time)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 7) -> float:
    """STREAM-style copy bandwidth in GB/s: (read + write) bytes / median time of copying a
    ``nbytes`` float32 tensor on the CPU."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), repeats, warmup=2)
    return 2 * nbytes / seconds / 1e9
