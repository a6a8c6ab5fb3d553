// One block samples one row of logits exactly as the reference (domino_ops.reference.
// sample_from_logits) does for the same uniform u: z = (logits - max) / T, NaN as -inf,
// +inf entries sharing the mass, a row with no mass giving token 0; top-k keeps z >= the
// k-th largest z; top-p keeps a token while the mass sorted before it is < top_p * total
// (ties in index order); then the first index whose CDF exceeds u * total, in float64.
//
// No sort: the k-th largest value and the top-p cut are found by bisection over the
// 32-bit ordered key of z (32 block-wide counting/summing passes each), then one chunked
// block scan walks the CDF in index order. Cost per row: ~2 + 32 (top-k) + 32 (top-p)
// passes over V values that stay in L2 after the first (V = 151936 fp32 is 0.6 MB), so
// a few tens of microseconds. It serves `sample` and the head rollout's top-k/top-p
// path; the head's plain-temperature path uses the fused exponential race instead.
// Used by blocks of kSamplerThreads threads.
#pragma once

#include "cuda/common.cuh"

namespace domino::cuda {

constexpr int kSamplerThreads = kBlockThreads;

struct RowScratch {
  ArgMax argmax[kWarp];
  float fmax[kWarp];
  double dsum[kWarp];
  long long isum[kWarp];
  double dscan[kSamplerThreads];
  long long iscan[kSamplerThreads];
};

struct Pick {
  int64_t token;
  float logprob;
};

// Chunk of [0, V) owned by this thread in the index-ordered scans.
__device__ __forceinline__ void thread_chunk(int64_t V, int64_t& begin, int64_t& end) {
  const int64_t per = (V + blockDim.x - 1) / blockDim.x;
  begin = min(V, per * static_cast<int64_t>(threadIdx.x));
  end = min(V, begin + per);
}

// The first j whose inclusive CDF of weight(j, rank) exceeds u * total(weights), over the
// whole row, scanning in index order; the last positive weight if rounding runs past the
// end. weight(j, rank) returns a float64 >= 0; `rank` starts at rank_start(this thread's
// chunk) and lets the weight depend on how many tied tokens precede j (top-p).
// Returns (token, log(w_token / total)); token -1 if every weight is 0.
template <typename WeightFn>
__device__ Pick inverse_cdf_pick(const WeightFn& weight, int64_t V, double u, long long rank_start,
                                 RowScratch& sh) {
  int64_t begin, end;
  thread_chunk(V, begin, end);
  double chunk = 0.0;
  int64_t last_positive = -1;
  {
    long long rank = rank_start;
    for (int64_t j = begin; j < end; ++j) {
      const double w = weight(j, rank);
      chunk += w;
      if (w > 0) last_positive = j;
    }
  }
  const double prefix = block_exclusive_scan(chunk, sh.dscan);
  const double total = block_sum(chunk, sh.dsum);
  const double target = u * total;
  int64_t found = INT64_MAX;
  double found_w = 0.0;
  // Every chunk that ends past the target walks (the one holding it, and after rounding
  // possibly its successor, which then stops at its first positive weight).
  if (chunk > 0 && prefix + chunk > target) {
    long long rank = rank_start;
    double cum = prefix;
    for (int64_t j = begin; j < end; ++j) {
      const double w = weight(j, rank);
      cum += w;
      if (w > 0 && cum > target) {
        found = j;
        found_w = w;
        break;
      }
    }
  }
  // Lowest index found (neighbouring chunks can both claim a boundary after rounding).
  const ArgMax f = block_argmax({found == INT64_MAX ? -INFINITY : 0.0f, found}, sh.argmax);
  int64_t token = f.idx;
  if (f.val == -INFINITY) {  // rounding ran past the end: the last positive weight
    token = block_argmax({last_positive >= 0 ? static_cast<float>(0) : -INFINITY,
                          last_positive >= 0 ? -last_positive : INT64_MAX}, sh.argmax).idx;
    token = token == INT64_MAX ? -1 : -token;
    found_w = 0.0;
    if (token >= 0) {
      long long rank = rank_start;
      for (int64_t j = begin; j < end; ++j) {
        const double w = weight(j, rank);
        if (j == token) found_w = w;
      }
    }
    found_w = block_max(found_w, sh.dsum);
  } else {
    found_w = block_max(found == token ? found_w : 0.0, sh.dsum);
  }
  return {token, static_cast<float>(log(found_w) - log(total))};
}

// The filtered weights of row[0:V] (float or bf16) at temperature > 0 with top-k (0 = off)
// and top-p: returns finish(weight, ties_before), where weight(j, rank) is the float64
// weight of token j (for the j of this thread's chunk in order, rank starting at
// ties_before), or empty() when the row has no mass.
template <typename T, typename Empty, typename Finish>
__device__ auto filtered_row(const T* row, int64_t V, float temperature, int64_t top_k, double top_p,
                             RowScratch& sh, const Empty& empty, const Finish& finish) {
  int64_t begin, end;
  thread_chunk(V, begin, end);
  float xmax = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) xmax = fmaxf(xmax, to_float(row[j]));  // skips NaN
  xmax = block_max(xmax, sh.fmax);
  if (xmax == -INFINITY) return empty();
  const bool inf_row = xmax == INFINITY;
  auto z_of = [&](int64_t j) {
    const float x = to_float(row[j]);
    if (inf_row) return x == INFINITY ? 0.0f : -INFINITY;
    return x == x ? (x - xmax) / temperature : -INFINITY;
  };
  const float zmax = 0.0f;  // z of the max

  // top-k: the largest key t with count(key >= t) >= k.
  unsigned kth = 0;
  if (top_k > 0 && top_k < V) {
    uint64_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      long long count = 0;
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) count += float_key(z_of(j)) >= mid;
      if (block_sum(count, sh.isum) >= top_k) lo = mid;
      else hi = mid - 1;
    }
    kth = static_cast<unsigned>(lo);
  }
  auto w_topk = [&](int64_t j, unsigned& key) -> double {
    const float z = z_of(j);
    key = float_key(z);
    return key >= kth ? exp(static_cast<double>(z - zmax)) : 0.0;
  };

  // top-p: the smallest key t with mass(key > t) < top_p * total; tokens above t are
  // kept, and of the tokens at t the first n_tie (index order) whose mass-before stays
  // under the bound.
  unsigned cut = 0;
  long long n_tie = LLONG_MAX;
  if (top_p < 1.0) {
    double total = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      unsigned key;
      total += w_topk(j, key);
    }
    const double bound = top_p * block_sum(total, sh.dsum);
    uint64_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      double above = 0.0;
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        unsigned key;
        const double w = w_topk(j, key);
        if (key > mid) above += w;
      }
      if (block_sum(above, sh.dsum) < bound) hi = mid;
      else lo = mid + 1;
    }
    cut = static_cast<unsigned>(lo);
    double above = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      unsigned key;
      const double w = w_topk(j, key);
      if (key > cut) above += w;
    }
    above = block_sum(above, sh.dsum);
    const double w_tie = exp(static_cast<double>(key_float(cut) - zmax));
    n_tie = 0;
    if (w_tie > 0) {
      n_tie = static_cast<long long>(ceil((bound - above) / w_tie));
      n_tie = n_tie < 1 ? 1 : n_tie;  // the cut value itself is kept (mass above it < bound)
      while (n_tie > 1 && !(above + (n_tie - 1) * w_tie < bound)) --n_tie;
      while (above + n_tie * w_tie < bound && n_tie < V) ++n_tie;
    }
  }

  long long ties_before = 0;
  if (top_p < 1.0) {
    for (int64_t j = begin; j < end; ++j) ties_before += float_key(z_of(j)) == cut;
  }
  ties_before = block_exclusive_scan(ties_before, sh.iscan);
  auto weight = [&](int64_t j, long long& rank) -> double {
    unsigned key;
    const double w = w_topk(j, key);
    if (top_p >= 1.0 || key > cut) return w;
    if (key < cut) return 0.0;
    return rank++ < n_tie ? w : 0.0;
  };
  return finish(weight, ties_before);
}

// Samples row[0:V] (float or bf16) at temperature > 0 with top-k (0 = off) and top-p.
template <typename T>
__device__ Pick sample_row(const T* row, int64_t V, float temperature, int64_t top_k, double top_p,
                           double u, RowScratch& sh) {
  return filtered_row(
      row, V, temperature, top_k, top_p, sh, [] { return Pick{0, 0.0f}; },  // no mass: token 0, as the reference
      [&](const auto& weight, long long ties_before) { return inverse_cdf_pick(weight, V, u, ties_before, sh); });
}

// Greedy choice of row[0:V]: (argmax, lowest index on ties).
template <typename T>
__device__ int64_t argmax_row(const T* row, int64_t V, RowScratch& sh) {
  ArgMax a{-INFINITY, INT64_MAX};
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) a = argmax_merge(a, {to_float(row[j]), j});
  return block_argmax(a, sh.argmax).idx;
}

}  // namespace domino::cuda
