// The epilogue both packed products share (small_batch_linear_packed.cpp's AVX512-BF16
// vectors, small_batch_linear_packed_amx.cpp's AMX tiles): 16 consecutive outputs of one row,
// their float32 sums plus the bias (when there is one) rounded once to out's dtype.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <type_traits>

namespace domino::cpu::packed_outputs {

#define DOMINO_PACKED_OUT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

// Whether this CPU runs the epilogue: AVX-512F with BW and VL (every packed product needs it).
inline bool cpu_supported() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return ok;
}

// The lanes of the 16-output block starting `c0` outputs into a block of `cols` (c0 < cols).
inline __mmask16 lanes(int64_t cols, int64_t c0) {
  return cols - c0 >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (cols - c0)) - 1u);
}

// 16 fp32 -> 16 bf16, round to nearest even, NaN -> 0x7fc0 (c10::BFloat16's conversion).
DOMINO_PACKED_OUT_TARGET inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0)));
}

// The bias of those lanes (null: none).
DOMINO_PACKED_OUT_TARGET inline __m512 load_bias(const float* bias, __mmask16 mask) {
  return bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
}

// dst[lanes] = sum (+ bias when has_bias: adding +0.0 would turn a -0.0 sum into +0.0),
// rounded once to O.
template <typename O>
DOMINO_PACKED_OUT_TARGET inline void store(__m512 sum, bool has_bias, __m512 bias, O* dst, __mmask16 mask) {
  const __m512 y = has_bias ? _mm512_add_ps(sum, bias) : sum;
  if constexpr (std::is_same_v<O, float>)
    _mm512_mask_storeu_ps(dst, mask, y);
  else
    _mm256_mask_storeu_epi16(dst, mask, to_bf16(y));
}

// A tile's epilogue: rows [0, MR) of a panel's 48 outputs, acc[m][v] holding outputs
// n0 + 16 v .. n0 + 16 v + 15 of row m (those < n0 + cols written), row m's output n at
// out[m * ldo + n - origin], plus bias[n] (null: none).
template <int MR, int Vectors, typename O>
DOMINO_PACKED_OUT_TARGET inline void store_tile(const __m512 (&acc)[MR][Vectors], const float* bias, O* out,
                                                int64_t ldo, int64_t origin, int64_t n0, int64_t cols) {
  for (int v = 0; v < Vectors; ++v) {
    const int64_t c0 = 16 * v;
    if (c0 >= cols) break;
    const __mmask16 mask = lanes(cols, c0);
    const __m512 b = load_bias(bias == nullptr ? nullptr : bias + n0 + c0, mask);
    for (int m = 0; m < MR; ++m) store(acc[m][v], bias != nullptr, b, out + m * ldo + (n0 - origin) + c0, mask);
  }
}

}  // namespace domino::cpu::packed_outputs
#endif
