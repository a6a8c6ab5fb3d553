// Out-of-line, multiversioned instances of the helpers in vec.h.
#include "cpu/vec.h"

namespace domino::cpu {

DOMINO_MULTIVERSION void rows_dot(const float* w, int64_t row0, int64_t row1, int64_t cols,
                                  const float* x, int64_t x_stride, int64_t nb, float* y,
                                  int64_t y_stride) {
  rows_dot_impl(w, row0, row1, cols, x, x_stride, nb, y, y_stride);
}

DOMINO_MULTIVERSION void rows_dot(const c10::BFloat16* w, int64_t row0, int64_t row1,
                                  int64_t cols, const float* x, int64_t x_stride, int64_t nb,
                                  float* y, int64_t y_stride) {
  rows_dot_impl(w, row0, row1, cols, x, x_stride, nb, y, y_stride);
}

DOMINO_MULTIVERSION float sum_exp_shifted(const float* v, int64_t n, float m) {
  v16f acc = v16f{};
  const int64_t n_vec = n - n % kLanes;
  for (int64_t i = 0; i < n_vec; i += kLanes) {
    acc += exp_approx(load16(v + i) - m);
  }
  if (n_vec < n) {
    // Tail: pad with -inf-like values whose exp is ~0 and mask them out.
    v16f tail = v16f{} + m;
    for (int64_t i = n_vec; i < n; ++i) tail[i - n_vec] = v[i];
    v16f e = exp_approx(tail - m);
    for (int l = static_cast<int>(n - n_vec); l < kLanes; ++l) e[l] = 0.0f;
    acc += e;
  }
  return hsum(acc);
}

}  // namespace domino::cpu
