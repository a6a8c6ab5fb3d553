"""Argument validation for the public ops: clear exceptions that name the argument.

TypeError for a wrong type or dtype, ValueError for a wrong shape, device, layout or
range. The C++ kernels check again (RuntimeError) so that a direct ``torch.ops`` call
cannot read out of bounds.
"""

from __future__ import annotations

import numbers
from typing import Iterable

import numpy as np
import torch

FLOAT_OR_BF16 = (torch.float32, torch.bfloat16)
FLOAT32_MAX = torch.finfo(torch.float32).max


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
    if t.shape == expected:  # the common case in one comparison: 0.13 against 0.57 us a call
        return
    if len(t.shape) != len(expected) or any(e is not None and s != e for s, e in zip(t.shape, expected)):
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(t.shape)}")


def sampling_params(temperature, top_k, top_p, rows: int | None = None, device=None) -> tuple:
    """temperature >= 0, integer top_k >= 0, top_p in (0, 1]: each a Python number or, when
    ``rows`` is given, a [rows] tensor on ``device`` (one value per row). Tensor values are
    checked on the host, except while a CUDA graph is being captured (no sync there).
    Returns the three with numbers as Python's float / int / float (a NumPy scalar or a
    ``fractions.Fraction`` then works in every backend), tensors as they are."""
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 0):
        raise ValueError(f"rows must be None or an int >= 0, got {rows!r}")
    if device is not None and not isinstance(device, torch.device):
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device must be a torch.device or a device string, got {device!r}") from e
    _param("temperature", temperature, rows, device, integer=False)
    _param("top_k", top_k, rows, device, integer=True)
    _param("top_p", top_p, rows, device, integer=False)
    # the kernels divide in float32: a temperature past its largest value would be inf there
    # (every token tied), so "finite" means finite in float32
    if not isinstance(temperature, torch.Tensor) and not 0.0 <= temperature <= FLOAT32_MAX:  # also rejects NaN
        raise ValueError(f"temperature must be finite and >= 0 (finite in float32: <= {FLOAT32_MAX:.4g}), "
                         f"got {temperature!r:.60}")
    if not isinstance(top_k, torch.Tensor) and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if not isinstance(top_p, torch.Tensor) and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    as_python = (temperature if isinstance(temperature, torch.Tensor) else float(temperature),
                 top_k if isinstance(top_k, torch.Tensor) else int(top_k),
                 top_p if isinstance(top_p, torch.Tensor) else float(top_p))
    if _capturing(device):
        return as_python
    if isinstance(temperature, torch.Tensor) and not bool(((temperature >= 0) & (temperature <= FLOAT32_MAX)).all()):
        raise ValueError(f"temperature must be finite and >= 0 in every row (finite in float32), "
                         f"got {temperature.tolist()}")
    if isinstance(top_k, torch.Tensor) and bool((top_k < 0).any()):
        raise ValueError(f"top_k must be >= 0 in every row (0 disables it), got {top_k.tolist()}")
    if isinstance(top_p, torch.Tensor) and not bool(((top_p > 0) & (top_p <= 1)).all()):
        raise ValueError(f"top_p must be in (0, 1] in every row, got {top_p.tolist()}")
    return as_python


# the integer dtypes a per-row integer parameter may have: those with CPU comparison kernels
_INTEGER_PARAM_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _param(name, value, rows, device, integer: bool) -> None:
    if isinstance(value, torch.Tensor):
        if rows is None:
            raise TypeError(f"{name} must be a number here, got a tensor")
        if value.dim() != 1 or value.shape[0] != rows:
            raise ValueError(f"{name} as a tensor must have shape [{rows}] (one value per row), "
                             f"got {list(value.shape)}")
        if integer != (not value.dtype.is_floating_point and value.dtype != torch.bool):
            kind = "an integer" if integer else "a floating-point"
            raise TypeError(f"{name} as a tensor must have {kind} dtype, got {str(value.dtype).replace('torch.', '')}")
        if integer and value.dtype not in _INTEGER_PARAM_DTYPES:
            # unsigned dtypes past uint8 have no CPU comparison kernels (and uint64's top
            # values are no int64)
            raise TypeError(f"{name} as a tensor must have a signed integer dtype (or uint8), "
                            f"got {str(value.dtype).replace('torch.', '')}")
        if device is not None and value.device != torch.device(device):
            raise ValueError(f"{name} is on {value.device} but the op runs on {device}")
        return
    # Python's numbers or NumPy's scalars (numbers.Integral / Real), not bools
    if integer:
        if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be an int or a [b] integer tensor, got {type(value).__name__}")
    elif not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number or a [b] tensor, got {type(value).__name__}")


def flag(name: str, value) -> bool:
    """``value``, a Python or NumPy bool, as a Python bool; TypeError for anything else
    (an int too: ``write_logits=1`` is more likely a slip than a choice)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def number(name: str, value, *, lo: float | None = None, lo_open: bool = False) -> float:
    """``value`` (a real Python or NumPy number, not a bool) as a float, finite in float32
    and at least ``lo`` (above it when ``lo_open``): TypeError for another type, ValueError
    for the range."""
    # a float skips the abstract-base-class checks: 0.10 against 0.43 us a call
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float64
        v = float("inf")
    below = lo is not None and (v <= lo if lo_open else v < lo)
    if not -FLOAT32_MAX <= v <= FLOAT32_MAX or below:
        bound = "" if lo is None else f" {'>' if lo_open else '>='} {lo}"
        raise ValueError(f"{name} must be a finite number{bound} (finite in float32), got {value!r:.60}")
    return v


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The byte addresses [start, end) a strided tensor's elements span."""
    start = t.data_ptr()
    return start, start + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def no_overlap(outputs: Iterable[tuple[str, torch.Tensor | None]],
               inputs: Iterable[tuple[str, torch.Tensor | None]]) -> None:
    """Raises ValueError "<output> must not share memory with <other>" when an output's
    byte span meets an input's or another output's (None entries are skipped): whatever the
    backend, the result would depend on the order its kernel reads and writes in. Spans, not
    elements: an output interleaved with another tensor's elements is refused too, as the
    C++ kernels' check refuses it."""
    def spans(named):
        return [(name, _extent(t)) for name, t in named
                if t is not None and t.numel() and t.device.type != "meta"]

    outs, ins = spans(outputs), spans(inputs)
    for i, (name, (a0, a1)) in enumerate(outs):
        for other, (b0, b1) in outs[i + 1:] + ins:
            if a0 < b1 and b0 < a1:
                raise ValueError(f"{name} must not share memory with {other}")


def _capturing(device) -> bool:
    return (device is not None and torch.device(device).type == "cuda"
            and torch.cuda.is_current_stream_capturing())


def in_range(name: str, t: torch.Tensor, lo: int, hi: int, must: str = "be") -> None:
    """Raises ValueError "<name> must <must> in [lo, hi), got values in [min, max]" unless
    lo <= t < hi. Reads the values, so only on the CPU (no device sync); the kernels never
    use such a value as an address unchecked."""
    if t.device.type != "cpu" or not t.numel():
        return
    # a short vector through Python's min/max: a tensor min()/max() pair costs tens of
    # microseconds (a tree step checks two vectors of ~16 values per call)
    if t.numel() <= 4096:
        values = t.reshape(-1).tolist()
        t_min, t_max = min(values), max(values)
    else:
        t_min, t_max = map(int, torch.aminmax(t))
    if t_min < lo or t_max >= hi:
        raise ValueError(f"{name} must {must} in [{lo}, {hi}), got values in [{t_min}, {t_max}]")


def no_autograd(op: str, tensors) -> None:
    """Raises RuntimeError naming the first of ``tensors`` ((name, tensor or None) pairs)
    that requires grad while grad mode is on: ``op`` is an inference kernel with no
    backward, so its result would silently not track gradients (a model trained through
    it would get none for what feeds it). One flag read when grad mode is off, as in
    ``torch.no_grad()`` / ``torch.inference_mode()``, where the engine calls the ops."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(f"{op}: {name} requires grad and grad mode is on, but {op} is an inference kernel "
                               "with no backward (its result would not track gradients): call it under "
                               "torch.no_grad() or torch.inference_mode(), or detach the inputs")


def unit_interval(name: str, t: torch.Tensor, closed: bool = False) -> None:
    """Raises ValueError unless every value of ``t`` is in [0, 1) (NaN is not), or in [0, 1]
    where ``closed``: the coins a sampler consumes. Reads the values, so only on the CPU
    (see :func:`in_range`)."""
    if t.device.type != "cpu" or not t.numel():
        return
    bad = ~((t >= 0) & ((t <= 1) if closed else (t < 1)))
    if bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0])
        raise ValueError(f"{name} must be in [0, 1{']' if closed else ')'}, got {float(t.reshape(-1)[i])} "
                         f"at flat index {i}")


def token_ids(name: str, t: torch.Tensor, vocab_size: int) -> None:
    """Checks 0 <= t < vocab_size (on the CPU: see :func:`in_range`)."""
    in_range(name, t, 0, vocab_size, "hold token ids")


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


CPU_KERNEL_BACKENDS = ("auto", "native", "reference")


def cpu_kernel_backend(op: str, backend, device: torch.device) -> str:
    """The path of an op that has a CPU kernel only: "native" (the C++ kernel, on the CPU)
    or "reference" (asked for, or "auto" on another device). ``backend`` None means "auto";
    "native" off the CPU raises."""
    if backend is None and device.type == "cpu":  # the common case first: 0.25 against 0.54 us
        return "native"
    backend = "auto" if backend is None else backend
    if backend not in CPU_KERNEL_BACKENDS:
        raise ValueError(f"backend must be one of {CPU_KERNEL_BACKENDS}, got {backend!r}")
    if backend == "reference" or (device.type != "cpu" and backend == "auto"):
        return "reference"
    if device.type != "cpu":
        raise RuntimeError(f"backend='native': {op} has a CPU kernel only, not {device.type}")
    return "native"
