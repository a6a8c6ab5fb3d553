"""One torchrun rank of ``training.train`` (argv: the trainer's), then a check that the
process group is gone, whether the run trained or was refused: gloo's worker threads,
alive into the interpreter's exit, once aborted a rank there (where ``training.train.main``
starts the group). Exit status 3 if any is left. ``DATA_FOR_RANK_1``: another --data for
rank 1 (a test of ranks that load different shards)."""
import os
import sys

from training.train import main


def gloo_threads() -> list[str]:
    """The names of this process's gloo threads (``/proc/self/task/*/comm``)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{tid}/comm").read().strip())
        except FileNotFoundError:  # a thread that just ended
            continue
    return [n for n in names if "gloo" in n]


if __name__ == "__main__":
    argv = sys.argv[1:]
    if os.environ.get("RANK") == "1" and "DATA_FOR_RANK_1" in os.environ:
        argv[argv.index("--data") + 1] = os.environ["DATA_FOR_RANK_1"]
    try:
        main(argv)
    finally:
        if left := gloo_threads():
            print(f"rank {os.environ.get('RANK')}: gloo threads alive after training: {left}", file=sys.stderr)
            sys.exit(3)
