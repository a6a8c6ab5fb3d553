"""domino_ops: kernels for Domino speculative decoding.

Ops (each also as a pure-PyTorch reference in :mod:`domino_ops.reference` and as a
dispatcher op ``torch.ops.domino_ops.<name>`` with caller-provided outputs):

- :func:`domino_head_rollout`: the Domino head's k sequential correction + GRU steps.
- :func:`domino_head_expand`: one step of Domino tree drafting, the children of a
  frontier of tree nodes, each with its own GRU state.
- :func:`sample`: temperature / top-k / top-p sampling of a row of logits.
- :func:`filtered_probs`: the distribution :func:`sample` draws from, as float32
  probabilities (the ``p`` / ``q`` that the verification ops take).
- :func:`verify_greedy`: greedy verification of a draft block.
- :func:`verify_sampling`: lossless rejection-sampling verification.
- :func:`small_batch_linear`: ``x @ weight.T + bias`` for a few rows on the CPU, weights
  read once for all rows, batch-invariant (:mod:`domino_ops.linear`; no ``backend="triton"``).
- :func:`small_batch_linear_packed`: the same with a weight packed ahead of time
  (:func:`pack_small_batch_linear_weight`): bf16 and float32 panels for CPUs with AVX2 and
  FMA (8-lane FMA tiles), AVX512-BF16 / AVX-512F, or AMX (:mod:`domino_ops.linear_packed`).
- :func:`small_batch_attention`: causal attention of a few query rows against a KV cache
  on the CPU, each row computed as a one-token decoding step would (:mod:`domino_ops.attention`).
- :func:`rms_norm`, :func:`silu_mul`, :func:`apply_rotary_pos_emb`: a HF decoder layer's
  RMSNorm, gated-MLP activation and rotary embedding in one call each on the CPU, HF's
  rounding order, batch-invariant (:mod:`domino_ops.rms_norm`, :mod:`domino_ops.silu_mul`,
  :mod:`domino_ops.apply_rotary_pos_emb`).

Three CPU ops run those kernels a whole layer stack at a time, for the engine (dispatcher
ops only, no Python wrapper: their callers build the flat weight lists):
``torch.ops.domino_ops.decoder_layers`` (a Llama / Qwen2 / Qwen3 target's decoder layers,
writing into its KV cache's storage; :mod:`domino.fast_forward`, whose Python loop is its
reference), ``torch.ops.domino_ops.draft_layers`` (a Domino drafter's backbone layers;
:meth:`domino.model.DominoDraftModel.backbone`, the layers' fused forwards its reference)
and ``torch.ops.domino_ops.draft_context`` (a drafter's context extension, writing its new
keys and values into the context cache's stores; :meth:`domino.model.DominoDraftModel.extend_context`,
the modules' fused forwards its reference). ``torch.ops.domino_ops.switched_linear`` is the
forward of an ``nn.Linear`` switched by :func:`domino.fast_linear.use_small_batch_linear`:
the product above where the kernels apply, ``F.linear`` elsewhere, in one call.

Drop-in, sgl-kernel-compatible tree ops (:mod:`domino_ops.tree_ops`, references in
:mod:`domino_ops.reference_tree`): :func:`build_tree_kernel_efficient`,
:func:`verify_tree_greedy`, :func:`tree_speculative_sampling_target_only`; and, in the same
layout, :func:`verify_tree_sampling`, lossless tree verification that uses the draft's
probabilities, and :func:`draft_tree` (:mod:`domino_ops.tree_draft`), Domino tree drafting
in SGLang's EAGLE-2 layout (expand with :func:`domino_head_expand`, select the frontier,
emit what :func:`build_tree_kernel_efficient` consumes).

Runtime sampling helpers (:func:`draw_uniforms`, :func:`check_sampling_params`) live in
:mod:`domino_ops.sampling`.

Every op takes ``backend=`` ("auto", "native", "triton", "reference"; the CPU-only ops
:func:`small_batch_linear`, :func:`small_batch_linear_packed`, :func:`small_batch_attention`,
:func:`rms_norm`, :func:`silu_mul` and :func:`apply_rotary_pos_emb` have no "triton"); see
:mod:`domino_ops.ops`. The hand-written CUDA kernels live in csrc/cuda/, the Triton ones
in :mod:`domino_ops.triton`.
"""

import torch

from domino_ops import _C  # registers torch.ops.domino_ops.*

if _C.torch_version != torch.__version__:
    raise ImportError(
        f"domino_ops was compiled against torch {_C.torch_version} but torch {torch.__version__} "
        "is imported; rebuild it (pip install --no-build-isolation .) against this torch")

from domino_ops import _fake, reference, sampling  # noqa: E402,F401
from domino_ops.ops import (  # noqa: E402
    domino_head_expand, domino_head_rollout, filtered_probs, has_kernel, sample, select_backend, verify_greedy,
    verify_sampling)
from domino_ops.sampling import check_sampling_params, draw_uniforms  # noqa: E402
from domino_ops import reference_tree, tree_ops  # noqa: E402,F401
from domino_ops.tree_ops import (  # noqa: E402
    build_tree_kernel_efficient, tree_speculative_sampling_target_only, verify_tree_greedy, verify_tree_sampling)
from domino_ops.linear import small_batch_linear, small_batch_linear_isa  # noqa: E402
from domino_ops.linear_packed import (  # noqa: E402
    PackedLinearWeight, pack_small_batch_linear_weight, small_batch_linear_packed, small_batch_linear_packed_path,
    small_batch_linear_packed_supported)
from domino_ops.attention import small_batch_attention  # noqa: E402
from domino_ops.rms_norm import rms_norm  # noqa: E402
from domino_ops.silu_mul import silu_mul  # noqa: E402
from domino_ops.apply_rotary_pos_emb import apply_rotary_pos_emb  # noqa: E402
from domino_ops.tree_draft import DraftTree, draft_tree  # noqa: E402

cuda_compiled: bool = _C.cuda_compiled
__version__ = "0.1.0"
__all__ = ["domino_head_rollout", "domino_head_expand", "sample", "verify_greedy", "verify_sampling", "has_kernel", "select_backend",
           "check_sampling_params", "draw_uniforms", "filtered_probs", "reference", "sampling", "cuda_compiled",
           "build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
           "verify_tree_sampling", "reference_tree", "draft_tree", "DraftTree", "tree_ops",
           "small_batch_linear", "small_batch_linear_isa", "small_batch_attention",
           "small_batch_linear_packed", "pack_small_batch_linear_weight", "PackedLinearWeight",
           "small_batch_linear_packed_supported", "small_batch_linear_packed_path", "rms_norm", "silu_mul",
           "apply_rotary_pos_emb"]
