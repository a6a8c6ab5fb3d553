// The CPU kernels of a decoder layer's ops, as csrc/cpu/<op>.cpp define them (each also
// registered there as torch.ops.domino_ops.<op>): declared here for decoder_layers.cpp,
// which calls them directly instead of through the dispatcher.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace domino::cpu {

void small_batch_linear_packed_cpu(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                   const std::optional<at::Tensor>& bias, at::Tensor out);
void small_batch_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::optional<at::Tensor>& mask, double scale, at::Tensor out);
void rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps, at::Tensor out);
void silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up, at::Tensor out);
void apply_rotary_pos_emb_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                              at::Tensor q_out, at::Tensor k_out);

}  // namespace domino::cpu
