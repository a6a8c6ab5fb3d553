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

}  // namespace domino::cuda
