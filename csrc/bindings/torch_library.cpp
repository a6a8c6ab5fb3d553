// One TORCH_LIBRARY schema per op (bindings/schemas.h) and the CPU implementations. The
// CUDA implementations are in cuda_impls.cpp; fake implementations for torch.compile in
// python/domino_ops/_fake.py.
#include <torch/library.h>

#include "bindings/schemas.h"
#include "ops.h"
#include "tree_ops.h"

TORCH_LIBRARY(domino_ops, m) {
  domino::schemas::define_ops(m);  // the kernel ops the emulated CUDA library shares
  m.def(domino::schemas::kSmallBatchLinear);
}

TORCH_LIBRARY_IMPL(domino_ops, CPU, m) {
  m.impl("domino_head_rollout", &domino::cpu::domino_head_rollout_cpu);
  m.impl("sample", &domino::cpu::sample_cpu);
  m.impl("verify_greedy", &domino::cpu::verify_greedy_cpu);
  m.impl("verify_sampling", &domino::cpu::verify_sampling_cpu);
  m.impl("build_tree_kernel_efficient", &domino::cpu::build_tree_kernel_efficient_cpu);
  m.impl("verify_tree_greedy", &domino::cpu::verify_tree_greedy_cpu);
  m.impl("tree_speculative_sampling_target_only", &domino::cpu::tree_speculative_sampling_target_only_cpu);
  m.impl("verify_tree_sampling", &domino::cpu::verify_tree_sampling_cpu);
  m.impl("domino_head_expand", &domino::cpu::domino_head_expand_cpu);
  m.impl("small_batch_linear", &domino::cpu::small_batch_linear_cpu);
}
