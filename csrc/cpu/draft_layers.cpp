// CPU op draft_layers: a Domino drafter's backbone layers (domino.model.DraftLayer, on the
// fused kernels of domino.fast_layers) in one call: each layer's Python forward
// (_draft_attention_forward, _draft_attend, _mlp_forward: the reference) run in C++ over
// the same kernels in the same order (each residual add fused with the norm after it:
// at::add's bits, then rms_norm's), so every output is bit for bit the Python layers'.
//
//   x [b, Q, H] (the embedded block), cos / sin [b or 1, Q, d] (the drafter's rotary
//   table), mask [b, 1 or Q, Tc + Q] bool (which context slots and block positions each
//   block position sees), key_stores / value_stores one per layer [b, Hkv, capacity, d]
//   holding the context's Tc = past slots first (domino.draft_context.DraftContextCache),
//   with room for the block: capacity >= past + Q + M - 1, M the rows a layer computes (Q
//   but in a lone last layer); weights / eps / heads as decoder_layers takes them (12
//   weights and 3 eps a layer; the q/k norms required: the drafter normalises q and k per
//   head); the last layer computes the block positions row_start .. row_stop - 1 past its
//   attention (every position's keys and values still enter it). Returns the last layer's
//   output [b, row_stop - row_start, H] (before the drafter's final norm). The stores'
//   slots past .. past + Q + M - 2 are scratch, overwritten; the context's are not touched.
//
// The attention, as _draft_attend runs it: the rows' queries against [context keys, the
// block's keys, M - 1 zero keys], the zero keys hidden (so every real key is at or before
// each row's own position under the kernel's bottom-right causal rule). The block's keys
// and the zeros are written into the stores' room after the context, so the attention
// reads the context where it lies: a round copies nothing of it (with the context
// concatenated per layer, as the Python layers do, a 6-token draft at 4,000 slots took
// 3.77 ms against 3.40 on the 2-core Xeon VM: benchmarks/engine_speed.py drafter).
//
// Why it exists: a 4-token draft of the shipped SmolLM2 drafter (2 layers) ran 4.7 ms, 3.3 of
// it kernels; the backbone 3.0 ms against 2.1 (benchmarks/drafter_backbone_ab.py).
//
// Bytes it must move: what its kernels move (their headers): per layer the packed weights
// once (~8 MB bf16 for the shipped drafter) and the context cache's keys and values the
// rows see; the glue writes the block's keys and values (2 x b x Hkv x (Q + M - 1) x d
// elements a layer) and a row mask of b x (1 or M) x (Tc + Q + M - 1) bools.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "cpu/layer_kernels.h"

namespace domino::cpu {

using namespace layer;

at::Tensor draft_layers_cpu(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                            const at::Tensor& mask, at::TensorList key_stores, at::TensorList value_stores,
                            int64_t past, const c10::List<std::optional<at::Tensor>>& weights, at::IntArrayRef heads,
                            at::ArrayRef<double> eps, int64_t row_start, int64_t row_stop) {
  check_layer_input(x_in);
  const int64_t b = x_in.size(0), Q = x_in.size(1), H = x_in.size(2), Tc = past;
  TORCH_CHECK(0 <= row_start && row_start < row_stop && row_stop <= Q, "row_start and row_stop must satisfy 0 <= ",
              "row_start < row_stop <= ", Q, " (the block's positions), got ", row_start, " and ", row_stop);
  // the most rows a layer computes: all Q but in a lone last layer
  const int64_t most_rows = key_stores.size() > 1 ? Q : row_stop - row_start;
  const int64_t L = check_layer_args(x_in, {{"cos", &cos}, {"sin", &sin}, {"mask", &mask}}, heads, key_stores,
                                     value_stores, past, Q + most_rows - 1, weights, eps);
  const int64_t n_q = heads[0], n_kv = heads[1], d = heads[2], inter = heads[3];
  for (int64_t l = 0; l < L; ++l) {
    TORCH_CHECK(weights.get(kWeightsPerLayer * l + kQNorm).has_value(), "layer ", l,
                ": the drafter's q_norm and k_norm must be given");
  }
  TORCH_CHECK(mask.device().is_cpu() && mask.scalar_type() == at::kBool && mask.dim() == 3 && mask.size(0) == b &&
                  (mask.size(1) == 1 || mask.size(1) == Q) && mask.size(2) == Tc + Q,
              "mask must be a CPU bool tensor [", b, ", 1 or ", Q, ", ", Tc + Q, "], got ", mask.scalar_type(), " ",
              mask.sizes());
  const int64_t qkv_n = (n_q + 2 * n_kv) * d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  at::Tensor x = x_in;
  // h: the input norm of x (layer l's: the previous layer's last add computed it)
  at::Tensor h = rms_norm(x, *weights.get(kInputNorm), eps[0]);
  for (int64_t l = 0; l < L; ++l) {
    const auto lw = layer_weights(weights, l);
    const bool last = l == L - 1;
    const int64_t r0 = last ? row_start : 0, M = last ? row_stop - row_start : Q;
    // attention: q/k/v as one product, q/k norms per head, rotary, attention, o_proj, residual
    auto parts = product(h.view({b * Q, H}), *lw[kQkv], qkv_n, lw[kQkvBias])
                     .view({b, Q, qkv_n})
                     .split_with_sizes({n_q * d, n_kv * d, n_kv * d}, 2);
    at::Tensor q = rms_norm(parts[0].reshape({b, Q, n_q, d}).contiguous(), *lw[kQNorm], eps[3 * l + 2]).transpose(1, 2);
    at::Tensor k = rms_norm(parts[1].reshape({b, Q, n_kv, d}).contiguous(), *lw[kKNorm], eps[3 * l + 2]).transpose(1, 2);
    at::Tensor v = parts[2].reshape({b, Q, n_kv, d}).transpose(1, 2);
    at::Tensor q_rot = at::empty({b, n_q, Q, d}, x.options());
    at::Tensor k_rot = at::empty({b, n_kv, Q, d}, x.options());
    apply_rotary_pos_emb_cpu(q, k, cos, sin, q_rot, k_rot);
    // [context, block, M - 1 zeros] in place in the stores' room
    key_stores[l].narrow(2, Tc, Q).copy_(k_rot);
    value_stores[l].narrow(2, Tc, Q).copy_(v);
    key_stores[l].narrow(2, Tc + Q, M - 1).zero_();
    value_stores[l].narrow(2, Tc + Q, M - 1).zero_();
    const at::Tensor keys = key_stores[l].narrow(2, 0, Tc + Q + M - 1);
    const at::Tensor values = value_stores[l].narrow(2, 0, Tc + Q + M - 1);
    at::Tensor row_mask = mask.size(1) == 1 ? mask : mask.narrow(1, r0, M);
    row_mask = at::cat({row_mask, at::zeros({b, row_mask.size(1), M - 1}, row_mask.options())}, 2)
                   .unsqueeze(1)
                   .expand({b, 1, M, Tc + Q + M - 1});
    at::Tensor attended = at::empty({b, M, n_q, d}, x.options());
    small_batch_attention_cpu(q_rot.narrow(2, r0, M), keys, values, row_mask, scale, attended.transpose(1, 2));
    at::Tensor o = product(attended.view({b * M, n_q * d}), *lw[kO], H, lw[kOBias]).view({b, M, H});
    std::tie(x, h) = mlp_residual(last ? x.narrow(1, r0, M).contiguous() : x, o, lw, weights, eps, l, inter);
  }
  return x;
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("draft_layers", &domino::cpu::draft_layers_cpu); }
