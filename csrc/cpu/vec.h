// Vector code shared by every CPU op, compiled once per instruction set (see isa.h).
//
// Written with GCC vector extensions at the native width of the build it is compiled
// into: 16 floats (zmm) under -march=x86-64-v4, 8 (ymm) under x86-64-v3, 4 (xmm) for the
// SSE2 baseline. (The previous version used 16-float vectors everywhere and let one
// binary pick a clone at load time; GCC splits such vectors into ymm or xmm pieces and,
// with eight accumulators, kept them on the stack: the AVX2 build moved every
// accumulator through memory and general registers on every step, and reached a third
// of the copy bandwidth.) Register blocking is sized to the build's register file: with
// one activation the dot products keep kAcc accumulators (8 with 16 vector registers, 16
// with 32) and read every weight row start to end (the weight stream bounds); with
// several they hold the activations in registers across a few interleaved rows (the
// FMAs bound). Measured limits per build: the header of domino_head_rollout.cpp.
//
// Everything here lives in namespace domino::cpu::DOMINO_ISA and includes no header with
// inline functions of external linkage, so no instance compiled for one instruction set
// can be linked into another's code.
#pragma once

#if !defined(DOMINO_ISA)
#error "cpu/vec.h is compiled once per instruction set by cpu/vec.cpp (DOMINO_ISA names the build)"
#endif

#include <cstdint>
#include <cstring>
#include <utility>  // std::index_sequence: types only

#include "cpu/isa.h"

#define DOMINO_INLINE inline __attribute__((always_inline))
#define DOMINO_UNROLL _Pragma("GCC unroll 32")

namespace domino::cpu::DOMINO_ISA {

#if defined(__AVX512F__)
constexpr int L = 16;    // floats per vector
constexpr int kAcc = 16;  // accumulators of a dot-product block (32 zmm registers)
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int L = 8;
constexpr int kAcc = 8;  // 16 ymm registers: 8 accumulators + operands
#else
constexpr int L = 4;
constexpr int kAcc = 8;  // 16 xmm registers
#endif

typedef float vf __attribute__((vector_size(4 * L)));
typedef int32_t vi __attribute__((vector_size(4 * L)));
typedef uint32_t vu __attribute__((vector_size(4 * L)));
typedef uint16_t vh __attribute__((vector_size(2 * L)));
typedef double vd __attribute__((vector_size(4 * L)));  // L / 2 doubles
typedef int64_t vl __attribute__((vector_size(4 * L)));
typedef float vf2 __attribute__((vector_size(2 * L)));  // L / 2 floats

constexpr float kInf = __builtin_inff();

template <typename To, typename From>
DOMINO_INLINE To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(to));
  return to;
}

DOMINO_INLINE vf splat(float x) { return vf{} + x; }
DOMINO_INLINE vf loadu(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
DOMINO_INLINE void storeu(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
// L uint32 words = 2L bf16 values.
DOMINO_INLINE vu load_words(const uint16_t* p) {
  vu v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// L bf16 values widened to floats (a bf16 is the top half of an fp32). GCC 12 compiles
// __builtin_convertvector(vh -> vu) as two half-width zero-extensions, an extract and an
// insert (6 instructions for the 2 of vpmovzxwd from memory + vpslld): the AVX-512 and
// AVX2 builds call the zero-extension builtin itself.
DOMINO_INLINE vf loadu(const uint16_t* p) {
  vh h;
  std::memcpy(&h, p, sizeof(h));
  typedef short vs16 __attribute__((vector_size(2 * L)));
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
  const vu w = bit_cast<vu>(__builtin_ia32_pmovzxwd512_mask(bit_cast<vs16>(h), vi{}, static_cast<unsigned short>(-1)));
#elif defined(__AVX2__) && defined(__GNUC__) && !defined(__clang__)
  const vu w = bit_cast<vu>(__builtin_ia32_pmovzxwd256(bit_cast<vs16>(h)));
#else
  const vu w = __builtin_convertvector(h, vu);
#endif
  return bit_cast<vf>(w << 16);
}
// v rounded to bf16, as fp32 bit patterns (the low halves zero): round to nearest even,
// NaN to the quiet NaN 0x7fc0, c10::BFloat16's conversion.
DOMINO_INLINE vu bf16_rounded_bits(vf v) {
  const vu u = bit_cast<vu>(v);
  const vu rounded = (u + ((u >> 16) & 1u) + 0x7fffu) & 0xffff0000u;
  const vu nan = bit_cast<vu>(v != v);
  return (rounded & ~nan) | (nan & 0x7fc00000u);
}
DOMINO_INLINE void storeu(uint16_t* p, vf v) {
  const vh h = __builtin_convertvector(bf16_rounded_bits(v) >> 16, vh);
  std::memcpy(p, &h, sizeof(h));
}
DOMINO_INLINE float to_float(float x) { return x; }
DOMINO_INLINE float to_float(uint16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
DOMINO_INLINE uint16_t to_bf16(float f) {
  if (f != f) return 0x7fc0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>((u + ((u >> 16) & 1u) + 0x7fffu) >> 16);
}
DOMINO_INLINE void store_one(float* p, float x) { *p = x; }
DOMINO_INLINE void store_one(uint16_t* p, float x) { *p = to_bf16(x); }

// The sum of v's lanes by a fixed tree (lane i + L/2 onto lane i, then L/4, ...), in
// shuffles: the same operations for every vector it sums (rms_norm relies on that: each
// row's sum of squares is summed the same way wherever the row sits).
template <int W, size_t... I>
DOMINO_INLINE vf fold_down(vf v, std::index_sequence<I...>) {
  return v + __builtin_shufflevector(v, v, int((I + W) % L)...);
}
DOMINO_INLINE float hsum(vf v) {
  if constexpr (L >= 16) v = fold_down<8>(v, std::make_index_sequence<L>{});
  if constexpr (L >= 8) v = fold_down<4>(v, std::make_index_sequence<L>{});
  v = fold_down<2>(v, std::make_index_sequence<L>{});
  v = fold_down<1>(v, std::make_index_sequence<L>{});
  return v[0];
}
DOMINO_INLINE float hmax(vf v) {
  float t[L];
  std::memcpy(t, &v, sizeof(t));
  for (int w = L / 2; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) t[i] = t[i + w] > t[i] ? t[i + w] : t[i];
  return t[0];
}

// ---- transpose-reduce: the lane sums of L vectors as one vector ---------------------
// One level folds the partial sums of a and b, each held in groups of 2G lanes, into
// groups of G lanes, a's in the first half of each 2G group, b's in the second.
template <int G, size_t... I>
DOMINO_INLINE vf fold(vf a, vf b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, ((I / G) % 2 == 0 ? int(I) : int(L + I))...) +
         __builtin_shufflevector(a, b, ((I / G) % 2 == 0 ? int(I + G) : int(L + I - G))...);
}
template <int G, int N>
DOMINO_INLINE void fold_levels(vf* t) {
  DOMINO_UNROLL
  for (int p = 0; p < N / 2; ++p) t[p] = fold<G>(t[2 * p], t[2 * p + 1], std::make_index_sequence<L>{});
  if constexpr (G > 1) fold_levels<G / 2, N / 2>(t);
}
constexpr int bit_reverse(int i) {
  int r = 0;
  for (int b = 1; b < L; b <<= 1, i >>= 1) r = (r << 1) | (i & 1);
  return r;
}
// out[i] = sum of the lanes of a[i] for i < N (log2(L) shuffle-and-add levels per L
// vectors instead of one horizontal sum each).
template <int N>
DOMINO_INLINE void reduce_lanes(const vf* a, float* out) {
  DOMINO_UNROLL
  for (int g = 0; g < N; g += L) {
    vf t[L];
    DOMINO_UNROLL
    for (int i = 0; i < L; ++i) t[i] = g + bit_reverse(i) < N ? a[g + bit_reverse(i)] : vf{};
    fold_levels<L / 2, L>(t);  // lane i of t[0] = sum of input bit_reverse(i): reordered above
    if (N - g >= L) {
      storeu(out + g, t[0]);
    } else {
      float tmp[L];
      storeu(tmp, t[0]);
      for (int i = 0; i < N - g; ++i) out[g + i] = tmp[i];
    }
  }
}

// ---- dot products of weight rows with nb activation vectors -------------------------
// A block is RB consecutive weight rows times JN activations (RB * JN = kAcc
// accumulators, all in registers). bf16 weights: one step covers 2L columns, loaded as L
// uint32 words; a word holds columns 2i (low half) and 2i + 1 (high half), so the even
// columns are `word << 16` and the odd ones `word & 0xffff0000` (one integer op per L
// weights, no shuffles). The activations are stored to match, each block of 2L columns
// as [L even | L odd] (pack_bf16_x). Columns beyond the last full step: scalar.
template <typename W>
constexpr int64_t kStep = sizeof(W) == 2 ? 2 * L : L;

// Software prefetch of the weight stream, this many bytes ahead of the row being read
// (in every pass of the rows-outer blocks: the first activation block's pass is the one
// that reads from memory). The hardware prefetchers stop at 4 KB pages; on the Zen 5 VM
// one thread's batch-1 pass over w2 (V = 151936, r = 256, bf16) went from 3.8 to 2.4 ms
// (avx512) and 3.8 to 2.2 ms (avx2) with it; 4-16 KB measured alike.
constexpr int64_t kPrefetchBytes = 4096;

// The dot products of RB rows with JN activations, as unreduced vectors: acc[j * stride +
// rr] for row rr, activation j. The rows are read step by step side by side (RB loads a
// step), each activation step once (2 * JN loads), 2 * RB * JN FMAs. Every dot product of
// every kernel below comes from here (even / odd accumulators over the steps in column
// order, then their sum), then one reduce_lanes and the scalar tail, so its bits do not
// depend on the block shape or the batch position that computed it. Two accumulators per
// activation: two dependency chains per row (with one, a row of r = 256 bf16 weights is 16
// dependent FMAs per accumulator; one chain measured 28 GB/s from L1 at batch 1 on the
// AVX2 build, barely above DRAM).
template <int RB, int JN, typename W>
DOMINO_INLINE void interleaved_sums(const W* __restrict w, int64_t cols, const float* __restrict x, int64_t xs,
                                    int64_t ahead, vf* acc, int stride) {
  constexpr int64_t S = kStep<W>;
  const int64_t cv = cols - cols % S;
  vf e[RB * JN], o[RB * JN];
  DOMINO_UNROLL
  for (int a = 0; a < RB * JN; ++a) e[a] = o[a] = vf{};
  if constexpr (sizeof(W) == 2) {
    for (int64_t c = 0; c < cv; c += S) {
      vf xe[JN], xo[JN];
      DOMINO_UNROLL
      for (int j = 0; j < JN; ++j) {
        xe[j] = loadu(x + j * xs + c);
        xo[j] = loadu(x + j * xs + c + L);
      }
      DOMINO_UNROLL
      for (int rr = 0; rr < RB; ++rr) {
        __builtin_prefetch(reinterpret_cast<const char*>(w + rr * cols + c) + ahead, 0, 3);
        const vu raw = load_words(w + rr * cols + c);
        const vf we = bit_cast<vf>(raw << 16), wo = bit_cast<vf>(raw & 0xffff0000u);
        DOMINO_UNROLL
        for (int j = 0; j < JN; ++j) {
          e[rr * JN + j] += we * xe[j];
          o[rr * JN + j] += wo * xo[j];
        }
      }
    }
  } else {
    int64_t c = 0;
    for (; c + 2 * S <= cv; c += 2 * S) {
      vf x0[JN], x1[JN];
      DOMINO_UNROLL
      for (int j = 0; j < JN; ++j) {
        x0[j] = loadu(x + j * xs + c);
        x1[j] = loadu(x + j * xs + c + S);
      }
      DOMINO_UNROLL
      for (int rr = 0; rr < RB; ++rr) {
        __builtin_prefetch(reinterpret_cast<const char*>(w + rr * cols + c) + ahead, 0, 3);
        __builtin_prefetch(reinterpret_cast<const char*>(w + rr * cols + c + S) + ahead, 0, 3);
        const vf w0 = loadu(w + rr * cols + c), w1 = loadu(w + rr * cols + c + S);
        DOMINO_UNROLL
        for (int j = 0; j < JN; ++j) {
          e[rr * JN + j] += w0 * x0[j];
          o[rr * JN + j] += w1 * x1[j];
        }
      }
    }
    if (c < cv) {
      DOMINO_UNROLL
      for (int rr = 0; rr < RB; ++rr) {
        const vf w0 = loadu(w + rr * cols + c);
        DOMINO_UNROLL
        for (int j = 0; j < JN; ++j) e[rr * JN + j] += w0 * loadu(x + j * xs + c);
      }
    }
  }
  DOMINO_UNROLL
  for (int rr = 0; rr < RB; ++rr)
    DOMINO_UNROLL
    for (int j = 0; j < JN; ++j) acc[j * stride + rr] = e[rr * JN + j] + o[rr * JN + j];
}

// PASSES * RB consecutive rows against JN activations: the rows in PASSES passes of RB read
// side by side (the registers hold one pass's accumulators), then one reduce_lanes over all
// the row x activation sums (a fold of L vectors costs what a fold of fewer does: with
// r = 256 bf16, 8 steps a row, the folds and the scalar stores were ~a fifth of a 16-node
// tree step when they were run per 10 sums). RB = 1 is the rows-outer kernel: each row
// read start to end, one sequential weight stream, the activations re-read from L1 for
// every row.
template <int RB, int JN, int PASSES, typename W>
DOMINO_INLINE void dot_block(const W* __restrict w, int64_t cols, const float* __restrict x, int64_t xs,
                             float* __restrict y, int64_t ys, int64_t ahead) {
  constexpr int R = RB * PASSES;
  const int64_t cv = cols - cols % kStep<W>;
  vf acc[R * JN];
  DOMINO_UNROLL
  for (int p = 0; p < PASSES; ++p) interleaved_sums<RB, JN>(w + p * RB * cols, cols, x, xs, ahead, acc + p * RB, R);
  float sums[R * JN];
  reduce_lanes<R * JN>(acc, sums);
  DOMINO_UNROLL
  for (int j = 0; j < JN; ++j)
    DOMINO_UNROLL
    for (int rr = 0; rr < R; ++rr) {
      float s = sums[j * R + rr];
      for (int64_t c = cv; c < cols; ++c) s += to_float(w[rr * cols + c]) * x[j * xs + c];
      y[j * ys + rr] = s;
    }
}

// Several activations on avx512: 4 rows side by side against 2 activations held in
// registers (2 * 4 * 2 accumulators + 4 activation vectors + a row's widened weights of 32
// zmm: 8 loads per 16 FMAs, where rows outer re-reads every activation from L1 for every
// row, 17 loads per 16 FMAs), 2 passes per fold of 16 sums. With 16 registers (avx2, sse2)
// such a block holds too few sums to pay for its fold (2 x 2 with one fold of 8 lanes, or
// spills with two passes), and on the Zen 5 VM rows outer was faster there (paper-shape
// 16-node tree step, avx2: 8.6-8.9 ms against 9.2-9.4).
#if defined(__AVX512F__)
constexpr bool kInterleave = true;
#else
constexpr bool kInterleave = false;
#endif
constexpr int kJN = 2, kRB = 4, kPasses = 2;  // the avx512 blocking

// Rows [0, rows) against JN activations in blocks of PASSES * RB rows (dot_block), then
// single rows with the same arithmetic; each weight line prefetched `ahead` bytes on.
template <int RB, int JN, int PASSES, typename W>
DOMINO_INLINE void dot_rows(const W* w, int64_t rows, int64_t cols, const float* x, int64_t xs, float* y,
                            int64_t ys, int64_t ahead) {
  constexpr int R = RB * PASSES;
  int64_t row = 0;
  for (; row + R <= rows; row += R) dot_block<RB, JN, PASSES>(w + row * cols, cols, x, xs, y + row, ys, ahead);
  for (; row < rows; ++row) dot_block<1, JN, 1>(w + row * cols, cols, x, xs, y + row, ys, ahead);
}

// Rows outer: blocks of kAcc / JN rows, each read start to end (2 * JN <= kAcc
// accumulators), the prefetch kPrefetchBytes ahead. Interleaving the rows step by step
// measured 35-50 % slower from DRAM at batch 1 on the AVX2 build, at 2 rows as at 8.
template <int JN, typename W>
DOMINO_INLINE void dot_rows_outer(const W* w, int64_t rows, int64_t cols, const float* x, int64_t xs, float* y,
                                  int64_t ys) {
  static_assert(2 * JN <= kAcc);
  dot_rows<1, JN, kAcc / JN>(w, rows, cols, x, xs, y, ys, kPrefetchBytes);
}

template <typename W>
DOMINO_INLINE void rows_dot_impl(const W* w, int64_t rows, int64_t cols, const float* x,
                                 int64_t xs, int64_t nb, float* y, int64_t ys) {
  if (nb == 1) {
    // One activation (a batch-1 rollout, the weight stream's bound): one pass, kAcc rows
    // outer, each read start to end (one sequential stream).
    dot_rows_outer<1>(w, rows, cols, x, xs, y, ys);
    return;
  }
  // More: chunks of rows that stay in L1 (16 KB) while every block of activations passes
  // over them (interleaved on avx512, rows outer elsewhere), so the weights cross the
  // memory bus once per call whatever the batch (the first pass reads them from memory).
  const int64_t per_row = cols * static_cast<int64_t>(sizeof(W));
  constexpr int R = kInterleave ? kRB * kPasses : kAcc;  // a whole number of blocks
  int64_t chunk = (16384 / (per_row > 0 ? per_row : 1)) / R * R;
  if (chunk < R) chunk = R;
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
    const W* wc = w + r0 * cols;
    float* yc = y + r0;
    int64_t j = 0;
    if constexpr (kInterleave) {
      // every pass prefetches the next chunk's same line: it is in L1 when its passes start
      const int64_t ahead = chunk * per_row;
      for (; j + kJN <= nb; j += kJN)
        dot_rows<kRB, kJN, kPasses>(wc, n, cols, x + j * xs, xs, yc + j * ys, ys, ahead);
      for (; j < nb; ++j) dot_rows<kRB, 1, kPasses>(wc, n, cols, x + j * xs, xs, yc + j * ys, ys, ahead);
    } else {
      for (; j + kAcc / 2 <= nb; j += kAcc / 2) dot_rows_outer<kAcc / 2>(wc, n, cols, x + j * xs, xs, yc + j * ys, ys);
      if (j + 2 <= nb) { dot_rows_outer<2>(wc, n, cols, x + j * xs, xs, yc + j * ys, ys); j += 2; }
      if (j < nb) dot_rows_outer<1>(wc, n, cols, x + j * xs, xs, yc + j * ys, ys);
    }
  }
}

// ---- exponentials ---------------------------------------------------------------------
// exp on L floats (Cephes' expf reduction and polynomial) in plain vector arithmetic.
// Relative error below 2e-7 on [-87, 88]; inputs are clamped to that range (below it the
// result is ~1e-38 where the exact value is smaller, above it exp(88)).
DOMINO_INLINE vf exp_approx(vf x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  x = x > 88.0f ? splat(88.0f) : x;
  // Round to nearest by the 1.5 * 2^23 trick: no rounding instruction needed.
  const vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  vf r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * bit_cast<vf>(bits);
}

DOMINO_INLINE vf sigmoid(vf x) { return 1.0f / (1.0f + exp_approx(-x)); }

// exp on L / 2 doubles for x <= 0 (the shifted logits of a softmax): reduction by ln 2
// split in two parts and the degree-13 Taylor polynomial on |r| <= ln(2) / 2 (truncation
// error below 1e-17, so within a few ulp of the libm exp). x < -708.39 gives 0 where the
// exact value is a subnormal below 2.3e-308; NaN stays NaN.
DOMINO_INLINE vd exp_double(vd x) {
  const vd magic = vd{} + 6755399441055744.0;  // 1.5 * 2^52: round to integer in the low bits
  const vl underflow = x < -708.39;
  x = x < -708.39 ? vd{} - 708.39 : x;
  const vd t = x * 1.4426950408889634 + magic;
  const vd n = t - magic;
  const vl ni = bit_cast<vl>(t) - bit_cast<vl>(magic);
  vd r = x - n * 0.6931471803691238;  // ln 2, high part (exact in n * hi)
  r = r - n * 1.9082149292705877e-10;  // ln 2, low part
  vd p = vd{} + 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const vd scale = bit_cast<vd>((ni + 1023) << 52);
  const vd e = p * scale;
  return bit_cast<vd>(bit_cast<vl>(e) & ~underflow);
}

}  // namespace domino::cpu::DOMINO_ISA
