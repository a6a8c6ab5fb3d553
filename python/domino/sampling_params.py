"""Per-request sampling parameters, and the per-row form the ops take for a batch."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Sequence

import torch

import domino_ops


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples: ``temperature`` 0 is greedy (``top_k``/``top_p`` then
    unused); ``top_k`` 0 disables top-k; ``top_p`` in (0, 1]; ``seed`` makes the request's
    draws reproducible on their own (None: the call's ``generator``, or torch's default)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        domino_ops.check_sampling_params(self.temperature, self.top_k, self.top_p)
        # below GREEDY_BELOW a temperature is the argmax (domino_ops.sampling): stored as 0,
        # so every later test (greedy trees, lookup, the budget) sees a greedy request
        object.__setattr__(self, "temperature", domino_ops.sampling.effective_temperature(self.temperature))
        if self.seed is not None:
            if not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool):
                raise TypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
            object.__setattr__(self, "seed", int(self.seed))  # a NumPy integer as Python's
            if not -2**63 <= self.seed < 2**64:
                raise ValueError(f"seed must be in [-2**63, 2**64) (torch.Generator.manual_seed), got {self.seed}")


@dataclass
class RowSampling:
    """The sampling arguments of the ops for a batch of rows: Python scalars when every row
    agrees (the ops' fast path), else [rows] tensors; ``generator`` is one torch.Generator,
    a list with one per row (per-request seeds), or None."""

    temperature: float | torch.Tensor
    top_k: int | torch.Tensor
    top_p: float | torch.Tensor
    generator: torch.Generator | list[torch.Generator] | None
    any_sampled: bool  # some row has temperature > 0

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device, generator: torch.Generator | None = None
                    ) -> "RowSampling":
        """One row per request. Requests with a seed get their own generator; the others
        share ``generator``."""
        params = list(params)
        gens = None
        if any(p.seed is not None for p in params):
            # torch's default generator of the rows' device (the CPU one cannot draw for CUDA rows)
            dev = torch.device(device)
            default = torch.default_generator
            if dev.type == "cuda":
                default = torch.cuda.default_generators[dev.index if dev.index is not None else torch.cuda.current_device()]
            shared = generator if generator is not None else default
            gens = [torch.Generator(device).manual_seed(p.seed) if p.seed is not None else shared for p in params]

        def column(name, dtype):
            values = [getattr(p, name) for p in params]
            if all(v == values[0] for v in values):
                return values[0]
            return torch.tensor(values, dtype=dtype, device=device)

        return cls(column("temperature", torch.float32), column("top_k", torch.int64), column("top_p", torch.float32),
                   gens if gens is not None else generator, any(p.temperature > 0 for p in params))

    def repeat_rows(self, m: int) -> "RowSampling":
        """Each row's arguments for m consecutive rows (a [b] batch flattened to [b*m])."""
        rep = (lambda x: x.repeat_interleave(m) if isinstance(x, torch.Tensor) else x)
        gen = [g for g in self.generator for _ in range(m)] if isinstance(self.generator, list) else self.generator
        return RowSampling(rep(self.temperature), rep(self.top_k), rep(self.top_p), gen, self.any_sampled)

    def select_rows(self, rows: list[int]) -> "RowSampling":
        """The arguments of rows ``rows`` only (a batch whose other rows have finished)."""
        pick = (lambda x: x[rows] if isinstance(x, torch.Tensor) else x)
        gen = [self.generator[r] for r in rows] if isinstance(self.generator, list) else self.generator
        return RowSampling(pick(self.temperature), pick(self.top_k), pick(self.top_p), gen, self.any_sampled)

    def op_kwargs(self) -> dict:
        """The keyword arguments of domino_ops.sample / domino_head_rollout."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, generator=self.generator)

    def filter_kwargs(self) -> dict:
        """The keyword arguments of domino_ops.filtered_probs."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
