// CPU kernel of rms_norm: HF's LlamaRMSNorm (and Qwen2/Qwen3/Mistral's, the same formula)
// over the last dimension, one call instead of PyTorch's eight small ops (to float, pow,
// mean, add, rsqrt, mul, to dtype, mul).
//
//   input [..., n], weight [n], out input's shape; float32 or bfloat16, one dtype,
//   contiguous. out = round(weight * round(x / sqrt(mean(x^2) + eps))): float math,
//   rounded to the dtype (bf16: nearest even) where HF rounds, after normalizing and
//   after the weight product.
//
// Bytes it must move: each row read twice (the sum of squares, then the product; the
// second read hits L1), the weight once per row from cache, out written once. A decode
// step's norm is 576 elements: the call is the cost, which is what one call saves.
//
// add_rms_norm_cpu (decoder_layers.cpp and draft_layers.cpp, through layer_kernels.h's
// add_rms_norm): a layer's residual add and the norm after it (the post-attention norm, or
// the next layer's input norm) in one pass, each row's sum stored rounded to the dtype and
// normalised from L1: the bits of at::add then rms_norm_cpu, one call and one pass fewer.
// 30 layers of SmolLM2 make 60 of them a forward; with them the layers' one-call forward
// took ~2 % less at 1, 9 and 16 tokens on the Zen 4 VM (sixty-third session,
// benchmarks/results/add_rms_norm_zen4_session63.txt).
//
// Batch invariance, by construction: a row's sum of squares runs in vector lanes over the
// row then a fixed lane tree (the instruction-set build's rms_norm_row, cpu/vec.cpp); a
// row's bits depend on that row, the weight and eps alone, not on the rows around it or
// the thread split.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "cpu/dense_checks.h"
#include "cpu/isa.h"
#include "cpu/layer_kernels.h"
#include "ops.h"

namespace domino::cpu {

void rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps, at::Tensor out) {
  check_dense_float(input, "input");
  check_dense_float(weight, "weight");
  check_dense_float(out, "out");
  TORCH_CHECK(input.dim() >= 1, "input must have at least one dimension");
  const int64_t n = input.size(-1);
  TORCH_CHECK(weight.scalar_type() == input.scalar_type() && out.scalar_type() == input.scalar_type(),
              "input, weight and out must share a dtype, got ", input.scalar_type(), ", ", weight.scalar_type(),
              " and ", out.scalar_type());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == n, "weight must have shape [", n, "] (input's last dimension), got ",
              weight.sizes());
  TORCH_CHECK(out.sizes() == input.sizes(), "out must have input's shape ", input.sizes(), ", got ", out.sizes());
  TORCH_CHECK(std::isfinite(eps) && eps >= 0.0, "eps must be finite and >= 0, got ", eps);
  // Row by row, each element read before it is written: out may be input itself, but not
  // overlap it otherwise, nor the weight.
  at::assert_no_partial_overlap(out, input);
  at::assert_no_overlap(out, weight);
  if (input.numel() == 0) return;
  const int64_t rows = input.numel() / n;
  const Kernels& K = kernels();
  const float e = static_cast<float>(eps);
  // ~32K elements per thread's share: a decode step's one row stays on the calling thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / n);
  if (input.scalar_type() == at::kFloat) {
    const float* x = input.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) K.rms_norm_f32(x + r * n, w, n, e, o + r * n);
    });
  } else {
    const auto* x = reinterpret_cast<const uint16_t*>(input.data_ptr());
    const auto* w = reinterpret_cast<const uint16_t*>(weight.data_ptr());
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) K.rms_norm_bf16(x + r * n, w, n, e, o + r * n);
    });
  }
}

void add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight, double eps, at::Tensor sum,
                      at::Tensor out) {
  // decoder_layers' and draft_layers' own tensors: the checks guard the pointer arithmetic
  using Named = std::pair<const at::Tensor*, const char*>;
  for (const auto& [t, name] : {Named{&x, "x"}, Named{&y, "y"}, Named{&sum, "sum"}, Named{&out, "out"}}) {
    TORCH_CHECK(t->is_contiguous() && t->sizes() == x.sizes() && t->scalar_type() == x.scalar_type(), "add_rms_norm: ",
                name, " must be contiguous with x's shape ", x.sizes(), " and dtype ", x.scalar_type());
  }
  const int64_t n = x.size(-1);
  check_dense_float(weight, "weight");
  TORCH_CHECK(std::isfinite(eps) && eps >= 0.0, "eps must be finite and >= 0, got ", eps);
  const bool float_or_bf16 = x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(weight.is_contiguous() && weight.dim() == 1 && weight.size(0) == n &&
                  weight.scalar_type() == x.scalar_type() && float_or_bf16,
              "add_rms_norm: weight must be a contiguous [", n, "] of x's dtype (float32 or bfloat16)");
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / n;
  const Kernels& K = kernels();
  const float e = static_cast<float>(eps);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / n);  // as rms_norm_cpu's
  if (x.scalar_type() == at::kFloat) {
    const float *xp = x.data_ptr<float>(), *yp = y.data_ptr<float>(), *w = weight.data_ptr<float>();
    float *s = sum.data_ptr<float>(), *o = out.data_ptr<float>();
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) K.add_rms_norm_f32(xp + r * n, yp + r * n, w, n, e, s + r * n, o + r * n);
    });
  } else {
    auto bits = [](const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
    const uint16_t *xp = bits(x), *yp = bits(y), *w = bits(weight);
    uint16_t *s = bits(sum), *o = bits(out);
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) K.add_rms_norm_bf16(xp + r * n, yp + r * n, w, n, e, s + r * n, o + r * n);
    });
  }
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("rms_norm", &domino::cpu::rms_norm_cpu); }
