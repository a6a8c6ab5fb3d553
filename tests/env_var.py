"""A switch for the kernels' environment variables, which the ops read at every call: set
(or, with None, unset) for a block, the old value back after it."""

import contextlib
import os
from unittest import mock


@contextlib.contextmanager
def env_var(name: str, value: str | None):
    with mock.patch.dict(os.environ):  # restores the whole environment after the block
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
        yield
