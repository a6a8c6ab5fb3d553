// Row argmax on the active instruction-set build (isa.h), shared by the CPU kernels of
// `sample` (greedy) and `verify_greedy`: first index of the max, the first NaN if there
// is one (torch.argmax). A row is split across threads only when it is very long: one
// 151936-float row takes ~40 us on one core, and on the shared 2-core VM a two-thread
// parallel region often waited 4-16 ms for its second thread (measured in this
// benchmark's row-op table: 12 ms per greedy sample at batch 1 with the split, and the
// same wait in a bare torch.argmax), so splitting vocabulary rows is not worth the risk.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <vector>

#include "cpu/isa.h"

namespace domino::cpu {

inline ArgMax argmax_span(const Kernels& K, const float* x, int64_t n) { return K.argmax_f32(x, n); }
inline ArgMax argmax_span(const Kernels& K, const c10::BFloat16* x, int64_t n) {
  return K.argmax_bf16(reinterpret_cast<const uint16_t*>(x), n);
}

// Elements per thread below which a row is not split (4M floats: 16 MB).
constexpr int64_t kArgmaxSplitMin = int64_t{1} << 22;

template <typename T>
int64_t row_argmax(const Kernels& K, const T* row, int64_t n, bool split) {
  const int64_t threads = at::get_num_threads();
  const int64_t parts = std::min<int64_t>(threads, n / kArgmaxSplitMin);
  if (!split || parts < 2 || at::in_parallel_region()) return argmax_span(K, row, n).index;
  std::vector<ArgMax> part(parts);
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t begin = n * p / parts / 64 * 64, end = p + 1 == parts ? n : n * (p + 1) / parts / 64 * 64;
      part[p] = argmax_span(K, row + begin, end - begin);
      part[p].index += begin;
    }
  });
  ArgMax best = part[0];  // in order: ties and NaNs go to the earliest part
  for (int64_t p = 1; p < parts && best.value == best.value; ++p)
    if (part[p].value != part[p].value || part[p].value > best.value) best = part[p];
  return best.index;
}

}  // namespace domino::cpu
