// The row sampler: row-level sampling shared by the CPU kernels of `sample`,
// `domino_head_rollout` (T > 0) and `verify_sampling`, and the greedy row choice shared by
// `sample` and `verify_greedy` (as cuda/row_sampler.cuh and triton/row_sampler.py).
//
// Randomness comes in as uniforms drawn by the caller from a torch.Generator, so a kernel
// and the PyTorch reference given the same uniforms pick the same token (up to float
// rounding at a CDF boundary), and seeding is torch's own.
//
// Semantics (the reference in python/domino_ops/reference.py implements the same):
//   z = logits / temperature
//   top_k > 0:  drop tokens whose z is below the k-th largest z (ties at the k-th are kept)
//   top_p < 1:  sort the survivors by z (descending, ties by index), drop a token when the
//               probability mass before it already reaches top_p (the first always stays)
//   token = first index j (vocabulary order) with cumsum(p)[j] > u * sum(p)
//   logprob = log p(token) under the filtered, renormalised distribution
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace domino::cpu {

struct SampleScratch {
  std::vector<float> z;      // tempered logits, -inf where filtered out
  std::vector<double> w;     // unnormalised probabilities
  std::vector<float> tmp;    // partial-sort buffer for top-k
  std::vector<int64_t> idx;  // sort buffer for top-p
  void resize(int64_t n) {
    z.resize(n);
    w.resize(n);
  }
};

// Greedy choice of row[0:n] (float or bf16): the first index of the maximum, as torch.argmax.
template <typename T>
inline int64_t argmax_row(const T* row, int64_t n) {
  float best = static_cast<float>(row[0]);
  int64_t arg = 0;
  for (int64_t j = 1; j < n; ++j) {
    const float v = static_cast<float>(row[j]);
    if (v > best) {
      best = v;
      arg = j;
    }
  }
  return arg;
}

// First index j with cumsum(w)[j] > u * total; the last positive entry when rounding
// leaves the target unreached. Returns -1 when every weight is zero.
inline int64_t inverse_cdf(const double* w, int64_t n, double total, double u) {
  const double target = u * total;
  double cum = 0.0;
  int64_t last_positive = -1;
  for (int64_t j = 0; j < n; ++j) {
    if (w[j] <= 0.0) continue;
    cum += w[j];
    last_positive = j;
    if (cum > target) return j;
  }
  return last_positive;
}

struct Sampled {
  int64_t token;
  float logprob;
};

// Samples one token from a row of n float logits. u is uniform in [0, 1).
inline Sampled sample_row(const float* logits, int64_t n, float temperature, int64_t top_k,
                          float top_p, double u, SampleScratch& s) {
  s.resize(n);
  float* z = s.z.data();
  double* w = s.w.data();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) z[j] = logits[j] / temperature;

  if (top_k > 0 && top_k < n) {
    s.tmp.assign(z, z + n);
    std::nth_element(s.tmp.begin(), s.tmp.begin() + (top_k - 1), s.tmp.end(), std::greater<float>());
    const float kth = s.tmp[top_k - 1];
    for (int64_t j = 0; j < n; ++j)
      if (z[j] < kth) z[j] = neg_inf;
  }

  float m = neg_inf;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, z[j]);
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    w[j] = z[j] == neg_inf ? 0.0 : std::exp(static_cast<double>(z[j] - m));
    total += w[j];
  }

  if (top_p < 1.0f) {
    s.idx.clear();
    for (int64_t j = 0; j < n; ++j)
      if (w[j] > 0.0) s.idx.push_back(j);
    std::stable_sort(s.idx.begin(), s.idx.end(), [z](int64_t a, int64_t b) { return z[a] > z[b]; });
    const double budget = static_cast<double>(top_p) * total;
    double before = 0.0;
    for (int64_t j : s.idx) {
      if (before >= budget)
        w[j] = 0.0;
      else
        before += w[j];
    }
    total = before;
  }

  const int64_t token = inverse_cdf(w, n, total, u);
  const float logprob = static_cast<float>(std::log(w[token]) - std::log(total));
  return {token, logprob};
}

}  // namespace domino::cpu
