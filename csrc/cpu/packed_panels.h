// small_batch_linear_packed's layout check and its product on one thread, for a range of
// its panels: what domino_head_expand runs for w2 @ a when it is given w2 packed
// (domino_ops.pack_small_batch_linear_weight). Layout and numerics:
// small_batch_linear_packed.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace domino::cpu {

// Outputs per panel of the packed layout [P, ceil(K / 2), 48, 2].
constexpr int64_t kPackedPanelCols = 48;

// Whether this CPU has AVX512-BF16 (and -BW, -VL): the packed kernels need it.
bool small_batch_linear_packed_supported();

// The product it runs: "amx" (AMX tiles) or "avx512_bf16" (vectors); see
// small_batch_linear_packed.cpp.
const char* small_batch_linear_packed_path();

// `packed` (the argument `name`) is a [N, K] weight packed by pack_small_batch_linear_weight:
// on the CPU, contiguous, bf16, [ceil(N / 48), ceil(K / 2), 48, 2]; errors name `name`.
void check_packed_weight(const at::Tensor& packed, const char* name, int64_t N, int64_t K);

// The rows an x operand of M rows must hold for the packed product: M up to 16, else M
// rounded up to a multiple of 16 (the AMX path reads whole 16-row tiles; the rows past M
// are multiplied but never stored, and each row's outputs depend on that row alone, so
// their values do not matter: zeros). Defined in small_batch_linear_packed_amx.cpp.
int64_t amx_padded_rows(int64_t M);

// out[m * ldo + (n - 48 * p0)] = sum over k of x[m, k] * weight[n, k], in float32 (one
// VDPBF16PS lane per output, column pairs in order; or AMX tiles:
// small_batch_linear_packed_path()), for rows m < M and the outputs n < N of
// panels [p0, p1). x: amx_padded_rows(M) rows of `pairs` bf16 column pairs read as 32-bit
// words, `ldx` words apart (a zero high half past an odd K; zero rows past M); pairs >= 1
// (none would leave out unwritten: checked). On the calling thread; needs AVX512-BF16.
void packed_panels_f32(const c10::BFloat16* packed, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t M,
                       int64_t N, int64_t p0, int64_t p1, float* out, int64_t ldo);

}  // namespace domino::cpu
