"""The one timing loop the benchmarks share: warm-up calls excluded, then the median of
``repeats`` timed calls (a benchmark script imports it as ``from timing import ...``; the
script's own folder is on sys.path)."""

from __future__ import annotations

import statistics
import time


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
