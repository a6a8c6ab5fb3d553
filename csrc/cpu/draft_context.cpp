// CPU op draft_context: a Domino drafter's context extension (domino.model.DominoDraftModel.
// extend_context on the fused kernels of domino.fast_layers: its reference) in one call: the
// new context slots' hidden states hidden_norm(fc(features)), then each layer's keys and
// values of them (k_norm per head, rotated; v as projected), written into the layer's
// stores at past .. past + T - 1, over the same kernels in the same order, so every key and
// value is bit for bit the Python path's.
//
//   features [b, T, F] (the target's hidden states of the new slots, concatenated), cos /
//   sin [b or 1, T, d] (the drafter's rotary table at the slots' positions), fc_packed the
//   packed fc weight [H, F] (domino_ops.pack_small_batch_linear_weight), its bias or None,
//   hidden_norm_weight [H] and hidden_eps; key_stores / value_stores one per layer [b, Hkv,
//   capacity >= past + T, d]; weights 3 a layer: the packed k and v projections as one
//   product ([Hkv d] key outputs, then [Hkv d] value outputs), its bias or None, k_norm's
//   weight [d]; eps one a layer (k_norm's); heads = [Hkv, d]. All tensors of one dtype
//   (features, cos, sin, the norms' weights and the stores; the packed weights bf16 or
//   float32 as small_batch_linear_packed takes them). The slots before past are not touched.
//
// Why it exists: generation extends the drafter's context every round by the slots it kept
// (~3); in Python that was ~40 small calls (two projections, a norm and the rotation's
// seven ops a layer, the stores' copies): ~0.57 ms of a ~19 ms round on the 2-core Xeon VM,
// for ~0.15 ms of weights (fc's 3.3 MB bf16).
//
// Bytes it must move: fc's packed weight once (F x H), each layer's k/v weight once (2 Hkv d
// x H), the features once; writes 2 x b x Hkv x T x d a layer. Limits: those of its kernels.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "cpu/layer_kernels.h"

namespace domino::cpu {

using namespace layer;

namespace {

constexpr int64_t kContextWeightsPerLayer = 3;  // k/v packed, its bias, k_norm

void check_store(const at::Tensor& store, const char* name, int64_t l, const at::Tensor& x, int64_t b, int64_t n_kv,
                 int64_t d, int64_t slots) {
  TORCH_CHECK(store.device().is_cpu() && store.scalar_type() == x.scalar_type() && store.dim() == 4 &&
                  store.size(0) == b && store.size(1) == n_kv && store.size(3) == d && store.size(2) >= slots &&
                  store.stride(3) == 1,
              name, "[", l, "] must be a CPU tensor [", b, ", ", n_kv, ", >= ", slots, ", ", d,
              "] of features' dtype ", x.scalar_type(), " (contiguous in its last dimension), got ",
              store.scalar_type(), " ", store.sizes());
}

}  // namespace

void draft_context_cpu(const at::Tensor& features, const at::Tensor& cos, const at::Tensor& sin,
                       const at::Tensor& fc_packed, const std::optional<at::Tensor>& fc_bias,
                       const at::Tensor& hidden_norm_weight, double hidden_eps, at::TensorList key_stores,
                       at::TensorList value_stores, int64_t past, const c10::List<std::optional<at::Tensor>>& weights,
                       at::IntArrayRef heads, at::ArrayRef<double> eps) {
  TORCH_CHECK(features.device().is_cpu() && features.dim() == 3 && features.is_contiguous(),
              "features must be a contiguous CPU tensor [batch, slots, features], got ", features.sizes());
  TORCH_CHECK(heads.size() == 2 && heads[0] > 0 && heads[1] > 0, "heads must be [kv heads, head dim], positive, got ",
              heads);
  TORCH_CHECK(past >= 0, "past must be >= 0, got ", past);
  const int64_t b = features.size(0), T = features.size(1), F = features.size(2);
  const int64_t n_kv = heads[0], d = heads[1];
  TORCH_CHECK(hidden_norm_weight.dim() == 1 && hidden_norm_weight.size(0) > 0,
              "hidden_norm_weight must be a tensor [hidden], got ", hidden_norm_weight.sizes());
  const int64_t H = hidden_norm_weight.size(0);
  const int64_t L = static_cast<int64_t>(key_stores.size());
  TORCH_CHECK(L > 0, "key_stores must hold one tensor per layer, got none");
  TORCH_CHECK(static_cast<int64_t>(value_stores.size()) == L, "value_stores must hold ", L,
              " tensors (one per layer, as key_stores), got ", value_stores.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == kContextWeightsPerLayer * L, "weights must hold ",
              kContextWeightsPerLayer, " entries per layer (", kContextWeightsPerLayer * L, "), got ", weights.size());
  TORCH_CHECK(static_cast<int64_t>(eps.size()) == L, "eps must hold one per layer (", L, "), got ", eps.size());
  for (int64_t l = 0; l < L; ++l) {
    check_store(key_stores[l], "key_stores", l, features, b, n_kv, d, past + T);
    check_store(value_stores[l], "value_stores", l, features, b, n_kv, d, past + T);
    for (int64_t i : {int64_t{0}, int64_t{2}}) {
      TORCH_CHECK(weights.get(kContextWeightsPerLayer * l + i).has_value(), "weights[",
                  kContextWeightsPerLayer * l + i, "] (layer ", l, ") must be a tensor, got None");
    }
  }
  if (T == 0) return;
  // the new slots' hidden states: fc, then the drafter's hidden norm
  at::Tensor ctx = rms_norm(product(features.view({b * T, F}), fc_packed, H, fc_bias).view({b, T, H}),
                            hidden_norm_weight, hidden_eps);
  for (int64_t l = 0; l < L; ++l) {
    const std::optional<at::Tensor> kv_packed = weights.get(kContextWeightsPerLayer * l);
    const std::optional<at::Tensor> kv_bias = weights.get(kContextWeightsPerLayer * l + 1);
    const std::optional<at::Tensor> k_norm = weights.get(kContextWeightsPerLayer * l + 2);
    auto parts = product(ctx.view({b * T, H}), *kv_packed, 2 * n_kv * d, kv_bias)
                     .view({b, T, 2 * n_kv * d})
                     .split_with_sizes({n_kv * d, n_kv * d}, 2);
    at::Tensor k = rms_norm(parts[0].reshape({b, T, n_kv, d}).contiguous(), *k_norm, eps[l]).transpose(1, 2);
    at::Tensor v = parts[1].reshape({b, T, n_kv, d}).transpose(1, 2);
    at::Tensor k_rot = at::empty({b, n_kv, T, d}, features.options());
    // no query heads: the rotation of the keys alone (two empty tensors, not one: the op
    // refuses an output that is its input)
    apply_rotary_pos_emb_cpu(at::empty({b, 0, T, d}, features.options()), k, cos, sin,
                             at::empty({b, 0, T, d}, features.options()), k_rot);
    key_stores[l].narrow(2, past, T).copy_(k_rot);
    value_stores[l].narrow(2, past, T).copy_(v);
  }
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("draft_context", &domino::cpu::draft_context_cpu); }
