"""One torchrun rank of ``training.train`` (argv: the trainer's), then a check that the
process group is gone: gloo's worker threads, alive into the interpreter's exit, once
aborted a rank there (``training.train.sum_gradients_over_ranks``). Exit status 3 if any is
left."""
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
    main(sys.argv[1:])
    if left := gloo_threads():
        print(f"rank {os.environ.get('RANK')}: gloo threads alive after training: {left}", file=sys.stderr)
        sys.exit(3)
