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

namespace {

// rms_norm_cpu's arguments (input [..., n], weight [n], out input's shape; one dtype), the
// ones add_rms_norm_cpu's norm takes too.
void check_norm_args(const at::Tensor& input, const at::Tensor& weight, double eps, const at::Tensor& out) {
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
  TORCH_CHECK(finite_in_float32(eps) && eps >= 0.0, "eps must be finite and >= 0 (finite in float32), got ", eps);
  // Row by row, each element read before it is written: out may be input itself, but not
  // overlap it otherwise, nor the weight.
  check_apart(out, "out", input, "input", /*in_place_ok=*/true);
  check_apart(out, "out", weight, "weight");
}

// row(r) for the rows of t (rows of its last dimension's n elements), split over the
// threads by ~32K elements a share: a decode step's one row stays on the calling thread.
template <class Row>
void for_each_row(const at::Tensor& t, const Row& row) {
  const int64_t n = t.size(-1), rows = t.numel() / n;
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / n), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row(r * n);
  });
}

uint16_t* bf16_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

}  // namespace

void rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight, double eps, at::Tensor out) {
  check_norm_args(input, weight, eps, out);
  if (input.numel() == 0) return;
  const Kernels& K = kernels();
  const int64_t n = input.size(-1);
  const float e = static_cast<float>(eps);
  if (input.scalar_type() == at::kFloat) {
    const float *x = input.data_ptr<float>(), *w = weight.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for_each_row(input, [&](int64_t i) { K.rms_norm_f32(x + i, w, n, e, o + i); });
  } else {
    const uint16_t *x = bf16_bits(input), *w = bf16_bits(weight);
    uint16_t* o = bf16_bits(out);
    for_each_row(input, [&](int64_t i) { K.rms_norm_bf16(x + i, w, n, e, o + i); });
  }
}

void add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight, double eps, at::Tensor sum,
                      at::Tensor out) {
  // decoder_layers' and draft_layers' own tensors: the checks guard the pointer arithmetic
  check_norm_args(x, weight, eps, out);
  for (const auto& [name, t] : {Named{"y", &y}, Named{"sum", &sum}}) {
    check_dense_float(*t, name);
    TORCH_CHECK(t->sizes() == x.sizes() && t->scalar_type() == x.scalar_type(), "add_rms_norm: ", name,
                " must have x's shape ", x.sizes(), " and dtype ", x.scalar_type());
  }
  if (x.numel() == 0) return;
  const Kernels& K = kernels();
  const int64_t n = x.size(-1);
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    const float *xp = x.data_ptr<float>(), *yp = y.data_ptr<float>(), *w = weight.data_ptr<float>();
    float *s = sum.data_ptr<float>(), *o = out.data_ptr<float>();
    for_each_row(x, [&](int64_t i) { K.add_rms_norm_f32(xp + i, yp + i, w, n, e, s + i, o + i); });
  } else {
    const uint16_t *xp = bf16_bits(x), *yp = bf16_bits(y), *w = bf16_bits(weight);
    uint16_t *s = bf16_bits(sum), *o = bf16_bits(out);
    for_each_row(x, [&](int64_t i) { K.add_rms_norm_bf16(xp + i, yp + i, w, n, e, s + i, o + i); });
  }
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("rms_norm", &domino::cpu::rms_norm_cpu); }
