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
//   nearest even), so the bits are HF's (NaN payloads aside). No FMA contraction: this
//   file is compiled with -ffp-contract=off (CMakeLists.txt).
//
// Bytes it must move: q and k read once, cos and sin once per head (from cache), the
// outputs written once. A decode step's 12 heads of 64 are 768 elements: the call, not
// the bytes, is the cost, which is what one call instead of fourteen saves (SmolLM2's
// forward with it and without: benchmarks/fused_projections_ab.py).
//
// Batch invariance, by construction: every element is the same three operations on its
// own inputs, whatever the shape, the place in it or the thread split.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

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

// One row of D: out[i] = x[i] * c[i] + rot[i] * s[i], rot = (-x[h:], x[:h]), every step
// rounded to T as PyTorch rounds it (c10::BFloat16's operators convert to float, compute,
// round to nearest even; float is IEEE float with no contraction).
template <typename T>
void rotate_row(const T* x, const T* c, const T* s, int64_t D, T* out) {
  const int64_t h = D / 2;
  for (int64_t i = 0; i < h; ++i) {
    const T a = x[i] * c[i];
    const T b = static_cast<T>(-x[i + h]) * s[i];
    out[i] = a + b;
  }
  for (int64_t i = h; i < D; ++i) {
    const T a = x[i] * c[i];
    const T b = x[i - h] * s[i];
    out[i] = a + b;
  }
}

template <typename T>
void rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), S = x.size(2), D = x.size(3);
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), xs2 = x.stride(2);
  // a batch of one cos / sin serves every sequence
  const int64_t cs0 = cos.size(0) == 1 ? 0 : cos.stride(0), cs1 = cos.stride(1);
  const int64_t ss0 = sin.size(0) == 1 ? 0 : sin.stride(0), ss1 = sin.stride(1);
  const T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* op = out.data_ptr<T>();
  // ~32K elements per thread's share: a decode step's and a verification's few heads stay
  // on the calling thread (a fork and join would cost more than the rows).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(D, 1));
  at::parallel_for(0, B * H * S, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bi = r / (H * S), hi = (r / S) % H, si = r % S;
      rotate_row<T>(xp + bi * xs0 + hi * xs1 + si * xs2, cp + bi * cs0 + si * cs1, sp + bi * ss0 + si * ss1, D,
                    op + r * D);
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
  for (const at::Tensor* in : {&q, &k, &cos, &sin}) {
    at::assert_no_overlap(q_out, *in);
    at::assert_no_overlap(k_out, *in);
  }
  at::assert_no_overlap(q_out, k_out);
  if (dtype == at::kFloat) {
    if (q.numel()) rotate<float>(q, cos, sin, q_out);
    if (k.numel()) rotate<float>(k, cos, sin, k_out);
  } else {
    if (q.numel()) rotate<c10::BFloat16>(q, cos, sin, q_out);
    if (k.numel()) rotate<c10::BFloat16>(k, cos, sin, k_out);
  }
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("apply_rotary_pos_emb", &domino::cpu::apply_rotary_pos_emb_cpu); }
