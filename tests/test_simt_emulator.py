"""The host SIMT emulator (csrc/simt/) itself: barriers, shuffles, votes, atomics, shared
memory and launch limits behave as on a GPU, a missing __syncthreads is caught, and threads
stopped at barriers the others never reach raise an error."""

import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import domino_simt

CSRC = Path(__file__).resolve().parents[1] / "csrc"
INVALID_CONFIGURATION = 9  # cudaErrorInvalidConfiguration


@pytest.mark.parametrize("blocks,threads", [(1, 32), (1, 64), (3, 128), (2, 256)])
def test_correct_reduction_passes(blocks, threads):
    x = np.random.default_rng(blocks * threads).integers(-8, 9, size=1000).astype(np.float32)
    assert domino_simt.block_sum(x.tolist(), blocks, threads, True) == float(x.sum())


def test_missing_syncthreads_gives_a_wrong_result():
    """Without the barriers the first thread runs the whole tree reduction before its
    partners have written their slots (poisoned NaN), every time."""
    x = [1.0] * 512
    assert math.isnan(domino_simt.block_sum(x, 1, 256, False))


@pytest.mark.parametrize("offset", [1, -1], ids=["reads_higher", "reads_lower"])
def test_a_missing_barrier_is_caught_whichever_neighbour_a_thread_reads(offset):
    """Threads run between barriers in ascending order in even blocks and descending in odd
    ones, so in a grid of two blocks a thread reads its neighbour's slot before the
    neighbour writes it, whether that neighbour is above or below it."""
    T = 64
    x = np.arange(2 * T, dtype=np.float32)
    want = np.concatenate([np.roll(x[:T], -offset), np.roll(x[T:], -offset)])
    np.testing.assert_array_equal(domino_simt.rotate(x.tolist(), 2, offset, True), want)
    racy = np.array(domino_simt.rotate(x.tolist(), 2, offset, False))
    # in one of the blocks every thread but the one whose read wraps around reads too early
    assert max(np.isnan(racy[:T]).sum(), np.isnan(racy[T:]).sum()) >= T - 1, racy


def test_threads_stopped_at_different_barriers_raise_instead_of_hanging():
    with pytest.raises(RuntimeError,
                       match=r"deadlock in block \(0, 0, 0\): 32 threads wait at barriers that cannot complete"):
        domino_simt.divergent_barriers()
    assert domino_simt.block_sum([1.0] * 64, 2, 64, True) == 64.0  # the next launch runs


def _build_tsan(tmp_path):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not found")
    exe = tmp_path / "tsan_main"
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-fsanitize=thread", "-DDOMINO_SIMT", f"-I{CSRC}",
           str(CSRC / "simt" / "tsan_main.cpp"), str(CSRC / "simt" / "simt.cpp"), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True)
    return exe


def test_thread_sanitizer_reports_the_missing_syncthreads(tmp_path):
    exe = _build_tsan(tmp_path)
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66")
    clean = subprocess.run([str(exe), "sync"], capture_output=True, text=True, env=env)
    assert clean.returncode == 0 and "ThreadSanitizer" not in clean.stderr, clean.stderr[-2000:]
    assert "sum=762" in clean.stdout
    racy = subprocess.run([str(exe), "nosync"], capture_output=True, text=True, env=env)
    assert "WARNING: ThreadSanitizer: data race" in racy.stderr
    assert racy.returncode == 66


def test_warp_shuffles_and_votes():
    threads = 64
    out = np.array(domino_simt.warp_ops(threads)).reshape(threads, 8)
    v = 100 * np.arange(threads)
    for t in range(threads):
        lane, base = t % 32, t - t % 32
        down = lane + 1
        assert out[t, 0] == (v[base + down] if down < 32 else v[t])
        assert out[t, 1] == (v[t - 3] if lane >= 3 else v[t])
        assert out[t, 2] == v[base + (lane ^ 5)]
        assert out[t, 3] == v[base + 7]
        seg = lane // 16
        assert out[t, 4] == (v[t + 2] if (lane + 2) // 16 == seg else v[t])
        assert out[t, 5] == sum(1 << l for l in range(32) if l % 3 == 0)
        assert out[t, 6] == 1 and out[t, 7] == 1


def test_atomics_are_atomic():
    counter, maximum, cas = domino_simt.atomics(3, 128)
    assert (counter, maximum, cas) == (384, 383, 384)


def test_dynamic_shared_memory_is_poisoned_per_block():
    assert all(math.isnan(x) for x in domino_simt.read_unwritten_shared(3))


def test_launch_limits_are_a_gpus():
    assert domino_simt.launch_status(2, 64, 0) == 0
    assert domino_simt.launch_status(1, 2048, 0) == INVALID_CONFIGURATION  # > 1024 threads
    assert domino_simt.launch_status(1, 64, 64 * 1024) == INVALID_CONFIGURATION  # > 48 KiB dynamic smem
    assert domino_simt.launch_status(0, 64, 0) == INVALID_CONFIGURATION  # empty grid
