// Vectorised building blocks for the CPU kernels: batched row dot products over fp32 or
// bf16 weight rows, and a vectorisable exp.
//
// Everything here is written with GCC vector extensions (16 floats per vector) and is
// compiled once per instruction set through `target_clones`, so the same source runs as
// AVX-512, AVX2+FMA or SSE2 code chosen at load time by the CPU it lands on. The weight
// stream is the only large operand, so each weight chunk is loaded and converted once and
// multiplied into up to kBatchBlock input vectors held in registers.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DOMINO_MULTIVERSION __attribute__((target_clones("arch=sapphirerapids", "avx512f", "avx2,fma", "default")))
#else
#define DOMINO_MULTIVERSION
#endif
#define DOMINO_INLINE inline __attribute__((always_inline))

namespace domino::cpu {

typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));
typedef int32_t v16i32 __attribute__((vector_size(64)));

constexpr int kLanes = 16;
// Input vectors multiplied into one weight chunk while it sits in registers.
constexpr int kBatchBlock = 8;

DOMINO_INLINE float to_float(float x) { return x; }
DOMINO_INLINE float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

DOMINO_INLINE v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

DOMINO_INLINE v16f load16(const c10::BFloat16* p) {
  // bf16 is the upper half of an fp32: widen and shift.
  v16u16 h;
  std::memcpy(&h, p, sizeof(h));
  v16u32 w = __builtin_convertvector(h, v16u32) << 16;
  v16f v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}

DOMINO_INLINE float hsum(v16f v) {
  // Pairwise, so the sum order is fixed regardless of instruction set.
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// y[row * y_stride + j] = dot(w[row, :cols], x[j, :cols]) for rows in [row0, row1) and
// j in [0, JN). w is row-major with leading dimension `cols`; x has stride x_stride.
// JN is a compile-time count so the JN accumulators stay in registers.
template <int JN, typename W>
DOMINO_INLINE void rows_dot_block(const W* __restrict w, int64_t row0, int64_t row1, int64_t cols,
                                  const float* __restrict x, int64_t x_stride,
                                  float* __restrict y, int64_t y_stride) {
  const int64_t cols_vec = cols - cols % kLanes;
  for (int64_t row = row0; row < row1; ++row) {
    const W* wr = w + row * cols;
    v16f acc[JN];
    for (int j = 0; j < JN; ++j) acc[j] = v16f{};
    for (int64_t c = 0; c < cols_vec; c += kLanes) {
      const v16f wv = load16(wr + c);
      for (int j = 0; j < JN; ++j) acc[j] += wv * load16(x + j * x_stride + c);
    }
    for (int j = 0; j < JN; ++j) {
      float s = hsum(acc[j]);
      const float* xj = x + j * x_stride;
      for (int64_t c = cols_vec; c < cols; ++c) s += to_float(wr[c]) * xj[c];
      y[row * y_stride + j] = s;
    }
  }
}

template <typename W>
DOMINO_INLINE void rows_dot_impl(const W* w, int64_t row0, int64_t row1, int64_t cols,
                                 const float* x, int64_t x_stride, int64_t nb, float* y,
                                 int64_t y_stride) {
  // Rows outer, batch blocks inner: a weight row is read from memory once and re-read
  // from L1 for the next batch block, so the weight stream crosses the bus once per call
  // whatever the batch.
  constexpr int64_t kRowChunk = 16;
  for (int64_t r0 = row0; r0 < row1; r0 += kRowChunk) {
    const int64_t r1 = r0 + kRowChunk < row1 ? r0 + kRowChunk : row1;
    for (int64_t j0 = 0; j0 < nb; j0 += kBatchBlock) {
      const float* xj = x + j0 * x_stride;
      float* yj = y + j0;
      switch (nb - j0 < kBatchBlock ? nb - j0 : kBatchBlock) {
        case 1: rows_dot_block<1>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
        case 2: rows_dot_block<2>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
        case 3: rows_dot_block<3>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
        case 4: rows_dot_block<4>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
        case 5: rows_dot_block<5>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
        case 6: rows_dot_block<6>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
        case 7: rows_dot_block<7>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
        default: rows_dot_block<8>(w, r0, r1, cols, xj, x_stride, yj, y_stride); break;
      }
    }
  }
}

DOMINO_MULTIVERSION void rows_dot(const float* w, int64_t row0, int64_t row1, int64_t cols,
                                  const float* x, int64_t x_stride, int64_t nb, float* y,
                                  int64_t y_stride);
DOMINO_MULTIVERSION void rows_dot(const c10::BFloat16* w, int64_t row0, int64_t row1,
                                  int64_t cols, const float* x, int64_t x_stride, int64_t nb,
                                  float* y, int64_t y_stride);

// exp on 16 lanes for x <= 88 (Cephes' expf reduction and polynomial), in plain vector
// arithmetic so it compiles for every target. Relative error below 2e-7 on [-87, 88];
// inputs below -87 are clamped there (they are exp(x - max) terms, which then count ~0).
DOMINO_INLINE v16f exp_approx(v16f x) {
  const v16f lo = v16f{} - 87.0f;
  x = x < lo ? lo : x;
  // Round to nearest by the 1.5 * 2^23 trick: no rounding intrinsic needed.
  const v16f n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  v16f r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  v16f p = v16f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const v16i32 bits = (__builtin_convertvector(n, v16i32) + 127) << 23;
  v16f scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// sum_i exp(v[i] - m) over n values.
DOMINO_MULTIVERSION float sum_exp_shifted(const float* v, int64_t n, float m);

DOMINO_INLINE float silu(float x) { return x / (1.0f + std::exp(-x)); }
DOMINO_INLINE float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace domino::cpu
