"""Runtime sampling helpers shared by the ops' wrappers and by engines that call them.

- :func:`draw_uniforms`: the uniforms a sampling op consumes, in the order and shapes the
  wrappers (and the references) draw them, so equal generator states give equal choices;
- :func:`filtered_weights`: the unnormalised float64 weights of the distribution the
  sampling ops draw from, ``softmax(filter(logits / temperature))`` (the references' and
  the test oracle's rules; the op that returns it normalised, the ``p`` / ``q`` that
  :func:`domino_ops.verify_sampling` expects, is :func:`domino_ops.filtered_probs`);
- :func:`check_sampling_params`: the validation every sampling-aware op applies to
  ``temperature``, ``top_k`` and ``top_p``, for engines that validate up front.

The test oracle is :mod:`domino_ops.reference`; nothing here is test-only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from domino_ops import _checks

__all__ = ["draw_uniforms", "expand_uniforms", "filtered_weights", "check_sampling_params", "per_row", "repeat_over_rows",
           "effective_temperature", "as_kernel_temperature", "kernel_top_k", "kernel_top_p", "kernel_sampling_args",
           "may_sample", "GREEDY_BELOW", "MIN_TOP_P"]


def draw_uniforms(shape: Sequence[int], device: torch.device | str,
                  generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None
                  ) -> torch.Tensor:
    """The uniforms [*shape] float64 in [0, 1) that a sampling op consumes, from one
    torch.Generator (or torch's default for None), or from a list of ``shape[0]``
    generators, row i drawing its ``shape[1:]`` uniforms from generator i (per-request seeds).
    Raises TypeError / ValueError naming ``shape``, ``device`` or ``generator`` for what is
    not one of these."""
    if (isinstance(shape, (str, bytes, torch.Tensor)) or not isinstance(shape, Sequence)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise ValueError(f"shape must be a sequence of ints >= 0, got {shape!r}")
    if not isinstance(device, (torch.device, str)):
        raise TypeError(f"device must be a torch.device or a string, got {type(device).__name__}")
    try:
        device = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: {e}") from e
    _checks.generator(generator, device, rows=shape[0] if shape else None)
    return drawn_uniforms(shape, device, generator)


def drawn_uniforms(shape: Sequence[int], device: torch.device | str,
                   generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None
                   ) -> torch.Tensor:
    """:func:`draw_uniforms` for the ops, whose own checks have already passed ``generator``
    (:func:`domino_ops._checks.generator`, with ``shape[0]`` rows for a list): the draw
    alone, without checking its arguments again at every step."""
    if isinstance(generator, (list, tuple)):
        rows = [torch.rand(tuple(shape[1:]), dtype=torch.float64, device=device, generator=g) for g in generator]
        return torch.stack(rows) if rows else torch.empty(shape, dtype=torch.float64, device=device)
    return torch.rand(shape, dtype=torch.float64, device=device, generator=generator)


def expand_uniforms(node_seq: torch.Tensor, num_children: int,
                    generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None
                    ) -> torch.Tensor:
    """The [n, num_children] float64 uniforms :func:`domino_ops.domino_head_expand` consumes
    when some node may sample, for a frontier of nodes whose sequences are ``node_seq`` [n]
    int64: from one generator (or torch's default for None) in node order, or from a list
    with one generator per sequence, sequence s's nodes drawing theirs from generator s in
    node order (``node_seq`` is then read on the host, and must hold values in
    ``[0, len(generator))``)."""
    n, dev = node_seq.shape[0], node_seq.device
    if not isinstance(generator, (list, tuple)):
        return drawn_uniforms((n, num_children), dev, generator)
    seq = node_seq.cpu()
    _checks.in_range("node_seq", seq, 0, len(generator), "hold values")
    u = torch.empty(n, num_children, dtype=torch.float64, device=dev)
    for s, g in enumerate(generator):
        nodes = torch.nonzero(seq == s)[:, 0]
        if nodes.numel():
            u[nodes.to(dev)] = drawn_uniforms((nodes.numel(), num_children), dev, g)
    return u


# Below this temperature sampling is the argmax (its limit): logits / T would overflow.
GREEDY_BELOW = 1e-20
# The smallest top-p the kernels see: a positive float32, so the top token always survives.
MIN_TOP_P = 1.1754943508222875e-38


def effective_temperature(temperature):
    """``temperature`` with values below :data:`GREEDY_BELOW` set to 0 (greedy); a Python
    number or a tensor."""
    if isinstance(temperature, torch.Tensor):
        return torch.where(temperature < GREEDY_BELOW, torch.zeros_like(temperature), temperature)
    return 0.0 if temperature < GREEDY_BELOW else float(temperature)


def as_kernel_temperature(temperature):
    """``temperature`` as the kernels read it: a per-row tensor in float32 (so the greedy
    threshold of :func:`effective_temperature` sees the float32 value, e.g. a float64
    9.99999999e-21 is 1e-20 there and samples), a Python number as it is
    (:func:`kernel_sampling_args` thresholds it in float64 too)."""
    return temperature.float() if isinstance(temperature, torch.Tensor) else temperature


def kernel_top_k(top_k, vocab_size: int):
    """``top_k`` clamped to the vocabulary (k >= V keeps everything, like 0), so any int fits int64."""
    if isinstance(top_k, torch.Tensor):
        return top_k.clamp(max=vocab_size)
    return min(int(top_k), vocab_size)


def kernel_top_p(top_p):
    """``top_p`` raised to :data:`MIN_TOP_P`, so it stays positive in float32."""
    if isinstance(top_p, torch.Tensor):
        return top_p.clamp(min=MIN_TOP_P)
    return max(float(top_p), MIN_TOP_P)


def may_sample(temperature) -> bool:
    """Whether some row may sample (and so consumes uniforms): a scalar temperature at or
    above :data:`GREEDY_BELOW`, or any per-row temperature tensor (its values are not read,
    so no device sync; its greedy rows draw and ignore their uniforms)."""
    return isinstance(temperature, torch.Tensor) or effective_temperature(temperature) > 0


def kernel_sampling_args(temperature, top_k, top_p, vocab_size: int) -> tuple:
    """The sampling arguments of a kernel call in the schemas' order: the scalars
    ``(temperature, top_k, top_p)``, then the per-row tensors ``(row_temperature float32,
    row_top_k int64, row_top_p float32)`` or None where a parameter is a scalar, with the
    rules of :func:`effective_temperature`, :func:`kernel_top_k` and :func:`kernel_top_p`."""
    scalars = (0.0 if isinstance(temperature, torch.Tensor) else effective_temperature(temperature),
               0 if isinstance(top_k, torch.Tensor) else kernel_top_k(top_k, vocab_size),
               1.0 if isinstance(top_p, torch.Tensor) else kernel_top_p(top_p))
    rows = (effective_temperature(as_kernel_temperature(temperature)).contiguous()
            if isinstance(temperature, torch.Tensor) else None,
            kernel_top_k(top_k.long(), vocab_size).contiguous() if isinstance(top_k, torch.Tensor) else None,
            kernel_top_p(top_p.float()).contiguous() if isinstance(top_p, torch.Tensor) else None)
    return scalars + rows


def repeat_over_rows(value, b: int, rows: int):
    """A sampling parameter of ``b`` leading rows as one value per row of ``b * rows``
    flattened rows (``rows`` per leading row, e.g. a [b, k, V] tensor's middle axis): a
    [b] tensor repeated ``rows`` times each, a Python number as it is."""
    return value.reshape(b).repeat_interleave(rows) if isinstance(value, torch.Tensor) and rows > 1 else value


def per_row(value, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """A sampling parameter (a Python number or a [n] tensor) as a [n, 1] tensor."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).reshape(n, 1)
    return torch.full((n, 1), value, dtype=dtype, device=device)


def filtered_weights(logits: torch.Tensor, temperature, top_k, top_p) -> torch.Tensor:
    """Unnormalised float64 weights [n, V] of softmax(filter(logits / temperature)) for
    logits [n, V]; each parameter is a Python number or one value per row ([n] tensor).

    The rules, the same in every backend (see the README's "Extreme values"):

    - temperature 0, or below :data:`GREEDY_BELOW` (where ``logits / T`` would overflow),
      is the limit: ``torch.argmax`` (the first index among equal maxima; the first NaN if
      the row has one, as the target's own greedy decoding would pick);
    - at temperature > 0, NaN logits count as -inf;
    - a ``+inf`` logit wins: the weight is spread evenly over the ``+inf`` entries;
    - a row with no finite mass (all -inf / NaN) puts all its weight on token 0;
    - z = (logits - max) / temperature, computed in float32 as the kernels compute it;
      top-k keeps z >= the k-th largest z (k = 0 or k >= V disables it); top-p sorts the
      survivors by z (descending, stable) and drops a token once the mass before it
      reaches top_p, never the first: a top-p below the largest probability keeps exactly
      the top token; top_p counts as its float32 value, as the kernels take it (one in
      (1 - 2**-25, 1) is 1: no filter).
    """
    n, V = logits.shape
    greedy_top = logits.float().argmax(dim=-1, keepdim=True)  # torch.argmax, NaN included
    x = logits.float()
    x = torch.where(torch.isnan(x), torch.full_like(x, float("-inf")), x)
    T = per_row(effective_temperature(as_kernel_temperature(temperature)), n, torch.float32, x.device)
    k = per_row(kernel_top_k(top_k, V), n, torch.int64, x.device)
    p = per_row(top_p, n, torch.float32, x.device).double()  # the kernels' float32 top_p
    m = x.max(dim=-1, keepdim=True).values
    # max-shifted before scaling, so a tiny temperature sends the non-maxima to -inf
    # instead of overflowing the maximum to inf (inf - inf would be NaN). In float32, as
    # every kernel computes it (one rounding of the difference, one of the quotient): top-k
    # and top-p read z's order, so two logits closer than float32 resolves at z's scale
    # are a tie (broken by index) here as in the kernels, not ordered by a float64 z.
    z = ((x - m) / T.clamp(min=torch.finfo(torch.float32).tiny)).double()
    z = torch.where(m.isinf(), torch.where(x == m, 0.0, float("-inf")).double(), z)  # +inf wins / all -inf
    # greedy rows: torch.argmax; rows with no mass: token 0 (x.argmax of a row of -inf)
    top = torch.zeros_like(z).scatter(-1, torch.where(T == 0, greedy_top, x.argmax(dim=-1, keepdim=True)), 1.0)
    z = torch.where((T == 0) | (m == float("-inf")), torch.where(top > 0, 0.0, float("-inf")).double(), z)
    use_k = (k > 0) & (k < V)
    if bool(use_k.any()):
        sorted_z = z.sort(dim=-1, descending=True).values
        kth = sorted_z.gather(-1, (k.clamp(1, V) - 1))
        z = torch.where(use_k & (z < kth), float("-inf"), z)
    w = torch.exp(z)
    w = torch.where(torch.isnan(w), 0.0, w)
    if bool((p < 1.0).any()):
        order = torch.sort(z, dim=-1, descending=True, stable=True).indices
        ws = w.gather(-1, order)
        before = torch.cumsum(ws, dim=-1) - ws
        drop_sorted = (before >= p * ws.sum(dim=-1, keepdim=True)) & (p < 1.0)
        drop_sorted[:, 0] = False  # the top token always survives
        w = w.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), 0.0)
    return w


def check_sampling_params(temperature: float | torch.Tensor, top_k: int | torch.Tensor, top_p: float | torch.Tensor,
                          rows: int | None = None, device: torch.device | str | None = None) -> None:
    """Raises TypeError / ValueError naming the argument unless temperature >= 0, top_k >= 0
    (an int; 0 disables it) and top_p in (0, 1]: Python numbers, or with ``rows`` also
    [rows] tensors on ``device`` with one value per row."""
    _checks.sampling_params(temperature, top_k, top_p, rows, device)
