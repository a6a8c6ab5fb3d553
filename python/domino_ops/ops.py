"""Public ops: validate, allocate outputs, dispatch to a backend.

Backends, chosen per call (``backend=``) or for the process (``DOMINO_OPS_BACKEND``):

- ``"native"``: the C++ CPU kernels or the hand-written CUDA kernels registered as
  ``torch.ops.domino_ops.<op>``;
- ``"triton"``: the Triton kernels of :mod:`domino_ops.triton` (CUDA devices, or the CPU
  under ``TRITON_INTERPRET=1``);
- ``"reference"``: the PyTorch references of :mod:`domino_ops.reference`.

``"auto"`` (the default) takes the native kernel for the tensors' device if there is one,
else Triton if it can run there, else the reference, so every op works on every device.
"""

from __future__ import annotations

import functools
import os
import weakref

import torch

from domino_ops import _checks, reference
from domino_ops import triton as triton_ops
from domino_ops.linear_packed import PANEL_COLS, PackedLinearWeight, small_batch_linear_packed_supported
from domino_ops.sampling import drawn_uniforms, expand_uniforms, kernel_sampling_args, may_sample, repeat_over_rows

__all__ = ["domino_head_rollout", "domino_head_expand", "sample", "filtered_probs", "verify_greedy", "verify_sampling", "has_kernel", "select_backend"]

BACKENDS = ("auto", "native", "triton", "reference")


def has_kernel(op: str, device: torch.device | str) -> bool:
    """Whether ``op`` has a native kernel for ``device`` (e.g. "cpu", "cuda")."""
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(torch.device(device).type)
    return key is not None and _registered(op, key)


@functools.cache
def _registered(op: str, key: str) -> bool:
    # The extension registers its kernels when it is imported, before any call here, and
    # never again; the dispatcher's lookup costs ~10 us, and every op call asks it.
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"domino_ops::{op}", key)


def select_backend(op: str, device: torch.device | str, backend: str | None = None) -> str:
    """The backend ("native", "triton" or "reference") that runs ``op`` on ``device``:
    ``backend``, else ``$DOMINO_OPS_BACKEND``, else "auto" (see the module docstring).
    Raises ValueError for an unknown name and RuntimeError when the one asked for cannot
    run on ``device``."""
    choice = backend if backend is not None else os.environ.get("DOMINO_OPS_BACKEND", "auto")
    if choice not in BACKENDS:
        source = "backend" if backend is not None else "DOMINO_OPS_BACKEND"
        raise ValueError(f"{source} must be one of {BACKENDS}, got {choice!r}")
    device = torch.device(device)
    if choice == "auto":
        if has_kernel(op, device):
            return "native"
        return "triton" if op in triton_ops.OPS and triton_ops.available(device) else "reference"
    if choice == "native" and not has_kernel(op, device):
        raise RuntimeError(f"backend='native': domino_ops has no {op} kernel for {device.type} "
                           f"(CUDA kernels compiled into this build: {_cuda_compiled()})")
    if choice == "triton" and op not in triton_ops.OPS:
        raise RuntimeError(f"backend='triton': there is no Triton kernel for {op} yet")
    if choice == "triton" and not triton_ops.available(device):
        raise RuntimeError(f"backend='triton': Triton cannot run on {device.type} here (needs triton and a CUDA "
                           "device, or TRITON_INTERPRET=1 for the CPU interpreter)")
    return choice


def refuse_meta_reference(op: str, device: torch.device, chosen: str) -> None:
    """The references of the samplers and tree ops read their inputs' values (a filter's
    threshold, a walk's next node), which tensors on the meta device do not have: a clear
    ValueError instead of PyTorch's from deep inside them."""
    if chosen == "reference" and device.type == "meta":
        raise ValueError(f"{op} reads its inputs' values, which tensors on the meta device do not have "
                         f"(torch.ops.domino_ops.{op} has a fake kernel for tracing shapes)")


def _cuda_compiled() -> bool:
    from domino_ops import _C
    return bool(_C.cuda_compiled)


def _kernel(op: str, backend: str):
    return getattr(torch.ops.domino_ops, op) if backend == "native" else triton_ops.kernel(op)


def _head_weights(gru_input, w_ih, w_hh, w1s, w2, V: int, dev) -> tuple[int, int]:
    """Checks the head's weights for a vocabulary of V; returns (r, G)."""
    w2 = _checks.tensor("w2", w2, ndim=2, dtypes=_checks.FLOAT_OR_BF16, device=dev, contiguous=True)
    wdt = (w2.dtype,)
    w1s = _checks.tensor("w1s", w1s, ndim=2, dtypes=wdt, device=dev, contiguous=True)
    w_hh = _checks.tensor("w_hh", w_hh, ndim=2, dtypes=wdt, device=dev, contiguous=True)
    gru_input = _checks.tensor("gru_input", gru_input, ndim=2, dtypes=wdt, device=dev, contiguous=True)
    r, G = w1s.shape
    _checks.shape("w_hh", w_hh, (3 * G, G))
    _checks.shape("w2", w2, (V, r))
    if w_ih is None:
        _checks.shape("gru_input (the table E @ w_ih.T, since w_ih is None)", gru_input, (V, 3 * G))
    else:
        w_ih = _checks.tensor("w_ih", w_ih, ndim=2, dtypes=wdt, device=dev, contiguous=True)
        _checks.shape("gru_input (the embedding, since w_ih is given)", gru_input, (V, None))
        _checks.shape("w_ih", w_ih, (3 * G, gru_input.shape[1]))
    return r, G


def domino_head_rollout(base_logits: torch.Tensor, hproj: torch.Tensor, state: torch.Tensor, gru_input: torch.Tensor,
                        w_ih: torch.Tensor | None, w_hh: torch.Tensor, w1s: torch.Tensor, w2: torch.Tensor, *,
                        temperature: float | torch.Tensor = 0.0, top_k: int | torch.Tensor = 0,
                        top_p: float | torch.Tensor = 1.0,
                        generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None = None,
                        write_logits: bool = False,
                        backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafts k tokens with the Domino head, one GRU step per token.

    For i in 0..k-1: ``L = base_logits[:, i] + w2 @ silu(hproj[:, i] + w1s @ S)``; the
    token is ``argmax(L)`` at temperature 0, else a sample of
    ``softmax(filter(L / temperature))`` (top-k, then top-p); then
    ``S = GRUCell(E[token], S)`` (torch.nn.GRUCell gate order, no biases).

    Args:
        base_logits: [b, k, V] float32 or bfloat16, contiguous, sharing no memory with the
            other arguments. Overwritten with the final logits L when ``write_logits`` (so
            then not a tensor that requires grad, nor an inference tensor outside
            ``torch.inference_mode()``).
        hproj: [b, k, r] float32 or bfloat16, ``W1[:, :H] @ h_i`` for each position.
        state: [b, G] float32, the GRU state after the tokens already fixed.
        gru_input: the token embedding [V, H] (then ``w_ih`` [3G, H] is required) or the
            table ``E @ w_ih.T`` [V, 3G] (then ``w_ih`` is None).
        w_ih (above), w_hh ([3G, G]), w1s ([r, G], ``W1[:, H:]``), w2 ([V, r]): float32 or
            bfloat16, one dtype for all weights, contiguous.
        temperature: 0 for greedy (below 1e-20 counts as 0: the argmax is its limit).
            top_k: 0 (or >= V) disables. top_p: in (0, 1]; one below the largest
            probability keeps exactly the top token. Each is a Python number or a [b]
            tensor on the op's device (float / integer / float), one value per sequence:
            the batch can mix greedy and sampled requests.
        generator: torch.Generator for the uniforms consumed when some row samples (a
            temperature > 0, or temperature given as a tensor), or a list of b of them
            (row i draws from generator i: per-request seeds). The CPU
            kernel and top-k/top-p sampling invert the CDF at them; the CUDA and Triton
            kernels' plain-temperature path uses each step's uniform as the 64-bit seed of
            an exponential race (same distribution, different draws).
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    Returns:
        tokens [b, k] int64; logprobs [b, k] float32, the log-probability of each token
        under the distribution it was drawn from (at temperature 0, under softmax(L));
        state [b, G] float32 after the GRU has consumed all k tokens.
    """
    t = _checks.tensor("base_logits", base_logits, ndim=3, dtypes=_checks.FLOAT_OR_BF16, contiguous=True)
    dev = t.device
    b, k, V = base_logits.shape
    hproj = _checks.tensor("hproj", hproj, ndim=3, dtypes=_checks.FLOAT_OR_BF16, device=dev)
    state = _checks.tensor("state", state, ndim=2, dtypes=(torch.float32,), device=dev)
    r, G = _head_weights(gru_input, w_ih, w_hh, w1s, w2, V, dev)
    _checks.shape("hproj", hproj, (b, k, r))
    _checks.shape("state", state, (b, G))
    temperature, top_k, top_p = _checks.sampling_params(temperature, top_k, top_p, rows=b, device=dev)
    _checks.generator(generator, dev, rows=b)
    write_logits = _checks.flag("write_logits", write_logits)
    if write_logits:
        _check_writable("base_logits", base_logits)
    # one rule for every backend (the native kernels' own): base_logits, which a kernel may
    # write, shares no memory with the other arguments
    inputs = _head_inputs("state", hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k, top_p)
    _checks.no_overlap([("base_logits", base_logits)], inputs)
    _checks.no_autograd("domino_head_rollout", [("base_logits", base_logits)] + inputs)
    chosen = select_backend("domino_head_rollout", dev, backend)
    if may_sample(temperature):  # greedy runs on meta; sampling's reference reads values
        refuse_meta_reference("domino_head_rollout", dev, chosen)
    if chosen == "reference":
        return reference.domino_head_rollout(
            base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature=temperature,
            top_k=top_k, top_p=top_p, generator=generator, write_logits=write_logits)
    T, top_k, top_p, row_T, row_k, row_p = kernel_sampling_args(temperature, top_k, top_p, V)
    uniforms = drawn_uniforms((b, k), dev, generator) if may_sample(temperature) else None
    tokens = torch.empty(b, k, dtype=torch.int64, device=dev)
    logprobs = torch.empty(b, k, dtype=torch.float32, device=dev)
    state_out = torch.empty(b, G, dtype=torch.float32, device=dev)
    _kernel("domino_head_rollout", chosen)(
        base_logits, hproj.contiguous(), state.contiguous(), gru_input, w_ih, w_hh, w1s, w2,
        T, top_k, top_p, uniforms, write_logits, tokens, logprobs, state_out, row_T, row_k, row_p)
    return tokens, logprobs, state_out


def _check_writable(name: str, t: torch.Tensor) -> None:
    """A tensor an op overwrites in place: not one autograd tracks, not an inference tensor
    outside inference mode (both of which PyTorch itself refuses to update in place)."""
    if t.requires_grad:
        raise ValueError(f"{name} is overwritten in place, but requires grad: pass a detached tensor")
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(f"{name} is overwritten in place, but is an inference tensor used outside "
                         "torch.inference_mode(): call the op inside it, or pass a clone")


def _head_inputs(state_name: str, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k, top_p) -> list:
    """The named tensors :func:`domino_head_rollout` and :func:`domino_head_expand` read
    besides their per-position inputs (None where absent or a number); the GRU state is
    named ``state_name`` (rollout: state, expand: node_state)."""
    maybe = lambda t: t if isinstance(t, torch.Tensor) else None  # noqa: E731
    return [("hproj", hproj), (state_name, state), ("gru_input", gru_input), ("w_ih", w_ih), ("w_hh", w_hh),
            ("w1s", w1s), ("w2", w2), ("temperature", maybe(temperature)), ("top_k", maybe(top_k)),
            ("top_p", maybe(top_p))]


def domino_head_expand(base_logits: torch.Tensor, hproj: torch.Tensor, node_state: torch.Tensor,
                       node_seq: torch.Tensor, node_depth: torch.Tensor, gru_input: torch.Tensor,
                       w_ih: torch.Tensor | None, w_hh: torch.Tensor, w1s: torch.Tensor, w2: torch.Tensor, *,
                       num_children: int, temperature: float | torch.Tensor = 0.0, top_k: int | torch.Tensor = 0,
                       top_p: float | torch.Tensor = 1.0,
                       generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None = None,
                       backend: str | None = None,
                       w2_packed: PackedLinearWeight | None = None, w_hh_packed: PackedLinearWeight | None = None,
                       write_node_logits: bool = True,
                       out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One step of Domino tree drafting: the children of a frontier of tree nodes.

    Node f belongs to sequence ``node_seq[f]``, sits at depth ``d = node_depth[f]`` and
    carries its own GRU state ``S = node_state[f]``; nodes of a sequence at one depth share
    that position's ``hproj`` and base logits. For every node::

        L = base_logits[seq, d] + w2 @ silu(hproj[seq, d] + w1s @ S)

    and its ``num_children`` children: at temperature 0 the best tokens of L (descending,
    NaN first as torch.argmax, ties by index) with their ``log_softmax(L)``; at T > 0
    draws *without replacement* from ``softmax(filter(L / T))`` (top-k, then top-p; draw j
    is the inverse CDF at the node's j-th uniform over the weights not drawn yet), with
    their log-probabilities under that whole filtered distribution; a node whose filtered
    support is smaller than ``num_children`` fills the rest with its best remaining tokens
    at log-probability -inf (a sampler never proposes them; :func:`verify_tree_sampling`
    rejects them). Every child gets its own state ``GRUCell(E[child], S)``. The weights
    are streamed once for the whole frontier, never once per node. A frontier of one node
    with one child is a step of :func:`domino_head_rollout`.

    Args:
        base_logits: [b, k, V] float32 or bfloat16, the parallel backbone's logits per
            position (read only).
        hproj: [b, k, r] float32 or bfloat16, ``W1[:, :H] @ h`` per position.
        node_state: [n, G] float32, each node's GRU state (its path's tokens consumed).
        node_seq: [n] int64 in [0, b); node_depth: [n] int64 in [0, k).
        gru_input, w_ih, w_hh, w1s, w2: as :func:`domino_head_rollout`.
        num_children: int in [1, V], children per node.
        temperature, top_k, top_p: as :func:`domino_head_rollout`: Python numbers, or [b]
            tensors with one value per sequence (node f samples with those of its sequence
            ``node_seq[f]``): a frontier can mix greedy and sampled requests, and a greedy
            node among sampled ones gets exactly the children and (up to rounding) the
            log-probabilities a greedy call gives it.
        generator: torch.Generator for the [n, num_children] float64 uniforms consumed when
            some node may sample (a temperature > 0, or temperature given as a tensor), or a
            list of b of them, one per sequence (per-request seeds): sequence s's nodes draw
            their uniforms from generator s, in frontier order, ``num_children`` per node (so a
            sequence's draws do not depend on the other sequences of the frontier; the list
            reads ``node_seq`` on the host, a device sync on a GPU).
        backend: "auto", "native", "triton" or "reference" (see the module docstring). The
            CUDA and Triton kernels sum the float64 sampling totals by parallel reduction (a
            draw can differ from the CPU kernel's only within rounding of a CDF step), and
            clamp node indices they cannot check without a device sync (a node_seq or
            node_depth out of range on a GPU gives unspecified but in-bounds results).
        w2_packed: None, or on the CPU with bf16 weights and AVX512-BF16 or AVX2
            (:func:`small_batch_linear_packed_supported`) w2 packed once by
            :func:`pack_small_batch_linear_weight`: the native kernel then runs ``w2 @ a`` as
            :func:`small_batch_linear_packed` does on it (AVX512-BF16 dot products, AMX tiles
            or AVX2 FMAs: :func:`small_batch_linear_packed_path`), ``a`` rounded to bf16 (as the reference's
            ``F.linear(a.to(w2.dtype), w2)`` and :func:`small_batch_linear_packed` round it;
            without it ``a`` stays float32), a float32 sum; 1.5-1.8x faster at the paper
            shape from 4 nodes up (``benchmarks/bench_head.py``). A copy of w2: keep it in step.
        w_hh_packed: None, or, under the same conditions, w_hh packed the same way: the GRU's
            ``w_hh @ S`` then runs as that packed product (S rounded to bf16, as the
            reference's ``F.linear(S.to(w_hh.dtype), w_hh)``; without it S stays float32)
            instead of float32 FMAs over the bf16 rows, ~0.6 ms a 16-node step at the paper
            shape. A copy of w_hh: keep it in step.
        write_node_logits: False for a caller that never reads the node logits (a greedy
            tree): the fourth output is then None. The CPU kernel at temperature 0 with at
            most 32 children then never writes the rows (4 V bytes a node: ~10 MB at 16
            nodes of the paper shape, against w2's 78 MB read); the others still compute
            them into a scratch tensor, as they read them back. The other outputs are the
            same bits either way.
        out: None, or the four outputs below, preallocated (their shapes and dtypes,
            contiguous, on the inputs' device; the kernels refuse outputs that share
            memory with the inputs or each other; the fourth None exactly when
            ``write_node_logits`` is False), to write into and return instead of new
            tensors: a caller stepping a tree reuses them.
    Returns:
        child_tokens [n, num_children] int64, child_logprobs [n, num_children] float32,
        child_state [n, num_children, G] float32, node_logits [n, V] float32 or None (each
        node's L, from which the draft distribution for :func:`verify_tree_sampling` is
        ``filtered_probs(node_logits, temperature, top_k, top_p)``).
    """
    chosen, temperature, top_k, top_p = check_expand_args(
        base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2, num_children,
        temperature, top_k, top_p, generator, backend, w2_packed, w_hh_packed)
    write_node_logits = _checks.flag("write_node_logits", write_node_logits)
    inputs = _head_inputs("node_state", hproj, node_state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k, top_p)
    _checks.no_autograd("domino_head_expand", [("base_logits", base_logits)] + inputs)
    if out is not None:
        check_expand_out(out, node_state.shape[0], num_children, node_state.shape[1], base_logits.shape[2],
                         base_logits.device, write_node_logits)
        _checks.no_overlap(zip(("out's child_tokens", "out's child_logprobs", "out's child_state", "out's node_logits"),
                               out),
                           [("base_logits", base_logits), ("node_seq", node_seq), ("node_depth", node_depth),
                            ("w2_packed", None if w2_packed is None else w2_packed.data),
                            ("w_hh_packed", None if w_hh_packed is None else w_hh_packed.data)] + inputs)
    else:
        out = expand_outputs(node_state.shape[0], num_children, node_state.shape[1], base_logits.shape[2],
                             base_logits.device, write_node_logits)
    return run_expand(chosen, base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
                      num_children, temperature, top_k, top_p, generator, w2_packed, w_hh_packed, out)


def expand_outputs(n: int, m: int, G: int, V: int, dev, write_node_logits: bool = True) -> tuple:
    """:func:`domino_head_expand`'s four outputs for n nodes of m children, new tensors
    (the fourth None unless ``write_node_logits``)."""
    f32 = dict(dtype=torch.float32, device=dev)
    return (torch.empty(n, m, dtype=torch.int64, device=dev), torch.empty(n, m, **f32), torch.empty(n, m, G, **f32),
            torch.empty(n, V, **f32) if write_node_logits else None)


def check_expand_out(out, n: int, m: int, G: int, V: int, dev, write_node_logits: bool = True) -> None:
    """``out`` for :func:`domino_head_expand`: its four outputs, preallocated (the fourth
    None exactly when not ``write_node_logits``)."""
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        raise TypeError("out must be a tuple (child_tokens, child_logprobs, child_state, node_logits) or None")
    if (out[3] is None) == write_node_logits:
        raise ValueError("out's node_logits must be " + ("a tensor, since write_node_logits is True" if write_node_logits
                                                         else "None, since write_node_logits is False"))
    outputs = (("child_tokens", out[0], torch.int64, (n, m)), ("child_logprobs", out[1], torch.float32, (n, m)),
               ("child_state", out[2], torch.float32, (n, m, G)), ("node_logits", out[3], torch.float32, (n, V)))
    for name, t, dtype, expected in outputs[:4 if write_node_logits else 3]:
        _checks.tensor(f"out's {name}", t, ndim=len(expected), dtypes=(dtype,), device=dev, contiguous=True)
        _checks.shape(f"out's {name}", t, expected)
        _check_writable(f"out's {name}", t)


# id(packed.data) -> (packed.data and the weight it was compared with, as weak references;
# both version counters then): a tree steps with the same pair every call, and the
# comparison (two row slices and torch.equal, ~0.1 ms a weight) would be a third of a small
# step's time. Any in-place change to either tensor bumps its version and brings the
# comparison back; a new or dead weight object does too. Inference tensors keep no version
# counter: for them the pair alone is remembered (the comparison is a spot check of two rows
# against a wrong pairing in any case). Keyed by id, since tensors compare by value; an entry
# leaves with its packed tensor.
_VERIFIED_PACKS: dict[int, tuple] = {}


def _version(t: torch.Tensor):
    return None if t.is_inference() else t._version


def _packed_pair_verified(data: torch.Tensor, weight: torch.Tensor) -> bool:
    seen = _VERIFIED_PACKS.get(id(data))
    return (seen is not None and seen[0]() is data and seen[1]() is weight
            and seen[2:] == (_version(weight), _version(data)))


def _remember_packed_pair(data: torch.Tensor, weight: torch.Tensor) -> None:
    key = id(data)
    _VERIFIED_PACKS[key] = (weakref.ref(data, lambda _: _VERIFIED_PACKS.pop(key, None)), weakref.ref(weight),
                            _version(weight), _version(data))


def check_packed_head_weight(packed, weight: torch.Tensor, name: str, weight_name: str, backend: str) -> None:
    """``packed`` (the argument ``name``: w2_packed, w_hh_packed) must be
    ``pack_small_batch_linear_weight(weight)`` for a bf16 ``weight`` (``weight_name``: w2,
    w_hh) on the CPU, with a kernel that reads it (its first and last rows are compared)."""
    if packed is None:
        return
    if not isinstance(packed, PackedLinearWeight):
        raise TypeError(f"{name} must be a PackedLinearWeight (from pack_small_batch_linear_weight) or None, "
                        f"got {type(packed).__name__}")
    if weight.device.type != "cpu" or backend == "triton":
        raise ValueError(f"{name} is a CPU layout, for the native CPU kernel; pass None with the {backend} "
                         f"backend on {weight.device}")
    if weight.dtype != torch.bfloat16:
        raise ValueError(f"{name} needs a bfloat16 {weight_name}, got {str(weight.dtype).replace('torch.', '')}")
    if packed.data.dtype != torch.bfloat16 or packed.data.device != weight.device:
        raise ValueError(f"{name} must hold bfloat16 panels on {weight.device} "
                         f"(pack_small_batch_linear_weight({weight_name}), its default dtype), got "
                         f"{str(packed.data.dtype).replace('torch.', '')} on {packed.data.device}")
    N, K = weight.shape
    if (packed.out_features, packed.in_features) != (N, K):
        raise ValueError(f"{name} must be {weight_name} [{N}, {K}] packed, got a packed [{packed.out_features}, "
                         f"{packed.in_features}] weight")
    data = packed.data
    if not _packed_pair_verified(data, weight):
        for row in (0, N - 1):  # compared as bits: a NaN weight equals itself
            packed_row = data[row // PANEL_COLS, :, row % PANEL_COLS, :].reshape(-1)[:K]
            if not torch.equal(packed_row.view(torch.int16), weight[row].view(torch.int16)):
                raise ValueError(f"{name} is not pack_small_batch_linear_weight({weight_name}): row {row} differs")
        _remember_packed_pair(data, weight)
    if backend == "native" and not small_batch_linear_packed_supported():
        raise ValueError(f"{name} needs a CPU with AVX2 and FMA or AVX512-BF16 (small_batch_linear_packed_supported()); "
                         "this one has neither: pass None")


def check_expand_args(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
                      num_children, temperature, top_k, top_p, generator, backend, w2_packed=None,
                      w_hh_packed=None) -> tuple:
    """:func:`domino_head_expand`'s argument checks (errors name the argument); returns
    the backend that runs it and temperature, top_k, top_p with numbers as Python's
    (:func:`domino_ops._checks.sampling_params`). :func:`domino_ops.draft_tree` checks
    once per tree, then runs its steps through :func:`run_expand`."""
    t = _checks.tensor("base_logits", base_logits, ndim=3, dtypes=_checks.FLOAT_OR_BF16, contiguous=True)
    dev = t.device
    b, k, V = base_logits.shape
    hproj = _checks.tensor("hproj", hproj, ndim=3, dtypes=_checks.FLOAT_OR_BF16, device=dev)
    node_state = _checks.tensor("node_state", node_state, ndim=2, dtypes=(torch.float32,), device=dev)
    n = node_state.shape[0]
    node_seq = _checks.tensor("node_seq", node_seq, ndim=1, dtypes=(torch.int64,), device=dev)
    node_depth = _checks.tensor("node_depth", node_depth, ndim=1, dtypes=(torch.int64,), device=dev)
    r, G = _head_weights(gru_input, w_ih, w_hh, w1s, w2, V, dev)
    _checks.shape("hproj", hproj, (b, k, r))
    _checks.shape("node_state", node_state, (None, G))
    _checks.shape("node_seq", node_seq, (n,))
    _checks.shape("node_depth", node_depth, (n,))
    _checks.in_range("node_seq", node_seq, 0, b, "hold values")
    _checks.in_range("node_depth", node_depth, 0, k, "hold values")
    if isinstance(num_children, bool) or not isinstance(num_children, int):
        raise TypeError(f"num_children must be an int, got {type(num_children).__name__}")
    if not 1 <= num_children <= V:
        raise ValueError(f"num_children must be in [1, {V}] (the vocabulary), got {num_children}")
    temperature, top_k, top_p = _checks.sampling_params(temperature, top_k, top_p, rows=b, device=dev)
    _checks.generator(generator, dev, rows=b)
    chosen = select_backend("domino_head_expand", dev, backend)
    if may_sample(temperature):  # greedy runs on meta; sampling's reference reads values
        refuse_meta_reference("domino_head_expand", dev, chosen)
    check_packed_head_weight(w2_packed, w2, "w2_packed", "w2", chosen)
    check_packed_head_weight(w_hh_packed, w_hh, "w_hh_packed", "w_hh", chosen)
    return chosen, temperature, top_k, top_p


def run_expand(chosen, base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
               num_children, temperature, top_k, top_p, generator, w2_packed, w_hh_packed, out, uniforms=None):
    """:func:`domino_head_expand` on backend ``chosen``, its arguments already checked by
    :func:`check_expand_args` (or built from checked ones), into ``out`` (checked by
    :func:`check_expand_out`, or from :func:`expand_outputs`; its fourth None: no node
    logits). ``uniforms``: None (drawn from ``generator`` by
    :func:`domino_ops.sampling.expand_uniforms`), or
    the [n, num_children] float64 uniforms it would draw, drawn by the caller (a tree
    drafter that knows which nodes are whose without reading ``node_seq``)."""
    if uniforms is None and may_sample(temperature):
        uniforms = expand_uniforms(node_seq, num_children, generator)
    if chosen == "reference":
        got = reference.domino_head_expand(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih,
                                           w_hh, w1s, w2, num_children=num_children, temperature=temperature,
                                           top_k=top_k, top_p=top_p, uniforms=uniforms)
        for o, g in zip(out, got):
            if o is not None:
                o.copy_(g)
        return tuple(out)
    T, top_k, top_p, row_T, row_k, row_p = kernel_sampling_args(temperature, top_k, top_p, base_logits.shape[2])
    tokens, logprobs, child_state, node_logits = out
    _kernel("domino_head_expand", chosen)(
        base_logits, hproj.contiguous(), node_state.contiguous(), node_seq.contiguous(), node_depth.contiguous(),
        gru_input, w_ih, w_hh, w1s, w2, T, top_k, top_p, uniforms, tokens, logprobs, child_state, node_logits,
        None if w2_packed is None else w2_packed.data, None if w_hh_packed is None else w_hh_packed.data,
        row_T, row_k, row_p)
    return tokens, logprobs, child_state, node_logits


def sample(logits: torch.Tensor, *, temperature: float | torch.Tensor = 0.0, top_k: int | torch.Tensor = 0,
           top_p: float | torch.Tensor = 1.0,
           generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None = None,
           backend: str | None = None) -> torch.Tensor:
    """Samples one token per row.

    Args:
        logits: [b, V] float32 or bfloat16.
        temperature: 0 for argmax (top_k/top_p ignored; the first NaN wins, as
            torch.argmax); below 1e-20 counts as 0. top_k: 0 (or >= V) disables. top_p:
            (0, 1]; one below the largest probability keeps exactly the top token. Each
            is a Python number or a [b] tensor on the logits' device, one value per row.
        generator: torch.Generator for the one uniform per row consumed when some row
            samples, or a list with one generator per row.
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    Returns:
        tokens [b] int64.
    """
    logits = _checks.tensor("logits", logits, ndim=2, dtypes=_checks.FLOAT_OR_BF16)
    b, V = logits.shape
    temperature, top_k, top_p = _checks.sampling_params(temperature, top_k, top_p, rows=b, device=logits.device)
    _checks.generator(generator, logits.device, rows=b)
    chosen = select_backend("sample", logits.device, backend)
    refuse_meta_reference("sample", logits.device, chosen)
    if chosen == "reference":
        return reference.sample(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                generator=generator)
    T, top_k, top_p, row_T, row_k, row_p = kernel_sampling_args(temperature, top_k, top_p, V)
    uniforms = drawn_uniforms((b,), logits.device, generator) if may_sample(temperature) else None
    tokens = torch.empty(b, dtype=torch.int64, device=logits.device)
    _kernel("sample", chosen)(logits.contiguous(), T, top_k, top_p, uniforms, tokens, row_T, row_k, row_p)
    return tokens


def filtered_probs(logits: torch.Tensor, temperature: float | torch.Tensor = 0.0, top_k: int | torch.Tensor = 0,
                   top_p: float | torch.Tensor = 1.0, *, backend: str | None = None) -> torch.Tensor:
    """The distribution :func:`sample` draws from, ``softmax(filter(logits / temperature))``,
    as probabilities: the ``p`` / ``q`` that :func:`verify_sampling` and the tree samplers
    take.

    Args:
        logits: [b, ..., V] float32 or bfloat16 (at least 2 dimensions).
        temperature, top_k, top_p: as :func:`sample`'s; each a Python number or a [b]
            tensor on the logits' device, one value per leading row b, repeated over the
            middle axes. Temperature 0 (or below 1e-20) gives the argmax's one-hot
            (torch.argmax: the first NaN wins), so greedy and sampled requests can share one
            verification. The extreme-value rules are :func:`domino_ops.sampling.filtered_weights`'.
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    Returns:
        float32 probabilities of the logits' shape, each row summing to 1 (up to rounding).
    """
    logits = _checks.tensor("logits", logits, ndim=max(2, logits.dim() if isinstance(logits, torch.Tensor) else 2),
                            dtypes=_checks.FLOAT_OR_BF16)
    b, V = logits.shape[0], logits.shape[-1]
    temperature, top_k, top_p = _checks.sampling_params(temperature, top_k, top_p, rows=b, device=logits.device)
    _checks.no_autograd("filtered_probs", (("logits", logits),))
    chosen = select_backend("filtered_probs", logits.device, backend)
    refuse_meta_reference("filtered_probs", logits.device, chosen)
    if chosen == "reference":
        return reference.filtered_probs(logits, temperature, top_k, top_p)
    rows = logits[0].numel() // V
    flat = logits.reshape(b * rows, V).contiguous()
    probs = torch.empty(flat.shape, dtype=torch.float32, device=logits.device)
    T, top_k, top_p, row_T, row_k, row_p = kernel_sampling_args(
        *(repeat_over_rows(x, b, rows) for x in (temperature, top_k, top_p)), V)
    _kernel("filtered_probs", chosen)(flat, T, top_k, top_p, probs, row_T, row_k, row_p)
    return probs.view(logits.shape)


def _draft_tokens(draft_tokens, dev, vocab_size):
    draft_tokens = _checks.tensor("draft_tokens", draft_tokens, ndim=2, dtypes=(torch.int64,), device=dev)
    _checks.token_ids("draft_tokens", draft_tokens, vocab_size)
    return draft_tokens.contiguous()


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor, *,
                  backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: the longest draft prefix equal to the target's argmax.

    Args:
        draft_tokens: [b, k] int64.
        target_logits: [b, k+1, V] float32 or bfloat16, the target's logits at the anchor
            and at each draft position.
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    Returns:
        out_tokens [b, k+1] int64: the accepted drafts, then the target's token at the
        first mismatch (or after the last draft), then -1; num_accepted [b] int64, the
        number of accepted drafts (the sequence advances by num_accepted + 1).
    """
    target_logits = _checks.tensor("target_logits", target_logits, ndim=3, dtypes=_checks.FLOAT_OR_BF16)
    dev = target_logits.device
    b, k1, V = target_logits.shape
    draft_tokens = _draft_tokens(draft_tokens, dev, V)
    _checks.shape("target_logits", target_logits, (draft_tokens.shape[0], draft_tokens.shape[1] + 1, V))
    chosen = select_backend("verify_greedy", dev, backend)
    if chosen == "reference":
        return reference.verify_greedy(draft_tokens, target_logits)
    out_tokens = torch.empty(b, k1, dtype=torch.int64, device=dev)
    num_accepted = torch.empty(b, dtype=torch.int64, device=dev)
    _kernel("verify_greedy", chosen)(draft_tokens, target_logits.contiguous(), out_tokens, num_accepted)
    return out_tokens, num_accepted


def verify_sampling(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, *,
                    generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None = None,
                    backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless rejection sampling (Leviathan et al. 2023).

    Accepts draft i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection
    samples from normalize(max(0, p_i - q_i)); if all k are accepted, samples a bonus
    token from p_k. The output is distributed exactly as sampling from the target.

    Args:
        draft_tokens: [b, k] int64, drawn from draft_probs.
        draft_probs: [b, k, V] float32, the draft distributions q.
        target_probs: [b, k+1, V] float32, the target distributions p.
        generator: torch.Generator for the uniforms ([b, k] accept, then [b] resample), or
            a list with one generator per row.
        backend: "auto", "native", "triton" or "reference" (see the module docstring).
    Returns:
        (out_tokens [b, k+1] int64 padded with -1, num_accepted [b] int64), as verify_greedy.
    """
    target_probs = _checks.tensor("target_probs", target_probs, ndim=3, dtypes=(torch.float32,))
    dev = target_probs.device
    b, k1, V = target_probs.shape
    draft_tokens = _draft_tokens(draft_tokens, dev, V)
    draft_probs = _checks.tensor("draft_probs", draft_probs, ndim=3, dtypes=(torch.float32,), device=dev)
    _checks.shape("target_probs", target_probs, (draft_tokens.shape[0], draft_tokens.shape[1] + 1, V))
    _checks.shape("draft_probs", draft_probs, (b, k1 - 1, V))
    _checks.generator(generator, dev, rows=b)
    chosen = select_backend("verify_sampling", dev, backend)
    refuse_meta_reference("verify_sampling", dev, chosen)
    if chosen == "reference":
        return reference.verify_sampling(draft_tokens, draft_probs, target_probs, generator=generator)
    u_accept = drawn_uniforms((b, k1 - 1), dev, generator)
    u_resample = drawn_uniforms((b,), dev, generator)
    out_tokens = torch.empty(b, k1, dtype=torch.int64, device=dev)
    num_accepted = torch.empty(b, dtype=torch.int64, device=dev)
    _kernel("verify_sampling", chosen)(draft_tokens, draft_probs.contiguous(), target_probs.contiguous(),
                                         u_accept, u_resample, out_tokens, num_accepted)
    return out_tokens, num_accepted
