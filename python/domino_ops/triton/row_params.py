"""The per-row sampling parameters the Triton kernels read, as csrc/sampling_params.h gives
them to the CUDA kernels: every parameter as a [b] tensor (a scalar broadcast), the
temperature below ``GREEDY_BELOW`` set to 0, top-k 0 meaning off, top-p raised to
``MIN_TOP_P`` (domino_ops.sampling's rules, applied by its functions); plus what is known without reading the tensors: whether some row may
sample (then uniforms are needed) and whether some row may use top-k / top-p."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from domino_ops.sampling import effective_temperature, kernel_top_p, may_sample


@dataclass(frozen=True)
class RowParams:
    temperature: torch.Tensor  # [b] float32, 0 for greedy rows
    top_k: torch.Tensor  # [b] int64
    top_p: torch.Tensor  # [b] float32
    may_sample: bool
    may_filter: bool


def row_params(b, device, temperature, top_k, top_p, row_temperature=None, row_top_k=None,
               row_top_p=None) -> RowParams:
    """The scalars of a schema call, overridden row by row by the optional [b] tensors."""
    sampling = may_sample(row_temperature if row_temperature is not None else temperature)
    may_filter = sampling and (row_top_k is not None or row_top_p is not None or top_k > 0 or top_p < 1.0)
    t = row_temperature if row_temperature is not None else torch.full((b,), temperature, device=device)
    k = row_top_k if row_top_k is not None else torch.full((b,), top_k, dtype=torch.int64, device=device)
    p = row_top_p if row_top_p is not None else torch.full((b,), top_p, dtype=torch.float32, device=device)
    return RowParams(effective_temperature(t.float()).contiguous(), k.to(torch.int64).contiguous(),
                     kernel_top_p(p.float()).contiguous(), sampling, may_filter)
