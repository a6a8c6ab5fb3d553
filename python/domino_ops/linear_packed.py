"""``small_batch_linear_packed``: ``small_batch_linear`` with the weight packed ahead of time.

On CPUs without AVX-512 but with AVX2 and FMA (AMD Zen 2/3, Intel Haswell to Alder Lake)
the same panels, bf16 and float32, run on 8-lane FMA tiles
(csrc/cpu/small_batch_linear_packed_avx2.cpp, the "avx2" path): each output one FMA chain
over K in order, no reduction across lanes; SmolLM2's bf16 linears 1.21-1.29x faster than
``small_batch_linear``'s row-major avx2 tiles at one row, 1.11-1.27x at 16 (2-core Zen 3
VM, benchmarks/linear_panels_ab.py).

On CPUs with AVX512-BF16 (AMD Zen 4/5, Intel Cooper Lake, Sapphire Rapids and later) a bf16
weight packed once by :func:`pack_small_batch_linear_weight` into VNNI panels (48 outputs x
all of K, column pairs interleaved) lets the kernel (csrc/cpu/small_batch_linear_packed.cpp)
keep 16 consecutive outputs in each accumulator's lanes: no reduction across lanes and one
vector store per 16 outputs, where the row-major kernel reduces every output across 16
lanes. At the 6-16 rows of a verification that is 1.2-1.5x faster on SmolLM2's layers (Zen 4, in
cache; benchmarks/results/linear_zen4_session12_packed.txt);
at one row both stream the weight at the memory's speed. The price is memory: the packed
copy is as large as the weight (engines that pack keep it instead of the original, as
oneDNN and llama.cpp do; :mod:`domino.fast_linear` keeps both, so the module's parameters
and ``state_dict`` stay untouched).

On CPUs with Intel AMX (Sapphire Rapids and later Xeons) the same packed panels feed AMX
tiles instead (csrc/cpu/small_batch_linear_packed_amx.cpp): one TDPBF16PS multiplies a 1 KB
weight tile into up to 16 rows, so 16 rows cost about what one does
(:func:`small_batch_linear_packed_path`).

A float32 weight can be packed as float32 panels instead
(``pack_small_batch_linear_weight(w, dtype=torch.float32)``, for float32 x; CPUs with
AVX-512F): the same tiles with FMAs, no reduction across lanes, where the row-major
kernel's float32 tiles spend ~20-35 % of their time reducing (the fp32 16-token forward's
cost: benchmarks/bench_linear.py).

Batch-invariant like :func:`domino_ops.small_batch_linear`: row i of the output is
bit-identical whether it is computed alone or among any number of other rows. Its bits
differ from the row-major kernel's (another summation order), so a model uses one of the
two for every forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from domino_ops import _checks, reference

__all__ = ["PackedLinearWeight", "pack_small_batch_linear_weight", "small_batch_linear_packed",
           "small_batch_linear_packed_path", "small_batch_linear_packed_supported"]

PANEL_COLS = 48  # outputs per panel (three 16-lane accumulators); the kernel's kPanelCols


@dataclass(frozen=True)
class PackedLinearWeight:
    """A weight [out_features, in_features] in the packed layout.

    bf16 panels: ``data`` is [ceil(N / 48), ceil(K / 2), 48, 2] bfloat16 with
    ``data[p, k, c, j] = weight[48 p + c, 2 k + j]`` (zero past N or K). float32 panels:
    [ceil(N / 48), K, 48, 1] float32 with ``data[p, k, c, 0] = weight[48 p + c, k]``."""

    data: torch.Tensor
    out_features: int
    in_features: int

    def __post_init__(self):
        # a hand-made pairing of data and sizes is checked once here: the kernels and the
        # reference trust the sizes to read the panels
        for name in ("out_features", "in_features"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        data = _checks.tensor("data", self.data, ndim=4, dtypes=_checks.FLOAT_OR_BF16, contiguous=True)
        group = 2 if data.dtype == torch.bfloat16 else 1
        expected = (-(-self.out_features // PANEL_COLS), -(-self.in_features // group), PANEL_COLS, group)
        if tuple(data.shape) != expected:
            raise ValueError(f"data must have shape {list(expected)} to hold a packed [{self.out_features}, "
                             f"{self.in_features}] {str(data.dtype).replace('torch.', '')} weight, "
                             f"got {list(data.shape)}")


def small_batch_linear_packed_supported(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether this CPU runs :func:`small_batch_linear_packed` on panels of ``dtype``
    (bfloat16 or float32): with AVX2 and FMA, or AVX512-BF16 (bf16) / AVX-512F (float32),
    each with AVX-512BW and -VL."""
    from domino_ops import _C
    if _panel_dtype(dtype) == torch.bfloat16:
        return bool(_C.small_batch_linear_packed_supported())
    return bool(_C.small_batch_linear_packed_f32_supported())


def _panel_dtype(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` when panels come in it (bfloat16, float32); else TypeError naming it."""
    if dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float32, got {dtype}")
    return dtype


def small_batch_linear_packed_path() -> str:
    """The product :func:`small_batch_linear_packed` runs now on bf16 panels: ``"amx"``
    (Intel AMX tiles, TDPBF16PS: on Sapphire Rapids and later Xeons), ``"avx512_bf16"``
    (VDPBF16PS vectors) or ``"avx2"`` (8-lane FMAs on the weights widened to float32).

    The first the CPU (and OS) has; the environment variable
    ``DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH=auto|amx|avx512_bf16|avx2`` picks one (read once;
    :func:`domino_ops.cpu.kernel_switch` changes it in a process; ``avx2`` also puts float32
    panels on the AVX2 tiles, which give the AVX-512
    tiles' bits). All are batch-invariant, but they sum in different orders, so their bits
    differ: a process keeps one path for all its forwards. Raises RuntimeError on a CPU
    with neither AVX2 + FMA nor AVX512-BF16 (:func:`small_batch_linear_packed_supported`),
    ValueError for a bad value of the variable or a path this CPU lacks."""
    from domino_ops import _C
    return str(_C.small_batch_linear_packed_path())


def pack_small_batch_linear_weight(weight: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> PackedLinearWeight:
    """Packs a weight [N, K] (float32 or bfloat16) for :func:`small_batch_linear_packed`, as
    panels of ``dtype``: bfloat16 (the default; a float32 weight is rounded to it), for
    bfloat16 x, or float32 (a bfloat16 weight is widened exactly), for float32 x. A copy:
    later changes to ``weight`` are not seen."""
    weight = _checks.tensor("weight", weight, ndim=2, dtypes=_checks.FLOAT_OR_BF16)
    if weight.device.type != "cpu":
        raise ValueError(f"weight must be on the CPU (the packed kernel is a CPU kernel), got {weight.device}")
    N, K = weight.shape
    group = 2 if _panel_dtype(dtype) == torch.bfloat16 else 1  # columns per step: a bf16 pair, or one float32
    panels, steps = -(-N // PANEL_COLS), -(-K // group)
    w = F.pad(weight.detach().to(dtype), (0, group * steps - K, 0, panels * PANEL_COLS - N))
    data = w.view(panels, PANEL_COLS, steps, group).permute(0, 2, 1, 3).contiguous()
    return PackedLinearWeight(data, N, K)


def small_batch_linear_packed(x: torch.Tensor, weight: PackedLinearWeight, bias: torch.Tensor | None = None, *,
                              out_dtype: torch.dtype | None = None, backend: str | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with a packed weight, batch-invariant.

    Args:
        x: [..., K] in the packed weight's dtype (bfloat16, or float32 for float32
            panels); the leading dimensions are flattened into M rows (any M).
        weight: the :class:`PackedLinearWeight` of a [N, K] weight.
        bias: None or [N] float32 or bfloat16 (added in fp32).
        out_dtype: bfloat16 (default: x's dtype) or float32: the fp32 sums plus the bias,
            rounded once to it.
        backend: "auto" (default) or "native": the C++ kernel, which needs AVX2 and FMA
            (or AVX512-BF16 / AVX-512F)
            (:func:`small_batch_linear_packed_supported`; RuntimeError without it);
            "reference": unpack and :func:`domino_ops.reference.small_batch_linear`.
    Returns:
        [..., N] in ``out_dtype``. Not differentiable: inputs that require grad
        with grad mode on are refused (RuntimeError naming them).
    """
    # The checks cost a serving loop each call (~120 a SmolLM2 forward): plain attribute
    # reads, no copies of an x already [M, K] and contiguous
    # (benchmarks/layer_ops_wrapper_cost.py).
    if backend is not None and backend not in ("auto", "native", "reference"):
        raise ValueError(f"backend must be one of ('auto', 'native', 'reference'), got {backend!r}")
    if not isinstance(weight, PackedLinearWeight):
        raise TypeError(f"weight must be a PackedLinearWeight (from pack_small_batch_linear_weight), "
                        f"got {type(weight).__name__}")
    N, K, data = weight.out_features, weight.in_features, weight.data
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    shape = x.shape
    if not shape:
        raise ValueError(f"x must have at least 1 dimension ([..., K]), got shape {tuple(shape)}")
    if x.dtype != data.dtype:
        name = str(data.dtype).replace("torch.", "")
        raise TypeError(f"x must be {name} (the packed weight's dtype), got {str(x.dtype).replace('torch.', '')}")
    if not x.is_cpu:
        raise ValueError(f"x must be on the CPU, got {x.device}")
    if not data.is_cpu:
        raise ValueError(f"weight's data must be on the CPU, got {data.device}")
    if shape[-1] != K:
        raise ValueError(f"x must have shape [..., {K}] to match the packed weight [{N}, {K}], got {list(shape)}")
    if out_dtype is None:
        out_dtype = x.dtype
    elif out_dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype must be bfloat16 or float32, got {out_dtype}")
    if bias is not None:
        bias = _checks.tensor("bias", bias, ndim=1, dtypes=_checks.FLOAT_OR_BF16, device=x.device)
        _checks.shape("bias", bias, (N,))
        bias = bias.contiguous()
    _checks.no_autograd("small_batch_linear_packed", (("x", x), ("weight's data", data), ("bias", bias)))
    if backend == "reference":
        w = reference.unpack_small_batch_linear_weight(data, N, K)
        b = None if bias is None else bias.float()
        return reference.small_batch_linear(x.float(), w.float(), b).to(out_dtype)
    flat = len(shape) == 2 and x.is_contiguous()
    x2 = x if flat else x.reshape(-1, K).contiguous()
    out = torch.empty(x2.shape[0], N, dtype=out_dtype)
    if x2.shape[0] > 0:
        torch.ops.domino_ops.small_batch_linear_packed.default(x2, data, N, bias, out)
    return out if flat else out.reshape(*shape[:-1], N)
