// CPU kernel of verify_sampling: lossless rejection sampling (Leviathan et al. 2023).
//
// For i = 0..k-1: accept draft x_i when u_i * q_i(x_i) < p_i(x_i) (probability
// min(1, p/q)); at the first rejection sample from normalize(max(0, p_i - q_i)) (from p_i
// if that residual is all zero); when all k are accepted sample a bonus from p_k. The one
// resampled or bonus token uses uniforms_resample. A target row with no positive mass
// (zeros, NaN, negatives) gives token 0, as a sampled row with no mass does.
//
// Bytes per sequence: 2 probabilities per accepted draft, then 2V floats at the rejection
// (V for the bonus), read once. The token is the first index whose running sum of the
// weights (double, in index order, as the reference's cumsum) exceeds u * total, so the
// pass is one dependent double add per token (3-4 cycles), not the memory bus: that chain
// is the limit at batch 1 (0.23 ms per 151936-token row on one core of the AVX2 EPYC VM,
// ~5 GB/s of probabilities; it was 2.1 ms before: a second pass, and std::max compiled to a
// jump that mispredicted on half the tokens). One pass computes the weights (branch-free),
// their running sum and a checkpoint of it every kCheckpoint tokens; the token is then
// found by a binary search over the checkpoints and a replay of one block's sum
// (bit-identical to the full scan). Scalar code, the same on every instruction-set build.
// Sequences run in parallel.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ops.h"

namespace domino::cpu {
namespace {

constexpr int64_t kCheckpoint = 64;

// max(0, d), NaN -> 0, without a branch: GCC compiles std::max here to a compare and a
// jump that mispredicts on half the tokens (measured 1.3 ms per 151936-token row).
inline double positive(double d) {
#if defined(__SSE2__)
  return _mm_cvtsd_f64(_mm_max_sd(_mm_set_sd(d), _mm_setzero_pd()));
#else
  return d > 0.0 ? d : 0.0;
#endif
}

inline double residual_weight(const float* p, const float* q, int64_t j) {
  return q != nullptr ? positive(static_cast<double>(p[j]) - static_cast<double>(q[j]))
                      : positive(static_cast<double>(p[j]));
}

// Sum of the weights in index order; cp[c] = the running sum before token c * kCheckpoint.
double weight_sums(const float* p, const float* q, int64_t n, double* cp) {
  double cum = 0.0;
  for (int64_t c0 = 0; c0 < n; c0 += kCheckpoint) {
    cp[c0 / kCheckpoint] = cum;
    const int64_t c1 = std::min(n, c0 + kCheckpoint);
    if (q != nullptr)
      for (int64_t j = c0; j < c1; ++j) cum += positive(static_cast<double>(p[j]) - static_cast<double>(q[j]));
    else
      for (int64_t j = c0; j < c1; ++j) cum += positive(static_cast<double>(p[j]));
  }
  return cum;
}

// First index whose running sum exceeds target, else the last positive weight; -1 when
// every weight is zero.
int64_t find_token(const float* p, const float* q, int64_t n, const double* cp, double target) {
  const int64_t blocks = (n + kCheckpoint - 1) / kCheckpoint;
  // The block whose start sum is the last one <= target: the crossing, if any, is in it.
  const int64_t blk = std::upper_bound(cp, cp + blocks, target) - cp - 1;
  double cum = cp[blk];
  for (int64_t j = blk * kCheckpoint, end = std::min(n, j + kCheckpoint); j < end; ++j) {
    const double w = residual_weight(p, q, j);
    cum += w;
    if (w > 0.0 && cum > target) return j;
  }
  for (int64_t j = n - 1; j >= 0; --j)  // rounding left the target unreached
    if (residual_weight(p, q, j) > 0.0) return j;
  return -1;
}

}  // namespace

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
    std::vector<double> cp((V + kCheckpoint - 1) / kCheckpoint);
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
      const float* qr = n < k ? q + (s * k + n) * V : nullptr;
      double total = qr != nullptr ? weight_sums(pr, qr, V, cp.data()) : 0.0;
      if (total <= 0.0) {  // bonus row, or p == q on the rejected row
        qr = nullptr;
        total = weight_sums(pr, nullptr, V, cp.data());
      }
      const int64_t token = find_token(pr, qr, V, cp.data(), ur[s] * total);
      out[s * (k + 1) + n] = token >= 0 ? token : 0;  // no positive mass: token 0, as every backend
      acc[s] = n;
      for (int64_t i = n + 1; i <= k; ++i) out[s * (k + 1) + i] = -1;
    }
  });
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("verify_sampling", &domino::cpu::verify_sampling_cpu); }
