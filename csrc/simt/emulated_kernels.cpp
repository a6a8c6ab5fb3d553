// TEST INFRASTRUCTURE: the kernel sources of csrc/cuda/, unchanged, compiled as host C++
// for the SIMT emulator (DOMINO_SIMT is defined for the domino_simt target); bound to
// torch.ops.domino_simt by emulated_module.cpp.
#include "cuda/build_tree_kernel_efficient.cu"
#include "cuda/domino_head_expand.cu"
#include "cuda/domino_head_rollout.cu"
#include "cuda/filtered_probs.cu"
#include "cuda/sample.cu"
#include "cuda/verify_greedy.cu"
#include "cuda/verify_sampling.cu"
#include "cuda/tree_speculative_sampling_target_only.cu"
#include "cuda/verify_tree_greedy.cu"
#include "cuda/verify_tree_sampling.cu"
