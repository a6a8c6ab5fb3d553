// The argument checks of the CPU row-wise ops (rms_norm, silu_mul): a defined, contiguous
// float32 or bfloat16 CPU tensor; errors name the argument.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace domino::cpu {

inline void check_dense_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), name, " must be a tensor");
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
              " must be float32 or bfloat16, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace domino::cpu
