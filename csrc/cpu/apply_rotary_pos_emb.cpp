// CPU kernel of apply_rotary_pos_emb: HF's rotary position embedding of a layer's queries
// and keys (transformers' apply_rotary_pos_emb for LlamaAttention and its kin:
// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2])) in one call
// instead of PyTorch's fourteen small ops (two slices, a negation and a cat per
// rotate_half, four products, two sums).
//
//   q [b, Hq, T, D], k [b, Hk, T, D]: any strides with the last dimension contiguous (HF's
//   transposed views of the projections are read in place); cos, sin [b or 1, T, D]
//   (shared by every head, HF's unsqueeze(1); a batch of 1 serves every sequence), any
//   strides with the last dimension contiguous; q_out, k_out q's / k's shape, contiguous;
//   all one dtype, float32 or bfloat16; D even.
//   out = round(round(x * cos) + round(rot(x) * sin)): each product and the sum rounded
//   to the dtype exactly as PyTorch's elementwise ops round them (bf16: float math,
//   nearest even), so the bits are HF's (NaN payloads aside). The rows run through the
//   instruction-set build's rotary_row (cpu/vec.cpp: L lanes of a row's first half with
//   their partners in the second, the products kept apart from the sum, no FMA).
//
// Bytes it must move: q and k read once, cos and sin once per head (from cache), the
// outputs written once. A decode step's 12 heads of 64 are 768 elements: the call, not
// the bytes, is the cost, which is what one call instead of fourteen saves (SmolLM2's
// forward with it and without: benchmarks/fused_projections_ab.py). A verification's 16
// positions are 12K elements: element by element in c10::BFloat16's scalar operators they
// took ~22 us a layer on a 2-core Xeon (AVX-512), in vectors ~3 us.
//
// Batch invariance, by construction: every element is the same three operations on its
// own inputs, whatever the shape, the place in it or the thread split.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "cpu/isa.h"
#include "cpu/layer_kernels.h"
#include "ops.h"

namespace domino::cpu {
namespace {

void check_rotary_tensor(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got ", t.dim());
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name, " must be contiguous in its last dimension");
}

// Every row of x through the instruction-set build's rotary_row (cpu/vec.cpp): T is float
// or uint16_t (bf16's bits), Row its kernel.
template <typename T, typename Row>
void rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out, Row row) {
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  // a batch of one cos / sin serves every sequence
  const int64_t cs0 = cos.size(0) == 1 ? 0 : cos.stride(0), cs1 = cos.stride(1);
  const int64_t ss0 = sin.size(0) == 1 ? 0 : sin.stride(0), ss1 = sin.stride(1);
  const T* xp = static_cast<const T*>(x.data_ptr());
  const T* cp = static_cast<const T*>(cos.data_ptr());
  const T* sp = static_cast<const T*>(sin.data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  // ~32K elements per thread's share: a decode step's and a verification's few heads stay
  // on the calling thread (a fork and join would cost more than the rows).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(D, 1));
  at::parallel_for(0, B * H * S, grain, [&](int64_t r0, int64_t r1) {
    // row r = (bi, hi, si) in x's order, walked by increments (three divisions a row cost
    // as much as the row's arithmetic)
    int64_t bi = r0 / (H * S), hi = r0 / S % H, si = r0 % S;
    for (int64_t r = r0; r < r1; ++r) {
      row(xp + bi * xs0 + hi * xs1 + si * xs2, cp + bi * cs0 + si * cs1, sp + bi * ss0 + si * ss1, D, op + r * D);
      if (++si == S) {
        si = 0;
        if (++hi == H) hi = 0, ++bi;
      }
    }
  });
}

}  // namespace

void apply_rotary_pos_emb_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                              at::Tensor q_out, at::Tensor k_out) {
  check_rotary_tensor(q, "q", 4);
  check_rotary_tensor(k, "k", 4);
  check_rotary_tensor(cos, "cos", 3);
  check_rotary_tensor(sin, "sin", 3);
  check_rotary_tensor(q_out, "q_out", 4);
  check_rotary_tensor(k_out, "k_out", 4);
  const auto dtype = q.scalar_type();
  const at::Tensor& qo = q_out;
  const at::Tensor& ko = k_out;
  for (const at::Tensor* t : {&k, &cos, &sin, &qo, &ko}) {
    TORCH_CHECK(t->scalar_type() == dtype, "q, k, cos, sin, q_out and k_out must share a dtype, got ", dtype, " and ",
                t->scalar_type());
  }
  const int64_t B = q.size(0), S = q.size(2), D = q.size(3);
  TORCH_CHECK(D % 2 == 0, "q's head dimension must be even, got ", D);
  TORCH_CHECK(k.size(0) == B && k.size(2) == S && k.size(3) == D, "k must have shape [", B, ", heads, ", S, ", ", D,
              "] (q's batch, positions and head dimension), got ", k.sizes());
  for (const auto& [t, name] : {std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    TORCH_CHECK((t->size(0) == B || t->size(0) == 1) && t->size(1) == S && t->size(2) == D, name,
                " must have shape [", B, " or 1, ", S, ", ", D, "], got ", t->sizes());
  }
  TORCH_CHECK(q_out.sizes() == q.sizes() && q_out.is_contiguous(), "q_out must be contiguous with q's shape ",
              q.sizes(), ", got ", q_out.sizes());
  TORCH_CHECK(k_out.sizes() == k.sizes() && k_out.is_contiguous(), "k_out must be contiguous with k's shape ",
              k.sizes(), ", got ", k_out.sizes());
  // Outputs written while the inputs are read, element by element across rows: no
  // overlap with any input or with each other.
  for (const auto& [in, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&cos, "cos"}, std::pair{&sin, "sin"}}) {
    check_apart(q_out, "q_out", *in, name);
    check_apart(k_out, "k_out", *in, name);
  }
  check_apart(k_out, "k_out", q_out, "q_out");
  const Kernels& K = kernels();
  if (dtype == at::kFloat) {
    if (q.numel()) rotate<float>(q, cos, sin, q_out, K.rotary_row_f32);
    if (k.numel()) rotate<float>(k, cos, sin, k_out, K.rotary_row_f32);
  } else {
    if (q.numel()) rotate<uint16_t>(q, cos, sin, q_out, K.rotary_row_bf16);
    if (k.numel()) rotate<uint16_t>(k, cos, sin, k_out, K.rotary_row_bf16);
  }
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("apply_rotary_pos_emb", &domino::cpu::apply_rotary_pos_emb_cpu); }
