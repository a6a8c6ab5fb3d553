"""domino: lossless Domino speculative decoding on HF transformers targets.

    gen = domino.load_default()                     # SmolLM2-135M-Instruct + its drafter
    res = gen.generate("Write a haiku", max_new_tokens=64)
    res.text, res.token_ids, res.acceptance_lengths, res.tokens_per_second

The names below, and the submodules (``domino.tree``, ``domino.budget``, ...), are imported
when first used: ``import domino`` alone loads neither torch nor transformers, so the
``domino`` command answers ``--help`` and refuses bad arguments without the seconds those
take to import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_EXPORTS = {"DominoConfig": "domino.config", "DominoDraftModel": "domino.model", "DominoGenerator": "domino.generate",
            "GenerationResult": "domino.generate", "SamplingParams": "domino.sampling_params",
            "TreeShape": "domino.tree", "load": "domino.loading", "load_default": "domino.loading"}

__all__ = ["DominoConfig", "DominoDraftModel", "DominoGenerator", "GenerationResult", "SamplingParams", "TreeShape",
           "load", "load_default"]


def __getattr__(name: str):
    """A public name, or a submodule, imported on first use."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from domino.config import DominoConfig
    from domino.generate import DominoGenerator, GenerationResult
    from domino.loading import load, load_default
    from domino.model import DominoDraftModel
    from domino.sampling_params import SamplingParams
    from domino.tree import TreeShape
