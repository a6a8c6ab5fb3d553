"""Run a HF decoder's RMSNorms and gated-MLP activations on the CPU through
``domino_ops.rms_norm`` and ``domino_ops.silu_mul``.

``use_fused_layers(model)`` swaps the ``forward`` of every RMSNorm and gated MLP of the
HF classes below (the same formula in each) for one that calls the kernels: a norm is one
call instead of PyTorch's eight small ops, an MLP's ``act_fn(gate) * up`` one call
instead of two. The weights are untouched (same parameters, same ``state_dict``);
``undo_fused_layers`` restores the original forwards.

Where the layers' linears run the packed small-batch kernel (:mod:`domino.fast_linear`),
a switched MLP also runs its gate and up projections as one product, and a switched
LlamaAttention (:data:`ATTENTION_CLASSES`, only where its installed forward is the one
copied here) its q, k and v projections as one
(:func:`domino.fast_linear.fused_packed_linear`) and its rotary embedding as one call
(``domino_ops.apply_rotary_pos_emb``, HF's 14 small ops): the same bits, 90 fewer linear
calls and ~390 fewer small ops in a SmolLM2 forward (``benchmarks/fused_projections_ab.py``).

Both kernels compute in HF's rounding order (float32 math, rounded to the dtype where HF
rounds), row by row, so with :mod:`domino.fast_linear` and :mod:`domino.fast_attention` a
forward over k tokens still computes every row bit for bit as k one-token decoding steps
do. In bf16 they match HF's own modules bit for bit on most elements (the sum of squares
and the exponential are the kernels' own, so an element at a rounding boundary can land
one bf16 ulp away); a switched model is compared with HF's in tests/test_fast_layers.py.

A Domino drafter's own modules (:mod:`domino.model`: its RMSNorms, SwiGLU MLPs and
attention) are switched the same way, its attention to one q/k/v product and one rotary
call (:func:`_draft_attention_forward`, the bits of its own forward): the backbone over a
16-token block 3.4 ms instead of 4.0 on an AVX2 Zen 3, the same drafts
(``benchmarks/drafter_backbone_ab.py``; the fused norm may move an element by one ulp).
Where every layer's modules are switched and its linears run the packed product, the
backbone runs its layers as one ``domino_ops.draft_layers`` call (csrc/cpu/draft_layers.cpp:
these forwards in C++, the same bits; :func:`draft_layer_weights`): the backbone for a
6-token draft 3.0 -> 2.1 ms on the Zen 3 VM (fiftieth session).

A switched module runs its own forward off the CPU, for dtypes other than float32 /
bfloat16, when autograd needs a graph, or under CPU autocast. MLPs are switched only when
their activation is SiLU.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys

import torch

import domino_ops
from domino.fast_linear import (check_module, cpu_kernel_applies, fused_packed_linear, packed_product,
                                undo_fused_packed_linear)
from domino.model import DraftAttention, DraftMLP, RMSNorm

__all__ = ["use_fused_layers", "undo_fused_layers", "uses_fused_layers", "draft_layer_weights", "NORM_CLASSES",
           "MLP_CLASSES", "ATTENTION_CLASSES"]

# HF classes whose forward is exactly LlamaRMSNorm's / LlamaMLP's (checked against the
# installed transformers in tests/test_fast_layers.py).
NORM_CLASSES = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
MLP_CLASSES = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")
# Attention classes whose forward may be LlamaAttention's; switched only when it is, word
# for word, the forward whose source has this SHA-1 (transformers 5.24's).
ATTENTION_CLASSES = ("LlamaAttention",)
ATTENTION_SOURCE_SHA1 = "32e4843ca65965aa83a3356f19b8d59148093717"
_FLAG = "_domino_fused_layer"


def _rms_norm_forward(mod, x: torch.Tensor) -> torch.Tensor:
    w = mod.weight
    if not cpu_kernel_applies(x, w) or x.numel() == 0 or x.shape[-1] != w.shape[0]:
        return type(mod).forward(mod, x)
    x = x.contiguous()
    out = torch.empty_like(x)
    # The op itself (its C++ checks name any bad argument), not the validating wrapper:
    # ~60 calls per SmolLM2 forward.
    torch.ops.domino_ops.rms_norm.default(x, w.contiguous(), float(mod.variance_epsilon), out)
    return out


def _mlp_forward(mod, x: torch.Tensor) -> torch.Tensor:
    gate_up = fused_packed_linear(mod, (mod.gate_proj, mod.up_proj), x)
    if gate_up is None:
        gate, up = mod.gate_proj(x), mod.up_proj(x)
    else:
        gate, up = gate_up.split(mod.gate_proj.out_features, dim=-1)
    # act_fn read at every call: one replaced after the switch (GELU for SiLU) runs as itself
    if not cpu_kernel_applies(gate, up) or gate.shape != up.shape or gate.numel() == 0 or not _is_silu(mod.act_fn):
        return mod.down_proj(mod.act_fn(gate) * up)
    gate, up = gate.contiguous(), up.contiguous()
    act = torch.empty_like(gate)
    torch.ops.domino_ops.silu_mul.default(gate, up, act)
    return mod.down_proj(act)


def _attention_forward(mod, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, cache=None,
                       **kwargs):
    """LlamaAttention.forward (transformers 5.x, :data:`ATTENTION_SOURCE_SHA1`) with the q, k
    and v projections as one product (:func:`domino.fast_linear.fused_packed_linear`) and
    the rotary embedding as one call (``domino_ops.apply_rotary_pos_emb``); HF's own
    forward where the product does not apply."""
    cache = kwargs.pop("past_key_values", cache)  # the name before transformers 5.40
    qkv = fused_packed_linear(mod, (mod.q_proj, mod.k_proj, mod.v_proj), hidden_states)
    if qkv is None:
        return type(mod).forward(mod, hidden_states, position_embeddings, attention_mask, cache=cache, **kwargs)
    hf = sys.modules[type(mod).__module__]
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, mod.head_dim)
    q, k, v = qkv.split((mod.q_proj.out_features, mod.k_proj.out_features, mod.v_proj.out_features), dim=-1)
    query_states = q.view(hidden_shape).transpose(1, 2)
    key_states = k.view(hidden_shape).transpose(1, 2)
    value_states = v.view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    if cos.dtype is qkv.dtype and sin.dtype is qkv.dtype and cos.dim() == 3 and cos.shape[-1] == mod.head_dim:
        # HF's 14 small ops in one call, the same bits (the op's C++ checks name any bad argument)
        rotated_q = torch.empty(query_states.shape, dtype=qkv.dtype)
        rotated_k = torch.empty(key_states.shape, dtype=qkv.dtype)
        torch.ops.domino_ops.apply_rotary_pos_emb.default(query_states, key_states, cos, sin, rotated_q, rotated_k)
        query_states, key_states = rotated_q, rotated_k
    else:
        query_states, key_states = hf.apply_rotary_pos_emb(query_states, key_states, cos, sin)
    if cache is not None:
        key_states, value_states = cache.update(key_states, value_states, mod.layer_idx, kwargs=kwargs)
    attention_interface = hf.ALL_ATTENTION_FUNCTIONS.get_interface(mod.config._attn_implementation,
                                                                   hf.eager_attention_forward)
    attn_output, attn_weights = attention_interface(mod, query_states, key_states, value_states, attention_mask,
                                                    dropout=0.0 if not mod.training else mod.attention_dropout,
                                                    scaling=mod.scaling, **kwargs)
    attn_output = attn_output.reshape(*input_shape, -1).contiguous()
    return mod.o_proj(attn_output), attn_weights


def _draft_attention_forward(mod: DraftAttention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                             ctx_k: torch.Tensor, ctx_v: torch.Tensor, attn_mask: torch.Tensor,
                             rows: slice | None = None) -> torch.Tensor:
    """:meth:`domino.model.DraftAttention.forward` with the q, k and v projections as one
    product and both rotations as one ``domino_ops.apply_rotary_pos_emb`` call (the
    drafter's ``apply_rope`` is HF's rotation, the same bits; its own projections where the
    product does not apply) and the attention on ``small_batch_attention`` (:func:`_draft_attend`).
    x [b, Q, H]; cos, sin [b, 1, Q, hd]."""
    qkv = fused_packed_linear(mod, (mod.q_proj, mod.k_proj, mod.v_proj), x)
    b, Q, _ = x.shape
    if qkv is None or cos.dtype is not qkv.dtype or sin.dtype is not qkv.dtype:  # its own projections
        return _draft_attend(mod, mod.query(x, cos, sin), *mod.key_value(x, cos, sin), ctx_k, ctx_v, attn_mask, rows)
    q, k, v = qkv.split((mod.nh * mod.hd, mod.kvh * mod.hd, mod.kvh * mod.hd), dim=-1)
    q = mod.q_norm(q.reshape(b, Q, mod.nh, mod.hd)).transpose(1, 2)
    k = mod.k_norm(k.reshape(b, Q, mod.kvh, mod.hd)).transpose(1, 2)
    v = v.reshape(b, Q, mod.kvh, mod.hd).transpose(1, 2)
    rotated_q = torch.empty(q.shape, dtype=q.dtype)
    rotated_k = torch.empty(k.shape, dtype=k.dtype)
    # cos/sin [b, 1, Q, hd] -> the op's [b, Q, hd] (a strided view is fine)
    torch.ops.domino_ops.apply_rotary_pos_emb.default(q, k, cos[:, 0], sin[:, 0], rotated_q, rotated_k)
    return _draft_attend(mod, rotated_q, rotated_k, v, ctx_k, ctx_v, attn_mask, rows)


def _draft_attend(mod: DraftAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx_k: torch.Tensor,
                  ctx_v: torch.Tensor, attn_mask: torch.Tensor, rows: slice | None) -> torch.Tensor:
    """:meth:`domino.model.DraftAttention.attend` on ``domino_ops.small_batch_attention``
    (a CPU kernel; the same math as SDPA up to rounding), so that a sequence's drafts do not
    depend on the other sequences of its batch: SDPA's CPU kernels block the keys by
    position, so a sequence's left padding and the masked holes of earlier rounds changed
    its draft's bits, and a seeded sampled request drew different tokens alone and in a
    batch. The kernel computes each query row from its visible keys alone, in key order.

    Its causal rule (row m of M sees keys j <= N - M + m) would hide later block positions
    from a block row, which sees the whole block: M - 1 keys hidden by the mask are appended
    (never read), so every real key is at or before each row's own position. Only the
    ``rows`` asked for are queried."""
    if not cpu_kernel_applies(q, k, v, ctx_k, ctx_v):  # autograd, another device or dtype: SDPA
        return mod.attend(q, k, v, ctx_k, ctx_v, attn_mask, rows)
    rows = slice(None) if rows is None else rows
    q = q[:, :, rows]
    b, M = q.shape[0], q.shape[2]
    pad = k.new_zeros(b, k.shape[1], M - 1, k.shape[3])
    keys, values = torch.cat([ctx_k, k, pad], dim=2), torch.cat([ctx_v, v, pad], dim=2)
    mask = attn_mask if attn_mask.shape[1] == 1 else attn_mask[:, rows]
    mask = torch.cat([mask, mask.new_zeros(b, mask.shape[1], M - 1)], dim=2)[:, None].expand(b, 1, M, -1)
    out = domino_ops.small_batch_attention(q, keys, values, mask)  # [b, nh, M, hd], stored [b, M, nh, hd]
    return mod.o_proj(out.transpose(1, 2).reshape(b, M, mod.nh * mod.hd))


def draft_layer_weights(layers, dtype: torch.dtype) -> tuple[list, list, list] | None:
    """A drafter's backbone layers (:class:`domino.model.DraftLayer` s) as
    ``domino_ops.draft_layers`` takes them, for inputs of ``dtype``: 12 weights (None where a
    layer has none) and 3 eps a layer, and [query heads, kv heads, head dim, intermediate];
    None where the op would not compute what the layers' forwards compute: a module not on
    the fused forwards here, an MLP whose act_fn is no longer SiLU, a linear not on the packed product, a norm's weight in
    another dtype, q and k normalised with different eps. Looked up at every call (~170 us
    for the shipped drafter: the packed copies' checks, which the layers' own forwards run
    too), so a changed module, switch, eps or weight is seen at once.
    """
    weights, eps, inter = [], [], None
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        norms = (layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm)
        if not (all(getattr(m, _FLAG, False) for m in (attn, mlp, *norms)) and _is_silu(mlp.act_fn)
                and all(n.weight.dtype is dtype and n.weight.is_contiguous() for n in norms)
                and attn.q_norm.variance_epsilon == attn.k_norm.variance_epsilon):
            return None
        products = (packed_product(attn, (attn.q_proj, attn.k_proj, attn.v_proj), dtype),
                    packed_product(attn, (attn.o_proj,), dtype),
                    packed_product(mlp, (mlp.gate_proj, mlp.up_proj), dtype),
                    packed_product(mlp, (mlp.down_proj,), dtype))
        if None in products or inter not in (None, mlp.gate_proj.out_features):
            return None
        qkv, o, gate_up, down = products
        inter = mlp.gate_proj.out_features
        weights += [layer.input_layernorm.weight, qkv.data, qkv.bias, o.data, o.bias,
                    layer.post_attention_layernorm.weight, gate_up.data, gate_up.bias, down.data, down.bias,
                    attn.q_norm.weight, attn.k_norm.weight]
        eps += [float(layer.input_layernorm.variance_epsilon), float(layer.post_attention_layernorm.variance_epsilon),
                float(attn.q_norm.variance_epsilon)]
    attn = layers[0].self_attn
    return weights, [attn.nh, attn.kvh, attn.hd, inter], eps


def draft_context_weights(drafter, dtype: torch.dtype) -> tuple | None:
    """A drafter's context extension (:meth:`domino.DominoDraftModel.extend_context`) as
    ``domino_ops.draft_context`` takes it, for features of ``dtype``: fc's packed product
    (data, bias), the hidden norm's weight and eps, 3 weights a layer (the k and v projections
    as one packed product, its bias, k_norm's weight), each layer's k_norm eps, and [kv heads,
    head dim]; None where the op would not compute what the Python path computes: a norm
    not on the fused forwards or its weight in another dtype, a projection not on the packed
    product."""
    norms = (drafter.hidden_norm, *(layer.self_attn.k_norm for layer in drafter.layers))
    if not all(getattr(n, _FLAG, False) and n.weight.dtype is dtype and n.weight.is_contiguous() for n in norms):
        return None
    fc = packed_product(drafter, (drafter.fc,), dtype)
    # the k/v concatenation kept on k_proj: the attention itself keeps its q/k/v one (an owner
    # holds one), and k_proj and v_proj are called alone only here (their own packed copies,
    # which the context update's Python path packs, give way to it)
    kvs = [packed_product(layer.self_attn.k_proj, (layer.self_attn.k_proj, layer.self_attn.v_proj), dtype)
           for layer in drafter.layers]
    if fc is None or None in kvs:
        return None
    weights = []
    for layer, kv in zip(drafter.layers, kvs):
        weights += [kv.data, kv.bias, layer.self_attn.k_norm.weight]
    attn = drafter.layers[0].self_attn
    return (fc.data, fc.bias, drafter.hidden_norm.weight, float(drafter.hidden_norm.variance_epsilon), weights,
            [attn.kvh, attn.hd], [float(layer.self_attn.k_norm.variance_epsilon) for layer in drafter.layers])


@functools.cache
def _mirrors_hf_attention(cls: type) -> bool:
    """Whether ``cls.forward`` is the LlamaAttention forward :func:`_attention_forward`
    mirrors, word for word (a transformers release that changes it leaves its attention
    on HF's forward, unfused, rather than computing something else)."""
    try:
        source = inspect.getsource(inspect.unwrap(cls.forward))
    except (OSError, TypeError):
        return False
    return hashlib.sha1(source.encode()).hexdigest() == ATTENTION_SOURCE_SHA1


def _is_silu(act) -> bool:
    from transformers.activations import SiLUActivation

    return isinstance(act, (torch.nn.SiLU, SiLUActivation))


def use_fused_layers(model: torch.nn.Module) -> torch.nn.Module:
    """Switches the RMSNorms (:data:`NORM_CLASSES`, a drafter's :class:`domino.model.RMSNorm`),
    SiLU gated MLPs (:data:`MLP_CLASSES`, :class:`domino.model.DraftMLP`) and attentions
    (:data:`ATTENTION_CLASSES` where their forward is HF's,
    :class:`domino.model.DraftAttention`) of ``model`` to the fused kernels, in place;
    returns ``model``. Idempotent; other modules are left alone."""
    check_module(model)
    import domino_ops  # noqa: F401  (registers torch.ops.domino_ops)

    for mod in model.modules():
        if getattr(mod, _FLAG, False):
            continue
        cls = type(mod)
        name = cls.__name__
        if name in NORM_CLASSES or cls is RMSNorm:
            # a partial (not a bound method): a switched model still pickles
            mod.forward = functools.partial(_rms_norm_forward, mod)
        elif (name in MLP_CLASSES or cls is DraftMLP) and _is_silu(getattr(mod, "act_fn", None)):
            mod.forward = functools.partial(_mlp_forward, mod)
        elif name in ATTENTION_CLASSES and _mirrors_hf_attention(cls):
            mod.forward = functools.partial(_attention_forward, mod)
        elif cls is DraftAttention:
            mod.forward = functools.partial(_draft_attention_forward, mod)
        else:
            continue
        setattr(mod, _FLAG, True)
    return model


def undo_fused_layers(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the forwards switched by :func:`use_fused_layers`."""
    check_module(model)
    for mod in model.modules():
        if getattr(mod, _FLAG, False):
            del mod.forward
            delattr(mod, _FLAG)
            undo_fused_packed_linear(mod)
    return model


def uses_fused_layers(model: torch.nn.Module) -> bool:
    """Whether any module of ``model`` runs a fused kernel."""
    check_module(model)
    return any(getattr(mod, _FLAG, False) for mod in model.modules())
