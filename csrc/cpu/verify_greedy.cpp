// CPU kernel of verify_greedy: longest prefix of the draft equal to the target's argmax.
//
// Reads target rows only up to the first mismatch (at most (k+1)*V logits per sequence);
// sequences run in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {

void verify_greedy_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                       at::Tensor out_tokens, at::Tensor num_accepted) {
  check_verify_greedy_args(draft_tokens, target_logits, out_tokens, num_accepted);
  const int64_t b = draft_tokens.size(0), k = draft_tokens.size(1), V = target_logits.size(2);
  const int64_t* draft = draft_tokens.data_ptr<int64_t>();
  for (int64_t i = 0; i < b * k; ++i)
    TORCH_CHECK(draft[i] >= 0 && draft[i] < V, "draft_tokens must be in [0, ", V, "), got ", draft[i]);
  int64_t* out = out_tokens.data_ptr<int64_t>();
  int64_t* acc = num_accepted.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, target_logits.scalar_type(), "verify_greedy_cpu", [&] {
    const scalar_t* logits = target_logits.data_ptr<scalar_t>();
    at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        int64_t n = 0;
        for (int64_t i = 0; i <= k; ++i) {
          const int64_t arg = argmax_row(logits + (s * (k + 1) + i) * V, V);
          out[s * (k + 1) + i] = arg;
          if (i == k || arg != draft[s * k + i]) break;
          ++n;
        }
        acc[s] = n;
        for (int64_t i = n + 1; i <= k; ++i) out[s * (k + 1) + i] = -1;
      }
    });
  });
}

}  // namespace domino::cpu
