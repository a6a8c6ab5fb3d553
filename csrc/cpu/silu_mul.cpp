// CPU kernel of silu_mul: out = silu(gate) * up, elementwise, for a gated MLP's activation
// (HF's LlamaMLP and its kin: down_proj(act_fn(gate_proj(x)) * up_proj(x))) in one pass
// instead of PyTorch's two (silu, then mul) with a temporary between them.
//
//   gate, up, out: the same shape, float32 or bfloat16 (all one dtype), contiguous.
//   out = round(round(gate / (1 + exp(-gate))) * up): HF's order, rounded to the dtype
//   after the activation and after the product (bf16: nearest even), float math between.
//
// Bytes it must move: gate and up read once, out written once (3 * n elements); work ~25
// vector operations per L elements (the exponential). A verification's 16 rows of a
// 1536-wide MLP are 24.6K elements: the call, not the bytes, is the cost below ~100K
// elements, which is why one call replaces two.
//
// gate_up_silu_cpu (decoder_layers.cpp and draft_layers.cpp, through layer_kernels.h's
// mlp_residual): a layer's fused gate/up product and the same on the two halves of each of
// its rows, read where the product wrote them (before, each half was first copied out to be
// contiguous: two copies of a prompt's [rows, 1536]), in one parallel region where the halves
// split at a panel boundary.
//
// Batch invariance, by construction: every element goes through the same lane operations
// (the instruction-set build's silu_mul, cpu/vec.cpp), so an element's bits do not depend
// on the tensor's size, its place in it, or the thread split.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "cpu/dense_checks.h"
#include "cpu/isa.h"
#include "cpu/layer_kernels.h"
#include "cpu/packed_panels.h"
#include "ops.h"

namespace domino::cpu {

void silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up, at::Tensor out) {
  check_dense_float(gate, "gate");
  check_dense_float(up, "up");
  check_dense_float(out, "out");
  TORCH_CHECK(up.scalar_type() == gate.scalar_type() && out.scalar_type() == gate.scalar_type(),
              "gate, up and out must share a dtype, got ", gate.scalar_type(), ", ", up.scalar_type(), " and ",
              out.scalar_type());
  TORCH_CHECK(up.sizes() == gate.sizes(), "up must have gate's shape ", gate.sizes(), ", got ", up.sizes());
  TORCH_CHECK(out.sizes() == gate.sizes(), "out must have gate's shape ", gate.sizes(), ", got ", out.sizes());
  // Elementwise: out may be gate or up itself (in place), but not overlap them otherwise.
  check_apart(out, "out", gate, "gate", /*in_place_ok=*/true);
  check_apart(out, "out", up, "up", /*in_place_ok=*/true);
  const int64_t n = gate.numel();
  if (n == 0) return;
  const Kernels& K = kernels();
  // ~8K elements per thread's share (~5 us of exponentials and divisions): a decode
  // step's 1536 stay on the calling thread, a 16-row verification's 24.6K use both.
  constexpr int64_t kGrain = int64_t{1} << 13;
  if (gate.scalar_type() == at::kFloat) {
    const float* g = gate.data_ptr<float>();
    const float* u = up.data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) { K.silu_mul_f32(g + i0, u + i0, i1 - i0, o + i0); });
  } else {
    const auto* g = reinterpret_cast<const uint16_t*>(gate.data_ptr());
    const auto* u = reinterpret_cast<const uint16_t*>(up.data_ptr());
    auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
    at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) { K.silu_mul_bf16(g + i0, u + i0, i1 - i0, o + i0); });
  }
}

namespace {

// Rows [r0, r1), columns [n0, n0 + n) of silu(gate) * up from gate_up [rows, 2 inter]
// (gate's half, then up's) into out [rows, inter]; fn the instruction-set build's silu_mul.
template <typename Fn, typename T>
void silu_mul_block(Fn fn, const T* gate_up, int64_t inter, int64_t r0, int64_t r1, int64_t n0, int64_t n, T* out) {
  for (int64_t r = r0; r < r1; ++r)
    fn(gate_up + r * 2 * inter + n0, gate_up + r * 2 * inter + inter + n0, n, out + r * inter + n0);
}

// silu_mul_cpu on the two halves of each row of gate_up [rows, 2 inter] (contiguous), in
// place, without copying them out: out [rows, inter], the same bits.
void silu_mul_rows_cpu(const at::Tensor& gate_up, int64_t inter, at::Tensor out) {
  check_dense_float(gate_up, "gate_up");
  check_dense_float(out, "out");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) == 2 * inter &&
                  out.sizes() == at::IntArrayRef({gate_up.size(0), inter}),
              "gate_up must be [rows, 2 * ", inter, "] and out [rows, ", inter, "], got ", gate_up.sizes(), " and ",
              out.sizes());
  TORCH_CHECK(out.scalar_type() == gate_up.scalar_type(), "gate_up and out must share a dtype");
  const int64_t rows = gate_up.size(0);
  if (rows == 0 || inter == 0) return;
  const Kernels& K = kernels();
  // whole rows, about silu_mul_cpu's grain of elements a share
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 13) / inter);
  auto each_row = [&](auto fn, const auto* g, auto* o) {
    at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) { silu_mul_block(fn, g, inter, r0, r1, 0, inter, o); });
  };
  if (gate_up.scalar_type() == at::kFloat)
    each_row(K.silu_mul_f32, gate_up.data_ptr<float>(), out.data_ptr<float>());
  else
    each_row(K.silu_mul_bf16, reinterpret_cast<const uint16_t*>(gate_up.data_ptr()),
             reinterpret_cast<uint16_t*>(out.data_ptr()));
}

}  // namespace

void gate_up_silu_cpu(const at::Tensor& x, const at::Tensor& packed, int64_t inter,
                      const std::optional<at::Tensor>& bias, at::Tensor act) {
  at::Tensor gate_up = at::empty({x.size(0), 2 * inter}, x.options());
  // bf16 panels whose gate and up halves split at a panel boundary: one parallel region in
  // which each thread computes the gate panels of a range of columns, the up panels of the
  // same columns, then their silu_mul, from its own cache. (As two calls, the product's
  // threads split the panels in halves, the gate's to one thread and the up's to the other,
  // and silu_mul read half of each row from the other core.) Elementwise, and each output
  // one product: the same bits as the two calls.
  if (packed.defined() && packed.scalar_type() == at::kBFloat16 && inter > 0 && inter % kPackedPanelCols == 0 &&
      act.is_contiguous() && act.scalar_type() == x.scalar_type() && act.sizes() == at::IntArrayRef({x.size(0), inter})) {
    const PackedProductRunner product = prepare_packed_product(x, packed, 2 * inter, bias, gate_up);
    const int64_t half = inter / kPackedPanelCols, rows = x.size(0);
    if (product.panels == 0) return;
    TORCH_CHECK(product.panels == 2 * half, "gate_up_silu: the packed weight's panels must be 2 * inter / 48");
    const Kernels& K = kernels();
    auto* gu = reinterpret_cast<const uint16_t*>(gate_up.data_ptr());
    auto* o = reinterpret_cast<uint16_t*>(act.data_ptr());
    at::parallel_for(0, half, std::max<int64_t>(1, product.grain / 2), [&](int64_t c0, int64_t c1) {
      product.run(c0, c1);
      product.run(half + c0, half + c1);
      silu_mul_block(K.silu_mul_bf16, gu, inter, 0, rows, c0 * kPackedPanelCols, (c1 - c0) * kPackedPanelCols, o);
    });
    return;
  }
  small_batch_linear_packed_cpu(x, packed, 2 * inter, bias, gate_up);
  silu_mul_rows_cpu(gate_up, inter, act);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("silu_mul", &domino::cpu::silu_mul_cpu); }
