// The AMX path of the packed product (small_batch_linear_packed_amx.cpp): the same packed
// weight and meaning as packed_panels_f32 (packed_panels.h), the product in AMX tiles.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

#include "cpu/packed_panels.h"

namespace domino::cpu {

// Whether this CPU has AMX-BF16 (and AVX-512 BW/VL) and the OS granted this process the
// tile state (asked once, on the first call).
bool amx_available();

// out[m * ldo + (n - origin)] = bias[n] + sum over k of x[m, k] * weight[n, k] (no bias
// when null), for rows m < M and the outputs n < N of panels [p0, p1), in float32 or
// rounded once to bf16. x: amx_padded_rows(M) rows (packed_panels.h) of `pairs` column
// pairs as 32-bit words, `ldx` words apart. On the calling thread; needs amx_available().
void packed_panels_amx_f32(const c10::BFloat16* packed, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t M,
                           int64_t N, int64_t p0, int64_t p1, const float* bias, float* out, int64_t ldo,
                           int64_t origin);
void packed_panels_amx_bf16(const c10::BFloat16* packed, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t M,
                            int64_t N, int64_t p0, int64_t p1, const float* bias, c10::BFloat16* out, int64_t ldo,
                            int64_t origin);

}  // namespace domino::cpu
