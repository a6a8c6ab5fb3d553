// The sampling parameters of one call, as every kernel (CPU, CUDA, emulated CUDA) reads
// them: scalars, each overridden per row by an array when the caller passed a [b] tensor
// (flashinfer's convention: one request per row, each with its own temperature, top-k
// and top-p). Plain C++ with no torch or CUDA headers, so host and device code share it.
//
// The per-row accessors apply the rules of python/domino_ops/sampling.py, so a direct
// torch.ops caller gets the same answers as the Python wrappers:
//   - a temperature below kGreedyBelow is 0 (greedy: its limit is the argmax, and
//     logits / T would overflow);
//   - top_k = 0 or top_k >= V disables top-k;
//   - top_p is raised to kMinTopP, so it stays positive in float32 (the top token always
//     survives the nucleus).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DOMINO_HOST_DEVICE __host__ __device__
#else
#define DOMINO_HOST_DEVICE
#endif

namespace domino {

// domino_ops.sampling.GREEDY_BELOW and MIN_TOP_P.
constexpr float kGreedyBelow = 1e-20f;
constexpr double kMinTopP = 1.1754943508222875e-38;  // FLT_MIN

struct SamplingParams {
  float temperature = 0.0f;
  int64_t top_k = 0;
  double top_p = 1.0;
  const float* row_temperature = nullptr;  // [b] float32, or nullptr: `temperature` for every row
  const int64_t* row_top_k = nullptr;      // [b] int64, or nullptr
  const float* row_top_p = nullptr;        // [b] float32, or nullptr

  DOMINO_HOST_DEVICE float temperature_at(int64_t s) const {
    const float t = row_temperature != nullptr ? row_temperature[s] : temperature;
    return t < kGreedyBelow ? 0.0f : t;
  }
  DOMINO_HOST_DEVICE int64_t top_k_at(int64_t s) const { return row_top_k != nullptr ? row_top_k[s] : top_k; }
  DOMINO_HOST_DEVICE double top_p_at(int64_t s) const {
    const double p = row_top_p != nullptr ? static_cast<double>(row_top_p[s]) : top_p;
    return p < kMinTopP ? kMinTopP : p;
  }
  // Whether row s draws from a filtered distribution (top-k or top-p active) at T > 0.
  DOMINO_HOST_DEVICE bool filters_at(int64_t s, int64_t V) const {
    const int64_t k = top_k_at(s);
    return temperature_at(s) > 0.0f && ((k > 0 && k < V) || top_p_at(s) < 1.0);
  }

  // Known without reading the arrays (no device sync): whether some row may sample (then
  // the call needs uniforms), and whether some row may need top-k / top-p.
  DOMINO_HOST_DEVICE bool may_sample() const {
    return row_temperature != nullptr || !(temperature < kGreedyBelow);
  }
  DOMINO_HOST_DEVICE bool may_filter() const {
    return may_sample() && (row_top_k != nullptr || row_top_p != nullptr || top_k > 0 || top_p < 1.0);
  }
};

}  // namespace domino
