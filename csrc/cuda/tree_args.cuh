// The arguments every tree verification kernel takes (sgl-kernel's layout), the base of
// each kernel's argument struct. Plain CUDA (no torch headers).
#pragma once

#include "cuda/portable.cuh"

namespace domino::cuda {

struct TreeVerifyArgs {
  int32_t* predicts;          // slot_limit int32 slots
  int32_t* accept_index;      // [bs, steps]
  int32_t* accept_token_num;  // [bs]
  const int64_t* candidates;  // [bs, n]
  const int64_t* retrive_index;
  const int64_t* retrive_next_token;
  const int64_t* retrive_next_sibling;
  int64_t bs, n, steps, slot_limit;
};

// ... and those of the tree samplers: per-node coins and a final coin per request (float
// or double U), target and draft rows over a vocabulary of V.
template <typename U>
struct TreeSamplerArgs : TreeVerifyArgs {
  const U* uniform_samples;  // [bs, n]
  const U* final_uniforms;   // [bs]
  const float* target_probs;  // [bs, n, V]
  const float* draft_probs;   // [bs, n, V] or nullptr
  int64_t V;
};

}  // namespace domino::cuda
