// The row sampler (as cuda/row_sampler.cuh and triton/row_sampler.py): row-level sampling
// shared by the CPU kernels of `sample`, `domino_head_rollout` (T > 0) and `verify_sampling`.
// The per-element passes run on the instruction-set build chosen in isa.h (vec.cpp); the
// sorts and the CDF scan are scalar; the greedy row choice is argmax.h.
//
// Randomness comes in as uniforms drawn by the caller from a torch.Generator, so a kernel
// and the PyTorch reference given the same uniforms pick the same token (up to float
// rounding at a CDF boundary), and seeding is torch's own.
//
// Semantics (domino_ops.sampling.filtered_weights implements the same):
//   z = (logits - max) / temperature, NaN counting as -inf; a +inf logit wins (the +inf
//   entries share the mass evenly); a row with no mass (all -inf / NaN) gives token 0
//   top_k > 0:  drop tokens whose z is below the k-th largest z (ties at the k-th are kept)
//   top_p < 1:  sort the survivors by z (descending, ties by index), drop a token when the
//               probability mass before it already reaches top_p (the first always stays)
//   token = first index j (vocabulary order) with cumsum(p)[j] > u * sum(p)
//   logprob = log p(token) under the filtered, renormalised distribution
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu/isa.h"

namespace domino::cpu {

struct SampleScratch {
  std::vector<float> z;      // tempered logits, -inf where filtered out
  std::vector<double> w;     // unnormalised probabilities
  std::vector<float> tmp;    // the bucket holding the k-th largest, for top-k
  std::vector<int64_t> idx;  // sort buffer for top-p
  void resize(int64_t n) {
    z.resize(n);
    w.resize(n);
  }
};

// First index j with cumsum(w)[j] > u * total; the last positive entry when rounding
// leaves the target unreached. Returns -1 when every weight is zero. The sum runs in
// index order, one dependent double add per element (the reference's cumsum).
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

// The k-th largest of z[0, n), exactly what nth_element over the row returns: a histogram
// of the top 11 bits of an order-preserving integer key finds the bucket that holds it,
// and nth_element runs over that bucket only (one pass to count, one to collect: ~5x
// faster than nth_element over a 151936-token row).
inline float kth_largest(const float* z, int64_t n, int64_t k, std::vector<float>& tmp) {
  auto bucket = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return ((u & 0x80000000u) ? ~u : (u | 0x80000000u)) >> 21;
  };
  std::vector<int64_t> hist(2048, 0);
  for (int64_t j = 0; j < n; ++j) ++hist[bucket(z[j])];
  int64_t above = 0, b = 2047;
  for (; b > 0 && above + hist[b] < k; --b) above += hist[b];
  tmp.clear();
  for (int64_t j = 0; j < n; ++j)
    if (bucket(z[j]) == static_cast<uint32_t>(b)) tmp.push_back(z[j]);
  const int64_t kk = k - above;  // rank within the bucket, 1-based
  std::nth_element(tmp.begin(), tmp.begin() + (kk - 1), tmp.end(), std::greater<float>());
  return tmp[kk - 1];
}

struct Sampled {
  int64_t token;
  float logprob;
};

inline float temper(const Kernels& K, const float* x, int64_t n, float t, float* z) {
  return K.temper_f32(x, n, t, z);
}
inline float temper(const Kernels& K, const c10::BFloat16* x, int64_t n, float t, float* z) {
  return K.temper_bf16(reinterpret_cast<const uint16_t*>(x), n, t, z);
}

// The filtered, unnormalised probabilities of a row of n float or bf16 logits, into s.w
// (float64); returns their total. A row with no mass puts weight 1 on token 0.
// Vectorised (kernels K): the tempering and max, the exponentials (double) and their sum.
template <typename T>
inline double filtered_row_weights(const Kernels& K, const T* logits, int64_t n, float temperature,
                                   int64_t top_k, float top_p, SampleScratch& s) {
  s.resize(n);
  float* z = s.z.data();
  double* w = s.w.data();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float m = temper(K, logits, n, temperature, z);  // top-k always keeps the max
  if (m == neg_inf) {  // no mass anywhere: token 0, as the reference
    std::fill(w, w + n, 0.0);
    w[0] = 1.0;
    return 1.0;
  }

  if (top_k > 0 && top_k < n) {
    const float kth = kth_largest(z, n, top_k, s.tmp);
    for (int64_t j = 0; j < n; ++j)
      if (z[j] < kth) z[j] = neg_inf;
  }

  double total = K.exp_weights(z, n, m, w);

  if (top_p < 1.0f) {
    // Sort by z (descending, ties by index) and drop a token once the mass before it
    // reaches the budget. Only tokens with w >= t = (total - budget) / n can be kept:
    // the rest weigh less than n * t = total - budget together, so the sorted prefix
    // {w >= t} already holds the budget, and every later token is dropped. Sorting that
    // prefix alone gives the same result as sorting the row (checked below; otherwise,
    // after rounding, the whole row is sorted).
    const double budget = static_cast<double>(top_p) * total;
    const double t = (total - budget) / static_cast<double>(n);
    for (int pass = 0; pass < 2; ++pass) {
      const double floor = pass == 0 ? t : 0.0;
      s.idx.clear();
      for (int64_t j = 0; j < n; ++j)
        if (w[j] > 0.0 && w[j] >= floor) s.idx.push_back(j);
      std::stable_sort(s.idx.begin(), s.idx.end(), [z](int64_t a, int64_t b) { return z[a] > z[b]; });
      double before = 0.0;
      for (int64_t j : s.idx) {
        if (before >= budget)
          w[j] = 0.0;
        else
          before += w[j];
      }
      if (pass == 0 && !(before >= budget)) continue;  // nothing was dropped: sort every token
      if (pass == 0)
        for (int64_t j = 0; j < n; ++j)
          if (w[j] < floor) w[j] = 0.0;
      total = before;
      break;
    }
  }

  return total;
}

// Samples one token from a row of n float or bf16 logits. u is uniform in [0, 1).
template <typename T>
inline Sampled sample_row(const Kernels& K, const T* logits, int64_t n, float temperature,
                          int64_t top_k, float top_p, double u, SampleScratch& s) {
  const double total = filtered_row_weights(K, logits, n, temperature, top_k, top_p, s);
  const int64_t token = inverse_cdf(s.w.data(), n, total, u);
  const float logprob = static_cast<float>(std::log(s.w[token]) - std::log(total));
  return {token, logprob};
}

}  // namespace domino::cpu
