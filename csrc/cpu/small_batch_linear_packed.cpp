// CPU kernel of small_batch_linear_packed: out[M, N] = x[M, K] @ weight[N, K]^T (+ bias[N])
// for bf16 x and a bf16 weight packed once, ahead of time, into VNNI panels
// (domino_ops.pack_small_batch_linear_weight), on CPUs with AVX512-BF16 (AMD Zen 4/5, Intel
// Cooper Lake, Sapphire Rapids and later).
//
// Bytes it must move: the packed weight once (N*K*2, padded to whole panels), whatever M
// is; x, out and the bias are noise next to it at the M of decoding and verification. Work:
// 2*M*N*K flops. At M = 1 the weight stream is the floor (memory bandwidth); from M of
// about 6 the VDPBF16PS throughput is (16 rows of a 576 x 576 layer: 26 us on 2 Zen 4
// cores, 402 GFLOP/s, where small_batch_linear's row-major tiles take 38 us;
// benchmarks/results/linear_zen4_session12_packed.txt).
//
// Why a packed layout: small_batch_linear reads the weight in place (row-major [N, K]), so
// each 16-lane accumulator holds one output's partial sums over K and must be reduced
// across its lanes at the end (fold + horizontal adds, ~3.5 instructions per output, ~20 %
// of the work at K = 576) and stored one element at a time. Packed, the 16 lanes of an
// accumulator are 16 consecutive outputs: no reduction, one vector store per 16 outputs.
//
// Layout: weight [N, K] -> packed [P, Kh, 48, 2] bf16, P = ceil(N / 48) panels, Kh =
// ceil(K / 2) column pairs: packed[p, k, c, j] = weight[48 p + c, 2 k + j], zero where that
// is past N or K. One panel is 48 outputs x all of K, contiguous (55 KB at K = 576): its
// 2 * 48 bf16 of one column pair are three 64-byte vectors.
//
// Tiles: 8 x rows x one panel = 24 accumulators of 16 lanes + 3 weight registers + 1
// broadcast of an x column pair. Per column pair: 3 weight loads, 8 broadcasts, 24
// VDPBF16PS. The panels are split over the threads (at::parallel_for). With more than 8 rows
// the rows are shared evenly by ceil(M / 8) tiles, and a panel's tiles take turns by blocks
// of 96 steps (18 KB: the accumulators wait in L1 between blocks), so every tile after the
// first reads the block from L1 and the weights stream at one even rate; with more than one
// row the tiles prefetch the stream (to L2) ahead, each its share (kBlockSteps below). With
// blocks of 32 steps, measured on the AMX Xeon VM (2 threads; SmolLM2's 211
// linears streamed; benchmarks/compare_builds.sh over linear_panels_ab.py, 3 alternating
// rounds, results/linear_panels_ab_xeon_session54_kblocks.txt) against one whole-panel pass
// per tile with the hardware prefetchers alone (and a share of the next panel prefetched
// when a panel took two tiles): float32 panels at 1 / 4 / 8 / 16 rows 26.0 / 34.0 / 40.8 /
// 50.5 -> 25.4 / 27.5 / 31.9 / 36.5 ms; bf16 panels on VDPBF16PS 15.6 / 21.9 / 26.6 / 36.6
// -> 15.4 / 17.1 / 20.7 / 30.6 ms. At one row (a decode step) a thread takes its panels two
// at a time, two streams instead of one (sixty-first session, the same VM, 3 and 2
// alternating rounds of benchmarks/packed_placement_ab.py, results/packed_two_panels_xeon_session61.txt):
// float32 panels 21.8-23.6 -> 19.6-20.1 ms, the copy bandwidth (the row-major kernel 20.7-21.2),
// bf16 panels on VDPBF16PS 13.2-13.7 -> 11.4-11.6 ms.
//
// Batch invariance, by construction: out[m, n] is one lane of one accumulator: starting at
// +0, for each column pair k in order, one VDPBF16PS (lane += w[2k+1] x[2k+1] + w[2k] x[2k];
// products of two bf16 are exact in fp32), then + bias[n] in fp32, then one rounding to
// out's dtype (bf16: round to nearest even, NaN kept a quiet NaN, as c10::BFloat16). That
// depends on K alone: not on M, the tile, the row's place in it, the panel split or the
// thread count. So a row computed alone is bit-identical to the same row among others.
// VDPBF16PS flushes denormal inputs and results to zero (a bf16 below 1.2e-38 counts as 0).
//
// On CPUs with AMX (Sapphire Rapids and later) the same panels feed AMX tiles instead
// (small_batch_linear_packed_amx.cpp): 16 rows for about the price of one, batch-invariant
// too, with other bits. bf16_path() below picks the path for every call of the process.
//
// On CPUs without AVX-512 (AVX2 and FMA: AMD Zen 2/3, Intel Haswell to Alder Lake) the same
// panels, bf16 and float32, feed 8-lane FMA tiles (small_batch_linear_packed_avx2.cpp): one FMA
// chain per output, batch-invariant, the float32 panels' bits.
//
// float32 panels (pack_small_batch_linear_weight(w, dtype=torch.float32); CPUs with
// AVX-512F, -BW and -VL, bf16 or not): [P, K, 48, 1] float32, packed[p, k, c, 0] =
// weight[48 p + c, k], for float32 x. The same tiles with FMAs: per column, 3 weight loads
// (the same 192 bytes a bf16 column pair takes), 8 broadcasts of an x element, 24 FMAs;
// out[m, n] is one lane: from +0, acc = fma(w[n, k], x[m, k], acc) for k in order, + bias,
// one rounding: batch-invariant as the bf16 panels. Why: the row-major kernel's fp32 tiles
// reduce every output across 16 lanes and reached ~65 % of the FMA peak at 16 rows with the
// weights in cache on the Zen 4 VM (77 of 117 G multiply-adds/s on 2 cores) and ~53 %
// streaming them, so a 16-token fp32 forward cost ~1.6x a one-token one. Bytes: N*K*4.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DOMINO_SBLP_X86 1
#else
#define DOMINO_SBLP_X86 0
#endif

#include "cpu/aligned.h"
#include "cpu/kernel_switches.h"
#include "cpu/packed_outputs.h"
#include "cpu/packed_panels.h"
#include "cpu/small_batch_linear_packed_amx.h"
#include "cpu/small_batch_linear_packed_avx2.h"
#include "cpu/layer_kernels.h"
#include "ops.h"

namespace domino::cpu {
namespace {

using BF16 = c10::BFloat16;
// x's column pairs read as 32-bit words (bf16 storage seen through another type)
typedef uint32_t __attribute__((may_alias)) PairWord;

constexpr int kPanelVectors = 3;                        // 16-lane accumulators per x row
constexpr int64_t kPanelCols = 16 * kPanelVectors;      // outputs per panel
static_assert(kPanelCols == kPackedPanelCols, "packed_panels.h names the panel width");
constexpr int kRowsPerTile = 8;                         // x rows per tile: 24 accumulators

// bf16 panels: the epilogue's AVX-512 (F, BW, VL) and AVX512-BF16.
bool cpu_has_avx512_bf16() {
#if DOMINO_SBLP_X86
  static const bool ok = packed_outputs::cpu_supported() && __builtin_cpu_supports("avx512bf16");
  return ok;
#else
  return false;
#endif
}

// float32 panels: the epilogue's AVX-512 (F, BW, VL) alone.
bool cpu_has_avx512() {
#if DOMINO_SBLP_X86
  return packed_outputs::cpu_supported();
#else
  return false;
#endif
}

// Calls tile(std::integral_constant<int, MR>, m, t) for tile t of the ceil(M / kRowsPerTile)
// tiles of M x rows, row m its first: the rows shared as evenly as the tiles allow (9 rows:
// 4 + 5, not 8 + 1), because a tile of one or two rows has too few accumulators to hide
// VDPBF16PS's latency and costs about what a four-row tile costs.
template <class Tile>
inline void for_each_tile(int64_t M, Tile&& tile) {
  const int64_t tiles = (M + kRowsPerTile - 1) / kRowsPerTile;
  for (int64_t t = 0, m = 0; t < tiles; ++t) {
    const int64_t rows = (M - m) / (tiles - t);  // the tiles left take the rows left evenly, larger ones last
    switch (rows) {
      case 1: tile(std::integral_constant<int, 1>{}, m, t); break;
      case 2: tile(std::integral_constant<int, 2>{}, m, t); break;
      case 3: tile(std::integral_constant<int, 3>{}, m, t); break;
      case 4: tile(std::integral_constant<int, 4>{}, m, t); break;
      case 5: tile(std::integral_constant<int, 5>{}, m, t); break;
      case 6: tile(std::integral_constant<int, 6>{}, m, t); break;
      case 7: tile(std::integral_constant<int, 7>{}, m, t); break;
      case 8: tile(std::integral_constant<int, 8>{}, m, t); break;
      default: TORCH_INTERNAL_ASSERT(false, "for_each_tile: a tile of ", rows, " rows");
    }
    m += rows;
  }
}
static_assert(kRowsPerTile == 8, "for_each_tile's cases cover tiles of 1 to 8 rows");

#if DOMINO_SBLP_X86
#define DOMINO_SBLP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

// A panel is a stream of steps: a bf16 column pair or a float32 column of its 48 outputs,
// 192 bytes (three 64-byte vectors) either way. Each panel dtype says how one step of x
// meets one step of the panel.
constexpr int64_t kStepBytes = 4 * kPanelCols;
struct Bf16Steps {  // x as 32-bit column pairs; VDPBF16PS (AVX512-BF16)
  using W = BF16;
  using X = PairWord;
  static constexpr int64_t kStepElems = 2 * kPanelCols;
  DOMINO_SBLP_TARGET static __m512 broadcast(const X* x) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(*x)));
  }
  // acc += w[2j+1] x[1] + w[2j] x[0] per lane j. One instruction of inline assembly, so the
  // tiles can share one AVX-512F body with the float32 panels (GCC will not inline an
  // AVX512-BF16 intrinsic into it).
  DOMINO_SBLP_TARGET static __m512 madd(__m512 acc, __m512 w, __m512 xb) {
    asm("vdpbf16ps %2, %1, %0" : "+v"(acc) : "v"(w), "v"(xb));
    return acc;
  }
};
struct F32Steps {  // float32 x; FMA
  using W = float;
  using X = float;
  static constexpr int64_t kStepElems = kPanelCols;
  DOMINO_SBLP_TARGET static __m512 broadcast(const X* x) { return _mm512_set1_ps(*x); }
  DOMINO_SBLP_TARGET static __m512 madd(__m512 acc, __m512 w, __m512 xb) { return _mm512_fmadd_ps(w, xb, acc); }
};

// Steps per K block: a panel's tiles take turns block by block, so the tiles after the
// first read the block (18 KB) from L1 and the weights stream at one even rate instead of a
// burst per tile (the first tile waiting on memory, the others on the FMAs). Each turn
// reloads a tile's accumulators, and at blocks of 32 steps that cost ~10 % of the
// multiply-adds (a 32-step 8-row tile runs at 95 G/s against 110 at 96 steps, in L1, one
// Zen 4 core); a block's turn touches 18 KB of weights and per row 384 bytes of x and
// 192 of accumulators: a 32 KB L1 holds it to ~24 rows (16: 27 KB). SmolLM2's 211 linears
// at 9 / 12 / 16 rows against blocks of 32 steps, tiles of 8 rows and the rest (below) and
// a prefetch 32 steps ahead (sixty-second session, Zen 4 VM, 3 alternating rounds of
// benchmarks/linear_panels_ab.py, results/linear_panels_ab_zen4_session62_blocks96.txt):
// bf16 panels 11.9-13.2 / 12.7-13.7 / 15.8-17.2 -> 10.4-11.7 / 12.4-12.7 / 15.4-15.8 ms
// (8 rows, the same code: 9.8-11.2 before, 9.8-10.7 after), float32 panels 23.1-23.8 /
// 24.5-25.7 / 28.8-30.5 -> 17.3-21.0 / 20.5-21.4 / 27.0-27.5 ms.
constexpr int64_t kBlockSteps = 96;
// How far ahead of the tiles' reads the weight stream is prefetched (to L2), in steps. With
// more than one tile, one block: each tile prefetches a share of the next block, so the
// block must have arrived whole before the first tile reaches it (half a block ahead cost
// ~25 % at 9 rows). One tile (2 to 8 rows) streams the panel in one pass, and 32 steps
// (6 KB) ahead served it best (96 steps ahead cost ~5-8 %). The hardware prefetchers alone
// left 2- to 16-row tiles waiting on memory (see the header's numbers); at one row, two
// streams (one_row_two_panels), they serve best (prefetching a single stream too cost ~3 %).
constexpr int64_t kOneTilePrefetchSteps = 32;

// Steps [s0, s1) of rows [0, MR) of x (`ldx` apart) against one panel (`steps` steps,
// outputs [n0, n0 + cols)): the accumulators start at +0 (s0 = 0) or from `keep`, and end
// in `keep`, or (s1 = steps) plus the bias in out, row m's output n at out[m * ldo + n -
// origin]. With `prefetch_bytes` > 0, tile t of a panel's T tiles prefetches, that far ahead,
// the lines of the steps s = t mod T, so the T tiles of a block prefetch the stream once,
// spread over all of them (past the weight's end near its last steps: a prefetch never
// faults). Needs steps >= 1 (the last block writes out). `keep` holds MR x 48 floats, L1
// for the M of decoding and verification (with a block's weights and x, to ~24 rows).
template <int MR, class P, typename O>
DOMINO_SBLP_TARGET inline void tile_block(const typename P::W* panel, int64_t steps, int64_t s0, int64_t s1,
                                          const typename P::X* x, int64_t ldx, float* keep, int64_t prefetch_bytes, int64_t t,
                                          int64_t T, const float* bias, O* out, int64_t ldo, int64_t origin,
                                          int64_t n0, int64_t cols) {
  __m512 acc[MR][kPanelVectors];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kPanelVectors; ++v)
      acc[m][v] = s0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(keep + (m * kPanelVectors + v) * 16);
  int64_t until_prefetch = ((t - s0) % T + T) % T;  // steps to the next s = t mod T
  for (int64_t s = s0; s < s1; ++s) {
    const char* ws = reinterpret_cast<const char*>(panel + s * P::kStepElems);
    if (prefetch_bytes > 0 && until_prefetch-- == 0) {
      // an address, not a pointer into the weight: near its end it lies past it
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(ws) + prefetch_bytes;
      for (int v = 0; v < kPanelVectors; ++v) _mm_prefetch(reinterpret_cast<const char*>(ahead + 64 * v), _MM_HINT_T1);
      until_prefetch = T - 1;
    }
    __m512 w[kPanelVectors];
    for (int v = 0; v < kPanelVectors; ++v) w[v] = _mm512_loadu_ps(reinterpret_cast<const float*>(ws) + 16 * v);
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = P::broadcast(x + m * ldx + s);
      for (int v = 0; v < kPanelVectors; ++v) acc[m][v] = P::madd(acc[m][v], w[v], xb);
    }
  }
  if (s1 == steps) {
    packed_outputs::store_tile(acc, bias, out, ldo, origin, n0, cols);
    return;
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kPanelVectors; ++v) _mm512_store_ps(keep + (m * kPanelVectors + v) * 16, acc[m][v]);
}

// One row against two panels at once, each output one chain from +0 over the steps in
// order (tile_block's bits): two streams of weights instead of one, so the hardware
// prefetchers keep more lines in flight at the one row of a decode step.
template <class P, typename O>
DOMINO_SBLP_TARGET inline void one_row_two_panels(const typename P::W* a, const typename P::W* b, int64_t steps,
                                                  const typename P::X* x, const float* bias, O* out, int64_t origin,
                                                  int64_t n0, int64_t N) {
  __m512 acc_a[1][kPanelVectors], acc_b[1][kPanelVectors];
  for (int v = 0; v < kPanelVectors; ++v) acc_a[0][v] = acc_b[0][v] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    const __m512 xb = P::broadcast(x + s);
    const float* wa = reinterpret_cast<const float*>(a + s * P::kStepElems);
    const float* wb = reinterpret_cast<const float*>(b + s * P::kStepElems);
    for (int v = 0; v < kPanelVectors; ++v) {
      acc_a[0][v] = P::madd(acc_a[0][v], _mm512_loadu_ps(wa + 16 * v), xb);
      acc_b[0][v] = P::madd(acc_b[0][v], _mm512_loadu_ps(wb + 16 * v), xb);
    }
  }
  packed_outputs::store_tile(acc_a, bias, out, 0, origin, n0, std::min(kPanelCols, N - n0));
  packed_outputs::store_tile(acc_b, bias, out, 0, origin, n0 + kPanelCols, std::min(kPanelCols, N - n0 - kPanelCols));
}

// Panels [p0, p1) (`steps` steps each) for all M rows: output n of row m at
// out[m * ldo + n - origin]. A panel's tiles take turns by K blocks; each tile's
// accumulators live in registers through a block and in `saved` (L1) between blocks, so
// every output is still one chain from +0 over the steps in order, whatever M, the tile or
// the blocking (batch invariance).
template <class P, typename O>
DOMINO_SBLP_TARGET __attribute__((flatten)) void run_panels(const typename P::W* packed, int64_t steps,
                                                             const typename P::X* x, int64_t ldx, int64_t M,
                                                             const float* bias, O* out, int64_t ldo, int64_t origin,
                                                             int64_t N, int64_t p0, int64_t p1) {
  const int64_t tiles = (M + kRowsPerTile - 1) / kRowsPerTile;
  const int64_t block = tiles > 1 ? kBlockSteps : steps;  // one tile: no turns to take
  const int64_t prefetch_bytes = M == 1 ? 0 : (tiles > 1 ? kBlockSteps : kOneTilePrefetchSteps) * kStepBytes;
  if (M == 1) {  // a decode step: two panels at a time
    for (; p0 + 1 < p1; p0 += 2) {
      const typename P::W* panel = packed + p0 * steps * P::kStepElems;
      one_row_two_panels<P>(panel, panel + steps * P::kStepElems, steps, x, bias, out, origin, p0 * kPanelCols, N);
    }
  }
  thread_local CacheLineVector<float> saved;
  saved.resize(tiles * kRowsPerTile * kPanelCols);
  for (int64_t p = p0; p < p1; ++p) {
    const typename P::W* panel = packed + p * steps * P::kStepElems;
    const int64_t n0 = p * kPanelCols, cols = std::min(kPanelCols, N - n0);
    for (int64_t s0 = 0; s0 < steps; s0 += block) {
      const int64_t s1 = std::min(steps, s0 + block);
      for_each_tile(M, [&](auto mr, int64_t m, int64_t t) {
        tile_block<decltype(mr)::value, P>(panel, steps, s0, s1, x + m * ldx, ldx,
                                           saved.data() + t * kRowsPerTile * kPanelCols,
                                           prefetch_bytes, t, tiles, bias, out + m * ldo, ldo, origin, n0,
                                           cols);
      });
    }
  }
}

#endif

// packed_weight: float32 panels [ceil(N / 48), K, 48, 1] of a [N, K] weight.
void check_packed_weight_f32(const at::Tensor& packed, int64_t N, int64_t K) {
  TORCH_CHECK(packed.device().is_cpu(), "packed_weight must be on the CPU, got ", packed.device());
  TORCH_CHECK(packed.dim() == 4, "packed_weight must have 4 dimensions, got shape ", packed.sizes());
  TORCH_CHECK(packed.is_contiguous(), "packed_weight must be contiguous");
  const int64_t panels = (N + kPanelCols - 1) / kPanelCols;
  TORCH_CHECK(packed.size(0) == panels && packed.size(1) == K && packed.size(2) == kPanelCols && packed.size(3) == 1,
              "packed_weight must have shape [", panels, ", ", K, ", ", kPanelCols, ", 1] (a [", N, ", ", K,
              "] weight packed by pack_small_batch_linear_weight(..., dtype=torch.float32)), got ", packed.sizes());
}

void check_args(const at::Tensor& x, const at::Tensor& packed, int64_t N, const std::optional<at::Tensor>& bias,
                const at::Tensor& out) {
  auto check = [](const at::Tensor& t, const char* name, int64_t dim) {
    TORCH_CHECK(t.defined(), name, " must be a tensor");
    TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
    TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got shape ", t.sizes());
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  };
  check(x, "x", 2);
  check(out, "out", 2);
  TORCH_CHECK(packed.defined(), "packed_weight must be a tensor");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 || packed.scalar_type() == at::kFloat,
              "packed_weight must be bfloat16 or float32, got ", packed.scalar_type());
  const bool f32 = packed.scalar_type() == at::kFloat;  // float32 panels, else bf16 ones
  TORCH_CHECK(x.scalar_type() == (f32 ? at::kFloat : at::kBFloat16), "x must be ", f32 ? "float32" : "bfloat16",
              " (packed_weight is ", f32 ? "float32" : "bfloat16", "), got ", x.scalar_type());
  TORCH_CHECK(out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat,
              "out must be bfloat16 or float32, got ", out.scalar_type());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K > 0, "x must have at least one column, got shape ", x.sizes());
  TORCH_CHECK(N > 0, "out_features must be positive, got ", N);
  if (f32)
    check_packed_weight_f32(packed, N, K);
  else
    check_packed_weight(packed, "packed_weight", N, K);
  TORCH_CHECK(out.size(0) == M && out.size(1) == N, "out must have shape [", M, ", ", N, "], got ", out.sizes());
  auto no_overlap = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(out.numel() == 0 || t.numel() == 0 || at::get_overlap_status(out, t) == at::MemOverlapStatus::No,
                "out must not overlap ", name);
  };
  no_overlap(x, "x");
  no_overlap(packed, "packed_weight");
  if (bias.has_value() && bias->defined()) {
    check(*bias, "bias", 1);
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 || bias->scalar_type() == at::kFloat,
                "bias must be bfloat16 or float32, got ", bias->scalar_type());
    TORCH_CHECK(bias->size(0) == N, "bias must have shape [", N, "], got ", bias->sizes());
    no_overlap(*bias, "bias");
  }
}

// Which product runs on bf16 panels: AMX tiles where the CPU has them
// (small_batch_linear_packed_amx.cpp), else AVX512-BF16 vectors (this file), else AVX2 FMAs
// (small_batch_linear_packed_avx2.cpp). DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH=
// auto|amx|avx512_bf16|avx2 picks one (read once; domino_ops.cpu.kernel_switch switches it
// for a test or a benchmark; a process keeps one for all its forwards, as they sum in
// different orders).
enum class Path { kAmx, kAvx512Bf16, kAvx2 };

const char* path_name(Path p) { return p == Path::kAmx ? "amx" : p == Path::kAvx512Bf16 ? "avx512_bf16" : "avx2"; }

// The variable's value, or null for auto.
const char* forced_path() {
  const char* env = kernel_switch(KernelSwitch::kPackedPath);
  if (env == nullptr || *env == '\0' || std::strcmp(env, "auto") == 0) return nullptr;
  return env;
}

Path bf16_path() {
  TORCH_CHECK(cpu_has_avx512_bf16() || packed_avx2_available(),
              "small_batch_linear_packed needs a CPU with AVX2 and FMA, or AVX512-BF16 (and AVX512-BW/VL); this one "
              "has neither: use small_batch_linear");
  const bool amx = amx_available();
  const char* env = forced_path();
  if (env == nullptr) return amx ? Path::kAmx : cpu_has_avx512_bf16() ? Path::kAvx512Bf16 : Path::kAvx2;
  if (std::strcmp(env, "avx2") == 0) {
    TORCH_CHECK_VALUE(packed_avx2_available(), "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH=avx2 but this CPU has no AVX2 and FMA");
    return Path::kAvx2;
  }
  if (std::strcmp(env, "avx512_bf16") == 0) {
    TORCH_CHECK_VALUE(cpu_has_avx512_bf16(),
                "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH=avx512_bf16 but this CPU has no AVX512-BF16 (with AVX512-BW/VL)");
    return Path::kAvx512Bf16;
  }
  TORCH_CHECK_VALUE(std::strcmp(env, "amx") == 0,
              "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH must be auto, amx, avx512_bf16 or avx2, got '", env, "'");
  TORCH_CHECK_VALUE(amx, "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH=amx but this CPU has no AMX-BF16 (with AVX512-BW/VL), "
              "or the OS refused this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)");
  return Path::kAmx;
}

// float32 panels: AVX-512F tiles where the CPU has them, else (or when the variable says
// avx2) AVX2 tiles; both compute the same FMA chain, so the same bits.
bool f32_on_avx2() {
  TORCH_CHECK(cpu_has_avx512() || packed_avx2_available(),
              "small_batch_linear_packed with float32 panels needs a CPU with AVX2 and FMA, or AVX-512F (and -BW, -VL); "
              "this one has neither: use small_batch_linear");
  const char* env = forced_path();
  if (env != nullptr && std::strcmp(env, "avx2") != 0) bf16_path();  // refuses a bad value by name
  return !cpu_has_avx512() || (env != nullptr && std::strcmp(env, "avx2") == 0);
}

// x [M, K] bf16 as float32 rows of 2 * pairs columns (a zero last column for an odd K), in a
// buffer of the calling thread: what the AVX2 tiles broadcast from.
const float* x_as_f32(const BF16* x, int64_t M, int64_t K, int64_t pairs) {
  thread_local CacheLineVector<float> xf;
  xf.resize(M * 2 * pairs);
  for (int64_t m = 0; m < M; ++m) {
    float* d = xf.data() + m * 2 * pairs;
    for (int64_t k = 0; k < K; ++k) d[k] = static_cast<float>(x[m * K + k]);
    if (K % 2 != 0) d[K] = 0.0f;
  }
  return xf.data();
}

}  // namespace

bool small_batch_linear_packed_supported() { return cpu_has_avx512_bf16() || packed_avx2_available(); }

bool small_batch_linear_packed_f32_supported() { return cpu_has_avx512() || packed_avx2_available(); }

const char* small_batch_linear_packed_path() { return path_name(bf16_path()); }

void check_packed_weight(const at::Tensor& packed, const char* name, int64_t N, int64_t K) {
  TORCH_CHECK(packed.defined(), name, " must be a tensor");
  TORCH_CHECK(packed.device().is_cpu(), name, " must be on the CPU, got ", packed.device());
  TORCH_CHECK(packed.dim() == 4, name, " must have 4 dimensions, got shape ", packed.sizes());
  TORCH_CHECK(packed.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16, name, " must be bfloat16, got ", packed.scalar_type());
  const int64_t panels = (N + kPanelCols - 1) / kPanelCols, pairs = (K + 1) / 2;
  TORCH_CHECK(packed.size(0) == panels && packed.size(1) == pairs && packed.size(2) == kPanelCols &&
                  packed.size(3) == 2,
              name, " must have shape [", panels, ", ", pairs, ", ", kPanelCols, ", 2] (a [", N, ", ", K,
              "] weight packed by pack_small_batch_linear_weight), got ", packed.sizes());
}

void packed_panels_f32(const BF16* packed, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t M, int64_t N,
                       int64_t p0, int64_t p1, float* out, int64_t ldo) {
  TORCH_CHECK(pairs >= 1, "packed_panels_f32: the weight needs at least one column pair, got ", pairs);
  const Path path = bf16_path();
  const int64_t panels = (N + kPanelCols - 1) / kPanelCols;
  if (path == Path::kAvx2) {
    // The column pairs' words as float32 columns: the low half the even column, the high
    // half the odd one.
    thread_local CacheLineVector<float> xf;
    xf.resize(M * 2 * pairs);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < pairs; ++k) {
        const uint32_t word = x[m * ldx + k], lo = word << 16, hi = word & 0xffff0000u;
        std::memcpy(&xf[m * 2 * pairs + 2 * k], &lo, 4);
        std::memcpy(&xf[m * 2 * pairs + 2 * k + 1], &hi, 4);
      }
    packed_panels_avx2<float>(packed, pairs, xf.data(), 2 * pairs, M, N, p0, std::min(p1, panels), nullptr, out, ldo,
                              p0 * kPanelCols);
    return;
  }
#if DOMINO_SBLP_X86
  if (path == Path::kAmx) {
    packed_panels_amx_f32(packed, pairs, x, ldx, M, N, p0, std::min(p1, panels), nullptr, out, ldo, p0 * kPanelCols);
    return;
  }
  run_panels<Bf16Steps>(packed, pairs, reinterpret_cast<const PairWord*>(x), ldx, M, nullptr, out, ldo,
                        p0 * kPanelCols, N, p0, std::min(p1, panels));
#endif
}

namespace {

// The bias as float32 (null: none); `keep` holds a converted copy.
const float* bias_f32(const std::optional<at::Tensor>& bias, at::Tensor& keep) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  keep = bias->scalar_type() == at::kFloat ? bias->contiguous() : bias->to(at::kFloat);
  return keep.data_ptr<float>();
}

// float32 x times float32 panels (checked by check_args).
void small_batch_linear_packed_f32(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                   const std::optional<at::Tensor>& bias, at::Tensor& out) {
  const bool avx2 = f32_on_avx2();
  const int64_t M = x.size(0), K = x.size(1);
  if (M == 0) return;
  const int64_t panels = packed.size(0);
  at::Tensor keep;
  const float* b = bias_f32(bias, keep);
  const float* w = packed.data_ptr<float>();
  const float* xf = x.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (32 << 10) / (kPanelCols * K * 4));
  auto run = [&](auto* o) {
    at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
      if (avx2) {
        packed_panels_avx2_f32(w, K, xf, K, M, N, p0, p1, b, o, N, 0);
        return;
      }
#if DOMINO_SBLP_X86
      run_panels<F32Steps>(w, K, xf, K, M, b, o, N, 0, N, p0, p1);
#endif
    });
  };
  if (out.scalar_type() == at::kFloat) run(out.data_ptr<float>());
  else run(out.data_ptr<BF16>());
}

}  // namespace

PackedProductRunner prepare_packed_product(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                           const std::optional<at::Tensor>& bias, at::Tensor out) {
  check_args(x, packed, N, bias, out);
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16, "prepare_packed_product takes bf16 panels");
  const Path path = bf16_path();
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t pairs = (K + 1) / 2;
  PackedProductRunner r;
  r.panels = M == 0 ? 0 : packed.size(0);
  // At least ~32 KB of weights per thread, so tiny layers do not pay for a fork.
  r.grain = std::max<int64_t>(1, (32 << 10) / (kPanelCols * 2 * pairs * 2));
  if (r.panels == 0) return r;
  const float* b = bias_f32(bias, r.bias_f32);
  const BF16* w = packed.data_ptr<BF16>();
  float* out_f32 = out.scalar_type() == at::kFloat ? out.data_ptr<float>() : nullptr;
  BF16* out_bf16 = out.scalar_type() == at::kFloat ? nullptr : out.data_ptr<BF16>();
  if (path == Path::kAvx2) {
    const float* xf = x_as_f32(x.data_ptr<BF16>(), M, K, pairs);  // the calling thread's buffer
    r.run = [=](int64_t p0, int64_t p1) {
      if (out_f32) packed_panels_avx2(w, pairs, xf, 2 * pairs, M, N, p0, p1, b, out_f32, N, 0);
      else packed_panels_avx2(w, pairs, xf, 2 * pairs, M, N, p0, p1, b, out_bf16, N, 0);
    };
    return r;
  }
#if DOMINO_SBLP_X86
  const bool amx = path == Path::kAmx;
  // x as 32-bit column pairs: in place when K is even and the path reads only x's M rows,
  // else copied once with a zero last column (odd K) and zero rows up to amx_padded_rows(M)
  // (the AMX path), into the calling thread's buffer.
  const int64_t rows = amx ? amx_padded_rows(M) : M;
  const PairWord* xw = reinterpret_cast<const PairWord*>(x.data_ptr<BF16>());
  thread_local CacheLineVector<BF16> xpad;
  if (K % 2 != 0 || rows != M) {
    xpad.assign(rows * 2 * pairs, BF16(0.0f));
    for (int64_t m = 0; m < M; ++m) std::memcpy(xpad.data() + m * 2 * pairs, x.data_ptr<BF16>() + m * K, K * sizeof(BF16));
    xw = reinterpret_cast<const PairWord*>(xpad.data());
  }
  if (amx) {
    const uint32_t* xa = reinterpret_cast<const uint32_t*>(xw);
    r.run = [=](int64_t p0, int64_t p1) {
      if (out_f32) packed_panels_amx_f32(w, pairs, xa, pairs, M, N, p0, p1, b, out_f32, N, 0);
      else packed_panels_amx_bf16(w, pairs, xa, pairs, M, N, p0, p1, b, out_bf16, N, 0);
    };
    return r;
  }
  r.run = [=](int64_t p0, int64_t p1) {
    if (out_f32) run_panels<Bf16Steps>(w, pairs, xw, pairs, M, b, out_f32, N, 0, N, p0, p1);
    else run_panels<Bf16Steps>(w, pairs, xw, pairs, M, b, out_bf16, N, 0, N, p0, p1);
  };
#endif
  return r;
}

void small_batch_linear_packed_cpu(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                                   const std::optional<at::Tensor>& bias, at::Tensor out) {
  if (packed.defined() && packed.scalar_type() == at::kFloat) {
    check_args(x, packed, N, bias, out);
    small_batch_linear_packed_f32(x, packed, N, bias, out);
    return;
  }
  const PackedProductRunner r = prepare_packed_product(x, packed, N, bias, out);
  at::parallel_for(0, r.panels, r.grain, [&](int64_t p0, int64_t p1) { r.run(p0, p1); });
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) {
  m.impl("small_batch_linear_packed", &domino::cpu::small_batch_linear_packed_cpu);
}
