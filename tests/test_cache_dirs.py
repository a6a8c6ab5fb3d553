"""domino.cache_dirs.write_directory: a cache directory written once, atomically, by
processes or threads that may race to fill it (two data-generation workers converting the
default model on a fresh machine)."""

import threading
import time

import pytest

from domino.cache_dirs import write_directory


def run_writers(out, writes):
    """Runs write_directory(out, w, ...) for each w of ``writes`` in threads of its own;
    returns the errors raised."""
    errors = []

    def run(write):
        try:
            write_directory(out, write, lambda d: (d / "payload").exists())
        except BaseException as e:  # noqa: BLE001 - reported by the test, in its own thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in writes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_two_writers_finishing_together_both_get_the_directory(tmp_path):
    """Both writers complete their copies before either renames (a barrier): the first
    rename wins, the other keeps the winner's copy, and no temporary is left."""
    out = tmp_path / "model"
    barrier = threading.Barrier(2, timeout=60)

    def write(tmp):
        (tmp / "payload").write_text(threading.current_thread().name)
        barrier.wait()

    assert run_writers(out, [write, write]) == []
    assert (out / "payload").exists()
    assert [d.name for d in tmp_path.iterdir()] == ["model"]


def test_a_writer_still_writing_when_another_finishes_is_not_disturbed(tmp_path):
    """The slow writer goes on writing after the fast one has renamed its copy into place
    (they used to share one temporary directory, and the slow one crashed writing into the
    directory the fast one had just renamed)."""
    out = tmp_path / "model"
    slow_started, fast_done = threading.Event(), threading.Event()

    def slow(tmp):
        (tmp / "part").write_text("slow")
        slow_started.set()
        assert fast_done.wait(timeout=60)  # the fast writer has renamed its copy by now
        (tmp / "payload").write_text("slow")

    errors = []
    t = threading.Thread(target=lambda: errors.extend(run_writers(out, [slow])))
    t.start()
    assert slow_started.wait(timeout=60)
    write_directory(out, lambda tmp: (tmp / "payload").write_text("fast"), lambda d: (d / "payload").exists())
    fast_done.set()
    t.join(timeout=120)
    assert errors == []
    assert (out / "payload").read_text() == "fast"  # the first complete copy is kept
    assert [d.name for d in tmp_path.iterdir()] == ["model"]


def test_a_failed_write_leaves_nothing_and_raises(tmp_path):
    out = tmp_path / "model"

    def write(tmp):
        (tmp / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_directory(out, write, lambda d: (d / "half").exists())
    assert list(tmp_path.iterdir()) == []


def test_a_rename_onto_an_incomplete_directory_is_an_error(tmp_path):
    """Someone else's non-empty directory that is not a complete copy is never taken for one."""
    out = tmp_path / "model"
    out.mkdir()
    (out / "stray").write_text("x")
    with pytest.raises(OSError):
        write_directory(out, lambda tmp: (tmp / "payload").write_text("y"), lambda d: (d / "payload").exists())
    assert [d.name for d in tmp_path.iterdir()] == ["model"]


def test_one_conversion_of_the_default_at_a_time(tmp_path, monkeypatch):
    """Two threads loading the default on a fresh cache: one converts, the other waits for
    it and takes its directory (the conversion patches the gguf module for the process:
    two overlapping conversions had left the patch in place for good)."""
    from domino import loading

    monkeypatch.setenv("DOMINO_CACHE", str(tmp_path))
    converting = []

    def convert(out, quiet):
        converting.append(threading.current_thread().name)
        time.sleep(0.3)  # long enough for the other thread to arrive
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"")
        return out

    monkeypatch.setattr(loading, "_convert_smollm2", convert)
    found = []
    threads = [threading.Thread(target=lambda: found.append(loading.smollm2_dir(quiet=True))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(converting) == 1 and found == [tmp_path / "smollm2-135m-instruct"] * 2
