// The vector units' peak on one core: 12 independent accumulators (more than the FMA
// latency needs), one instruction each per iteration, no loads. Prints G multiply-adds/s
// for VFMADD231PS ymm (AVX2 + FMA), VFMADD231PS zmm and VDPBF16PS zmm (a CPU stops at the
// first it lacks).
// The ceilings that benchmarks/README.md sets the small-batch linear's rates against.
//
//     g++ -O2 -o /tmp/peak benchmarks/peak_multiply_adds.cpp && /tmp/peak
//     (/tmp/peak & /tmp/peak & wait)   # both cores at once
#include <immintrin.h>

#include <chrono>
#include <cstdio>

constexpr long kIters = 100000000;
constexpr int kAcc = 12;

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

__attribute__((target("avx2,fma"))) double fma_ymm() {
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(i * 0.001f);
  const __m256 a = _mm256_set1_ps(1.0001f), b = _mm256_set1_ps(0.9999f);
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(a, b, acc[i]);
  }
  const double s = since(t0);
  float sink = 0;
  for (int i = 0; i < kAcc; ++i) sink += acc[i][0];
  if (sink == 1234.5f) std::printf("-");
  return s;
}

__attribute__((target("avx512f"))) double fma_zmm() {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(i * 0.001f);
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
  }
  const double s = since(t0);
  float sink = 0;
  for (int i = 0; i < kAcc; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  if (sink == 1234.5f) std::printf("-");  // keeps the loop
  return s;
}

__attribute__((target("avx512f,avx512bf16"))) double dpbf16_zmm() {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(i * 0.001f);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f80);
  const auto t0 = Clock::now();
  for (long it = 0; it < kIters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  const double s = since(t0);
  float sink = 0;
  for (int i = 0; i < kAcc; ++i) sink += _mm512_reduce_add_ps(acc[i]);
  if (sink == 1234.5f) std::printf("-");
  return s;
}

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return std::puts("no AVX2 + FMA"), 1;
  double s = fma_ymm();
  std::printf("VFMADD231PS ymm: %.1f G multiply-adds/s (%.2f instructions/ns)\n", kIters * kAcc * 8.0 / s / 1e9,
              kIters * kAcc / s / 1e9);
  if (!__builtin_cpu_supports("avx512f")) return std::puts("no AVX-512F"), 0;
  s = fma_zmm();
  std::printf("VFMADD231PS zmm: %.1f G multiply-adds/s (%.2f instructions/ns)\n", kIters * kAcc * 16.0 / s / 1e9,
              kIters * kAcc / s / 1e9);
  if (!__builtin_cpu_supports("avx512bf16")) return std::puts("no AVX512-BF16"), 0;
  s = dpbf16_zmm();
  std::printf("VDPBF16PS zmm: %.1f G multiply-adds/s (%.2f instructions/ns)\n", kIters * kAcc * 32.0 / s / 1e9,
              kIters * kAcc / s / 1e9);
}
