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

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cpu/layer_kernels.h"
#include "cpu/packed_panels.h"
#include "ops.h"

namespace domino::cpu {

using namespace layer;

namespace {

constexpr int64_t kContextWeightsPerLayer = 3;  // k/v packed, its bias, k_norm

// `packed` (named `name`) is a [N, K] weight packed for x of `dtype`: bf16 panels [ceil(N / 48),
// ceil(K / 2), 48, 2] for bf16 x, float32 panels [ceil(N / 48), K, 48, 1] for float32 x
// (pack_small_batch_linear_weight); `bias` (named `bias_name`) None or [N].
void check_panels(const at::Tensor& packed, const std::string& name, int64_t N, int64_t K, at::ScalarType dtype,
                  const std::optional<at::Tensor>& bias, const std::string& bias_name, const std::string& what) {
  TORCH_CHECK(packed.defined() && packed.device().is_cpu() && packed.scalar_type() == dtype,
              name, " must be a CPU tensor of features' dtype ", dtype, " (", what, ", packed), got ",
              packed.defined() ? std::string(c10::toString(packed.scalar_type())) : std::string("None"));
  const bool bf16 = dtype == at::kBFloat16;
  const int64_t panels = (N + kPackedPanelCols - 1) / kPackedPanelCols, steps = bf16 ? (K + 1) / 2 : K;
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.size(0) == panels && packed.size(1) == steps &&
                  packed.size(2) == kPackedPanelCols && packed.size(3) == (bf16 ? 2 : 1),
              name, " must be ", what, " packed by pack_small_batch_linear_weight: contiguous [", panels, ", ", steps,
              ", ", kPackedPanelCols, ", ", bf16 ? 2 : 1, "], got ", packed.sizes());
  if (bias.has_value() && bias->defined())
    TORCH_CHECK(bias->device().is_cpu() && bias->dim() == 1 && bias->size(0) == N &&
                    (bias->scalar_type() == at::kBFloat16 || bias->scalar_type() == at::kFloat),
                bias_name, " must be None or a bfloat16 or float32 CPU tensor [", N, "], got ", bias->sizes());
}

// A norm's weight `w` (named `name`): a contiguous CPU tensor [n] of x's dtype.
void check_norm_weight(const at::Tensor& w, const std::string& name, int64_t n, at::ScalarType dtype) {
  TORCH_CHECK(w.defined() && w.device().is_cpu() && w.scalar_type() == dtype && w.dim() == 1 && w.size(0) == n &&
                  w.is_contiguous(),
              name, " must be a contiguous CPU tensor [", n, "] of features' dtype ", dtype, ", got ",
              w.defined() ? std::string(c10::toString(w.scalar_type())) : std::string("None"), " ",
              w.defined() ? w.sizes() : at::IntArrayRef{});
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
  const int64_t b = features.size(0), T = features.size(1), F = features.size(2);
  TORCH_CHECK(past >= 0 && past <= std::numeric_limits<int64_t>::max() - T, "past must be >= 0 (and past + ", T,
              " slots an int64), got ", past);
  const int64_t n_kv = heads[0], d = heads[1];
  int64_t kv_n = 0, kv_rows = 0;  // the k/v product's width, and times the slots' rows
  TORCH_CHECK(d <= std::numeric_limits<int64_t>::max() / 2 && !__builtin_mul_overflow(n_kv, 2 * d, &kv_n) &&
                  !__builtin_mul_overflow(kv_n, b * T, &kv_rows),
              "heads are too large: features' ", b * T, " rows times 2 x kv heads x head dim must fit an int64, got ",
              heads);
  const at::ScalarType dtype = features.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kFloat, "features must be bfloat16 or float32, got ", dtype);
  TORCH_CHECK(hidden_norm_weight.defined() && hidden_norm_weight.dim() == 1 && hidden_norm_weight.size(0) > 0,
              "hidden_norm_weight must be a tensor [hidden], got ", hidden_norm_weight.sizes());
  const int64_t H = hidden_norm_weight.size(0);
  check_norm_weight(hidden_norm_weight, "hidden_norm_weight", H, dtype);
  check_panels(fc_packed, "fc_packed", H, F, dtype, fc_bias, "fc_bias",
               "fc's [hidden, features] weight, hidden = hidden_norm_weight's size");
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == dtype && t->dim() == 3 && (t->size(0) == b || t->size(0) == 1) &&
                    t->size(1) == T && t->size(2) == d && (d <= 1 || t->stride(2) == 1),
                name, " must be a CPU tensor [", b, " or 1, ", T, ", ", d, "] of features' dtype ", dtype,
                " (contiguous in its last dimension), got ", t->scalar_type(), " ", t->sizes());
  }
  const int64_t L = check_layer_lists(key_stores, value_stores, static_cast<int64_t>(weights.size()),
                                      kContextWeightsPerLayer, static_cast<int64_t>(eps.size()), 1, "one");
  for (int64_t l = 0; l < L; ++l) {
    check_layer_store(key_stores[l], "key_stores", l, features, "features'", b, n_kv, d, past + T);
    check_layer_store(value_stores[l], "value_stores", l, features, "features'", b, n_kv, d, past + T);
    const int64_t w0 = kContextWeightsPerLayer * l;
    for (int64_t i : {w0, w0 + 2}) {
      TORCH_CHECK(weights.get(i).has_value(), "weights[", i, "] (layer ", l, ") must be a tensor, got None");
    }
    const std::string at_layer = " (layer " + std::to_string(l) + ")";
    check_panels(*weights.get(w0), "weights[" + std::to_string(w0) + "]" + at_layer, 2 * n_kv * d, H, dtype,
                 weights.get(w0 + 1), "weights[" + std::to_string(w0 + 1) + "]" + at_layer,
                 "the k and v projections' [2 kv heads head dim, hidden] weight");
    check_norm_weight(*weights.get(w0 + 2), "weights[" + std::to_string(w0 + 2) + "]" + at_layer + ", k_norm's,", d,
                      dtype);
  }
  check_stores_apart(key_stores, value_stores,
                     {{"features", &features}, {"cos", &cos}, {"sin", &sin}, {"fc_packed", &fc_packed},
                      {"fc_bias", opt(fc_bias)},
                      {"hidden_norm_weight", &hidden_norm_weight}},
                     weights);
  if (T == 0) return;
  // the new slots' hidden states: fc, then the drafter's hidden norm
  at::Tensor ctx = rms_norm(product(features.view({b * T, F}), fc_packed, H, fc_bias).view({b, T, H}),
                            hidden_norm_weight, hidden_eps);
  for (int64_t l = 0; l < L; ++l) {
    const int64_t w0 = kContextWeightsPerLayer * l;
    const std::optional<at::Tensor> kv_packed = weights.get(w0), kv_bias = weights.get(w0 + 1),
                                    k_norm = weights.get(w0 + 2);
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
