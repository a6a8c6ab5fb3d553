"""Run a HF Llama, Qwen2 or Qwen3 causal LM's forward on the CPU as one loop over its
layers that calls the kernels directly.

``use_fast_forward(model)`` replaces the ``forward`` of a ``LlamaForCausalLM``,
``Qwen2ForCausalLM`` or ``Qwen3ForCausalLM`` (full attention in every layer) whose layers are already on the CPU kernels (:mod:`domino.fast_linear` with packed weights,
:mod:`domino.fast_attention`, :mod:`domino.fast_layers`) with :func:`fast_forward`: the
same computation in the same order, op for op, but without what HF wraps around it per
layer and per module (module calls and hooks, the output-capturing and keyword
machinery, the switched modules' per-call checks and weight lookups, ~2,400 small
dispatcher calls a SmolLM2 forward; ~800 remain; for Qwen2 and Qwen3 it also runs the
q, k and v projections as one packed product and the rotary embedding as one
``apply_rotary_pos_emb`` call, as :mod:`domino.fast_layers` does for Llama's attention,
the same bits). What stays HF's own: the causal mask (``create_causal_mask``; a 2D
padding mask into a ``DynamicCache`` or ``GrowingCache`` is expanded here, to the same mask:
:func:`_padding_causal_mask`), the rotary table (the model's ``rotary_emb``), the KV cache
(``DynamicCache`` / ``StaticCache.update``) and the attention function of :mod:`domino.fast_attention`.
The model's logits, hidden states and cache are bit-identical to its switched HF
forward's (tests/test_fast_forward.py), so plain decoding, HF ``generate`` and the
engine's verification all get it, and stay token-identical: what it saves is time
(``benchmarks/fast_forward_ab.py``).

Into a :class:`domino.kv_cache.GrowingCache` (the engine's cache, and the plain
baseline's) the layers run as one ``domino_ops.decoder_layers`` call
(csrc/cpu/decoder_layers.cpp: this loop in C++, the same kernels in the same order, the
same bits), which writes the new keys and values straight into the cache's storage: the
Python around the ~450 kernel calls of a SmolLM2 forward cost ~5 ms of a ~19 ms decode step
on the Zen 3 VM (``benchmarks/decoder_layers_ab.py``). Other caches get the loop
(:func:`_decoder_layers_in_python`, the op's reference).

It takes the call HF's forward takes. Where it does not apply, it runs HF's own forward:
an argument it does not handle (``inputs_embeds``, ``labels``, ``output_attentions``, a
``return_dict=False``, a tensor ``logits_to_keep``, a cache other than a
``DynamicCache`` or a ``StaticCache``, no cache, a prepared mask mapping), autograd
needing a graph, training mode, a bidirectional config (``is_causal=False``), CPU
autocast, a rotary table that the rotary kernel does not take, or forward hooks on the
model's body or any module it stands in for (or global ones). It is switched on only
where the installed transformers' forwards (the causal LM's, its body's, the decoder
layer's and the attention's) are the ones it mirrors (:data:`SOURCE_SHA1`, checked word for
word as :mod:`domino.fast_layers` checks its attention), every layer is switched, and
every linear layer runs the packed kernel for the model's dtype (bf16 on a CPU with AVX2
or AVX512-BF16; float32 with AVX-512): elsewhere ``use_fast_forward`` leaves the model as
it is.

The weights it reads are looked up once, into a plan that is made again at the next
call when anything it was made from changed: a module replaced or removed (a new LM head,
resized embeddings, a pruned layer, an MLP's ``act_fn``), a hook added, a switch under it
undone, a norm's ``variance_epsilon`` or an attention's ``scaling`` set again, a weight
replaced, changed in place through its own in-place ops, or moved (``model.to(dtype)``);
the packed copies are made again, as :func:`domino.fast_linear.packed_weight` does. The
check compares each module's, switch's and parameter's identity, version and address
(with the hook check ~0.25 ms a SmolLM2 forward on the Zen 3 VM, ~1 % of it; 0.5-0.9 ms in
a decoding loop on the Xeon VM, where the forward before it streamed the caches cold: a
caller that owns the model for a while checks it once, in a :func:`model_fixed` block, as
the engine's loops do). Where the
plan cannot be made (a switch under the model undone, a dtype without packed panels), HF's
forward runs, and the plan is attempted again only every 64 calls: a repair is picked up
within that many calls. Like :mod:`domino.fast_linear`, it cannot see a change made
through ``weight.data`` in place, or to an inference tensor inside
``torch.inference_mode()`` (no version counts it): switch the model again after one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import operator
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from domino.fast_attention import small_batch_attention_forward, uses_small_batch_attention
from domino.fast_layers import ATTENTION_SOURCE_SHA1, _FLAG as _FUSED_LAYER_FLAG, _is_silu
from domino.fast_linear import _PACKS, PackedProduct, check_module, packed_product, place_packed_weights
from domino.fixed_blocks import fixed_block, fixed_value

__all__ = ["use_fast_forward", "undo_fast_forward", "uses_fast_forward", "fast_forward", "model_fixed", "SOURCE_SHA1"]

# The forwards mirrored here, word for word (transformers 5.24's); another release that
# changes one leaves the model on HF's forward. The three families' causal LM forwards
# differ only in their docstrings, their decoder layers not at all; Qwen2's and Qwen3's
# bodies build a mask per layer type, their attentions pass a sliding window (None with
# full attention), Qwen3's normalises q and k per head before the rotary embedding.
SOURCE_SHA1 = {
    "LlamaForCausalLM": "8b93ce9b4afccbb99fdf6eb6de1026be51d8b0e0",
    "Qwen2ForCausalLM": "b417de82d351c7cf8958954e13757b3507afc57c",
    "Qwen3ForCausalLM": "539c37ef8cce727df2d65484fdc79c885f794442",
    "LlamaModel": "b6b92004ca16bcbb2ea8a1c769adc4a580e4be43",
    "Qwen2Model": "992d9ddaa5fd74ff0aa460ecc07f10d67a94acc6",
    "Qwen3Model": "992d9ddaa5fd74ff0aa460ecc07f10d67a94acc6",
    "LlamaDecoderLayer": "3369831f808a5c4540648cf20a5553ab0d89f7ca",
    "Qwen2DecoderLayer": "3369831f808a5c4540648cf20a5553ab0d89f7ca",
    "Qwen3DecoderLayer": "3369831f808a5c4540648cf20a5553ab0d89f7ca",
    "LlamaAttention": ATTENTION_SOURCE_SHA1,
    "Qwen2Attention": "81453898582f75aa29671403e86ffdc589e03b33",
    "Qwen3Attention": "e4b92cf1773110f11447372956a1ea482f5baa35",
}
# causal LM -> its body's class (each body's forward returns the cache whatever use_cache
# says (Llama) or only with use_cache (Qwen2, Qwen3))
_BODIES = {"LlamaForCausalLM": ("LlamaModel", True), "Qwen2ForCausalLM": ("Qwen2Model", False),
           "Qwen3ForCausalLM": ("Qwen3Model", False)}
_PLAN = "_domino_fast_forward_plan"
_SWITCHED = "_domino_fast_forward"
# the plan checked on entry (None: HF's forward) while callers hold the model fixed
# (:func:`model_fixed`, a :func:`domino.fixed_blocks.fixed_block`)
_FIXED = "_domino_fast_forward_fixed"
_NOT_FIXED = object()  # outside such a block: the plan and hooks are checked at each call
# The keywords HF generate and the engine pass besides the named ones; any other runs HF's forward.
_HANDLED_KWARGS = frozenset(("return_dict", "output_hidden_states", "output_attentions", "past_key_values"))


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    input_eps: float
    qkv: PackedProduct
    o: PackedProduct
    post_norm: torch.Tensor
    post_eps: float
    gate_up: PackedProduct
    down: PackedProduct
    attention: torch.nn.Module  # for the attention function's checks (training, is_causal)
    scaling: float
    q_norm: torch.Tensor | None  # Qwen3: the per-head RMSNorms of q and k before the rotary embedding
    k_norm: torch.Tensor | None
    qk_eps: float


@dataclass(frozen=True)
class _Plan:
    embed: torch.Tensor
    layers: tuple
    norm: torch.Tensor
    norm_eps: float
    lm_head: PackedProduct
    heads: tuple  # (query heads, kv heads, head dim)
    create_causal_mask: object  # the model's module's, as HF's forward calls it
    returns_cache: bool  # whether the body returns the cache with use_cache False
    # the layers as domino_ops.decoder_layers takes them (:func:`_flat_layers`)
    flat_weights: list
    flat_heads: list
    flat_eps: list
    flat_scales: list
    # What the plan was made from, compared at every call (:func:`_plan_is_current`):
    # Each as columns (dicts, keys, expected values), so that the check runs in C (map):
    modules: tuple  # (parents' _modules dicts, names, modules): every module it reads or stands in for
    switches: tuple  # (modules' __dict__s, keys, values): the switches it relies on
    params: tuple  # (modules' _parameters dicts, names, tensors): every tensor read
    versions: tuple  # (the tensors that count versions (not inference tensors), their versions)
    addresses: list  # the tensors' data pointers


def _flat_layers(layers: tuple, heads: tuple) -> tuple[list, list, list, list]:
    """The layers' weights, heads, eps and scales as ``domino_ops.decoder_layers`` takes
    them (csrc/cpu/decoder_layers.cpp): 12 tensors or None per layer, [Hq, Hkv, head dim,
    intermediate], 3 eps per layer, a scale per layer."""
    weights, eps = [], []
    for layer in layers:
        weights += [layer.input_norm, layer.qkv.data, layer.qkv.bias, layer.o.data, layer.o.bias, layer.post_norm,
                    layer.gate_up.data, layer.gate_up.bias, layer.down.data, layer.down.bias, layer.q_norm,
                    layer.k_norm]
        eps += [layer.input_eps, layer.post_eps, layer.qk_eps]
    return weights, [*heads, layers[0].gate_up.n // 2], eps, [layer.scaling for layer in layers]


@functools.cache
def _mirrors_hf(cls: type) -> bool:
    """Whether ``cls.forward`` is, word for word, the forward of :data:`SOURCE_SHA1`."""
    want = SOURCE_SHA1.get(cls.__name__)
    try:
        source = inspect.getsource(inspect.unwrap(cls.forward))
    except (OSError, TypeError):
        return False
    return want is not None and hashlib.sha1(source.encode()).hexdigest() == want


def _build_plan(model: torch.nn.Module) -> _Plan | None:
    """The weights and shapes :func:`fast_forward` reads, or None where it does not apply.
    The packed products it reads (the fused q/k/v and gate/up ones made for it among them)
    are first placed back to back in forward order (:func:`domino.fast_linear.place_packed_weights`)."""
    plan = _plan_of(model)
    if plan is not None and place_packed_weights(model):
        plan = _plan_of(model)  # the products at their new places
    return plan


def _plan_of(model: torch.nn.Module) -> _Plan | None:
    """:func:`_build_plan` with the packed products where they lie."""
    inner = getattr(model, "model", None)
    body = _BODIES.get(type(model).__name__)
    if not (body and _mirrors_hf(type(model)) and type(inner).__name__ == body[0] and _mirrors_hf(type(inner))
            and uses_small_batch_attention(model)):
        return None
    config = model.config
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return None  # sliding layers get another mask
    embed, lm_head, norm = inner.embed_tokens, model.lm_head, inner.norm
    dtype = embed.weight.dtype
    if (not embed.weight.is_cpu or dtype not in (torch.float32, torch.bfloat16)
            or len(inner.layers) != config.num_hidden_layers or not getattr(norm, _FUSED_LAYER_FLAG, False)):
        return None
    layers, params, modules, switches = [], [], [], []

    def read(parent, name, *tensors):
        """Records parent's child ``name`` (its identity, its hooks) and its tensors."""
        mod = parent._modules[name]
        modules.append((parent._modules, name, mod))
        for t_name in tensors:
            t = mod._parameters.get(t_name)
            if t is not None:
                params.append((mod._parameters, t_name, t))
        return mod

    def usable_norm(mod) -> bool:  # switched to the rms_norm kernel, its weight in the dtype
        return getattr(mod, _FUSED_LAYER_FLAG, False) and mod.weight.dtype is dtype and mod.weight.is_contiguous()

    read(model, "model")
    read(inner, "rotary_emb")
    read(inner, "layers")
    heads = None
    for i, layer in enumerate(inner.layers):
        attn, mlp = layer.self_attn, layer.mlp
        qk_norms = tuple(getattr(attn, n, None) for n in ("q_norm", "k_norm"))
        qwen3 = type(attn).__name__ == "Qwen3Attention"
        if not (_mirrors_hf(type(layer)) and _mirrors_hf(type(attn)) and getattr(mlp, _FUSED_LAYER_FLAG, False)
                and _is_silu(mlp.act_fn) and usable_norm(layer.input_layernorm) and usable_norm(layer.post_attention_layernorm)
                and (not qwen3 or all(usable_norm(n) for n in qk_norms))
                and getattr(attn, "sliding_window", None) is None and attn.layer_idx == i):
            return None
        qkv = packed_product(attn, (attn.q_proj, attn.k_proj, attn.v_proj), dtype)
        gate_up = packed_product(mlp, (mlp.gate_proj, mlp.up_proj), dtype)
        o, down = packed_product(attn, (attn.o_proj,), dtype), packed_product(mlp, (mlp.down_proj,), dtype)
        if None in (qkv, gate_up, o, down):
            return None
        d = attn.head_dim
        layer_heads = (attn.q_proj.out_features // d, attn.k_proj.out_features // d, d)
        if heads not in (None, layer_heads) or attn.k_proj.out_features != attn.v_proj.out_features:
            return None
        heads = layer_heads
        q_norm, k_norm = qk_norms if qwen3 else (None, None)
        if q_norm is not None and q_norm.variance_epsilon != k_norm.variance_epsilon:
            return None
        layers.append(_Layer(layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon), qkv, o,
                             layer.post_attention_layernorm.weight,
                             float(layer.post_attention_layernorm.variance_epsilon), gate_up, down, attn,
                             float(attn.scaling), None if q_norm is None else q_norm.weight,
                             None if k_norm is None else k_norm.weight,
                             0.0 if q_norm is None else float(q_norm.variance_epsilon)))
        read(inner.layers, str(i))
        for parent, names in ((layer, ("self_attn", "mlp")), (layer, ("input_layernorm", "post_attention_layernorm")),
                              (attn, ("q_norm", "k_norm") if qwen3 else ())):
            for name in names:
                mod = read(parent, name, "weight")
                if name != "self_attn":
                    switches.append((mod.__dict__, _FUSED_LAYER_FLAG, True))
                if name.endswith("norm"):  # the eps the plan copied (a new value is a new object)
                    switches.append((mod.__dict__, "variance_epsilon", mod.variance_epsilon))
        read(mlp, "act_fn")  # the SiLU the op computes
        switches.append((attn.__dict__, "scaling", attn.scaling))  # the scale the plan copied
        for parent, names in ((attn, ("q_proj", "k_proj", "v_proj", "o_proj")), (mlp, ("gate_proj", "up_proj",
                                                                                         "down_proj"))):
            for name in names:
                mod = read(parent, name, "weight", "bias")
                switches.append((mod.__dict__, _PACKS, mod.__dict__.get(_PACKS)))
    head = packed_product(model, (lm_head,), dtype)
    if head is None or not layers or not usable_norm(norm):
        return None
    read(inner, "embed_tokens", "weight")
    read(inner, "norm", "weight")
    read(model, "lm_head", "weight", "bias")
    switches.append((norm.__dict__, _FUSED_LAYER_FLAG, True))
    switches.append((norm.__dict__, "variance_epsilon", norm.variance_epsilon))
    switches.append((lm_head.__dict__, _PACKS, lm_head.__dict__.get(_PACKS)))
    hf = sys.modules[type(inner).__module__]
    versioned = tuple(t for _, _, t in params if not t.is_inference())  # an inference tensor counts none
    return _Plan(embed.weight, tuple(layers), norm.weight, float(norm.variance_epsilon), head, heads,
                 hf.create_causal_mask, body[1], *_flat_layers(tuple(layers), heads), tuple(zip(*modules)), tuple(zip(*switches)),
                 tuple(zip(*params)), (versioned, [t._version for t in versioned]),
                 [t.data_ptr() for _, _, t in params])


def _plan_is_current(plan: _Plan) -> bool:
    """Whether nothing the plan was made from changed: every module it reads is still in
    its place, every switch under it is still set (and every eps and scale it copied the
    same object), every tensor is the same one, at the
    same version and address (``model.to(dtype)`` swaps a parameter's data in place,
    keeping its version). ~0.16 ms for SmolLM2's ~900 entries: the comparisons run in C."""
    for dicts, keys, expected in (plan.modules, plan.switches, plan.params):
        if not all(map(operator.is_, map(dict.get, dicts, keys), expected)):
            return False
    tensors, versions = plan.versions
    return [t._version for t in tensors] == versions and list(map(_DATA_PTR, plan.params[2])) == plan.addresses


_DATA_PTR = torch.Tensor.data_ptr
# HF's forward installs hooks of its own, once, on the modules whose outputs it can record
# (decoder layers, attentions); they do nothing outside its output-capturing wrapper.
_HF_CAPTURE_HOOKS = "transformers.utils.output_capturing"
_PRE_HOOKS, _HOOKS = operator.attrgetter("_forward_pre_hooks"), operator.attrgetter("_forward_hooks")


def _hooked(plan: _Plan) -> bool:
    """Whether a forward hook (global, or of a module the plan stands in for) would run in
    HF's forward, besides HF's own output-capturing ones."""
    if _global_forward_hooks or _global_forward_pre_hooks:
        return True
    modules = plan.modules[2]
    if any(map(_PRE_HOOKS, modules)):
        return True
    return any(getattr(h, "__module__", None) != _HF_CAPTURE_HOOKS
               for hooks in filter(None, map(_HOOKS, modules)) for h in hooks.values())


# Calls between attempts to make a plan that could not be made (a switch under the model
# undone, weights in a dtype without packed panels): an attempt walks the whole model (~10 ms
# for SmolLM2, a fifth of HF's forward), and HF's forward over the same switched modules,
# which runs meanwhile, computes the same bits.
_RETRY_AFTER = 64


def _current_plan(model: torch.nn.Module) -> _Plan | None:
    """The model's plan, made again when anything it was made from changed; None where it
    cannot be made, and then tried again only every :data:`_RETRY_AFTER` calls (the count
    to go is kept where the plan would be)."""
    plan = model.__dict__.get(_PLAN)
    if type(plan) is int:
        if plan:
            model.__dict__[_PLAN] = plan - 1
            return None
    elif plan is not None and _plan_is_current(plan):
        return plan
    plan = _build_plan(model)
    model.__dict__[_PLAN] = _RETRY_AFTER - 1 if plan is None else plan
    return plan


def _padding_causal_mask(attention_mask: torch.Tensor, T: int, past: int) -> torch.Tensor | None:
    """What HF's ``create_causal_mask`` makes for T new tokens after ``past`` cached ones in
    a cache of full-attention ``DynamicLayer`` s (a ``DynamicCache``, a
    :class:`domino.kv_cache.GrowingCache`) from a 2D ``attention_mask`` [b, >= 1] (nonzero:
    a real token; padded with hidden slots, or cut, to past + T), with the attention's mask
    interface, ``sdpa_mask``: None where the kernels' own causal rule is the mask (nothing
    hidden, and one new token or an empty cache), else a bool mask [b, 1, T, past + T] where
    token i sees slot j if j <= past + i and the slot is real. HF's function builds it
    through mask functions, and its tracing check (a CUDA stream query, which raises on a
    machine without a CUDA driver) made it ~0.3-0.4 ms of a decode step in the loop."""
    kv_length = past + T
    padding = attention_mask.bool()
    if padding.shape[1] < kv_length:
        padding = F.pad(padding, (0, kv_length - padding.shape[1]))
    padding = padding[:, :kv_length]
    if (T == 1 or kv_length == T) and bool(padding.all()):
        return None
    causal = torch.arange(kv_length)[None, :] <= torch.arange(past, kv_length)[:, None]  # [T, past + T]
    return (causal[None] & padding[:, None, :])[:, None]


def _usable_plan(model: torch.nn.Module) -> _Plan | None:
    """The model's current plan, or None where HF's forward must run instead: no plan, or
    a forward hook that would run in HF's forward."""
    plan = _current_plan(model)
    return None if plan is None or _hooked(plan) else plan


def _product(x: torch.Tensor, w: PackedProduct) -> torch.Tensor:
    """x [rows, K] (contiguous) times the packed weight: [rows, N]."""
    out = torch.empty(x.shape[0], w.n, dtype=x.dtype)
    torch.ops.domino_ops.small_batch_linear_packed.default(x, w.data, w.n, w.bias, out)
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    torch.ops.domino_ops.rms_norm.default(x, weight, eps, out)
    return out


def _decoder_layers_in_python(plan: _Plan, kv, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask, hidden: bool):
    """The decoder layers over the embedded tokens x [b, T, H], one kernel call at a time
    (any cache HF's layers update): the last layer's output and, with ``hidden``, the
    hidden states (x, then each layer's output), else None. The reference of
    ``domino_ops.decoder_layers`` (:func:`_decoder_layers_in_one_call`)."""
    b, T, H = x.shape
    n_q, n_kv, d = plan.heads
    rotary = torch.ops.domino_ops.apply_rotary_pos_emb.default
    silu_mul = torch.ops.domino_ops.silu_mul.default
    rows = b * T
    states = [x] if hidden else None
    for i, layer in enumerate(plan.layers):
        # attention: norm, q/k/v as one product, rotary, cache, attention, o_proj, residual
        h = _rms_norm(x, layer.input_norm, layer.input_eps)
        qkv = _product(h.view(rows, H), layer.qkv)
        q, k, v = qkv.view(b, T, n_q + 2 * n_kv, d).split((n_q, n_kv, n_kv), dim=2)
        if layer.q_norm is not None:  # Qwen3: each head's q and k normalised over d
            q = _rms_norm(q.contiguous(), layer.q_norm, layer.qk_eps)
            k = _rms_norm(k.contiguous(), layer.k_norm, layer.qk_eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q_rot = torch.empty(b, n_q, T, d, dtype=x.dtype)
        k_rot = torch.empty(b, n_kv, T, d, dtype=x.dtype)
        rotary(q, k, cos, sin, q_rot, k_rot)
        keys, values = kv.update(k_rot, v, i)
        module = layer.attention
        attended, _ = small_batch_attention_forward(module, q_rot, keys, values, mask, scaling=layer.scaling,
                                                    dropout=module.attention_dropout if module.training else 0.0)
        x = x + _product(attended.view(rows, n_q * d), layer.o).view(b, T, H)
        # MLP: norm, gate/up as one product, SiLU(gate) * up, down_proj, residual
        h = _rms_norm(x, layer.post_norm, layer.post_eps)
        gate, up = _product(h.view(rows, H), layer.gate_up).split(layer.gate_up.n // 2, dim=1)
        act = torch.empty_like(gate, memory_format=torch.contiguous_format)
        silu_mul(gate.contiguous(), up.contiguous(), act)
        x = x + _product(act, layer.down).view(b, T, H)
        if hidden:
            states.append(x)
    return x, states


def _decoder_layers_in_one_call(plan: _Plan, kv, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask, hidden: bool):
    """:func:`_decoder_layers_in_python` as one ``domino_ops.decoder_layers`` call (the same
    kernels in the same order in C++: the same bits, without the Python around ~450
    kernel calls a SmolLM2 forward), writing the new keys and values straight into a
    :class:`domino.kv_cache.GrowingCache`'s storage."""
    b, T, _ = x.shape
    n_q, n_kv, d = plan.heads
    num_layers = len(plan.layers)
    key_stores, value_stores, past = kv.reserve(num_layers, x.new_empty(b, n_kv, T, d))
    outputs = torch.ops.domino_ops.decoder_layers.default(
        x, cos, sin, mask, plan.flat_weights, plan.flat_heads, plan.flat_eps, plan.flat_scales, key_stores,
        value_stores, past, hidden)
    kv.hold(num_layers, past + T)
    return outputs[-1], ([x, *outputs] if hidden else None)


def fast_forward(model, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                 labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """``LlamaForCausalLM.forward`` (and Qwen2's, Qwen3's; transformers 5.24), computed as
    HF's with the switched kernels computes it; HF's own forward where it does not apply
    (module docstring).

    Args:
        model: a causal LM switched by :func:`use_fast_forward`.
        input_ids: [b, T] int64 token ids.
        attention_mask: None, [b, past + T] (1 / True: a real token) or a 4D mask [b, 1,
            T, past + T] (bool, or additive float), as HF's forward takes it.
        position_ids: [b, T] int64, or None (``past`` .. ``past + T - 1``).
        cache: a ``transformers.DynamicCache`` or ``StaticCache`` (``past_key_values`` too),
            updated in place.
        logits_to_keep: an int: logits of the last that many positions (0: all).

    Returns:
        ``CausalLMOutputWithPast``: ``logits`` [b, T or logits_to_keep, V] in the model's
        dtype, ``cache``, and with ``output_hidden_states`` the embeddings and each layer's
        output (the last one after the final norm, as HF's) as ``hidden_states``, each
        [b, T, H].
    """
    from transformers import DynamicCache, StaticCache
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from domino.kv_cache import GrowingCache

    def hf_forward():
        return type(model).forward(model, input_ids=input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids, cache=cache, inputs_embeds=inputs_embeds, labels=labels,
                                   use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)

    config = model.config
    kv = cache if cache is not None else kwargs.get("past_key_values")
    makes_cache = kv is None and (config.use_cache if use_cache is None else use_cache)  # as HF's forward does
    hidden = kwargs.get("output_hidden_states", config.output_hidden_states)  # an explicit None: none, as HF
    return_dict = kwargs.get("return_dict", getattr(config, "return_dict", True))
    plan = None
    if ((makes_cache or type(kv) in (DynamicCache, GrowingCache, StaticCache)) and inputs_embeds is None and labels is None
            and isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[1]
            and input_ids.is_cpu and isinstance(hidden, bool) and type(logits_to_keep) is int and logits_to_keep >= 0
            and not kwargs.get("output_attentions") and not isinstance(attention_mask, dict)
            and return_dict is not False and _HANDLED_KWARGS.issuperset(kwargs)
            # training mode (gradient checkpointing turns the cache off), a bidirectional
            # config, autocast: HF's forward
            and not model.training and getattr(config, "is_causal", None) is not False
            and not torch.is_autocast_enabled("cpu") and uses_small_batch_attention(model)
            # autograd needs a graph: not worth a plan (training loops change the weights every step)
            and not (torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()))):
        plan = fixed_value(model.__dict__, _FIXED, absent=_NOT_FIXED)
        if plan is _NOT_FIXED:
            plan = _usable_plan(model)
    if plan is None:
        return hf_forward()
    if makes_cache:
        kv = DynamicCache(config=config)

    x = F.embedding(input_ids, plan.embed)
    b, T, H = x.shape
    if position_ids is None:
        position_ids = (torch.arange(T) + kv.get_seq_length()).unsqueeze(0)
    n_q, n_kv, d = plan.heads
    cos, sin = model.model.rotary_emb(x, position_ids=position_ids)
    if not (cos.dtype is x.dtype and sin.dtype is x.dtype and cos.dim() == 3 and cos.shape[-1] == d):
        return hf_forward()  # the rotary kernel takes it not; nothing is changed yet
    use_cache = config.use_cache if use_cache is None else use_cache
    if (type(kv) in (DynamicCache, GrowingCache) and isinstance(attention_mask, torch.Tensor)
            and attention_mask.dim() == 2 and attention_mask.is_cpu and not torch.compiler.is_compiling()):
        mask = _padding_causal_mask(attention_mask, T, kv.get_seq_length())
    else:
        mask = plan.create_causal_mask(config=config, inputs_embeds=x, attention_mask=attention_mask, cache=kv,
                                       position_ids=position_ids)
    if type(kv) is GrowingCache and not kv.offloading and (mask is not None or T == 1 or not kv.get_seq_length()):
        x, states = _decoder_layers_in_one_call(plan, kv, x, cos, sin, mask, hidden)
    else:
        x, states = _decoder_layers_in_python(plan, kv, x, cos, sin, mask, hidden)
    x = _rms_norm(x, plan.norm, plan.norm_eps)
    if hidden and getattr(config, "tie_last_hidden_states", True):
        states[-1] = x  # HF's last hidden state is the normed one (unless the config says otherwise)
    keep = x[:, -logits_to_keep:] if logits_to_keep else x
    kept = keep.shape[1]
    logits = _product(keep.reshape(b * kept, H).contiguous(), plan.lm_head).view(b, kept, -1)
    return CausalLMOutputWithPast(logits=logits, cache=kv if use_cache or plan.returns_cache else None,
                                  hidden_states=tuple(states) if hidden else None)


@contextlib.contextmanager
def model_fixed(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """A block in which ``model`` does not change: its plan and hooks are checked once, on
    entry, instead of at every forward (in the loop, after a forward's weights have been
    streamed through the caches, the check and the hook walk cost ~0.6-0.9 ms of a ~20 ms
    SmolLM2 decode step on the Xeon VM: ~900 cold Python objects). The generator holds
    its target fixed across one call's decoding. Within the block, a change to the model
    (a module replaced, a hook added, a weight changed: what the plan check would see) is
    not seen until the block ends; blocks nest, and the check is made again when the
    outermost ends. A no-op for a model not switched by :func:`use_fast_forward`."""
    if not uses_fast_forward(model):
        yield model
        return
    with fixed_block(model.__dict__, _FIXED, functools.partial(_usable_plan, model)):
        yield model


def use_fast_forward(model: torch.nn.Module) -> torch.nn.Module:
    """Switches a Llama, Qwen2 or Qwen3 causal LM already on the CPU kernels to :func:`fast_forward`,
    in place, where it applies (module docstring); returns ``model``. Idempotent; a model
    it does not apply to is left as it is."""
    check_module(model)
    if getattr(model, _SWITCHED, False):
        return model
    with torch.no_grad():
        plan = _build_plan(model)
    if plan is None:
        return model
    model.__dict__[_PLAN] = plan
    # a partial (not a bound method): a switched model still pickles; its signature is
    # HF's, which generate reads (logits_to_keep, the cache keyword)
    model.forward = functools.partial(fast_forward, model)
    setattr(model, _SWITCHED, True)
    return model


def undo_fast_forward(model: torch.nn.Module) -> torch.nn.Module:
    """Restores the forward switched by :func:`use_fast_forward`."""
    check_module(model)
    if getattr(model, _SWITCHED, False):
        del model.forward
        delattr(model, _SWITCHED)
        model.__dict__.pop(_PLAN, None)
        model.__dict__.pop(_FIXED, None)
    return model


def uses_fast_forward(model: torch.nn.Module) -> bool:
    """Whether ``model`` runs :func:`fast_forward`."""
    check_module(model)
    return getattr(model, _SWITCHED, False)
