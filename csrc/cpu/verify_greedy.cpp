// CPU kernel of verify_greedy: longest prefix of the draft equal to the target's argmax.
//
// Bytes: target rows up to the first mismatch, at most (k+1)*V logits per sequence, each
// read once by the instruction-set build's argmax (argmax.h): bound by the read
// bandwidth of one core per sequence. Sequences run in parallel (rows are split across
// threads only when very long: argmax.h).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu/argmax.h"
#include "ops.h"

namespace domino::cpu {
namespace {

template <typename T>
void verify_rows(const Kernels& K, const int64_t* draft, const T* logits, int64_t b, int64_t k,
                 int64_t V, int64_t* out, int64_t* acc) {
  const bool split = b < at::get_num_threads();
  auto one = [&](int64_t s) {
    int64_t n = 0;
    for (int64_t i = 0; i <= k; ++i) {
      const int64_t arg = row_argmax(K, logits + (s * (k + 1) + i) * V, V, split);
      out[s * (k + 1) + i] = arg;
      if (i == k || arg != draft[s * k + i]) break;
      ++n;
    }
    acc[s] = n;
    for (int64_t i = n + 1; i <= k; ++i) out[s * (k + 1) + i] = -1;
  };
  if (split) {
    for (int64_t s = 0; s < b; ++s) one(s);
    return;
  }
  at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) one(s);
  });
}

}  // namespace

void verify_greedy_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                       at::Tensor out_tokens, at::Tensor num_accepted) {
  check_verify_greedy_args(draft_tokens, target_logits, out_tokens, num_accepted);
  const Kernels& K = kernels();
  const int64_t b = draft_tokens.size(0), k = draft_tokens.size(1), V = target_logits.size(2);
  const int64_t* draft = draft_tokens.data_ptr<int64_t>();
  for (int64_t i = 0; i < b * k; ++i)
    TORCH_CHECK(draft[i] >= 0 && draft[i] < V, "draft_tokens must be in [0, ", V, "), got ", draft[i]);
  int64_t* out = out_tokens.data_ptr<int64_t>();
  int64_t* acc = num_accepted.data_ptr<int64_t>();
  if (target_logits.scalar_type() == at::kBFloat16)
    verify_rows(K, draft, target_logits.data_ptr<c10::BFloat16>(), b, k, V, out, acc);
  else
    verify_rows(K, draft, target_logits.data_ptr<float>(), b, k, V, out, acc);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("verify_greedy", &domino::cpu::verify_greedy_cpu); }
