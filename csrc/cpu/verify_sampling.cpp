// CPU kernel of verify_sampling: lossless rejection sampling (Leviathan et al. 2023).
//
// For i = 0..k-1: accept draft x_i when u_i * q_i(x_i) < p_i(x_i) (probability
// min(1, p/q)); at the first rejection sample from normalize(max(0, p_i - q_i)) (from p_i
// if that residual is all zero); when all k are accepted sample a bonus from p_k. The one
// resampled or bonus token uses uniforms_resample. Reads 2 probabilities per accepted
// draft and 2V at the rejection (or V for the bonus): memory-light; sequences run in
// parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>

#include "cpu/row_sampler.h"
#include "ops.h"

namespace domino::cpu {

void verify_sampling_cpu(const at::Tensor& draft_tokens, const at::Tensor& draft_probs,
                         const at::Tensor& target_probs, const at::Tensor& uniforms_accept,
                         const at::Tensor& uniforms_resample, at::Tensor out_tokens,
                         at::Tensor num_accepted) {
  check_verify_sampling_args(draft_tokens, draft_probs, target_probs, uniforms_accept,
                             uniforms_resample, out_tokens, num_accepted);
  const int64_t b = draft_tokens.size(0), k = draft_tokens.size(1), V = target_probs.size(2);
  const int64_t* draft = draft_tokens.data_ptr<int64_t>();
  for (int64_t i = 0; i < b * k; ++i)
    TORCH_CHECK(draft[i] >= 0 && draft[i] < V, "draft_tokens must be in [0, ", V, "), got ", draft[i]);
  const float* q = draft_probs.data_ptr<float>();
  const float* p = target_probs.data_ptr<float>();
  const double* ua = uniforms_accept.data_ptr<double>();
  const double* ur = uniforms_resample.data_ptr<double>();
  int64_t* out = out_tokens.data_ptr<int64_t>();
  int64_t* acc = num_accepted.data_ptr<int64_t>();

  at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
    std::vector<double> w(V);
    for (int64_t s = s0; s < s1; ++s) {
      int64_t n = 0;
      while (n < k) {
        const int64_t x = draft[s * k + n];
        const double px = p[(s * (k + 1) + n) * V + x];
        const double qx = q[(s * k + n) * V + x];
        if (!(ua[s * k + n] * qx < px)) break;
        out[s * (k + 1) + n] = x;
        ++n;
      }
      const float* pr = p + (s * (k + 1) + n) * V;
      double total = 0.0;
      if (n < k) {
        const float* qr = q + (s * k + n) * V;
        for (int64_t j = 0; j < V; ++j) {
          w[j] = std::max(0.0, static_cast<double>(pr[j]) - static_cast<double>(qr[j]));
          total += w[j];
        }
      }
      if (total <= 0.0) {  // bonus row, or p == q on the rejected row
        total = 0.0;
        for (int64_t j = 0; j < V; ++j) {
          w[j] = std::max(0.0, static_cast<double>(pr[j]));
          total += w[j];
        }
      }
      int64_t token = inverse_cdf(w.data(), V, total, ur[s]);
      TORCH_CHECK(token >= 0, "target_probs row ", n, " of sequence ", s, " sums to zero");
      out[s * (k + 1) + n] = token;
      acc[s] = n;
      for (int64_t i = n + 1; i <= k; ++i) out[s * (k + 1) + i] = -1;
    }
  });
}

}  // namespace domino::cpu
