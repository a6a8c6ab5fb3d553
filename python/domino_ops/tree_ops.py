"""Drop-in, sgl-kernel-compatible tree ops for EAGLE-style tree speculation.

Serving engines that draft a *tree* of tokens (SGLang, and engines copying its layout) call
sgl-kernel's ``build_tree_kernel_efficient``, ``verify_tree_greedy`` and
``tree_speculative_sampling_target_only``. The functions here have the same names, argument
order, dtypes, in-place outputs and results (sgl-project/sglang, ``sgl-kernel/python/
sgl_kernel/speculative.py`` and ``sgl-kernel/csrc/speculative/``), so such a caller can
import them from ``domino_ops`` instead of ``sgl_kernel`` and change nothing else. Like
sgl-kernel's they return None and write their outputs in place.

The tree layout (left-child / right-sibling): request ``b`` has ``N = draft_token_num``
nodes; node 0 is the root (the last verified token), node ``i >= 1`` the i-th selected draft
token. ``retrive_next_token[b, u]`` is u's first child, ``retrive_next_sibling[b, u]`` its
next sibling, -1 for none; children are in ascending node order, i.e. descending draft
score. ``retrive_index[b, u]`` is u's slot in the flat ``predicts`` buffer, ``b * N + u``.
(The ``retrive`` spelling is sgl-kernel's.)

Backends, per call (``backend=``) or for the process (``DOMINO_OPS_BACKEND``), chosen by
the same rule as the other ops (:func:`domino_ops.select_backend`): ``"native"`` is the
kernel registered as ``torch.ops.domino_ops.<op>`` for the tensors' device (the C++ CPU
kernel, or the CUDA kernel of ``csrc/cuda/``); ``"triton"`` the Triton kernel of
:mod:`domino_ops.triton` (CUDA devices, or the CPU under ``TRITON_INTERPRET=1``);
``"reference"`` the PyTorch reference of :mod:`domino_ops.reference_tree`. ``"auto"`` (the
default) takes the native kernel when the device has one, else Triton where it can run,
else the reference.

Arguments are validated with TypeError (wrong type or dtype) or ValueError (shape, device,
layout, outputs overlapping inputs, index values out of range, links that do not form a
tree), naming the argument. Types, shapes and layouts are checked here; aliasing and the
index values are checked by the native CPU kernel before it writes anything (its
RuntimeError is re-raised as ValueError; a direct ``torch.ops`` call gets the RuntimeError
and can never read or write out of bounds), and here, on CPU tensors, before the reference
or a Triton kernel runs. On a GPU the index values are not read on the host (that would
cost a device sync): the CUDA and Triton kernels never use a bad one as an address (an
out-of-range link reads as "none", an out-of-range slot is skipped, walks are bounded, a
parent cycle makes its nodes orphans; csrc/cuda/tree_common.cuh), so such input gives
unspecified but in-bounds results, and an orphan gets no warning.
"""

from __future__ import annotations

import numbers
import operator

import numpy as np
import torch

from domino_ops import _checks, reference_tree
from domino_ops import triton as triton_ops
from domino_ops.ops import _check_writable, refuse_meta_reference, select_backend

__all__ = ["build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
           "verify_tree_sampling", "FULL_MASK", "QLEN_ONLY", "QLEN_ONLY_BITPACKING"]

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2  # sgl-kernel's TreeMaskMode
_INT_DTYPES = {1: (torch.uint8, torch.int8), 2: (torch.uint16, torch.int16), 4: (torch.uint32, torch.int32)}


def _dtype_names(dtypes) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def _tensor(name: str, t, *, dtypes=None, ndim: int | None = None, device=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension{'s' if ndim > 1 else ''}, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other arguments are on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t


def _bytes_as_words(tree_mask: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A byte buffer for a bit-packed mask of ``nbytes``-byte rows, viewed as its words:
    sgl-kernel addresses the mask as bytes (its own benchmark passes ``bs*N*nbytes`` uint8),
    and row t's byte k holds its bits 8k..8k+7, which is the little-endian word every device
    here stores. The kernels write words through the view, so into the caller's bytes (a
    trailing part word is left alone)."""
    flat = tree_mask.reshape(-1)  # contiguous: a view
    if tree_mask.storage_offset() % nbytes:
        raise ValueError(f"tree_mask as a byte buffer must start at a multiple of {nbytes} bytes into its storage "
                         f"(the kernels write {nbytes}-byte words), got offset {tree_mask.storage_offset()}")
    return flat[: flat.numel() // nbytes * nbytes].view(_INT_DTYPES[nbytes][0])


def _shape(name: str, t: torch.Tensor, expected: tuple, what: str = "") -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"{name} must have shape {list(expected)}{what}, got {list(t.shape)}")


def _int(name: str, v, minimum: int, maximum: int | None = None) -> int:
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got a bool")
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(v).__name__}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {v}")
    return v


def _number(name: str, v) -> float:
    # Python's and NumPy's real numbers (numbers.Real, which no NumPy bool is), as the other
    # ops take them; not bools
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__}")
    if not 0.0 <= v <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {v}")
    return float(v)


def _in_range(name: str, t: torch.Tensor, lo: int, hi: int, what: str = "") -> None:
    """lo <= t < hi (on the CPU: :func:`domino_ops._checks.in_range`). Used before the
    reference runs; the native kernel checks the values itself (with the same wording)."""
    _checks.in_range(name, t, lo, hi, f"be {what}" if what else "be")


def _run(op: str, device: torch.device, backend, args: tuple, value_checks) -> None:
    """The chosen backend: the native kernel (its value and aliasing checks re-raised as
    ValueError), or the reference or Triton kernel after ``value_checks`` (the same checks
    in Python; their value checks read CPU tensors only)."""
    chosen = select_backend(op, device, backend)
    refuse_meta_reference(op, device, chosen)
    if chosen != "native":
        value_checks()
        (getattr(reference_tree, op) if chosen == "reference" else triton_ops.kernel(op))(*args)
        return
    try:
        getattr(torch.ops.domino_ops, op)(*args)
    except RuntimeError as e:  # the kernel's value / aliasing checks; it has written nothing
        raise ValueError(str(e)) from e


def _no_alias(outputs: dict, inputs: dict) -> None:
    """Each output's bytes are disjoint from every input's and the other outputs' (all
    tensors contiguous, on one device). For the reference; the native kernel checks this
    itself, with the same wording."""
    def span(t):
        return None if t is None or t.numel() == 0 or t.device.type == "meta" else (t.data_ptr(), t.data_ptr() + t.nbytes)

    ins = [(name, span(t)) for name, t in inputs.items()]
    seen: list[tuple[str, tuple[int, int]]] = []
    for oname, o in outputs.items():
        a = span(o)
        if a is None:
            continue
        for kind, others in (("input", ins), ("output", seen)):
            for name, b in others:
                if b is not None and a[0] < b[1] and b[0] < a[1]:
                    raise ValueError(f"output {oname} overlaps {kind} {name}")
        seen.append((oname, a))


def build_tree_kernel_efficient(parent_list: torch.Tensor, selected_index: torch.Tensor,
                                verified_seq_len: torch.Tensor, tree_mask: torch.Tensor, positions: torch.Tensor,
                                retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                                retrive_next_sibling: torch.Tensor, topk: int, depth: int, draft_token_num: int,
                                tree_mask_mode: int, *, backend: str | None = None) -> None:
    """Builds the verify tree of an EAGLE draft: mask, positions and links (sgl-kernel's op).

    Node ``i >= 1`` of request ``b`` is the draft candidate with flat index
    ``selected_index[b, i-1]`` in the concatenated per-step candidate list (length
    ``topk + (depth-1) * topk**2``); its parent is the root when that index // topk is 0, else
    the node whose selected index equals ``parent_list[b, index // topk]`` (first match).
    A node whose parent was not selected (NaN scores upstream; sgl-kernel prints "invalid
    eagle tree") is left unlinked, its mask row and position covering the ancestors found.

    Args:
        parent_list: [bs, topk*(depth-1)+1] int64, -1 then the flat indices of each step's
            expanded frontier (SGLang's ``organize_draft_results``); with depth 1 SGLang's
            empty [bs, 0] tensor of any dtype is accepted.
        selected_index: [bs, N-1] int64, the selected candidates (ascending in SGLang).
        verified_seq_len: [bs] int64, each request's length before the draft.
        tree_mask: written, by ``tree_mask_mode``: 0 FULL_MASK, bool, per request N rows of
            ``seq_len + N`` columns, flattened and concatenated over the batch (at least
            ``sum(seq_len)*N + bs*N*N`` elements); only the root and draft columns are
            written, the first ``seq_len`` columns of each row are left as the caller filled
            them (SGLang: True). 1 QLEN_ONLY, bool, ``bs*N*N``: row t, column j true when node
            j is t, an ancestor of t or the root. 2 QLEN_ONLY_BITPACKING: one uint8 / uint16 /
            uint32 word per row for N <= 8 / 16 / 32 (int8/16/32 also accepted), bit j as
            column j of QLEN_ONLY; or, as sgl-kernel also takes it, a uint8 / int8 buffer of
            ``bs*N*nbytes`` bytes (the same words, little-endian).
        positions: at least bs*N int64, written ``seq_len + depth`` in its first bs*N elements.
        retrive_index, retrive_next_token, retrive_next_sibling: [bs, N] int64, written:
            ``b*N + u``; u's first child; u's next sibling (-1 for none). Every element is
            written (sgl-kernel needs the links pre-filled with -1; the result is the same).
        topk, depth: ints in [1, 2^20]. draft_token_num (N): an int >= 1. tree_mask_mode: 0, 1
            or 2.
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    """
    # the native kernel's bound (topk * depth cannot overflow), on every backend
    topk = _int("topk", topk, 1, 1 << 20)
    depth = _int("depth", depth, 1, 1 << 20)
    n = _int("draft_token_num", draft_token_num, 1)
    mode = _int("tree_mask_mode", tree_mask_mode, 0)
    if mode not in (FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING):
        raise ValueError(f"tree_mask_mode must be 0 (FULL_MASK), 1 (QLEN_ONLY) or 2 (QLEN_ONLY_BITPACKING), got {mode}")
    if mode == QLEN_ONLY_BITPACKING and n > 32:
        raise ValueError(f"draft_token_num must be <= 32 with QLEN_ONLY_BITPACKING (32-bit rows), got {n}")
    selected_index = _tensor("selected_index", selected_index, ndim=2, dtypes=(torch.int64,))
    dev = selected_index.device
    bs = selected_index.shape[0]
    _shape("selected_index", selected_index, (bs, n - 1), " ([bs, draft_token_num - 1])")
    parents = topk * (depth - 1) + 1
    parent_list = _tensor("parent_list", parent_list, ndim=2, device=dev)
    if not (depth == 1 and tuple(parent_list.shape) == (bs, 0)):
        _shape("parent_list", parent_list, (bs, parents), " ([bs, topk * (depth - 1) + 1])")
        _tensor("parent_list", parent_list, dtypes=(torch.int64,))
    verified_seq_len = _tensor("verified_seq_len", verified_seq_len, ndim=1, dtypes=(torch.int64,), device=dev)
    _shape("verified_seq_len", verified_seq_len, (bs,))
    if mode == QLEN_ONLY_BITPACKING:
        nbytes = 1 if n <= 8 else (2 if n <= 16 else 4)
        words_or_bytes = _INT_DTYPES[nbytes] + (_INT_DTYPES[1] if nbytes > 1 else ())
        tree_mask = _tensor("tree_mask", tree_mask, dtypes=words_or_bytes, device=dev)
        need = bs * n
        if tree_mask.element_size() < nbytes:
            if tree_mask.numel() < need * nbytes:
                raise ValueError(f"tree_mask must hold at least {need * nbytes} bytes ({need} rows of {nbytes}) "
                                 f"for tree_mask_mode={mode}, got {tree_mask.numel()}")
            tree_mask = _bytes_as_words(tree_mask, nbytes)
    else:
        tree_mask = _tensor("tree_mask", tree_mask, dtypes=(torch.bool,), device=dev)
        need = bs * n * n
    if tree_mask.numel() < need:
        raise ValueError(f"tree_mask must hold at least {need} elements for tree_mask_mode={mode}, "
                         f"got {tree_mask.numel()}")
    positions = _tensor("positions", positions, dtypes=(torch.int64,), device=dev)
    if positions.numel() < bs * n:
        raise ValueError(f"positions must hold at least bs * draft_token_num = {bs * n} elements, "
                         f"got {positions.numel()}")
    links = {}
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        links[name] = _tensor(name, t, ndim=2, dtypes=(torch.int64,), device=dev)
        _shape(name, t, (bs, n))
    for name, t in (("tree_mask", tree_mask), ("positions", positions), *links.items()):
        _check_writable(name, t)  # the outputs, written in place by every backend alike

    def values():
        _no_alias({"tree_mask": tree_mask, "positions": positions, **links},
                  {"parent_list": parent_list, "selected_index": selected_index, "verified_seq_len": verified_seq_len})
        _in_range("selected_index", selected_index, 0, topk * parents)
        # bounded so that positions (seq + depth) and the FULL_MASK size below cannot overflow
        if dev.type == "cpu" and bs and not 0 <= int(verified_seq_len.min()) <= int(verified_seq_len.max()) < 1 << 31:
            raise ValueError(f"verified_seq_len must be a length in [0, 2^31), got values in "
                             f"[{int(verified_seq_len.min())}, {int(verified_seq_len.max())}]")
        if mode == FULL_MASK and dev.type == "cpu" and tree_mask.numel() < need + int(verified_seq_len.sum()) * n:
            raise ValueError(f"tree_mask must hold sum(verified_seq_len) * draft_token_num + bs * draft_token_num^2 = "
                             f"{need + int(verified_seq_len.sum()) * n} elements in FULL_MASK mode, got {tree_mask.numel()}")

    _run("build_tree_kernel_efficient", dev, backend, (parent_list, selected_index, verified_seq_len, tree_mask,
         positions, retrive_index, retrive_next_token, retrive_next_sibling, topk, depth, n, mode), values)


def _verify_common(predicts, accept_index, accept_token_num, candidates, retrive_index,
                   retrive_next_token, retrive_next_sibling):
    candidates = _tensor("candidates", candidates, ndim=2, dtypes=(torch.int64,))
    dev = candidates.device
    bs, n = candidates.shape
    if n < 1:
        raise ValueError(f"candidates must have at least one node (the root) per request, got shape {list(candidates.shape)}")
    for name, t in (("retrive_index", retrive_index), ("retrive_next_token", retrive_next_token),
                    ("retrive_next_sibling", retrive_next_sibling)):
        _tensor(name, t, ndim=2, dtypes=(torch.int64,), device=dev)
        _shape(name, t, (bs, n))
    predicts = _tensor("predicts", predicts, ndim=1, dtypes=(torch.int32,), device=dev)
    accept_index = _tensor("accept_index", accept_index, ndim=2, dtypes=(torch.int32,), device=dev)
    if accept_index.shape[0] != bs or accept_index.shape[1] < 1:
        raise ValueError(f"accept_index must have shape [{bs}, num_spec_step] with num_spec_step >= 1, "
                         f"got {list(accept_index.shape)}")
    _tensor("accept_token_num", accept_token_num, ndim=1, dtypes=(torch.int32,), device=dev)
    _shape("accept_token_num", accept_token_num, (bs,))
    for name, t in (("predicts", predicts), ("accept_index", accept_index), ("accept_token_num", accept_token_num)):
        _check_writable(name, t)  # the outputs, written in place by every backend alike
    return dev, bs, n


def _link_values(retrive_next_token, retrive_next_sibling, n: int) -> None:
    """On CPU tensors (device values would cost a sync), the links' values as the kernels
    check them: -1 or a node in [0, n), forming a tree in first-child / next-sibling links:
    the root named by no link and every other node by at most one, so that a walk from the
    root never meets a node twice."""
    links = (("retrive_next_token", retrive_next_token), ("retrive_next_sibling", retrive_next_sibling))
    if retrive_next_token.device.type != "cpu" or not retrive_next_token.numel():
        return
    for name, t in links:
        if int(t.min()) < -1 or int(t.max()) >= n:
            raise ValueError(f"{name} must be -1 or a node in [0, {n}), got values in [{int(t.min())}, {int(t.max())}]")
        if bool((t == 0).any()):
            b, u = (t == 0).nonzero()[0].tolist()
            raise ValueError(f"{name} of request {b} names the root (node 0) at node {u}: the links do not form a tree")
    both = torch.cat([retrive_next_token, retrive_next_sibling], dim=1)  # [bs, 2n]
    named = both >= 0
    rows = torch.arange(both.shape[0]).unsqueeze(1).expand_as(both)
    counts = torch.bincount((rows * n + both)[named], minlength=both.shape[0] * n)
    if bool((counts > 1).any()):
        b, v = divmod(int((counts > 1).nonzero()[0]), n)
        raise ValueError(f"retrive_next_token / retrive_next_sibling of request {b} name node {v} more than once: "
                         "the links do not form a tree")


def verify_tree_greedy(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                       candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                       retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor, *,
                       backend: str | None = None) -> None:
    """Greedy verification of a draft tree (sgl-kernel's op).

    From the root, at each of at most ``num_spec_step - 1`` levels the first child (in
    sibling order) whose candidate equals the target's token at the current node is
    accepted. ``predicts[r(u)]`` gets the accepted child's token for every accepted parent u
    and the target's token at the last accepted node (the bonus), r = ``retrive_index``.

    Args:
        predicts: [>= bs*N] int32, written at ``retrive_index`` slots: the tokens above, -1
            at nodes off the accepted path (sgl-kernel leaves those as they were; SGLang
            ignores them). Slots no ``retrive_index`` names are left alone.
        accept_index: [bs, num_spec_step] int32, written: ``retrive_index`` of the accepted
            nodes, root first, then -1.
        accept_token_num: [bs] int32, written: accepted drafts (root not counted).
        candidates: [bs, N] int64, each node's draft token (the root's is not used).
        retrive_index, retrive_next_token, retrive_next_sibling: [bs, N] int64, the tree.
        target_predict: [bs, N] int64, the target's argmax at each node, addressed by
            ``retrive_index`` as a flat [bs*N] array (as sgl-kernel does); token ids in
            [0, 2^31), every one (they are written into int32 ``predicts``).
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    """
    dev, bs, n = _verify_common(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling)
    _tensor("target_predict", target_predict, ndim=2, dtypes=(torch.int64,), device=dev)
    _shape("target_predict", target_predict, (bs, n))
    def values():
        _no_alias({"predicts": predicts, "accept_index": accept_index, "accept_token_num": accept_token_num},
                  {"candidates": candidates, "retrive_index": retrive_index, "retrive_next_token": retrive_next_token,
                   "retrive_next_sibling": retrive_next_sibling, "target_predict": target_predict})
        _in_range("retrive_index", retrive_index, 0, min(predicts.numel(), bs * n))  # predicts, target_predict
        _link_values(retrive_next_token, retrive_next_sibling, n)
        # written into int32 predicts: what a cast would change is refused (the native kernel
        # checks the same, with the same words)
        _checks.in_range("target_predict", target_predict, 0, 2 ** 31, "hold token ids (predicts is int32)")

    _run("verify_tree_greedy", dev, backend, (predicts, accept_index, accept_token_num, candidates, retrive_index,
         retrive_next_token, retrive_next_sibling, target_predict), values)


def tree_speculative_sampling_target_only(predicts: torch.Tensor, accept_index: torch.Tensor,
                                          accept_token_num: torch.Tensor, candidates: torch.Tensor,
                                          retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                                          retrive_next_sibling: torch.Tensor, uniform_samples: torch.Tensor,
                                          uniform_samples_for_final_sampling: torch.Tensor,
                                          target_probs: torch.Tensor, draft_probs: torch.Tensor | None = None,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0,
                                          deterministic: bool = True, *, backend: str | None = None) -> None:
    """Sampled verification of a draft tree against the target only (sgl-kernel's op).

    At node u one coin ``c = uniform_samples[b, u]`` serves all of u's children: they are
    tried in sibling order accumulating their target probabilities ``acc += p_u(token)``
    (float32), and a child is accepted when ``c <= acc / max(threshold_acc, 1e-9)`` or
    ``p_u(token) >= threshold_single``; the walk then moves to it (at most num_spec_step - 1
    times). The last token is drawn, with ``uniform_samples_for_final_sampling[b]``, from
    ``max(p_u - q_u, 0)`` at the last accepted node u with the children rejected there
    zeroed, ``q_u = draft_probs[b, u]`` (zeros when None; not used after a full acceptance).
    With both thresholds 1, no draft_probs (or zeros, as SGLang passes) and distinct sibling
    tokens, every emitted token is distributed exactly as the target's: lossless. Smaller
    thresholds accept more and are lossy by design.

    Args:
        predicts, accept_index, accept_token_num: outputs, as in :func:`verify_tree_greedy`
            (predicts gets the accepted tokens and the final draw).
        candidates, retrive_index, retrive_next_token, retrive_next_sibling: the tree, as in
            :func:`verify_tree_greedy`; candidates are token ids in [0, vocab_size) (the
            native kernel checks those it reads, the reference path all but the root's).
        uniform_samples: [bs, N] float32 in [0, 1], one coin per node (1 is taken, as
            sgl-kernel takes it: ``1 - torch.rand`` gives it; it accepts a child only where
            the children's target mass reaches 1).
        uniform_samples_for_final_sampling: [bs] float32 in [0, 1] (1 draws the last token
            of positive weight).
        target_probs: [bs, N, vocab_size] float32, the target's distribution at each node.
        draft_probs: [bs, N, vocab_size] float32 or None (newer sgl-kernel releases dropped
            this argument; pass the thresholds by keyword then). Never written here
            (sgl-kernel writes rejected children's target probabilities into it).
        threshold_single, threshold_acc: in [0, 1]. deterministic: bool, accepted for
            compatibility (every kernel here is deterministic).
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    """
    if draft_probs is not None and not isinstance(draft_probs, torch.Tensor):
        raise TypeError(f"draft_probs must be a torch.Tensor or None, got {type(draft_probs).__name__} (newer "
                        "sgl-kernel releases dropped draft_probs: pass threshold_single, threshold_acc and "
                        "deterministic by keyword)")
    dev, values = _sampler_args(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling, uniform_samples,
                                uniform_samples_for_final_sampling, target_probs, draft_probs, torch.float32,
                                coins_closed=True)
    threshold_single = _number("threshold_single", threshold_single)
    threshold_acc = _number("threshold_acc", threshold_acc)
    deterministic = _checks.flag("deterministic", deterministic)
    _run("tree_speculative_sampling_target_only", dev, backend, (predicts, accept_index, accept_token_num, candidates,
         retrive_index, retrive_next_token, retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling,
         target_probs, draft_probs, threshold_single, threshold_acc, deterministic), values)


def _sampler_args(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                  retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                  draft_probs, uniform_dtype, *, coins_closed):
    """The checks the two tree samplers share: (device, the value checks for the reference).
    The coins must be in [0, 1), or in [0, 1] where ``coins_closed``."""
    dev, bs, n = _verify_common(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling)
    for name, t in (("uniform_samples", uniform_samples),
                    ("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling)):
        _tensor(name, t, dtypes=(uniform_dtype,), device=dev)
    _shape("uniform_samples", uniform_samples, (bs, n))
    _shape("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, (bs,))
    target_probs = _tensor("target_probs", target_probs, ndim=3, dtypes=(torch.float32,), device=dev)
    if target_probs.shape[:2] != (bs, n) or target_probs.shape[2] < 1:
        raise ValueError(f"target_probs must have shape [{bs}, {n}, vocab_size], got {list(target_probs.shape)}")
    if draft_probs is not None:
        _tensor("draft_probs", draft_probs, dtypes=(torch.float32,), device=dev)
        _shape("draft_probs", draft_probs, tuple(target_probs.shape), " (the shape of target_probs)")

    def values():
        _no_alias({"predicts": predicts, "accept_index": accept_index, "accept_token_num": accept_token_num},
                  {"candidates": candidates, "retrive_index": retrive_index, "retrive_next_token": retrive_next_token,
                   "retrive_next_sibling": retrive_next_sibling, "uniform_samples": uniform_samples,
                   "uniform_samples_for_final_sampling": uniform_samples_for_final_sampling,
                   "target_probs": target_probs, "draft_probs": draft_probs})
        _in_range("retrive_index", retrive_index, 0, predicts.numel())
        _link_values(retrive_next_token, retrive_next_sibling, n)
        _in_range("candidates", candidates[:, 1:], 0, target_probs.shape[2], "token ids")
        _checks.unit_interval("uniform_samples", uniform_samples, coins_closed)
        _checks.unit_interval("uniform_samples_for_final_sampling", uniform_samples_for_final_sampling, coins_closed)
    return dev, values


def verify_tree_sampling(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                         candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                         retrive_next_sibling: torch.Tensor, uniform_samples: torch.Tensor,
                         uniform_samples_for_final_sampling: torch.Tensor, target_probs: torch.Tensor,
                         draft_probs: torch.Tensor, *, backend: str | None = None) -> None:
    """Lossless verification of a sampled draft tree that uses the draft's probabilities
    (recursive rejection sampling, Recursive Speculative Decoding, arXiv 2402.14160).

    The children of each node u must have been drawn from the draft distribution
    ``q_u = draft_probs[b, u]`` *without replacement*, in sibling order (e.g. Gumbel-top-k),
    and be distinct tokens. From the root, the children of the current node are tried in
    sibling order against a target ``p`` and draft ``q`` that start as ``p_u`` and ``q_u``:
    child x is accepted when ``q(x) > 0`` and ``uniform_samples[b, x's node] * q(x) < p(x)``
    (probability ``min(1, p(x)/q(x))``; a child of draft probability 0 could not have been
    drawn and is rejected, a no-op) and the walk moves to it (at most
    ``num_spec_step - 1`` times).
    A rejection replaces ``p`` by the residual ``normalize(max(0, p - q))`` and removes x from
    ``q`` (renormalised). When all children are rejected the last token is drawn from the
    residual; at a leaf, or after ``num_spec_step - 1`` acceptances, from ``p_u``. The draw
    uses ``uniform_samples_for_final_sampling[b]`` (inverse CDF, float64, index order).
    Every emitted token is distributed exactly as the target's; with one child per node
    (drawn from q) the result is exactly :func:`domino_ops.verify_sampling`'s for the same
    uniforms (column ``u`` of ``uniform_samples`` playing ``uniforms_accept[:, u-1]`` for
    the chain's node u).

    Unlike :func:`tree_speculative_sampling_target_only`, which accepts child k with
    probability ``p_u(token_k)`` whatever the draft believed, this uses ``q``: a draft that
    matches the target is accepted with probability one.

    Args:
        predicts, accept_index, accept_token_num: outputs, as in :func:`verify_tree_greedy`.
        candidates, retrive_index, retrive_next_token, retrive_next_sibling: the tree, as in
            :func:`verify_tree_greedy`; candidates are token ids in [0, vocab_size).
        uniform_samples: [bs, N] float64 in [0, 1), one per node (its acceptance coin;
            column 0, the root's, is not used).
        uniform_samples_for_final_sampling: [bs] float64 in [0, 1).
        target_probs: [bs, N, vocab_size] float32, the target's distribution at each node.
        draft_probs: [bs, N, vocab_size] float32, the distribution each node's children were
            drawn from.
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    The last token is 0 when the distribution it is drawn from has no positive mass (not a
    distribution: zeros, NaN, negatives), as in :func:`domino_ops.verify_sampling`. The CPU
    kernel and the reference sum in index order and agree exactly; the CUDA and Triton
    kernels' float64 totals are parallel reductions, which can change a decision only when a
    uniform lands within rounding (~1e-16 relative) of a threshold.
    """
    if not isinstance(draft_probs, torch.Tensor):
        raise TypeError(f"draft_probs must be a torch.Tensor, got {type(draft_probs).__name__}")
    dev, values = _sampler_args(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling, uniform_samples,
                                uniform_samples_for_final_sampling, target_probs, draft_probs, torch.float64,
                                coins_closed=False)
    _run("verify_tree_sampling", dev, backend, (predicts, accept_index, accept_token_num, candidates, retrive_index,
         retrive_next_token, retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling,
         target_probs, draft_probs), values)
