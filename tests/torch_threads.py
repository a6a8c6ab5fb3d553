"""Test infrastructure: run a block on a given number of torch intra-op threads."""

import contextlib

import torch


@contextlib.contextmanager
def torch_threads(n: int):
    """torch.set_num_threads(n) inside the block, the caller's count restored after it.
    Tests of invariance across thread counts compare 1 against 2 or more, set here: under
    `make test` a worker's own share of the cores may be a single thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
