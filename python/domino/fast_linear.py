"""Run a model's ``nn.Linear`` layers on the CPU through ``domino_ops.small_batch_linear``.

``use_small_batch_linear(model)`` swaps the ``forward`` of every ``torch.nn.Linear`` in
``model`` (attention projections, MLP, LM head; exact ``nn.Linear`` only, not subclasses)
for one that calls the batch-invariant kernel. The weights are untouched: the same
parameters, the same ``state_dict``, tied weights still tied. ``undo_small_batch_linear``
restores the original forwards.

A switched layer's forward is one dispatcher call, ``torch.ops.domino_ops.switched_linear``
(csrc/cpu/switched_linear.cpp; its call costs what PyTorch's ``nn.Linear`` call costs around
``F.linear``). It uses the kernel when it can, and ``torch.nn.functional.linear`` (the
original behaviour) otherwise: off the CPU, for dtypes other than float32/bfloat16, when x
and the weight differ in dtype, for a non-contiguous weight, or when autograd needs a
graph (grad mode on and x or a parameter requiring grad), under CPU autocast (whose dtype
rules then apply), or for an empty weight. So run the model under
``torch.inference_mode()`` or ``torch.no_grad()``, as the engine and HF ``generate`` do.

With the kernel, row i of a layer's output is bit-identical however many tokens the
forward carries, so a verification forward over k tokens computes its linear layers
exactly as k one-token decoding steps would. HF's attention (sdpa, eager) is not
batch-invariant across query counts (it reduces over the KV length and runs GEMMs whose
shapes follow the number of queries): :func:`domino.fast_attention.use_small_batch_attention`
closes that gap, and with both switches a verification forward is bit-identical to k
one-token forwards (tests/test_fast_linear.py).

On a CPU with AVX512-BF16 (the kernel's "avx512_bf16" path), or with AVX2 and no AVX-512
(its "avx2" path: the packed product's 8-lane FMA tiles), a bf16 layer runs
``domino_ops.small_batch_linear_packed`` instead, on a copy of its weight packed at switch
time (repacked when the weight is replaced by another tensor or changed in place through
its own in-place ops; a change made through ``weight.data``, or to an inference tensor
inside ``torch.inference_mode()``, bypasses the version counter that tells: switch the
model again after such a change): 1.2-1.5x faster at the
6-16 rows of a verification on SmolLM2's layers (Zen 4, in cache), as fast or faster at
one row, and just as batch-invariant (AVX2, Zen 3: SmolLM2's 211 bf16 linears streamed from
memory 1.21-1.29x faster at one row and 1.11-1.27x at 16 than the row-major avx2 tiles,
benchmarks/linear_panels_ab.py). Likewise a float32 layer on a CPU with AVX-512F (the
"avx512" or "avx512_bf16" path) runs on float32 panels: SmolLM2's float32 linears at 16
rows 1.24-1.32x faster, at one row as fast (Zen 4, benchmarks/linear_panels_ab.py). The
copy doubles the memory of the
switched weights (a plain attribute: the parameters and ``state_dict`` are unchanged);
``undo_small_batch_linear`` frees it.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["use_small_batch_linear", "undo_small_batch_linear", "uses_small_batch_linear", "packed_weight",
           "place_packed_weights", "PackedProduct", "packed_product",
           "runs_packed", "fused_packed_weight", "fused_packed_linear"]

_FLAG = "_domino_small_batch_linear"
_PACKS = "_domino_packs"  # the dtypes (of x and the weight) for which the layer runs the packed kernel
_PACKED = "_domino_packed"  # (the weight tensor, (its version, its data's address), PackedLinearWeight)
_FUSED = "_domino_fused_packed"  # on a module calling several layers: (weights [+ biases], versions, packed, bias)
_DTYPES = (torch.float32, torch.bfloat16)


def cpu_kernel_applies(x: torch.Tensor, *params: torch.Tensor) -> bool:
    """Whether a CPU kernel may replace PyTorch's op on input ``x`` with ``params`` (a
    weight, a bias, a second input): all on the CPU in one dtype, float32 or bfloat16,
    no CPU autocast (its dtype rules then apply), and no autograd graph needed (grad
    mode off, or nothing requires grad). The check of every switched layer
    (:mod:`domino.fast_layers` too), once per call, ~200 times a SmolLM2 forward: plain
    loops, ``is_cpu`` and dtype identity (``x.device.type`` alone costs ~0.3 us)."""
    dtype = x.dtype
    if not x.is_cpu or (dtype is not torch.float32 and dtype is not torch.bfloat16) or torch.is_autocast_enabled("cpu"):
        return False
    needs_grad = x.requires_grad
    for p in params:
        if p.dtype is not dtype or not p.is_cpu:
            return False
        needs_grad = needs_grad or p.requires_grad
    return not (needs_grad and torch.is_grad_enabled())


def _small_batch_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # One dispatcher call (csrc/cpu/switched_linear.cpp): the kernel where it applies,
    # F.linear elsewhere. Only the packed copy's lookup stays in Python, where it is cached.
    # The parameters straight from _parameters: nn.Module.__getattr__ costs ~0.4 us an
    # attribute (a parametrization, which moves them out, still goes through it).
    params = self._parameters
    w = params["weight"] if "weight" in params else self.weight
    b = params["bias"] if "bias" in params else self.bias
    return torch.ops.domino_ops.switched_linear.default(x, w, b, _packed_data(self, w, x))


def _packed_data(mod: torch.nn.Linear, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """The panels (``PackedLinearWeight.data``) a switched layer runs for ``x``, or None
    where it runs the row-major kernel or F.linear (its dtype not packed on this CPU, or an
    autograd graph needed: then the weight may change every step, and packing it would be
    wasted)."""
    dtype = x.dtype
    if dtype not in mod.__dict__[_PACKS] or w.dtype is not dtype or (
            torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        return None
    cached = mod.__dict__.get(_PACKED)
    if cached is not None and cached[0] is w and cached[1] == _state(w):
        return cached[2].data
    if not w.is_cpu or not w.is_contiguous() or not w.numel():
        return None
    return packed_weight(mod).data


def _state(t: torch.Tensor) -> tuple[int, int]:
    """What a packed copy of ``t`` is checked against, with ``t`` itself: its version
    counter (bumped by its in-place ops; 0 for an inference tensor, which counts none) and
    its data's address (``model.to(dtype)`` swaps a parameter's data in place, keeping the
    tensor and its version). The tensor itself is checked too because a new weight can land
    at a freed one's address with the same (initial) version."""
    return 0 if t.is_inference() else t._version, t.data_ptr()


def packed_weight(mod: torch.nn.Linear):
    """The packed copy (:class:`domino_ops.PackedLinearWeight`, panels of the weight's own
    dtype) of a layer's weight, packed again when the weight was replaced or changed in
    place since."""
    import domino_ops

    w = mod.weight
    version = _state(w)  # with the tensor itself (_state says why)
    cached = mod.__dict__.get(_PACKED)
    if cached is None or cached[0] is not w or cached[1] != version:
        cached = (w, version, domino_ops.pack_small_batch_linear_weight(w, dtype=w.dtype))
        mod.__dict__[_PACKED] = cached
    return cached[2]


def fused_packed_weight(owner: torch.nn.Module, layers: tuple, dtype: torch.dtype):
    """The packed concatenation of ``layers``' weights and their concatenated bias (None
    when they have none), for inputs of ``dtype``, or None where one packed product cannot
    replace them: :func:`fused_packed_linear`'s weights, kept on ``owner`` (packed again
    when a weight was replaced or changed in place, as :func:`packed_weight`; the layers'
    own packed copies are dropped, so the memory stays one copy while the layers run only
    through it; a layer also called alone packs its own copy again beside it). An owner keeps
    one concatenation: a drafter's context update keeps its k and v one on ``k_proj``
    (:func:`domino.fast_layers.draft_context_weights`), beside the attention's q/k/v one.

    Applies when every layer is switched by :func:`use_small_batch_linear` and runs the
    packed kernel for ``dtype``, the layers share K, all or none have a bias, and every
    weight and bias is a CPU tensor of ``dtype``, contiguous, non-empty.

    Returns:
        (:class:`domino_ops.PackedLinearWeight` [sum of the layers' N, K], bias [sum of N]
        or None), or None.
    """
    import domino_ops

    if not all(getattr(m, _FLAG, False) and dtype in m.__dict__.get(_PACKS, ()) for m in layers):
        return None
    ws = tuple(m.weight for m in layers)
    bs = tuple(m.bias for m in layers)
    has_bias = bs[0] is not None
    if any((b is not None) != has_bias for b in bs):
        return None
    tensors = ws + bs if has_bias else ws
    K = ws[0].shape[1]
    if (not K or any(t.dtype is not dtype or not t.is_cpu for t in tensors)
            or any(w.shape[1] != K or not w.shape[0] or not w.is_contiguous() for w in ws)):
        return None
    # the tensors themselves and their states (as packed_weight)
    versions = tuple(_state(t) for t in tensors)
    cached = owner.__dict__.get(_FUSED)
    if (cached is None or len(cached[0]) != len(tensors) or any(a is not b for a, b in zip(cached[0], tensors))
            or cached[1] != versions):
        packed = domino_ops.pack_small_batch_linear_weight(torch.cat(ws), dtype=dtype)
        bias = torch.cat(bs).contiguous() if has_bias else None
        cached = (tensors, versions, packed, bias)
        owner.__dict__[_FUSED] = cached
        for m in layers:
            m.__dict__.pop(_PACKED, None)
    return cached[2], cached[3]


def fused_packed_linear(owner: torch.nn.Module, layers: tuple, x: torch.Tensor) -> torch.Tensor | None:
    """``torch.cat([layer(x) for layer in layers], -1)`` as one packed product, or None
    where that does not apply. For layers that read the same input (an attention's q, k
    and v projections, a gated MLP's gate and up): one call instead of several, each
    with its dispatch, its thread fork and join and its partly idle last panels
    (benchmarks/fused_projections_ab.py times the engine's forward with and without).
    Each output column is the same dot product over K whichever panel it lands in, so
    the bits are those of the separate layers (tests/test_fast_linear.py).

    Applies where :func:`fused_packed_weight` does, with K = ``x.shape[-1]``, and the
    kernel applies (:func:`cpu_kernel_applies`: no autograd graph needed, no autocast).

    Args:
        owner: the module that calls the layers (it holds the concatenation).
        layers: the ``nn.Linear`` layers, in output order.
        x: [..., K] float32 or bfloat16.

    Returns:
        [..., sum of the layers' N] in ``x``'s dtype, or None.
    """
    K = x.shape[-1]
    params = tuple(m.weight for m in layers) + tuple(m.bias for m in layers if m.bias is not None)
    if not cpu_kernel_applies(x, *params) or layers[0].weight.shape[1] != K:
        return None
    fused = fused_packed_weight(owner, layers, x.dtype)
    if fused is None:
        return None
    packed, bias = fused
    N = packed.out_features
    x2 = x.reshape(-1, K)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], N, dtype=x.dtype)
    if x2.shape[0]:
        torch.ops.domino_ops.small_batch_linear_packed.default(x2, packed.data, N, bias, out)
    return out.view(*x.shape[:-1], N)


def undo_fused_packed_linear(owner: torch.nn.Module) -> None:
    """Frees the packed concatenation :func:`fused_packed_linear` kept on ``owner``."""
    owner.__dict__.pop(_FUSED, None)


_PLACE_ALIGN = 64  # bytes: each copy starts on a cache line


def place_packed_weights(model: torch.nn.Module) -> bool:
    """Moves the packed copies cached on ``model``'s modules (each switched layer's own,
    :func:`packed_weight`, and the concatenations of :func:`fused_packed_weight`) into one
    buffer per panel dtype, back to back in ``model.modules()`` order (a decoder's forward
    order: q/k/v, o, gate/up, down, layer after layer, the LM head last). The caches then
    hold copies of the same bits at their new places; the old copies are freed. Nothing
    moves where the copies already lie so. Call it once the copies a model will run are
    made (the fast forward's plan calls it, its fused products made): a layer's copy that a
    fused one later replaces would keep its place in the buffer, unused, as long as any
    copy placed with it lives.

    Why: the weights stream from memory at every forward, one layer after another. Copies
    made one by one land wherever the allocator puts them (the small ones among other heap
    data, the large ones in separate mappings, placed downwards). On the AMX Xeon VM
    SmolLM2's 211 bf16 layers (AMX panels) streamed 1.02-1.24x slower so at one row and
    0.99-1.18x at 16 than from one buffer in forward order, which matches the model's own
    weights as its loader lays them out; float32 panels moved both ways, 0.93-1.26x
    (benchmarks/packed_placement_ab.py, eight processes: the gain follows where the
    allocator put the copies). A model's caches take twice their
    size while they move. Returns whether anything moved."""
    # (the cache's dict, its key): both caches hold their PackedLinearWeight at index 2
    entries = [(mod.__dict__, key) for mod in model.modules() for key in (_FUSED, _PACKED) if key in mod.__dict__]
    import domino_ops

    moved = False
    for dtype in {d[key][2].data.dtype for d, key in entries}:
        caches = [(d, key) for d, key in entries if d[key][2].data.dtype == dtype]
        mine = [d[key][2].data for d, key in caches]
        align = _PLACE_ALIGN // dtype.itemsize
        sizes = [-(-data.numel() // align) * align for data in mine]
        storage, start = mine[0].untyped_storage().data_ptr(), mine[0].data_ptr()
        if all(data.untyped_storage().data_ptr() == storage and data.data_ptr() == start + offset * dtype.itemsize
               for data, offset in zip(mine, itertools.accumulate([0] + sizes[:-1]))):
            continue  # already in one buffer, in this order
        arena = torch.empty(sum(sizes) + align, dtype=dtype)
        offset = (-(arena.data_ptr() // dtype.itemsize)) % align
        for (d, key), size in zip(caches, sizes):
            old = d[key][2]
            data = arena[offset:offset + old.data.numel()].view(old.data.shape)
            data.copy_(old.data)
            d[key] = (*d[key][:2], domino_ops.PackedLinearWeight(data, old.out_features, old.in_features),
                      *d[key][3:])
            offset += size
        moved = True
    return moved


def runs_packed(mod: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether a switched layer runs the packed kernel for inputs of ``dtype`` (bf16: this
    CPU has AVX512-BF16, or AVX2 without AVX-512; float32: AVX-512F; and no lower path was forced when it was
    switched)."""
    return dtype in getattr(mod, _PACKS, ())


def _cpu_packs() -> tuple:
    """The dtypes for which switched layers run the packed kernel: bf16 where the kernel's
    best path (or the one DOMINO_SMALL_BATCH_LINEAR_ISA forces at switch time) is
    avx512_bf16, or avx2 with the packed product on its avx2 path too; float32 where it is
    avx512 or avx512_bf16."""
    import domino_ops

    isa = domino_ops.small_batch_linear_isa()
    packs = []
    # bf16: on the AVX2 panels too (CPUs without AVX-512, or an AVX-512 one with both paths
    # forced to avx2): 1.21-1.29x faster than the row-major avx2 tiles for SmolLM2's linears
    # at one row, 1.11-1.27x at 16 (2-core Zen 3 VM, 2026-12-01, linear_panels_ab.py). float32 stays row-major there: the
    # AVX2 float32 panels measured faster at 1-4 rows but slower at 8-16.
    if domino_ops.small_batch_linear_packed_supported(torch.bfloat16) and (
            isa == "avx512_bf16" or (isa == "avx2" and domino_ops.small_batch_linear_packed_path() == "avx2")):
        packs.append(torch.bfloat16)
    if isa in ("avx512", "avx512_bf16") and domino_ops.small_batch_linear_packed_supported(torch.float32):
        packs.append(torch.float32)
    return tuple(packs)


def check_module(model) -> None:
    """Raises TypeError naming ``model`` unless it is a ``torch.nn.Module``: the argument of
    every kernel switch (``use_*``, ``undo_*``, ``uses_*``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")


def use_small_batch_linear(model: torch.nn.Module) -> torch.nn.Module:
    """Switches every ``nn.Linear`` of ``model`` (the model itself included) to the
    small-batch kernel, in place; returns ``model``. Idempotent."""
    check_module(model)
    import domino_ops  # noqa: F401  (registers torch.ops.domino_ops)

    packs = _cpu_packs()
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and not getattr(mod, _FLAG, False):
            w = mod.weight
            if w.dtype in packs and w.device.type == "cpu" and w.numel():
                packed_weight(mod)  # now, not inside the first (timed) forward; before switching, so
                # a failure leaves the layer as it was
            # a partial (not a bound method): a switched model still pickles (torch.save(model))
            mod.forward = functools.partial(_small_batch_forward, mod)
            setattr(mod, _FLAG, True)
            setattr(mod, _PACKS, packs)
    return model


def undo_small_batch_linear(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the original ``nn.Linear`` forwards switched by :func:`use_small_batch_linear`
    (and frees the packed concatenations of :func:`fused_packed_linear`)."""
    check_module(model)
    for mod in model.modules():
        undo_fused_packed_linear(mod)
        if getattr(mod, _FLAG, False):
            del mod.forward
            delattr(mod, _FLAG)
            delattr(mod, _PACKS)
            mod.__dict__.pop(_PACKED, None)
    return model


def uses_small_batch_linear(model: torch.nn.Module) -> bool:
    """Whether any ``nn.Linear`` of ``model`` is switched to the kernel."""
    check_module(model)
    return any(getattr(mod, _FLAG, False) for mod in model.modules())


@dataclass(frozen=True)
class PackedProduct:
    """One packed product, as ``domino_ops.small_batch_linear_packed`` takes it: the packed
    weight's data, its out features N, its bias (or None)."""

    data: torch.Tensor
    n: int
    bias: torch.Tensor | None


def packed_product(owner: torch.nn.Module, layers: tuple, dtype: torch.dtype) -> PackedProduct | None:
    """The packed product that computes ``layers`` (one switched layer, or several that
    read the same input, fused: :func:`fused_packed_weight`, kept on ``owner``) for inputs of
    ``dtype``, exactly as their switched forwards compute them; None where a layer would
    not run the packed product itself."""
    if len(layers) == 1:
        m = layers[0]
        if (not runs_packed(m, dtype) or m.weight.dtype is not dtype or not m.weight.is_contiguous()
                or (m.bias is not None and m.bias.dtype is not dtype)):
            return None  # where the switched layer itself would not run the packed product
        p = packed_weight(m)
        return PackedProduct(p.data, p.out_features, None if m.bias is None else m.bias.contiguous())
    fused = fused_packed_weight(owner, layers, dtype)
    return None if fused is None else PackedProduct(fused[0].data, fused[0].out_features, fused[1])
