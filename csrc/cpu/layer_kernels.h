// The CPU kernels of a decoder layer's ops, as csrc/cpu/<op>.cpp define them (each also
// registered there as torch.ops.domino_ops.<op>): declared here for decoder_layers.cpp and
// draft_layers.cpp, which call them directly instead of through the dispatcher.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "ops.h"

namespace domino::cpu {

void small_batch_linear_packed_cpu(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                   const std::optional<at::Tensor>& bias, at::Tensor out);
void small_batch_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::optional<at::Tensor>& mask, double scale, at::Tensor out);
void rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps, at::Tensor out);
// sum = x + y (rounded to the dtype, as at::add) and out = rms_norm(sum): a layer's
// residual add and the norm after it in one pass over the rows (rms_norm.cpp); x, y, sum,
// out contiguous, one shape and dtype.
void add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight, double eps, at::Tensor sum,
                      at::Tensor out);
void silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up, at::Tensor out);
void apply_rotary_pos_emb_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                              at::Tensor q_out, at::Tensor k_out);

// small_batch_linear_packed_cpu's work for bf16 panels (small_batch_linear_packed.cpp),
// prepared on the calling thread (the arguments checked, x laid out as the product's path
// reads it, the bias in float32) and then run a range of panels at a time, on any thread,
// while the preparing call lasts: a caller can give each thread panels of its choosing.
struct PackedProductRunner {
  int64_t panels = 0;   // the weight's panels (0 when x has no rows: nothing to run)
  int64_t grain = 1;    // the fewest panels worth a thread (~32 KB of weights)
  at::Tensor bias_f32;  // the bias as float32 where it was converted, kept for run
  std::function<void(int64_t, int64_t)> run;  // panels [p0, p1) of out, on the calling thread
};
PackedProductRunner prepare_packed_product(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                           const std::optional<at::Tensor>& bias, at::Tensor out);

// act [rows, I] = silu(gate) * up of x [rows, K] times a packed gate/up weight (2 I outputs,
// gate's then up's, as one product; its bias or none): the same bits as
// small_batch_linear_packed_cpu then silu_mul_rows_cpu (silu_mul.cpp).
void gate_up_silu_cpu(const at::Tensor& x, const at::Tensor& packed, int64_t inter,
                      const std::optional<at::Tensor>& bias, at::Tensor act);

// What decoder_layers.cpp and draft_layers.cpp call them through: new outputs.
namespace layer {

// The weights of one layer in those ops' flat lists (bindings/schemas.h): 12 a layer.
constexpr int64_t kWeightsPerLayer = 12;
enum Weight : int64_t {
  kInputNorm, kQkv, kQkvBias, kO, kOBias, kPostNorm, kGateUp, kGateUpBias, kDown, kDownBias, kQNorm, kKNorm
};

inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor out = at::empty_like(x);
  rms_norm_cpu(x, weight, eps, out);
  return out;
}

// x [rows, K] (contiguous) times a packed weight of N outputs: [rows, N].
inline at::Tensor product(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                          const std::optional<at::Tensor>& bias) {
  at::Tensor out = at::empty({x.size(0), N}, x.options());
  small_batch_linear_packed_cpu(x, packed, N, bias, out);
  return out;
}

// Layer l's 12 entries of the flat weight list.
inline std::vector<std::optional<at::Tensor>> layer_weights(const c10::List<std::optional<at::Tensor>>& weights,
                                                            int64_t l) {
  std::vector<std::optional<at::Tensor>> lw(kWeightsPerLayer);
  for (int64_t i = 0; i < kWeightsPerLayer; ++i) lw[i] = weights.get(kWeightsPerLayer * l + i);
  return lw;
}

// The residual stream after a sublayer and the next norm's input: {x + y, rms_norm(x + y)},
// the add rounded to the dtype as at::add rounds it (x [b, M, H] contiguous, y its shape).
inline std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& y,
                                                      const at::Tensor& weight, double eps) {
  at::Tensor sum = at::empty_like(x), out = at::empty_like(x);
  add_rms_norm_cpu(x, y.contiguous(), weight, eps, sum, out);
  return {sum, out};
}

// Layer l's second half, given the residual stream x [b, M, H] (contiguous) and the
// attention's output o (its shape): x + o, the MLP on its post-attention norm (gate and up
// as one product, down(SiLU(gate) * up)) added in turn, each add fused with the norm after
// it. Returns {the layer's output, the next layer's input norm of it} (the second
// undefined after the last layer). `weights` and `eps` are the ops' flat lists, lw layer l's
// entries of the first.
inline std::pair<at::Tensor, at::Tensor> mlp_residual(const at::Tensor& x, const at::Tensor& o,
                                                      const std::vector<std::optional<at::Tensor>>& lw,
                                                      const c10::List<std::optional<at::Tensor>>& weights,
                                                      at::ArrayRef<double> eps, int64_t l, int64_t inter) {
  auto [x_attn, h] = add_rms_norm(x, o, *lw[kPostNorm], eps[3 * l + 1]);
  const int64_t b = h.size(0), M = h.size(1), H = h.size(2);
  at::Tensor act = at::empty({b * M, inter}, h.options());
  gate_up_silu_cpu(h.view({b * M, H}), *lw[kGateUp], inter, lw[kGateUpBias], act);
  const at::Tensor down = product(act, *lw[kDown], H, lw[kDownBias]).view({b, M, H});
  const int64_t next = kWeightsPerLayer * (l + 1) + kInputNorm;
  if (next >= static_cast<int64_t>(weights.size())) return {at::add(x_attn, down), at::Tensor()};
  return add_rms_norm(x_attn, down, *weights.get(next), eps[3 * (l + 1)]);
}

// Both ops' input: x [batch, positions, hidden], contiguous on the CPU (checked first: the
// stores' sizes are counted from it).
inline void check_layer_input(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3 && x.is_contiguous(),
              "x must be a contiguous CPU tensor [batch, positions, hidden], got ", x.sizes());
}

// The per-layer lists of a layer-stack op: one key and one value store a layer,
// `weights_per_layer` weights and `eps_per_layer` eps a layer (`eps_per_layer_words`: how
// eps's message says that count, "3" or "one"). Returns the layer count L (> 0).
inline int64_t check_layer_lists(at::TensorList key_stores, at::TensorList value_stores, int64_t weights,
                                 int64_t weights_per_layer, int64_t eps, int64_t eps_per_layer,
                                 const char* eps_per_layer_words) {
  const int64_t L = static_cast<int64_t>(key_stores.size());
  TORCH_CHECK(L > 0, "key_stores must hold one tensor per layer, got none");
  TORCH_CHECK(static_cast<int64_t>(value_stores.size()) == L, "value_stores must hold ", L,
              " tensors (one per layer, as key_stores), got ", value_stores.size());
  TORCH_CHECK(weights == weights_per_layer * L, "weights must hold ", weights_per_layer, " entries per layer (",
              weights_per_layer * L, "), got ", weights);
  TORCH_CHECK(eps == eps_per_layer * L, "eps must hold ", eps_per_layer_words, " per layer (", eps_per_layer * L,
              "), got ", eps);
  return L;
}

// A layer's key or value store (named name[l]): a CPU tensor [b, Hkv, >= slots, d] of x's
// dtype (x named x_name), contiguous in its last dimension.
inline void check_layer_store(const at::Tensor& store, const char* name, int64_t l, const at::Tensor& x,
                              const char* x_name, int64_t b, int64_t n_kv, int64_t d, int64_t slots) {
  TORCH_CHECK(store.device().is_cpu() && store.scalar_type() == x.scalar_type() && store.dim() == 4 &&
                  store.size(0) == b && store.size(1) == n_kv && store.size(3) == d && store.size(2) >= slots &&
                  store.stride(3) == 1,
              name, "[", l, "] must be a CPU tensor [", b, ", ", n_kv, ", >= ", slots, ", ", d, "] of ", x_name,
              " dtype ", x.scalar_type(), " (contiguous in its last dimension), got ", store.scalar_type(), " ",
              store.sizes());
}

// The stores are written while the other tensors are read: every store must have memory of
// its own, apart from every other store (a layer's key and value stores included), from
// the `reads` (Named: a tensor or nullptr, by name) and from every weight given, and none may overlap
// itself. Compared by address ranges (a store's whole range, its slots past those written
// too) and nested strides: stores interleaved in one buffer, or a store whose dimensions
// interleave, are refused although their elements are apart (the engine's stores are
// dense, each its own range).
void check_stores_apart(at::TensorList key_stores, at::TensorList value_stores, c10::ArrayRef<Named> reads,
                        const c10::List<std::optional<at::Tensor>>& weights);

// The other checks both ops share, x checked: heads [Hq, Hkv, head dim, intermediate],
// positive and small enough that x's rows times a layer's widest product fit an int64;
// past >= 0 with past + new_slots an int64; one key and one value store a layer
// (key_stores / value_stores), each a CPU tensor [batch, Hkv, >= past + new_slots, head
// dim] of x's dtype, contiguous in its last dimension, apart from the others, x, `reads`
// (the op's other inputs: cos, sin, mask) and the weights (check_stores_apart); weights
// and eps of that many layers, each layer's required weights given. Returns the number of
// layers.
int64_t check_layer_args(const at::Tensor& x, std::initializer_list<Named> reads, at::IntArrayRef heads,
                         at::TensorList key_stores, at::TensorList value_stores, int64_t past, int64_t new_slots,
                         const c10::List<std::optional<at::Tensor>>& weights, at::ArrayRef<double> eps);

}  // namespace layer

}  // namespace domino::cpu
