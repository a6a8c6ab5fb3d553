"""Blocks in which a caller promises an object does not change, so that what is derived
from it is looked up once, on entry, instead of at every call: the engine holds its target
(:func:`domino.fast_forward.model_fixed`) and its drafter
(:meth:`domino.model.DominoDraftModel.weights_fixed`) fixed across one call's decoding."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["fixed_block", "fixed_value"]


@contextlib.contextmanager
def fixed_block(state: dict, key: str, derive: Callable[[], Any]) -> Iterator[Any]:
    """A block that keeps ``derive()`` under ``state[key]`` (an object's ``__dict__``) while
    it lasts, made on entry to the outermost block: blocks nest (and may overlap across
    threads), and the value is dropped when the last one ends. Yields the value."""
    held = state.get(key)
    if held is None:
        held = state[key] = [derive(), 0]
    held[1] += 1
    try:
        yield held[0]
    finally:
        held[1] -= 1
        if not held[1]:
            state.pop(key, None)


def fixed_value(state: dict, key: str, absent: Any = None) -> Any:
    """The value a :func:`fixed_block` keeps under ``state[key]``; ``absent`` outside one."""
    held = state.get(key)
    return absent if held is None else held[0]
