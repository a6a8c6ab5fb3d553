// One TORCH_LIBRARY schema per op (bindings/schemas.h). Each op's CPU kernel registers
// itself at the end of csrc/cpu/<op>.cpp; the CUDA implementations are in cuda_impls.cpp;
// fake implementations for torch.compile in python/domino_ops/_fake.py.
#include <torch/library.h>

#include "bindings/schemas.h"

TORCH_LIBRARY(domino_ops, m) {
  domino::schemas::define_ops(m);  // the kernel ops the emulated CUDA library shares
  m.def(domino::schemas::kSmallBatchLinear);
  m.def(domino::schemas::kSmallBatchLinearPacked);
  m.def(domino::schemas::kSwitchedLinear);
  m.def(domino::schemas::kSmallBatchAttention);
  m.def(domino::schemas::kRmsNorm);
  m.def(domino::schemas::kSiluMul);
  m.def(domino::schemas::kApplyRotaryPosEmb);
  m.def(domino::schemas::kDecoderLayers);
  m.def(domino::schemas::kDraftLayers);
  m.def(domino::schemas::kDraftContext);
}
