// switched_linear: the forward of an nn.Linear switched by domino.fast_linear's
// use_small_batch_linear, in one dispatcher call. Where the batch-invariant kernels apply
// (CPU tensors of one dtype, float32 or bf16; no CPU autocast; no autograd graph needed; a
// contiguous non-empty [N, K] weight, a [N] bias or none, x [..., K]) it runs
// small_batch_linear_packed on the given panels, or small_batch_linear on the weight in
// place when none are given; everywhere else it is at::linear, the layer's own forward.
//
// Bytes it must move: those of the product it runs (the weight once); the rest is call
// overhead, which is what this op exists to cut. A SmolLM2-135M forward calls 211 linears:
// the Python forward it replaces (checks, reshape, output allocation, view around the
// product's op) spent ~9 us a call around the product against ~1.6 us for PyTorch's
// nn.Linear around F.linear, ~1.5 ms of a ~35 ms float32 one-token forward; with this op
// ~3 us, the module call as fast as PyTorch's (AMX Xeon VM, benchmarks/layer_ops_wrapper_cost.py,
// benchmarks/results/switched_linear_xeon_session61.txt).
//
// Registered as CompositeImplicitAutograd: where autograd needs a graph the fallback's
// at::linear records it, and fake and meta tensors trace through the two products' fake
// kernels or at::linear (the products are called through the dispatcher, not as C++
// functions, for that reason).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

namespace domino::cpu {
namespace {

// Whether the kernels may replace at::linear (the conditions of domino.fast_linear's
// cpu_kernel_applies plus the shapes the products take).
bool kernels_apply(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const auto dtype = x.scalar_type();
  if (!x.is_cpu() || (dtype != at::kFloat && dtype != at::kBFloat16) || x.dim() == 0) return false;
  if (!weight.is_cpu() || weight.scalar_type() != dtype || weight.dim() != 2 || !weight.is_contiguous() ||
      weight.size(0) == 0 || weight.size(1) == 0 || x.size(-1) != weight.size(1))
    return false;
  bool needs_grad = x.requires_grad() || weight.requires_grad();
  if (bias.has_value() && bias->defined()) {
    if (!bias->is_cpu() || bias->scalar_type() != dtype || bias->dim() != 1 || bias->size(0) != weight.size(0))
      return false;
    needs_grad = needs_grad || bias->requires_grad();
  }
  if (needs_grad && at::GradMode::is_enabled()) return false;
  return !at::autocast::is_autocast_enabled(at::kCPU);
}

}  // namespace

at::Tensor switched_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           const std::optional<at::Tensor>& packed_weight) {
  if (!kernels_apply(x, weight, bias)) return at::linear(x, weight, bias);
  static const auto row_major = c10::Dispatcher::singleton()
                                    .findSchemaOrThrow("domino_ops::small_batch_linear", "")
                                    .typed<void(const at::Tensor&, const at::Tensor&,
                                                const std::optional<at::Tensor>&, at::Tensor)>();
  static const auto packed = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("domino_ops::small_batch_linear_packed", "")
                                 .typed<void(const at::Tensor&, const at::Tensor&, int64_t,
                                             const std::optional<at::Tensor>&, at::Tensor)>();
  const int64_t N = weight.size(0), K = weight.size(1);
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = N;
  // the result itself, not a view of it (as F.linear's: a view made under no_grad could not
  // be modified in place later with autograd on)
  const at::Tensor out = at::empty(sizes, x.options());
  if (x2.size(0) > 0) {
    std::optional<at::Tensor> b;
    if (bias.has_value() && bias->defined()) b = bias->contiguous();
    const at::Tensor rows = out.view({x2.size(0), N});
    if (packed_weight.has_value() && packed_weight->defined()) packed.call(x2, *packed_weight, N, b, rows);
    else row_major.call(x2, weight, b, rows);
  }
  return out;
}

}  // namespace domino::cpu

TORCH_LIBRARY_IMPL(domino_ops, CompositeImplicitAutograd, m) {
  m.impl("switched_linear", &domino::cpu::switched_linear);
}
