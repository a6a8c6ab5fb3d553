// Vectorised building blocks for the CPU kernels: batched row dot products over fp32 or
// bf16 weight rows, and a vectorisable exp.
//
// Everything here is written with GCC vector extensions (16 floats per vector) and is
// compiled once per instruction set through `target_clones` on the out-of-line functions
// in vec.cpp, so the same source runs as AVX-512 (x86-64-v4), AVX2+FMA (x86-64-v3) or
// SSE2 code, chosen at load time by the CPU it lands on. The weight
// stream is the only large operand, so each weight chunk is loaded and converted once and
// multiplied into up to kBatchBlock input vectors held in registers.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DOMINO_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
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

// Reduces 8 vectors to their 8 lane sums with a shuffle butterfly (8 adds, 16 shuffles):
// far cheaper than 8 scalar horizontal sums, which dominate a GEMV with short rows.
DOMINO_INLINE void hsum8(const v16f (&a)[8], float (&out)[8]) {
  v16f c[4], d[2];
  for (int p = 0; p < 4; ++p)  // lanes 0-7: a[2p], 8-15: a[2p+1]
    c[p] = __builtin_shufflevector(a[2 * p], a[2 * p + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * p], a[2 * p + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int q = 0; q < 2; ++q)  // 4 lanes per vector
    d[q] = __builtin_shufflevector(c[2 * q], c[2 * q + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(c[2 * q], c[2 * q + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const v16f e =  // 2 lanes per vector
      __builtin_shufflevector(d[0], d[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
      __builtin_shufflevector(d[0], d[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  for (int i = 0; i < 8; ++i) out[i] = e[2 * i] + e[2 * i + 1];
}

// y[row * y_stride + j] = dot(w[row, :cols], x[j, :cols]) for JN inputs and RB rows at a
// time (JN * RB <= 8 accumulators, all in registers), rows in [row0, row1).
// Columns per vector step: 16 fp32 weights, or 32 bf16 weights split into even and odd
// lanes (see rows_dot_impl), which needs no shuffles to widen.
template <typename W>
constexpr int64_t kColsPerStep = std::is_same_v<W, c10::BFloat16> ? 2 * kLanes : kLanes;

// y[row * y_stride + j] = dot(w[row, :cols], x[j, :cols]) for JN inputs and RB rows at a
// time (JN * RB <= 8 accumulators, all in registers), rows in [row0, row1). For bf16
// weights x must be in the even/odd-permuted layout made by rows_dot_impl.
template <int JN, int RB, typename W>
DOMINO_INLINE void rows_dot_block(const W* __restrict w, int64_t row0, int64_t row1, int64_t cols,
                                  const float* __restrict x, int64_t x_stride,
                                  float* __restrict y, int64_t y_stride) {
  static_assert(JN * RB <= 8, "at most 8 accumulators");
  constexpr int64_t step = kColsPerStep<W>;
  const int64_t cols_vec = cols - cols % step;
  for (int64_t row = row0; row + RB <= row1; row += RB) {
    v16f acc[8];
    for (int a = 0; a < 8; ++a) acc[a] = v16f{};
    // Row by row, so the weight stream is read strictly in address order.
    for (int rr = 0; rr < RB; ++rr) {
      const W* wr = w + (row + rr) * cols;
      for (int64_t c = 0; c < cols_vec; c += step) {
        if constexpr (std::is_same_v<W, c10::BFloat16>) {
          // 32 bf16 = 16 uint32 words; a bf16 is the top half of an fp32, so the even
          // elements are word << 16 and the odd ones word & 0xffff0000.
          v16u32 raw;
          std::memcpy(&raw, wr + c, sizeof(raw));
          const v16u32 lo = raw << 16, hi = raw & 0xffff0000u;
          v16f we, wo;
          std::memcpy(&we, &lo, sizeof(we));
          std::memcpy(&wo, &hi, sizeof(wo));
          for (int j = 0; j < JN; ++j) {  // two statements: two FMAs, no separate add
            acc[rr * JN + j] += we * load16(x + j * x_stride + c);
            acc[rr * JN + j] += wo * load16(x + j * x_stride + c + kLanes);
          }
        } else {
          const v16f wv = load16(wr + c);
          for (int j = 0; j < JN; ++j) acc[rr * JN + j] += wv * load16(x + j * x_stride + c);
        }
      }
    }
    float sums[8];
    hsum8(acc, sums);
    for (int rr = 0; rr < RB; ++rr) {
      const W* wr = w + (row + rr) * cols;
      for (int j = 0; j < JN; ++j) {
        float s = sums[rr * JN + j];
        const float* xj = x + j * x_stride;
        for (int64_t c = cols_vec; c < cols; ++c) s += to_float(wr[c]) * xj[c];
        y[(row + rr) * y_stride + j] = s;
      }
    }
  }
}

template <int JN, typename W>
DOMINO_INLINE void rows_dot_rows(const W* w, int64_t row0, int64_t row1, int64_t cols,
                                 const float* x, int64_t x_stride, float* y, int64_t y_stride) {
  constexpr int RB = 8 / JN;
  const int64_t main_end = row0 + (row1 - row0) / RB * RB;
  rows_dot_block<JN, RB>(w, row0, main_end, cols, x, x_stride, y, y_stride);
  rows_dot_block<JN, 1>(w, main_end, row1, cols, x, x_stride, y, y_stride);
}

template <typename W>
DOMINO_INLINE void rows_dot_impl(const W* w, int64_t row0, int64_t row1, int64_t cols,
                                 const float* x, int64_t x_stride, int64_t nb, float* y,
                                 int64_t y_stride) {
  // Rows outer, batch blocks inner: a chunk of weight rows is read from memory once and
  // re-read from L1 for the next batch block, so the weight stream crosses the memory
  // bus once per call whatever the batch. Batch blocks are 8, 4, 2 or 1 inputs.
  if constexpr (std::is_same_v<W, c10::BFloat16>) {
    // Permute each full 32-column block of x to [16 even | 16 odd] to match the split
    // of the bf16 weight words; the tail keeps its order. nb * cols floats: negligible
    // next to the rows * cols weights.
    thread_local std::vector<float> xp;
    xp.resize(nb * cols);
    const int64_t cols_vec = cols - cols % (2 * kLanes);
    for (int64_t j = 0; j < nb; ++j) {
      const float* src = x + j * x_stride;
      float* dst = xp.data() + j * cols;
      for (int64_t c = 0; c < cols_vec; c += 2 * kLanes)
        for (int l = 0; l < kLanes; ++l) {
          dst[c + l] = src[c + 2 * l];
          dst[c + kLanes + l] = src[c + 2 * l + 1];
        }
      for (int64_t c = cols_vec; c < cols; ++c) dst[c] = src[c];
    }
    x = xp.data();
    x_stride = cols;
  }
  constexpr int64_t kRowChunk = 32;
  for (int64_t r0 = row0; r0 < row1; r0 += kRowChunk) {
    const int64_t r1 = r0 + kRowChunk < row1 ? r0 + kRowChunk : row1;
    int64_t j0 = 0;
    for (; j0 + 8 <= nb; j0 += 8) rows_dot_rows<8>(w, r0, r1, cols, x + j0 * x_stride, x_stride, y + j0, y_stride);
    if (j0 + 4 <= nb) { rows_dot_rows<4>(w, r0, r1, cols, x + j0 * x_stride, x_stride, y + j0, y_stride); j0 += 4; }
    if (j0 + 2 <= nb) { rows_dot_rows<2>(w, r0, r1, cols, x + j0 * x_stride, x_stride, y + j0, y_stride); j0 += 2; }
    if (j0 < nb) rows_dot_rows<1>(w, r0, r1, cols, x + j0 * x_stride, x_stride, y + j0, y_stride);
  }
}

void rows_dot(const float* w, int64_t row0, int64_t row1, int64_t cols,
                                  const float* x, int64_t x_stride, int64_t nb, float* y,
                                  int64_t y_stride);
void rows_dot(const c10::BFloat16* w, int64_t row0, int64_t row1,
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
float sum_exp_shifted(const float* v, int64_t n, float m);

DOMINO_INLINE float silu(float x) { return x / (1.0f + std::exp(-x)); }
DOMINO_INLINE float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace domino::cpu
