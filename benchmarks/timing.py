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


def interleaved_median_seconds(fns, repeats: int, warmup: int = 1, block: int = 3) -> list[float]:
    """Median seconds of each of ``fns`` over ``repeats`` timed calls, the functions taking
    turns in blocks of ``block`` timed calls, each block after ``warmup`` untimed ones (so
    each is timed in its own steady state, not in the cache the other left), so a machine
    whose speed drifts weighs on all of them alike (a ratio of two timed one after the
    other favours whichever ran in the faster minutes)."""
    times = [[] for _ in fns]
    while len(times[0]) < repeats:
        for fn, ts in zip(fns, times):
            for _ in range(warmup):
                fn()
            for _ in range(min(block, repeats - len(ts))):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def copy_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 7) -> float:
    """STREAM-style copy bandwidth in GB/s: (read + write) bytes / median time of copying a
    ``nbytes`` float32 tensor on the CPU."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), repeats, warmup=2)
    return 2 * nbytes / seconds / 1e9
