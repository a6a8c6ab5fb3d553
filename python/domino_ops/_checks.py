"""Argument validation for the public ops: clear exceptions that name the argument.

TypeError for a wrong type or dtype, ValueError for a wrong shape, device, layout or
range. The C++ kernels check again (RuntimeError) so that a direct ``torch.ops`` call
cannot read out of bounds.
"""

from __future__ import annotations

from typing import Iterable

import torch

FLOAT_OR_BF16 = (torch.float32, torch.bfloat16)


def tensor(name: str, t, *, ndim: int, dtypes: Iterable[torch.dtype], device=None,
           contiguous: bool = False) -> torch.Tensor:
    """Checks that ``t`` is a tensor of rank ``ndim`` with an allowed dtype on ``device``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        names = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must be {names}, got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other arguments are on {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (call .contiguous() once, outside the loop)")
    if t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")
    return t


def shape(name: str, t: torch.Tensor, expected: tuple) -> None:
    """Checks ``t.shape`` against ``expected`` (None entries match any size)."""
    if len(t.shape) != len(expected) or any(e is not None and s != e for s, e in zip(t.shape, expected)):
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")


def sampling_params(temperature, top_k, top_p) -> None:
    """temperature >= 0, integer top_k >= 0, top_p in (0, 1]."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    if not temperature >= 0.0:  # also rejects NaN
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool):
        raise TypeError(f"top_p must be a number, got {type(top_p).__name__}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def token_ids(name: str, t: torch.Tensor, vocab_size: int) -> None:
    """Checks 0 <= t < vocab_size. Reads the values, so only on the CPU (no device sync);
    the CUDA kernels never use a draft id as an address."""
    if t.device.type == "cpu" and t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab_size):
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), "
                         f"got values in [{int(t.min())}, {int(t.max())}]")


def generator(gen, device: torch.device, rows: int | None = None) -> None:
    """None, one torch.Generator on ``device``'s type, or (when ``rows`` is given) a list of
    ``rows`` of them, one per row."""
    if isinstance(gen, (list, tuple)) and rows is not None:
        if len(gen) != rows:
            raise ValueError(f"generator as a list must have one generator per row ({rows}), got {len(gen)}")
        for i, g in enumerate(gen):
            _one_generator(f"generator[{i}]", g, device)
        return
    if gen is not None:
        _one_generator("generator", gen, device)


def _one_generator(name: str, gen, device: torch.device) -> None:
    if not isinstance(gen, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator, a list of them (one per row) or None, "
                        f"got {type(gen).__name__}")
    if gen.device.type != device.type:
        raise ValueError(f"{name} is on {gen.device} but the op runs on {device}")
