// The AVX2 + FMA path of small_batch_linear_packed (and of packed_panels_f32, domino_head_expand's
// w2 product): the same packed panels, the product done by 8-lane FMAs on CPUs without
// AVX-512 (AMD Zen 2/3, Intel Haswell to Alder Lake). Layout, numerics and costs:
// small_batch_linear_packed_avx2.cpp.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace domino::cpu {

// Whether this CPU has AVX2 and FMA.
bool packed_avx2_available();

// out[m * ldo + (n - origin)] = bias[n] + sum over k of x[m, k] * weight[n, k] (no bias when
// null), for rows m < M and the outputs n < N of panels [p0, p1), in float32 or rounded once
// to bf16. bf16 panels [P, Kh, 48, 2]: x is float32, M rows of 2 * Kh columns `ldx` apart
// (a zero last column for an odd K). float32 panels [P, K, 48, 1]: x float32, M rows of K
// columns `ldx` apart. Each output is one FMA chain over the columns in order from +0 (the
// float32 panels' AVX-512 tiles sum the same chain: the same bits). On the calling thread;
// needs packed_avx2_available().
template <typename O>
void packed_panels_avx2(const c10::BFloat16* packed, int64_t pairs, const float* x, int64_t ldx, int64_t M,
                        int64_t N, int64_t p0, int64_t p1, const float* bias, O* out, int64_t ldo, int64_t origin);
template <typename O>
void packed_panels_avx2_f32(const float* packed, int64_t K, const float* x, int64_t ldx, int64_t M, int64_t N,
                            int64_t p0, int64_t p1, const float* bias, O* out, int64_t ldo, int64_t origin);

}  // namespace domino::cpu
