"""The Domino drafter: a DFlash parallel backbone plus the Domino head.

Backbone: the target's hidden states from a few layers are fused (``fc`` + ``hidden_norm``)
into context features; every draft layer attends, non-causally, from the block
``[anchor, MASK, ...]`` to the context (as extra keys/values, cached across rounds) and to
the block itself. Base logits come from the target's LM head. Head: a GRU over the
target's embeddings of the anchor and the drafted tokens, and a low-rank correction
``W2 · SiLU(W1 · [h_i; S_{i-1}])`` added to the base logits before each token is chosen
(:func:`domino_ops.domino_head_rollout`).

State-dict keys follow the public DFlash/Domino checkpoints (``fc``, ``hidden_norm``,
``layers.*``, ``norm``, ``prefix_gru``, ``embed_proj``), so those load as they are.

The drafter owns all of its math: generation (:meth:`DominoDraftModel.draft`, and
:meth:`DominoDraftModel.draft_tree` for tree speculation) and training
(:meth:`DominoDraftModel.packed_draft_hidden`, :meth:`DominoDraftModel.teacher_forced_head_input`,
:meth:`DominoDraftModel.self_fed_logits`) call the same backbone and head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

import domino_ops
from domino_ops.reference import gru_cell
from domino.budget import Calibration
from domino.config import DominoConfig
from domino.draft_context import DraftContextCache
from domino.fast_linear import cpu_kernel_applies, runs_packed, uses_small_batch_linear
from domino.fixed_blocks import fixed_block, fixed_value
from domino.sampling_params import RowSampling


class RMSNorm(nn.Module):
    """RMS normalization over the last dimension, computed in float32 and cast back to the
    input's dtype before the weight multiplies it (as HF Llama/Qwen do; the epsilon under
    HF's attribute name, which :mod:`domino.fast_layers`' fused norm reads)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.variance_epsilon = eps

    def __setstate__(self, state: dict) -> None:
        # a module pickled (torch.save(model)) before the forty-fifth session holds `eps`
        if "eps" in state and "variance_epsilon" not in state:
            state["variance_epsilon"] = state.pop("eps")
        super().__setstate__(state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x32.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Default RoPE (rotate-half layout, as Llama/Qwen) at explicit positions.

    The frequencies stay float32 whatever dtype the drafter is cast to: they are held as
    the int32 bits of their float32 values, which ``Module.to(dtype)`` leaves alone. As a
    float buffer they were rounded to bf16 with the weights when a drafter loaded in bf16
    (every deployed one until the seventy-second session), unlike the float32 ones it
    trained with (the shipped drafter's acceptance on 64 held-out chat prompts: 2.375 with
    the rounded ones, 2.377 without)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq_bits", inv_freq.view(torch.int32), persistent=False)

    @property
    def inv_freq(self) -> torch.Tensor:
        """The frequencies [head_dim / 2], float32."""
        return self.inv_freq_bits.view(torch.float32)

    def __setstate__(self, state):
        # a drafter pickled before: its float buffer "inv_freq" (float32 unless cast)
        buffers = state.get("_buffers", {})
        if "inv_freq" in buffers:
            buffers["inv_freq_bits"] = buffers.pop("inv_freq").float().view(torch.int32)
            state.setdefault("_non_persistent_buffers_set", set()).discard("inv_freq")
            state["_non_persistent_buffers_set"].add("inv_freq_bits")
        super().__setstate__(state)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq  # [b, T, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [b, 1, T, hd]
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, T, hd] rotated by cos, sin [b, 1, T, hd] (rotate-half layout)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftAttention(nn.Module):
    """A draft layer's attention: grouped-query attention with per-head q/k RMS norms and
    RoPE (Qwen3 layout), whose queries attend to cached context keys/values as well as to
    their own block's keys."""

    def __init__(self, c: DominoConfig):
        super().__init__()
        self.nh, self.kvh, self.hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kvh * self.hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kvh * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = RMSNorm(self.hd, c.rms_norm_eps)

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotated queries [b, nh, T, hd] of hidden states x [b, T, H]."""
        b, T, _ = x.shape
        return apply_rope(self.q_norm(self.q_proj(x).view(b, T, self.nh, self.hd)).transpose(1, 2), cos, sin)

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Rotated keys and values [b, kvh, T, hd] of hidden states x [b, T, H]."""
        b, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, T, self.kvh, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, T, self.kvh, self.hd).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(self, x, cos, sin, ctx_k, ctx_v, attn_mask, rows: slice | None = None):
        """Queries x [b, Q, H] attend to the context keys [b, kvh, Tc, hd] and to the
        queries' own keys, wherever attn_mask [b, 1 or Q, Tc + Q] (bool) holds. Returns
        [b, Q, H], or only the query positions ``rows`` [b, len(rows), H] (the output
        projection then runs on those rows alone)."""
        return self.attend(self.query(x, cos, sin), *self.key_value(x, cos, sin), ctx_k, ctx_v, attn_mask, rows)

    def attend(self, q, k, v, ctx_k, ctx_v, attn_mask, rows: slice | None = None) -> torch.Tensor:
        """The rest of :meth:`forward` from the rotated queries [b, nh, Q, hd] and the
        block's rotated keys and values [b, kvh, Q, hd]: attention over the context and the
        block, then the output projection ([b, Q, H], or the rows ``rows``)."""
        k = torch.cat([ctx_k, k], dim=2)
        v = torch.cat([ctx_v, v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask[:, None], enable_gqa=self.nh != self.kvh)
        out = out.transpose(1, 2)
        if rows is not None:
            out = out[:, rows]
        return self.o_proj(out.reshape(out.shape[0], out.shape[1], self.nh * self.hd))


class DraftMLP(nn.Module):
    """SwiGLU MLP: ``down(silu(gate(x)) * up(x))`` (HF LlamaMLP's layout and forward, so
    :mod:`domino.fast_layers` runs it on the fused kernels as it runs a target's)."""

    def __init__(self, c: DominoConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def __setstate__(self, state: dict) -> None:
        # a module pickled before the forty-fifth session has no act_fn (its forward called F.silu)
        super().__setstate__(state)
        if "act_fn" not in self._modules:
            self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """One pre-norm decoder layer of the backbone: attention to the context and the
    block, then the MLP, each on a residual."""

    def __init__(self, c: DominoConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = DraftMLP(c)

    def forward(self, x, cos, sin, ctx_k, ctx_v, attn_mask, rows: slice | None = None):
        """x [b, Q, H] -> [b, Q, H], or the positions ``rows`` alone [b, len(rows), H]:
        every position's keys and values still enter the attention, but the rest of the
        layer (output projection, residuals, MLP) is row-wise and runs on those rows."""
        attended = self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, attn_mask, rows)
        x = (x if rows is None else x[:, rows]) + attended
        return x + self.mlp(self.post_attention_layernorm(x))


# Beside a checkpoint's weights: how the drafter's confidence maps to acceptance by its
# target (domino.budget.Calibration; written by benchmarks/calibration.py).
CALIBRATION_FILE = "calibration.json"

# model.safetensors key of the draft vocabulary's token ids (int64), when a checkpoint has one
DRAFT_VOCAB_KEY = "draft_vocab"


def to_full_vocab(rows: torch.Tensor, draft_vocab: torch.Tensor | None, vocab_size: int, fill: float) -> torch.Tensor:
    """Rows [.., K] over a draft vocabulary (``draft_vocab`` [K] int64: the target id of
    each index) -> [.., vocab_size], ``fill`` outside it; the rows themselves without one."""
    if draft_vocab is None:
        return rows
    full = rows.new_full((*rows.shape[:-1], vocab_size), fill)
    return full.index_copy_(-1, draft_vocab, rows)


@dataclass
class Draft:
    """One round's drafted tokens of a batch and what they were chosen from."""

    tokens: torch.Tensor  # [b, n] int64 target token ids
    # [b, n, K] float32: the logits each token was chosen from, over the drafter's draft
    # vocabulary (K = V when it has none, as the tests' stand-in drafters)
    vocab_logits: torch.Tensor
    # [b, n] float32: the largest probability of the distribution each token was chosen
    # from (the token's own probability at temperature 0): the drafter's confidence, which
    # domino.budget maps to an acceptance probability. Position i's depends only on the
    # tokens before it, so a verify length chosen from it by a stopping rule keeps
    # rejection sampling exact.
    confidence: torch.Tensor
    draft_vocab: torch.Tensor | None = None  # [K] int64: the target id of each draft-vocabulary index
    vocab_size: int | None = None  # V, the target's vocabulary (with a draft vocabulary)
    # [b, n, K] float32 when some sequence samples: the filtered distribution each token was
    # drawn from (domino_ops.filtered_probs of vocab_logits), kept from the confidence that
    # needed it, so verification does not compute it again; None otherwise
    vocab_probs: torch.Tensor | None = None

    def prefix(self, k: int) -> "Draft":
        """The first k drafts of every sequence."""
        return Draft(self.tokens[:, :k], self.vocab_logits[:, :k], self.confidence[:, :k], self.draft_vocab,
                     self.vocab_size, None if self.vocab_probs is None else self.vocab_probs[:, :k])

    @property
    def logits(self) -> torch.Tensor:
        """[b, n, V] float32 over the target's whole vocabulary, -inf outside the draft
        vocabulary: the draft distribution rejection sampling needs. Built on access (a
        [b, n, V] fill costs ~0.5 ms a round on the CPU), so greedy verification, which
        compares tokens only, never pays for it."""
        return to_full_vocab(self.vocab_logits, self.draft_vocab, self.vocab_size, float("-inf"))

    @property
    def probs(self) -> torch.Tensor | None:
        """[b, n, V] float32 over the target's whole vocabulary, 0 outside the draft
        vocabulary: ``vocab_probs`` as rejection sampling takes them (the q of
        :func:`domino_ops.verify_sampling`); None where they were not kept."""
        if self.vocab_probs is None:
            return None
        return to_full_vocab(self.vocab_probs, self.draft_vocab, self.vocab_size, 0.0)


# dtype -> the draft_layers weights while callers hold a drafter's weights fixed
# (DominoDraftModel.weights_fixed, a domino.fixed_blocks.fixed_block)
_FIXED = "_domino_weights_fixed"


class DominoDraftModel(nn.Module):
    """The Domino drafter: DFlash backbone + Domino head (this module's docstring).

    Holds only its own weights; the target's input embedding and LM head are borrowed with
    :meth:`bind_target` before use. Load a checkpoint with :meth:`from_pretrained`; draft
    with :meth:`draft` (chains) or :meth:`draft_tree` (trees), which
    :class:`domino.generate.DominoGenerator` calls each round."""

    def __init__(self, config: DominoConfig):
        super().__init__()
        c = self.config = config
        n_feat = len(c.target_layer_ids)
        self.fc = nn.Linear(n_feat * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary = RotaryEmbedding(c.head_dim, c.rope_theta)
        if c.has_head:
            self.prefix_gru = nn.GRU(c.hidden_size, c.gru_hidden_dim, bias=False, batch_first=True)
            self.embed_proj = nn.Sequential(
                nn.Linear(c.hidden_size + c.gru_hidden_dim, c.emb_dim, bias=False), nn.SiLU(),
                nn.Linear(c.emb_dim, c.vocab_size, bias=False))
        self._target: tuple[nn.Module, nn.Module] | None = None  # (embed_tokens, lm_head), frozen, not ours
        # the target token ids drafting may choose (ascending), None for all: set_draft_vocab
        self.register_buffer("draft_vocab", None, persistent=False)
        self._vocab_rows: tuple | None = None  # (key, lm_head rows, embedding rows, w2 rows), see _draft_rows
        self._vocab_rows_packed: tuple | None = None  # (lm_head rows, their PackedLinearWeight)
        self._head_packs: dict = {}  # name -> (weight, its key, its PackedLinearWeight), see _packed_head_weight
        # confidence -> acceptance probability (identity until fitted; from_pretrained loads it)
        self.calibration = Calibration()

    # ---- the target's borrowed pieces -------------------------------------------------

    def bind_target(self, target: nn.Module) -> "DominoDraftModel":
        """Borrows the target's input embedding and LM head (frozen, never saved)."""
        self._target = (target.get_input_embeddings(), target.get_output_embeddings())
        return self

    @property
    def embed_tokens(self) -> nn.Module:
        """The target's input embedding (borrowed by :meth:`bind_target`)."""
        if self._target is None:
            raise RuntimeError("call bind_target(target) before running the drafter")
        return self._target[0]

    @property
    def lm_head(self) -> nn.Module:
        """The target's LM head (borrowed by :meth:`bind_target`)."""
        if self._target is None:
            raise RuntimeError("call bind_target(target) before running the drafter")
        return self._target[1]

    # ---- backbone ---------------------------------------------------------------------

    def new_cache(self, batch_size: int, device: torch.device | str, dtype: torch.dtype) -> DraftContextCache:
        """An empty context cache for ``batch_size`` sequences (keys/values of ``dtype``
        on ``device``), to be filled by :meth:`extend_context`."""
        c = self.config
        return DraftContextCache(batch_size, len(self.layers), c.num_key_value_heads, c.head_dim, device=device,
                                 dtype=dtype)

    def extend_context(self, cache: DraftContextCache, features: torch.Tensor, positions: torch.Tensor,
                       valid: torch.Tensor) -> None:
        """Appends context: features [b, T, n*H] from the target layers, their positions
        [b, T] and which of them are real tokens [b, T] (bool). On the CPU kernels as one
        ``domino_ops.draft_context`` call where it applies (:meth:`_fused_context_weights`;
        the same bits as the modules' fused forwards below)."""
        b, T = features.shape[:2]
        for name, t in (("positions", positions), ("valid", valid)):
            if tuple(t.shape) != (b, T):
                raise ValueError(f"{name} must have shape [{b}, {T}] (features' batch and slots), got {list(t.shape)}")
        features = features.to(self.fc.weight.dtype)
        store = cache.key_stores[0]  # the op writes the stores as they are: the features' dtype, on the CPU
        fused = self._fused_context_weights(features) if store.dtype is features.dtype and store.is_cpu else None
        if fused is not None:
            fc, fc_bias, norm_weight, norm_eps, weights, heads, eps = fused
            cos, sin = self.rotary(positions, features.dtype)
            cache.reserve(T)
            torch.ops.domino_ops.draft_context.default(features.contiguous(), cos[:, 0], sin[:, 0], fc, fc_bias,
                                                       norm_weight, norm_eps, cache.key_stores, cache.value_stores,
                                                       cache.length, weights, heads, eps)
            cache.commit(valid)
            return
        ctx = self.hidden_norm(self.fc(features))
        cos, sin = self.rotary(positions, ctx.dtype)
        keys_values = [layer.self_attn.key_value(ctx, cos, sin) for layer in self.layers]
        cache.append([k for k, _ in keys_values], [v for _, v in keys_values], valid)

    def backbone(self, cache: DraftContextCache, block_ids: torch.Tensor, positions: torch.Tensor,
                 attn_mask: torch.Tensor | None = None, rows: slice | None = None) -> torch.Tensor:
        """Final-normed hidden states [b, Q, H] of the block tokens [b, Q] at positions [b, Q].

        By default every query sees all real context and the whole block (one block per
        sequence, as in generation); training packs several blocks per sequence and passes
        its own mask [b, Q, Tc + Q]. ``rows``: only these block positions' states
        [b, len(rows), H]. All Q positions still run up to the last layer's attention (every
        block position's keys and values enter it); from there on only ``rows`` are
        computed, which in generation is the drafts' n rows of the 16: the same values for
        them (bit for bit where the linears are batch-invariant, :mod:`domino.fast_linear`)
        at less cost (the last layer's output projection and MLP are most of it). On the
        CPU kernels the layers run as one ``domino_ops.draft_layers`` call where it applies
        (:meth:`_fused_layer_weights`; the same bits as the layers' fused forwards)."""
        x = self.embed_tokens(block_ids).to(self.fc.weight.dtype)
        if attn_mask is None:
            b, Q = block_ids.shape
            attn_mask = torch.cat([cache.mask, cache.mask.new_ones(b, Q)], dim=1)[:, None, :]
        cos, sin = self.rotary(positions, x.dtype)
        fused = self._fused_layer_weights(x, attn_mask, rows)
        if fused is not None:  # the layers' fused forwards in one C++ call: the same bits
            start, stop, _ = (rows or slice(None)).indices(x.shape[1])
            Q = x.shape[1]
            cache.reserve(2 * Q - 1)  # the op's scratch: the block's keys and values, up to Q - 1 hidden zeros
            x = torch.ops.domino_ops.draft_layers.default(x, cos[:, 0], sin[:, 0], attn_mask, cache.key_stores,
                                                          cache.value_stores, cache.length, *fused, start, stop)
            return self.norm(x)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache.keys[i], cache.values[i], attn_mask, rows if i == last else None)
        return self.norm(x)

    def _fused_layer_weights(self, x: torch.Tensor, attn_mask: torch.Tensor, rows: slice | None):
        """:func:`domino.fast_layers.draft_layer_weights` where the layers may run as one
        ``domino_ops.draft_layers`` call (csrc/cpu/draft_layers.cpp): their fused forwards
        would run on the CPU kernels (no autograd graph, no autocast: ``cpu_kernel_applies``),
        the mask is bool, ``rows`` contiguous, cos and sin in x's dtype; else None."""
        from domino.fast_layers import draft_layer_weights

        if (attn_mask.dtype != torch.bool or (rows is not None and rows.step not in (None, 1))
                or not cpu_kernel_applies(x)
                # autograd needs a graph through any layer that trains (the op records none)
                or (torch.is_grad_enabled() and any(p.requires_grad for p in self.layers.parameters()))):
            return None
        fixed = fixed_value(self.__dict__, _FIXED)
        if fixed is None:
            return draft_layer_weights(self.layers, x.dtype)
        if x.dtype not in fixed:
            fixed[x.dtype] = draft_layer_weights(self.layers, x.dtype)
        return fixed[x.dtype]

    def _fused_context_weights(self, features: torch.Tensor):
        """:func:`domino.fast_layers.draft_context_weights` where :meth:`extend_context` may
        run as one ``domino_ops.draft_context`` call (csrc/cpu/draft_context.cpp): its modules'
        fused forwards would run on the CPU kernels (no autograd graph, no autocast); else
        None. Looked up once per dtype inside :meth:`weights_fixed`."""
        from domino.fast_layers import draft_context_weights

        if (not cpu_kernel_applies(features)
                or (torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()))):
            return None
        fixed = fixed_value(self.__dict__, _FIXED)
        if fixed is None:
            return draft_context_weights(self, features.dtype)
        key = ("context", features.dtype)
        if key not in fixed:
            fixed[key] = draft_context_weights(self, features.dtype)
        return fixed[key]

    @contextlib.contextmanager
    def weights_fixed(self) -> Iterator[DominoDraftModel]:
        """A block in which the drafter's layers do not change: the weights ``draft_layers``
        takes (:func:`domino.fast_layers.draft_layer_weights`, looked up and checked at
        every backbone forward otherwise: ~0.5 ms a round in the loop on the Xeon VM, cold)
        are looked up once per dtype. The generator holds its drafter fixed across one
        call's decoding; a change made inside the block is not seen until the outermost
        block ends. Blocks nest."""
        with fixed_block(self.__dict__, _FIXED, dict):
            yield self

    # ---- head -------------------------------------------------------------------------

    def head_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(gru_input, w_ih, w_hh, w1h, w1s, w2) in the drafter's dtype; gru_input is the
        target's embedding (cast once and cached if its dtype differs). With a draft
        vocabulary (:meth:`set_draft_vocab`) gru_input and w2 hold its K rows, in its order:
        the head then works in draft-vocabulary indices, as :meth:`base_logits` does."""
        H = self.config.hidden_size
        w1 = self.embed_proj[0].weight
        w_hh, w1s = self.prefix_gru.weight_hh_l0.detach(), w1[:, H:].contiguous().detach()
        if self.draft_vocab is not None:
            _, E, w2 = self._draft_rows()
        else:
            E, w2 = self.embed_tokens.weight, self.embed_proj[2].weight.detach()
            if E.dtype != w1.dtype:
                cached = getattr(self, "_embed_cast", None)
                if cached is None or cached.dtype != w1.dtype or cached.device != E.device:
                    cached = self._embed_cast = E.detach().to(w1.dtype)
                E = cached
        return E.detach(), self.prefix_gru.weight_ih_l0.detach(), w_hh, w1[:, :H].detach(), w1s, w2

    # ---- draft vocabulary -------------------------------------------------------------

    def set_draft_vocab(self, token_ids: torch.Tensor | None) -> "DominoDraftModel":
        """Restricts drafting to the target token ids ``token_ids`` [K] (distinct, in
        [0, vocab_size), any integer dtype), or lifts the restriction (None); returns self.

        A frequency-ranked draft vocabulary (as FR-Spec and EAGLE-3's ``d2t`` do): the base
        logits come from the K rows of the target's LM head (copied once, in the drafter's
        dtype) and the head's ``w2`` and GRU input from the same K rows, so a drafted position costs
        K/V of the LM head's bytes and a head step K/V of ``w2``'s. Tokens outside it are
        never drafted; verification is unchanged, so generation stays exactly the target's
        (greedy and sampled). ``training/draft_vocab.py`` picks the K tokens the target
        writes most often; checkpoints store the ids (``draft_vocab`` in model.safetensors)."""
        if token_ids is None:
            self.draft_vocab, self._vocab_rows, self._vocab_rows_packed = None, None, None
            self._head_packs = {}
            return self
        V = self.config.vocab_size
        if not isinstance(token_ids, torch.Tensor):
            raise TypeError(f"token_ids must be a torch.Tensor or None, got {type(token_ids).__name__}")
        if token_ids.dim() != 1 or token_ids.dtype.is_floating_point or token_ids.dtype.is_complex \
                or token_ids.dtype == torch.bool:
            raise ValueError(f"token_ids must be a 1-D integer tensor, got {str(token_ids.dtype).replace('torch.', '')}"
                             f" of shape {list(token_ids.shape)}")
        ids = token_ids.to(torch.int64).sort().values
        if not 1 <= ids.numel() <= V:
            raise ValueError(f"token_ids must hold 1 to {V} (vocab_size) ids, got {ids.numel()}")
        if int(ids[0]) < 0 or int(ids[-1]) >= V:
            raise ValueError(f"token_ids must lie in [0, {V}), got ids from {int(ids[0])} to {int(ids[-1])}")
        if bool((ids[1:] == ids[:-1]).any()):
            raise ValueError("token_ids must be distinct")
        self.draft_vocab = ids.to(self.fc.weight.device)
        self._vocab_rows = self._vocab_rows_packed = None
        self._head_packs = {}
        return self

    def _draft_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The draft vocabulary's rows of the LM head, of the embedding and of w2, in the
        drafter's dtype: copied once, again only when a weight or the dtype or device
        changes (training updates w2 in place: its version counts)."""
        w2 = self.embed_proj[2].weight
        E, W = self.embed_tokens.weight, self.lm_head.weight
        dt = self.embed_proj[0].weight.dtype
        # the shape too: a head weight replaced by one of another size may reuse the freed one's address
        key = (W.data_ptr(), W.device, E.data_ptr(), w2.data_ptr(), tuple(w2.shape), w2._version, dt,
               self.draft_vocab.device)
        if self._vocab_rows is None or self._vocab_rows[0] != key:
            ids = self.draft_vocab.to(W.device)
            self._vocab_rows = (key, W.detach()[ids].to(dt).contiguous(), E.detach()[ids].to(dt).contiguous(),
                                w2.detach()[ids].contiguous())
        return self._vocab_rows[1:]

    def _draft_rows_packed(self) -> domino_ops.PackedLinearWeight:
        """The draft vocabulary's LM-head rows (:meth:`_draft_rows`), packed for
        ``small_batch_linear_packed``; packed again whenever those rows are copied again."""
        rows = self._draft_rows()[0]
        cached = self._vocab_rows_packed
        if cached is None or cached[0] is not rows:
            cached = self._vocab_rows_packed = (rows, domino_ops.pack_small_batch_linear_weight(rows, dtype=rows.dtype))
        return cached[1]

    def _packed_head_weight(self, name: str, w: torch.Tensor,
                            param: torch.Tensor) -> domino_ops.PackedLinearWeight | None:
        """The head weight ``w`` (``name``: "w2" or "w_hh", as :meth:`head_weights` gives it;
        ``param`` the parameter it comes from) packed for the tree expand kernel's packed
        products (``domino_head_expand(w2_packed=, w_hh_packed=)``), or None where they do not
        run: w not bf16, not on the CPU, or neither AVX512-BF16 nor AVX2. Packed once, again when w changes
        (another tensor, or an in-place update of the parameter: its version counts)."""
        if w.dtype != torch.bfloat16 or w.device.type != "cpu" or not domino_ops.small_batch_linear_packed_supported():
            return None
        # The cache keeps the tensor it packed alive, so no other tensor can have its address:
        # the same address is the same storage. The version is the parameter's (w2 may be the
        # draft vocabulary's copy, made in inference mode, which counts no versions; that copy
        # is remade whenever the parameter changes).
        key = (w.data_ptr(), param._version, tuple(w.shape))
        cached = self._head_packs.get(name)
        if cached is None or cached[1] != key:
            cached = self._head_packs[name] = (w, key, domino_ops.pack_small_batch_linear_weight(w))
        return cached[2]

    def base_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The backbone's logits [.., K] float32 for draft hidden states h [.., H], over the
        draft vocabulary (K = its size; all V tokens, by the target's own LM head, without
        one). Their indices are what :meth:`choose_tokens` takes."""
        if self.draft_vocab is None:
            return self.lm_head(h.to(self.lm_head.weight.dtype)).float()
        W = self._draft_rows()[0]
        if uses_small_batch_linear(self.lm_head):  # the kernel the target's LM head runs
            if runs_packed(self.lm_head, W.dtype):
                return domino_ops.small_batch_linear_packed(h.to(W.dtype), self._draft_rows_packed()).float()
            return domino_ops.small_batch_linear(h.to(W.dtype), W).float()
        return F.linear(h.to(W.dtype), W).float()

    def _head_linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` in x's dtype for the head's small products (hproj, the GRU's input and
        state products): on ``domino_ops.small_batch_linear`` where the drafter's linears run
        it (CPU), so a sequence's drafts do not depend on its batch, as the rest of the drafter;
        else ``F.linear``."""
        if x.device.type == "cpu" and uses_small_batch_linear(self.lm_head):
            return domino_ops.small_batch_linear(x, w.contiguous())
        return F.linear(x, w)

    def _to_target_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices -> target token ids (identity without a draft vocabulary)."""
        return tokens if self.draft_vocab is None else self.draft_vocab[tokens]

    def gru_state(self, tokens: torch.Tensor) -> torch.Tensor:
        """GRU state [b, G] float32 after consuming tokens [b, n >= 1] from a zero state.

        The reference's float32 cell from the weights' products, as the head kernels step it
        (and ``nn.GRU`` up to rounding). A round's root state is one step from zero, which
        needs no ``w_hh`` product (the GRU has no biases): one small product and a few
        elementwise ops, where calling ``nn.GRU`` cost ~0.1 ms warm and ~0.3 ms in a round (cold)."""
        w_ih, w_hh = self.prefix_gru.weight_ih_l0, self.prefix_gru.weight_hh_l0
        gi = self._head_linear(self.embed_tokens(tokens).to(w_ih.dtype), w_ih).float()  # [b, n, 3G]
        state = gi.new_zeros(gi.shape[0], w_hh.shape[1])
        hidden = torch.zeros_like(gi[:, 0])  # w_hh @ 0 at the first step
        for t in range(tokens.shape[1]):
            if t:
                hidden = self._head_linear(state.to(w_hh.dtype), w_hh).float()
            state = gru_cell(gi[:, t], hidden, state)
        return state

    def block_input(self, anchor: torch.Tensor, anchor_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tokens [anchor, MASK, ...] [b, B] and their positions [b, B]."""
        B = self.config.block_size
        block = torch.full((anchor.shape[0], B), self.config.mask_token_id, dtype=torch.int64, device=anchor.device)
        block[:, 0] = anchor
        return block, anchor_pos[:, None] + torch.arange(B, device=anchor.device)

    def draft_rows(self, n: int | None = None) -> slice:
        """The block positions whose hidden states draft the first ``n`` (default all)
        tokens: all B with shift_label, else the B - 1 after the anchor."""
        first = 0 if self.config.shift_label else 1
        return slice(first, self.config.block_size if n is None else first + n)

    def draft_hidden(self, h: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """The hidden states [.., n, H] of the first ``n`` (default all) block positions that
        draft tokens (:meth:`draft_rows`). Contiguous: a
        strided 3D input sends ``nn.Linear`` (the LM head next) down a batched-matmul path
        2-2.6x slower than one matrix product (measured for [128, 15, 576] x [49152, 576] and
        [4, 15, 576] on this CPU), which had made the training step's LM head half its time."""
        return h[..., self.draft_rows(n), :].contiguous()

    def draft_block_hidden(self, cache: DraftContextCache, anchor: torch.Tensor, anchor_pos: torch.Tensor,
                           n: int) -> torch.Tensor:
        """The hidden states [b, n, H] that draft the first ``n`` tokens after ``anchor``
        [b] at ``anchor_pos`` [b]: one backbone forward over the block
        ``[anchor, MASK, ...]`` computing only those rows past the last attention."""
        block, positions = self.block_input(anchor, anchor_pos)
        return self.backbone(cache, block, positions, rows=self.draft_rows(n)).contiguous()

    def packed_draft_hidden(self, features: torch.Tensor, ctx_valid: torch.Tensor, block_tokens: torch.Tensor,
                            block_pos: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        """Draft-position hidden states [N*A, n, H] of A blocks per sequence packed in one
        forward: each sequence's context features [N, Tc, n*H] (real where ``ctx_valid``
        [N, Tc]) are projected once, and the blocks ``block_tokens`` [N, A*B] at
        ``block_pos`` [N, A*B] see what ``attn_mask`` [N, A*B, Tc + A*B] (bool) allows:
        in training, the context strictly before each block's anchor and the block itself."""
        N, Tc = ctx_valid.shape
        cache = self.new_cache(N, features.device, self.fc.weight.dtype)
        self.extend_context(cache, features, torch.arange(Tc, device=features.device).expand(N, Tc), ctx_valid)
        h = self.backbone(cache, block_tokens, block_pos, attn_mask)
        return self.draft_hidden(h.view(-1, self.config.block_size, h.shape[-1]))

    def head_correction(self, h: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        """The Domino head's residual ``W2 silu(W1 [h; S])`` [.., V] for draft hidden states
        h [.., H] and GRU states S [.., G] (the state after the tokens before the position)."""
        return self.embed_proj(torch.cat([h, S], dim=-1))

    def teacher_forced_head_input(self, h: torch.Tensor, gru_inputs: torch.Tensor) -> torch.Tensor:
        """The head's activation ``a = SiLU(W1 [h; S])`` [M, n, r] at every draft position at
        once, the GRU run over ``gru_inputs`` [M, n] (x_p, x_{p+1}, ...: teacher forcing) from
        a zero state; h [M, n, H]. Final logits are ``base + a @ W2^T``; ``a`` is zero at the
        first ``pure_draft_prefix_len`` positions, which keep their base logits, as in
        generation."""
        S, _ = self.prefix_gru(self.embed_tokens(gru_inputs).to(h.dtype))  # [M, n, G]: state after x_p..x_{p+k}
        a = self.embed_proj[1](self.embed_proj[0](torch.cat([h, S], dim=-1)))
        corrected = torch.arange(a.shape[1], device=a.device) >= self.config.pure_draft_prefix_len
        return a * corrected[:, None].to(a.dtype)

    def self_fed_logits(self, h: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """Final logits [M, n, V] with the GRU consuming the drafter's own argmax step by step
        (training-time test), from the anchor [M]; h [M, n, H], base [M, n, V]. With a draft
        vocabulary the argmax is over its tokens, the only ones drafting can choose."""
        P = self.config.pure_draft_prefix_len
        vocab = self.draft_vocab
        state, x, outs = None, anchor, []
        for k in range(h.shape[1]):
            _, state = self.prefix_gru(self.embed_tokens(x)[:, None].to(h.dtype), state)
            logits_k = base[:, k] if k < P else base[:, k] + self.head_correction(h[:, k], state[0])
            outs.append(logits_k)
            x = logits_k.detach().argmax(-1) if vocab is None else vocab[logits_k.detach()[:, vocab].argmax(-1)]
        return torch.stack(outs, dim=1)

    @torch.no_grad()
    def draft(self, cache: DraftContextCache, anchor: torch.Tensor, anchor_pos: torch.Tensor, *,
              use_head: bool = True, sampling: RowSampling | None = None, num_drafts: int | None = None) -> Draft:
        """Drafts ``num_drafts`` tokens (default ``config.num_drafts``, the most a block
        holds) after ``anchor`` [b] at positions ``anchor_pos`` [b]; ``sampling`` holds each
        sequence's sampling arguments (None: greedy). Fewer drafts cost fewer LM-head rows
        and head steps; the first n drafts are the same whatever n (the head is causal; bit for bit
        where the linears are batch-invariant, :mod:`domino.fast_linear`, as the engine runs them
        on the CPU: the backbone's last layer computes only the n draft rows)."""
        n_max = self.config.num_drafts
        n = n_max if num_drafts is None else num_drafts
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= n_max:
            raise ValueError(f"num_drafts must be an int in [1, {n_max}], got {num_drafts!r}")
        h = self.draft_block_hidden(cache, anchor, anchor_pos, n)
        return self.choose_tokens(h, self.base_logits(h), anchor, use_head=use_head, sampling=sampling)

    @torch.no_grad()
    def choose_tokens(self, h: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, *, use_head: bool = True,
                      sampling: RowSampling | None = None) -> Draft:
        """Picks the drafts from draft hidden states h [b, n, H] and base logits [b, n, K]
        float32 over the draft vocabulary (:meth:`base_logits`; K = V without one): the
        first ``pure_draft_prefix_len`` from the base logits, the rest by the Domino head
        rollout (or all from the base logits when the head is off). ``sampling`` holds each
        of the b sequences' sampling arguments (None: greedy). The :class:`Draft` holds
        target token ids and the logits over the draft vocabulary (its ``logits``: over the
        whole vocabulary, -inf outside the draft vocabulary)."""
        c = self.config
        b, n, V = logits.shape
        sampling = sampling or RowSampling(0.0, 0, 1.0, None, False)

        def sample_rows(rows):  # [b, m, V] -> [b, m]
            return domino_ops.sample(rows.reshape(-1, V), **sampling.repeat_rows(rows.shape[1]).op_kwargs()).view(b, -1)

        kept_probs = []  # at T > 0 the distributions the tokens were drawn from, kept for verification

        def confidence(rows):  # [b, m, V] -> [b, m]: the top probability of each row's distribution
            if sampling.any_sampled:
                kept_probs.append(domino_ops.filtered_probs(rows, **sampling.filter_kwargs()))
                return kept_probs[-1].amax(-1)
            return torch.softmax(rows, dim=-1).amax(-1)

        if not (use_head and c.has_head):
            return self._draft(sample_rows(logits), logits, confidence(logits), kept_probs)
        P = min(c.pure_draft_prefix_len, n)
        prefix = sample_rows(logits[:, :P]) if P > 0 else anchor.new_empty(b, 0)
        tokens, confidences = [prefix], [confidence(logits[:, :P])] if P > 0 else []
        if P < n:
            E, w_ih, w_hh, w1h, w1s, w2 = self.head_weights()
            state = self.gru_state(torch.cat([anchor[:, None], self._to_target_ids(prefix)], dim=1))
            hproj = self._head_linear(h[:, P:].to(w1h.dtype), w1h).float()
            rest = logits[:, P:].contiguous()
            drafted, logprobs, _ = domino_ops.domino_head_rollout(
                rest, hproj, state, E, w_ih, w_hh, w1s, w2, write_logits=sampling.any_sampled, **sampling.op_kwargs())
            tokens.append(drafted)
            if sampling.any_sampled:  # the rollout wrote the corrected logits the tokens came from
                logits = torch.cat([logits[:, :P], rest], dim=1)
                confidences.append(confidence(rest))
            else:  # the argmax's own log-probability, from the kernel
                confidences.append(logprobs.exp())
        return self._draft(torch.cat(tokens, dim=1), logits, torch.cat(confidences, dim=1), kept_probs)

    def _draft(self, tokens: torch.Tensor, logits: torch.Tensor, confidence: torch.Tensor,
               probs: list[torch.Tensor]) -> Draft:
        """A :class:`Draft` from draft-vocabulary tokens [b, n], logits [b, n, K] and, when
        sampled, the distributions its positions were drawn from ([b, m_i, K] pieces in
        position order; empty when greedy)."""
        return Draft(self._to_target_ids(tokens), logits, confidence, self.draft_vocab, self.config.vocab_size,
                     torch.cat(probs, dim=1) if probs else None)

    @torch.no_grad()
    def draft_tree(self, cache: DraftContextCache, anchor: torch.Tensor, anchor_pos: torch.Tensor, *, topk: int,
                   depth: int, num_draft_tokens: int | None = None, use_head: bool = True,
                   sampling: RowSampling | None = None) -> domino_ops.DraftTree:
        """Drafts a tree of tokens after ``anchor`` [b] (node 0, the root) at positions
        ``anchor_pos`` [b], in SGLang's EAGLE-2 layout (:func:`domino_ops.draft_tree`):
        ``topk`` children per expanded node, ``depth`` expansion steps (depth d's children
        sit at draft position d, so ``depth <= config.num_drafts``), ``num_draft_tokens``
        nodes including the root (greedy only; default every candidate).

        One backbone forward, as :meth:`draft`; base logits for the first ``depth`` draft
        positions only. With the head, each node carries its own GRU state (the root's:
        after the anchor) and its children see the correction for its own path; the first
        ``pure_draft_prefix_len`` depths use the base logits alone, as :meth:`choose_tokens`
        does, while the states still advance. Without the head (or a head-less drafter) the
        children of every node at depth d are the same: the best (or drawn) tokens of the
        base logits at d. ``topk = 1`` drafts :meth:`draft`'s chain at temperature 0: bit for
        bit without a pure-draft prefix; with one, the prefix tokens' GRU steps are the expand
        kernel's float32 cell rather than ``nn.GRU`` in the drafter's dtype (equal to rounding).

        ``sampling`` (None: greedy): each sequence's temperature/top_k/top_p and generator
        (one for all, or one per sequence: per-request seeds); when some sequence samples,
        the tree is a sampled one (every candidate a node, :func:`domino_ops.draft_tree`), a
        greedy sequence's children its best tokens.
        Returns a :class:`domino_ops.DraftTree` (``draft_probs`` [b, N, V] float32 at T > 0).
        """
        n = self.config.num_drafts
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= n:
            raise ValueError(f"depth must be an int in [1, {n}] (the drafter's num_drafts), got {depth!r}")
        if sampling is None or not sampling.any_sampled:
            sampling = RowSampling(0.0, 0, 1.0, None, False)  # greedy rows' other arguments do not matter
        h = self.draft_block_hidden(cache, anchor, anchor_pos, depth)
        base = self.base_logits(h)  # [b, depth, K]
        if use_head and self.config.has_head:
            E, w_ih, w_hh, w1h, w1s, w2 = self.head_weights()
            hproj = self._head_linear(h.to(w1h.dtype), w1h).float()
            head = (hproj, self.gru_state(anchor[:, None]), E, w_ih, w_hh, w1s, w2)
            plain = min(self.config.pure_draft_prefix_len, depth)
            packs = {"w2_packed": self._packed_head_weight("w2", w2, self.embed_proj[2].weight),
                     "w_hh_packed": self._packed_head_weight("w_hh", w_hh, self.prefix_gru.weight_hh_l0)}
        else:
            head, plain, packs = _zero_head(base), depth, {}
        tree = domino_ops.draft_tree(base, *head, anchor, topk=topk, depth=depth, num_draft_tokens=num_draft_tokens,
                                     plain_depths=plain, **packs, **sampling.op_kwargs())
        if self.draft_vocab is None:
            return tree
        # draft-vocabulary indices -> target ids (the root is the anchor, a target id already)
        candidates = torch.cat([tree.candidates[:, :1], self._to_target_ids(tree.candidates[:, 1:])], dim=1)
        probs = (None if tree.draft_probs is None
                 else to_full_vocab(tree.draft_probs, self.draft_vocab, self.config.vocab_size, 0.0))
        return domino_ops.DraftTree(tree.parent_list, tree.selected_index, candidates, probs, tree.candidate_scores,
                                    self._to_target_ids(tree.candidate_tokens))

    # ---- checkpoints ------------------------------------------------------------------

    def save_pretrained(self, directory: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        """Writes config.json, model.safetensors (weights in ``dtype``, and the draft
        vocabulary's ids as ``draft_vocab`` int64 when one is set) and the calibration."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.config.save(directory)
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        if self.draft_vocab is not None:
            state[DRAFT_VOCAB_KEY] = self.draft_vocab.cpu().contiguous()
        weights = directory / "model.safetensors"
        save_file(state, str(weights), metadata={"format": "pt"})
        # safetensors writes the file 0600 whatever the umask; give it config.json's mode,
        # so a drafter saved for a team is as readable as its config
        weights.chmod((directory / "config.json").stat().st_mode & 0o777)
        if self.calibration.edges:
            self.calibration.save(directory / CALIBRATION_FILE)
        else:  # none: a file left by earlier weights in this directory is not these weights'
            (directory / CALIBRATION_FILE).unlink(missing_ok=True)

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu") -> "DominoDraftModel":
        """Loads a Domino checkpoint (with its draft vocabulary, if it has one), or a DFlash
        one (backbone only: the head is absent)."""
        directory = Path(directory)
        config = DominoConfig.load(directory)
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise ValueError(f"drafter: no *.safetensors in {directory}")
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        vocab = state.pop(DRAFT_VOCAB_KEY, None)
        model = cls(config)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"checkpoint {directory} does not match its config: missing {missing}, "
                             f"unexpected {unexpected}")
        model.calibration = Calibration.load(directory / CALIBRATION_FILE)
        model = model.to(device=device, dtype=dtype).eval()
        return model.set_draft_vocab(vocab)


def _zero_head(base: torch.Tensor) -> tuple:
    """A head of rank 1 and GRU width 1 with every weight zero, in
    :func:`domino_ops.draft_tree`'s argument order after the base logits [b, k, V]: with
    every depth plain its correction is exactly zero, so a tree drafts from the base logits
    alone (the block drafter's tree), through the same expand and sampling kernels."""
    b, k, V = base.shape
    z = lambda *shape: torch.zeros(*shape, device=base.device, dtype=torch.float32)  # noqa: E731
    # hproj, state, gru_input (a [V, 3G] table), w_ih (unused with a table), w_hh, w1s, w2
    return z(b, k, 1), z(b, 1), z(V, 3), None, z(3, 1), z(1, 1), z(V, 1)
