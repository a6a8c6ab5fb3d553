"""A switch for the kernels' environment variables, which the ops read at every call: set
(or, with None, unset) for a block, the old value back after it."""

import contextlib
import os


@contextlib.contextmanager
def env_var(name: str, value: str | None):
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
