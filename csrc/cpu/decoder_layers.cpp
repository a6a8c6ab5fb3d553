// CPU op decoder_layers: a HF Llama / Qwen2 / Qwen3 causal LM's decoder layers, all of
// them, in one call: the loop of domino.fast_forward (python/domino/fast_forward.py, its
// reference) run in C++ over the same kernels in the same order (each residual add fused
// with the norm after it: at::add's bits, then rms_norm's), so every output is bit for bit
// the Python loop's.
//
//   x [b, T, H] (the embedded tokens), cos / sin [b or 1, T, d] (the model's rotary
//   table), mask None or [b or 1, 1 or Hq, T, >= past + T] (bool or additive float, as
//   small_batch_attention takes it); per layer l, weights[12 l .. 12 l + 11] = input norm,
//   packed q/k/v (one product), its bias, packed o_proj, its bias, post-attention norm,
//   packed gate/up (one product), its bias, packed down_proj, its bias, q_norm, k_norm
//   (None where the layer has none; the q/k norms are Qwen3's), eps[3 l ..] = the two
//   norms' eps and the q/k norms', scale[l] the attention's; heads = [Hq, Hkv, d,
//   intermediate]; key_stores / value_stores [b, Hkv, capacity >= past + T, d], one per
//   layer, holding past positions: the layer writes its T new keys and values at past ..
//   past + T - 1 (the caller's cache then views the first past + T). Returns each layer's
//   output [b, T, H] with keep_hidden (the hidden states), else the last one alone.
//
// Why it exists: a decode step of SmolLM2-135M (30 layers) is ~16 ms on a 2-core Zen 3,
// and the Python loop around its ~450 kernel calls (module-free as it already is) cost
// ~4-5 ms of it: a 30-layer model with 64-wide layers, whose kernels take microseconds,
// ran its 1-token forward in ~5.4 ms (benchmarks/decoder_layers_ab.py measures both).
// Here a layer's glue is a few tensor allocations and views.
//
// Bytes it must move: what its kernels move (each kernel's header): per layer the packed
// weights once (~7 MB bf16 for SmolLM2-135M; a decode step is bound by reading them) and
// the layer's cache rows the queries may see; the glue moves the [b, T, *] activations,
// a few KB a layer at decode. Limits: those of its kernels; b * T rows at most as the
// products take.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/layer_kernels.h"

namespace domino::cpu {

namespace layer {

namespace {

// The bytes [begin, end) a tensor with elements spans (strides are never negative).
struct Span {
  uintptr_t begin, end;
};

// Whether t's elements may share bytes: its dimensions of more than one element, sorted by
// stride, must each step past the whole extent of the one before (a stride of 0 never does).
// Sufficient for apart, not necessary: a layout whose dimensions interleave is refused too.
bool may_overlap_itself(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.size(i) > 1) dims.emplace_back(t.stride(i), t.size(i));
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;  // elements one step of the next dimension must clear
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return true;
    extent = stride * size;
  }
  return false;
}

Span byte_span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {begin, begin + static_cast<uintptr_t>((last + 1) * t.element_size())};
}

}  // namespace

void check_stores_apart(at::TensorList key_stores, at::TensorList value_stores, c10::ArrayRef<Named> reads,
                        const c10::List<std::optional<at::Tensor>>& weights) {
  struct Store {
    Span span;
    const char* list;
    int64_t layer;
  };
  std::vector<Store> stores;
  stores.reserve(2 * key_stores.size());
  for (const auto& [list, name] : {std::pair{key_stores, "key_stores"}, std::pair{value_stores, "value_stores"}}) {
    for (int64_t l = 0; l < static_cast<int64_t>(list.size()); ++l) {
      TORCH_CHECK(!may_overlap_itself(list[l]), name, "[", l,
                  "] must not overlap itself (each dimension's stride past the extent of the smaller ones), got "
                  "strides ", list[l].strides(), " for shape ", list[l].sizes());
      if (list[l].numel() > 0) stores.push_back({byte_span(list[l]), name, l});
    }
  }
  std::sort(stores.begin(), stores.end(), [](const Store& a, const Store& b) { return a.span.begin < b.span.begin; });
  for (size_t i = 1; i < stores.size(); ++i) {  // sorted by start: apart iff each starts past the one before ends
    const Store &a = stores[i - 1], &b = stores[i];
    TORCH_CHECK(b.span.begin >= a.span.end, a.list, "[", a.layer, "] and ", b.list, "[", b.layer,
                "] share memory: every layer's key and value stores must have memory of their own");
  }
  // apart, so sorted by end too: the first store ending past t's start is the only candidate
  // (the name's index, weights[i], is formatted only for the message: a call checks ~12 a layer)
  auto check_read = [&](const at::Tensor& t, const char* name, int64_t index) {
    if (!t.defined() || t.numel() == 0) return;
    const Span r = byte_span(t);
    const auto s = std::upper_bound(stores.begin(), stores.end(), r.begin,
                                    [](uintptr_t at, const Store& st) { return at < st.span.end; });
    TORCH_CHECK(s == stores.end() || s->span.begin >= r.end, s->list, "[", s->layer,
                "] must not share memory with ", name, index < 0 ? "" : "[" + std::to_string(index) + "]");
  };
  for (const auto& [name, t] : reads) {
    if (t != nullptr) check_read(*t, name, -1);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(weights.size()); ++i) {
    const std::optional<at::Tensor> w = weights.get(i);
    if (w.has_value()) check_read(*w, "weights", i);
  }
}

int64_t check_layer_args(const at::Tensor& x, std::initializer_list<Named> reads, at::IntArrayRef heads,
                         at::TensorList key_stores, at::TensorList value_stores, int64_t past, int64_t new_slots,
                         const c10::List<std::optional<at::Tensor>>& weights, at::ArrayRef<double> eps) {
  TORCH_CHECK(heads.size() == 4, "heads must be [query heads, kv heads, head dim, intermediate], got ", heads);
  TORCH_CHECK(heads[0] > 0 && heads[1] > 0 && heads[2] > 0 && heads[3] > 0 && heads[0] % heads[1] == 0,
              "heads must be positive with query heads a multiple of kv heads, got ", heads);
  // the widest row a layer's products write ((Hq + 2 Hkv) d for q/k/v, 2 intermediate for
  // gate/up), times x's rows, must be a tensor size
  int64_t two_kv = 0, qkv_n = 0, gate_up_n = 0, widest_rows = 0;
  const bool too_wide = __builtin_mul_overflow(heads[1], int64_t{2}, &two_kv) ||
                        __builtin_add_overflow(heads[0], two_kv, &qkv_n) ||
                        __builtin_mul_overflow(qkv_n, heads[2], &qkv_n) ||
                        __builtin_mul_overflow(heads[3], int64_t{2}, &gate_up_n) ||
                        __builtin_mul_overflow(std::max(qkv_n, gate_up_n), x.size(0) * x.size(1), &widest_rows);
  TORCH_CHECK(!too_wide, "heads are too large: x's ", x.size(0) * x.size(1),
              " rows times (query heads + 2 kv heads) x head dim, or times 2 x intermediate, must fit an int64, got ",
              heads);
  TORCH_CHECK(past >= 0 && past <= std::numeric_limits<int64_t>::max() - new_slots, "past must be >= 0 (and past + ",
              new_slots, " slots an int64), got ", past);
  const int64_t slots = past + new_slots;
  const int64_t L = check_layer_lists(key_stores, value_stores, static_cast<int64_t>(weights.size()),
                                      kWeightsPerLayer, static_cast<int64_t>(eps.size()), 3, "3");
  const int64_t b = x.size(0), n_kv = heads[1], d = heads[2];
  for (int64_t l = 0; l < L; ++l) {
    check_layer_store(key_stores[l], "key_stores", l, x, "x's", b, n_kv, d, slots);
    check_layer_store(value_stores[l], "value_stores", l, x, "x's", b, n_kv, d, slots);
    for (Weight i : {kInputNorm, kQkv, kO, kPostNorm, kGateUp, kDown}) {
      TORCH_CHECK(weights.get(kWeightsPerLayer * l + i).has_value(), "weights[", kWeightsPerLayer * l + i,
                  "] (layer ", l, ") must be a tensor, got None");
    }
    TORCH_CHECK(weights.get(kWeightsPerLayer * l + kQNorm).has_value() ==
                    weights.get(kWeightsPerLayer * l + kKNorm).has_value(),
                "layer ", l, ": q_norm and k_norm must both be given or both be None");
  }
  // a layer writes its new keys and values before the next reads cos, sin and the mask
  std::vector<Named> all_reads{{"x", &x}};
  all_reads.insert(all_reads.end(), reads.begin(), reads.end());
  check_stores_apart(key_stores, value_stores, all_reads, weights);
  return L;
}

}  // namespace layer

using namespace layer;

std::vector<at::Tensor> decoder_layers_cpu(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                                           const std::optional<at::Tensor>& mask,
                                           const c10::List<std::optional<at::Tensor>>& weights, at::IntArrayRef heads,
                                           at::ArrayRef<double> eps, at::ArrayRef<double> scale,
                                           at::TensorList key_stores, at::TensorList value_stores, int64_t past,
                                           bool keep_hidden) {
  check_layer_input(x_in);
  const int64_t L = check_layer_args(x_in, {{"cos", &cos}, {"sin", &sin}, {"mask", opt(mask)}}, heads, key_stores,
                                     value_stores, past, x_in.size(1), weights, eps);
  const int64_t n_q = heads[0], n_kv = heads[1], d = heads[2], inter = heads[3];
  TORCH_CHECK(static_cast<int64_t>(scale.size()) == L, "scale must hold one per layer (", L, "), got ", scale.size());
  const int64_t b = x_in.size(0), T = x_in.size(1), H = x_in.size(2), rows = b * T;
  const int64_t qkv_n = (n_q + 2 * n_kv) * d;
  std::optional<at::Tensor> layer_mask;
  if (mask.has_value()) {
    TORCH_CHECK(mask->dim() == 4 && mask->size(3) >= past + T, "mask must be [batch, heads, ", T, ", >= ", past + T,
                "], got ", mask->sizes());
    layer_mask = mask->narrow(3, 0, past + T);
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(keep_hidden ? L : 1);
  at::Tensor x = x_in;
  // h: the input norm of x (layer l's: the previous layer's last add computed it)
  at::Tensor h = rms_norm(x, *weights.get(kInputNorm), eps[0]);
  for (int64_t l = 0; l < L; ++l) {
    const auto lw = layer_weights(weights, l);
    // attention: q/k/v as one product, rotary, cache, attention, o_proj, residual
    at::Tensor qkv = product(h.view({rows, H}), *lw[kQkv], qkv_n, lw[kQkvBias]);
    auto parts = qkv.view({b, T, n_q + 2 * n_kv, d}).split_with_sizes({n_q, n_kv, n_kv}, 2);
    at::Tensor q = parts[0], k = parts[1], v = parts[2];
    if (lw[kQNorm].has_value()) {  // Qwen3: each head's q and k normalised over d
      q = rms_norm(q.contiguous(), *lw[kQNorm], eps[3 * l + 2]);
      k = rms_norm(k.contiguous(), *lw[kKNorm], eps[3 * l + 2]);
    }
    q = q.transpose(1, 2);
    k = k.transpose(1, 2);
    v = v.transpose(1, 2);
    at::Tensor q_rot = at::empty({b, n_q, T, d}, x.options());
    at::Tensor k_rot = at::empty({b, n_kv, T, d}, x.options());
    apply_rotary_pos_emb_cpu(q, k, cos, sin, q_rot, k_rot);
    key_stores[l].narrow(2, past, T).copy_(k_rot);
    value_stores[l].narrow(2, past, T).copy_(v);
    at::Tensor attended = at::empty({b, T, n_q, d}, x.options());
    small_batch_attention_cpu(q_rot, key_stores[l].narrow(2, 0, past + T), value_stores[l].narrow(2, 0, past + T),
                              layer_mask, scale[l], attended.transpose(1, 2));
    const at::Tensor o = product(attended.view({rows, n_q * d}), *lw[kO], H, lw[kOBias]).view({b, T, H});
    std::tie(x, h) = mlp_residual(x, o, lw, weights, eps, l, inter);
    if (keep_hidden || l == L - 1) outputs.push_back(x);
  }
  return outputs;
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("decoder_layers", &domino::cpu::decoder_layers_cpu); }
