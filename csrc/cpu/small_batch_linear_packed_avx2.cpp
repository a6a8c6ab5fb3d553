// The AVX2 + FMA path of small_batch_linear_packed (and of packed_panels_f32): the packed
// panels of small_batch_linear_packed.cpp multiplied by 8-lane FMAs, for CPUs without
// AVX-512 (AMD Zen 2/3, Intel Haswell to Alder Lake).
//
// Bytes it must move: the packed weight once (N*K*2 for bf16 panels, N*K*4 for float32 ones,
// padded to whole panels of 48 outputs), whatever M is; x (converted once per call to float32
// rows by the caller), out and the bias are noise next to it. Work: 2*M*N*K flops. At M = 1
// the weight stream is the floor: one tile pass reads a panel front to back, so the hardware
// prefetchers follow it. At the 6-16 rows of a verification the FMAs are: 2 ports of 8 lanes,
// ~46 G multiply-adds/s per Zen 3 core, so a bf16 SmolLM2-135M forward over 16 tokens needs
// >= ~23 ms of FMAs on 2 cores, about what its one-token weight stream takes at ~13 GB/s.
//
// Why not the row-major kernel (small_batch_linear.cpp's avx2 tiles): there each 8-lane
// accumulator holds one output's partial sums over K, reduced across lanes and stored one
// element at a time at the end of every tile, and its bf16 tiles (3 weight rows x 3 x rows)
// reload x from L1 for every 18 FMAs; measured on the 2-core Zen 3 VM (2026-12-01) at 40-50 %
// of the FMA peak with the weights in cache and ~30 % inside a 16-token forward. Here the 8
// lanes of an accumulator are 8 consecutive outputs: no reduction, one vector store per 8
// outputs, and one broadcast of an x element feeds V FMAs.
//
// Panels: bf16 [P, Kh, 48, 2] (packed[p, k, c, j] = weight[48 p + c, 2 k + j]): the 32 bytes
// of outputs 8v..8v+7 at a column pair are 8 (even, odd) words; a shift left by 16 gives the
// even column's 8 weights as float32, a mask of the high halves the odd column's, exactly
// (bf16 is float32's high half). float32 [P, K, 48, 1]: 8 weights a load.
//
// Tiles: MR x rows times V vectors of 8 outputs (a "group" of a panel's 6 vectors), MR * V
// accumulators: a panel's first 1-2 rows as 1-2 x 6 (one pass over the whole panel, front to
// back: the weight stream the hardware prefetchers follow; M = 1 takes two panels at a time
// so, two streams: one_row_two_panels, SmolLM2's 211 bf16 layers at one row 15.3-15.5 ->
// 12.3-12.5 ms on the AMX Xeon VM with this path forced, sixty-first session,
// results/packed_two_panels_avx2_xeon_session61.txt; not measured on an AVX2-only CPU), holding the
// MR broadcasts and one weight vector at a time; then whole tiles of 5 rows and the 3-4 rows
// left as 5 x 2 / 3-4 x 2 (three passes of a third of the panel each), holding the 2 weight
// vectors and one broadcast at a time (13 registers and the bf16 mask at 5 x 2; 6 x 2 spilled); 1-2 rows left
// as 1-2 x 6 again. Per column: V weight loads (+ a shift or an AND each for bf16), MR broadcasts,
// MR * V FMAs. The passes of a panel run back to back, so all but the first read it from
// L1/L2; when a panel takes more than one pass, each pass prefetches (to L2) its share of the
// next panel, spread evenly over the passes' columns, so that the weight stream keeps flowing
// while the later passes compute (without it, an earlier version of these tiles ran 211 layers
// of SmolLM2's shapes, streamed, at 16 rows 1.7x slower: 93.8 against 53.9 ms on the Zen 3 VM).
//
// x reaches the tiles interleaved per row group (run_panels copies it once per call and
// thread: M * K floats, nothing next to the weight), so a tile's MR broadcasts at a column are MR
// consecutive floats off one pointer, immediate offsets. With x's rows `ldx` apart, the 5 x 2
// loop needed 4 general registers for the row addresses and GCC reloaded two of them from the
// stack at every column pair. A pass's steps run in chunks of T (the passes per panel), one
// prefetch at the start of each, so the step loop has no branch but its own (a countdown
// tested at every step, before).
//
// Measured (Zen 3 VM, 2026-12-01), these three changes (this layout, the odd column by an AND
// instead of two shifts, the chunked prefetch) against the version before them:
// - the committed benchmark, benchmarks/compare_builds.sh over linear_panels_ab.py --dtypes
//   bf16, 3 alternating rounds, 2 threads (results/linear_panels_ab_zen3_session36_old_vs_new.txt):
//   SmolLM2's 211 bf16 linears streamed at 16 rows 64.1 -> 61.6 ms (median of the rounds'
//   medians, ~4 %; the same-run ratio to the row-major kernel 1.21-1.29x -> 1.32-1.40x), at
//   one row unchanged (30.3 / 30.3 ms);
// - in cache, one thread, each tile's rate over an FMA loop's timed alternately (a
//   development harness, not committed: this VM's speed swings by a third over seconds):
//   5 x 2 0.59 -> 0.71-0.82 of the FMA loop, 4 x 2 0.57 -> 0.65-0.80, 2 x 6 0.57 -> 0.58-0.67,
//   1 x 6 0.30 -> 0.42-0.49. The rest of the gap to the FMA loop is not explained.
//
// Batch invariance, by construction: out[m, n] is one lane of one accumulator: from +0,
// acc = fma(w[n, k], x[m, k], acc) for k = 0, 1, ... K - 1 in order (bf16: widened exactly,
// so the even column of a pair, then the odd one), then + bias[n] in fp32 (only when there is
// a bias: adding +0 would turn a -0 sum into +0), then one rounding to out's dtype (bf16:
// to nearest even, NaN as 0x7fc0, as c10::BFloat16). That depends on K alone: not on M, the
// tile, the row's place in it, the panel split or the thread count. The float32 panels'
// AVX-512 tiles compute the same chain (the same bits); the bf16 panels' AVX512-BF16 and AMX
// paths do not (VDPBF16PS adds a pair's products in its own order), so a process runs one
// path (small_batch_linear_packed_path()).
#include "cpu/small_batch_linear_packed_avx2.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu/packed_panels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DOMINO_SBLP_AVX2 1
#else
#define DOMINO_SBLP_AVX2 0
#endif

namespace domino::cpu {

bool packed_avx2_available() {
#if DOMINO_SBLP_AVX2
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return ok;
#else
  return false;
#endif
}

#if DOMINO_SBLP_AVX2
namespace {

using BF16 = c10::BFloat16;
constexpr int64_t kPanelCols = kPackedPanelCols;  // 48 outputs: 6 vectors of 8
constexpr int kPanelVectors = 6;
constexpr int64_t kStepBytes = 4 * kPanelCols;   // a bf16 column pair or a float32 column: 192 bytes

#define DOMINO_AVX2_TARGET __attribute__((target("avx2,fma")))

// One step of a panel (a bf16 column pair, a float32 column) gives kSub columns' weights.
template <typename W>
struct Panel;

// The high halves of 8 words: a bf16 pair's odd column, as float32, is its word AND this.
alignas(32) const uint32_t kHighHalves[8] = {0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u,
                                            0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u};

template <>
struct Panel<BF16> {
  static constexpr int kSub = 2;
  static constexpr int64_t kStep = 2 * kPanelCols;  // elements per step
  // Vector v's 8 weights of column 2k + j (step = the panel at pair k). The even column is a
  // shift left by 16 (Zen 3 runs vector shifts on FP1/FP2, FP1 being an FMA pipe too); the
  // odd one an AND with the high halves, which any of the 4 FP pipes runs. Two shifts for the
  // odd column (an earlier version) cost the 1 x 6 tile 18 shift uops per 12 FMAs. A tile with
  // a register to spare holds the mask (kMaskInRegister); the 2 x 6 tile (12 accumulators, 2
  // broadcasts, a weight vector) has none, and GCC spilled 4 accumulators when it got the
  // mask as a constant, so there the AND reads it from memory (inline asm keeps GCC from
  // hoisting it into a register).
  template <bool kMaskInRegister>
  DOMINO_AVX2_TARGET static __m256 weights(const BF16* step, int v, int j) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(step + 16 * v));
    if (j == 0) return _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    if constexpr (kMaskInRegister) {
      return _mm256_and_ps(_mm256_castsi256_ps(raw), _mm256_load_ps(reinterpret_cast<const float*>(kHighHalves)));
    } else {
      __m256 odd;
      asm("vandps %[m], %[r], %[o]" : [o] "=x"(odd) : [r] "x"(_mm256_castsi256_ps(raw)), [m] "m"(kHighHalves));
      return odd;
    }
  }
};

template <>
struct Panel<float> {
  static constexpr int kSub = 1;
  static constexpr int64_t kStep = kPanelCols;
  template <bool kMaskInRegister>
  DOMINO_AVX2_TARGET static __m256 weights(const float* step, int v, int) { return _mm256_loadu_ps(step + 8 * v); }
};

// 8 fp32 -> 8 bf16, round to nearest even, NaN -> 0x7fc0 (c10::BFloat16's conversion).
DOMINO_AVX2_TARGET inline __m128i to_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan));
  // packus per 128-bit half: [r0..r3 r0..r3 | r4..r7 r4..r7]; quads 0 and 2 hold r0..r7.
  const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(p);
}

// dst[0, lanes) = sum (+ bias), rounded once to O.
template <typename O>
DOMINO_AVX2_TARGET inline void store(__m256 sum, const float* bias, O* dst, int lanes) {
  if (bias != nullptr) {
    if (lanes == 8) {
      sum = _mm256_add_ps(sum, _mm256_loadu_ps(bias));
    } else {
      alignas(32) float b[8] = {};
      std::memcpy(b, bias, lanes * sizeof(float));
      sum = _mm256_add_ps(sum, _mm256_load_ps(b));
    }
  }
  if constexpr (std::is_same_v<O, float>) {
    if (lanes == 8) {
      _mm256_storeu_ps(dst, sum);
    } else {
      alignas(32) float t[8];
      _mm256_store_ps(t, sum);
      std::memcpy(dst, t, lanes * sizeof(float));
    }
  } else {
    const __m128i h = to_bf16(sum);
    if (lanes == 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), h);
    } else {
      alignas(16) uint16_t t[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(t), h);
      std::memcpy(static_cast<void*>(dst), t, lanes * sizeof(uint16_t));
    }
  }
}

// A pass's outputs: res[m][v] holds outputs 8 (g + v) .. 8 (g + v) + 7 of the panel for row m
// (those below `cols` written). Out of line: inlined into the tile, GCC kept the tile's
// accumulators on the stack and stored all 12 of them at every column pair.
template <int MR, int V, typename O>
DOMINO_AVX2_TARGET __attribute__((noinline)) void epilogue(const float (&res)[MR][V][8], int g, const float* bias,
                                                          O* out, int64_t ldo, int64_t origin, int64_t n0,
                                                          int64_t cols) {
  for (int v = 0; v < V; ++v) {
    const int64_t c0 = 8 * static_cast<int64_t>(g + v);
    if (c0 >= cols) break;
    const int lanes = static_cast<int>(std::min<int64_t>(8, cols - c0));
    const float* b = bias == nullptr ? nullptr : bias + n0 + c0;
    for (int m = 0; m < MR; ++m) store(_mm256_load_ps(res[m][v]), b, out + m * ldo + (n0 + c0 - origin), lanes);
  }
}

// One pass: rows [0, MR) of x (float32, `ldx` apart) times vectors [g, g + V) of one panel
// of `steps` steps; writes the outputs of those vectors below `cols` (the panel's outputs
// n0 + c at out[m * ldo + n0 + c - origin]). Pass t of the panel's T passes prefetches its
// share of the next panel `next` (null: none): the 3 lines of every T-th of the T * steps
// steps, from step t * steps on.
template <int MR, int V, typename W, typename O>
DOMINO_AVX2_TARGET inline void tile(const W* panel, int64_t steps, int g, const float* x,
                                    const float* bias, O* out, int64_t ldo, int64_t origin, int64_t n0, int64_t cols,
                                    const W* next, int64_t t, int64_t T) {
  using P = Panel<W>;
  // The ymm registers the tile's loop holds: MR * V accumulators, the MR broadcasts and a
  // weight vector (MR < V) or the V weight vectors and a broadcast. The bf16 mask gets a
  // register when two are left (GCC wants one for a temporary: with only one left, the
  // 2 x 6 tile spilled).
  constexpr int kHeld = MR * V + (MR < V ? MR + 1 : V + 1);
  constexpr bool kMaskInRegister = kHeld + 2 <= 16;
  __m256 acc[MR][V];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < V; ++v) acc[m][v] = _mm256_setzero_ps();
  // One column step: the tile's FMAs for the kSub columns at step s.
  auto step = [&](int64_t s) __attribute__((target("avx2,fma"), always_inline)) {
    const W* ws = panel + s * P::kStep;
    for (int sub = 0; sub < P::kSub; ++sub) {
      const float* xc = x + (s * P::kSub + sub) * MR;
      if constexpr (MR < V) {  // the MR broadcasts held, one weight vector at a time
        __m256 b[MR];
        for (int m = 0; m < MR; ++m) b[m] = _mm256_broadcast_ss(xc + m);
        for (int v = 0; v < V; ++v) {
          const __m256 w = P::template weights<kMaskInRegister>(ws, g + v, sub);
          for (int m = 0; m < MR; ++m) acc[m][v] = _mm256_fmadd_ps(w, b[m], acc[m][v]);
        }
      } else {  // the V weight vectors held, one broadcast at a time
        __m256 w[V];
        for (int v = 0; v < V; ++v) w[v] = P::template weights<kMaskInRegister>(ws, g + v, sub);
        for (int m = 0; m < MR; ++m) {
          const __m256 b = _mm256_broadcast_ss(xc + m);
          for (int v = 0; v < V; ++v) acc[m][v] = _mm256_fmadd_ps(w[v], b, acc[m][v]);
        }
      }
    }
  };
  // The pass's prefetches: of the T passes' T * steps steps, every T-th prefetches the next
  // step of the next panel, so pass t takes the next panel's steps [ceil(t steps / T),
  // ceil((t + 1) steps / T)): one at the start of each chunk of T steps, the steps of a
  // chunk a loop with no branch but its own (a countdown tested at every step cost the
  // 5 x 2 tile ~10 % in L1).
  const int64_t first = next == nullptr ? 0 : (t * steps + T - 1) / T;
  int64_t left = next == nullptr ? 0 : ((t + 1) * steps + T - 1) / T - first;
  const char* line = next == nullptr ? nullptr : reinterpret_cast<const char*>(next) + first * kStepBytes;
  const int64_t chunk = next == nullptr ? steps : T;
  for (int64_t s0 = 0; s0 < steps; s0 += chunk) {
    if (left > 0) {
      for (int l = 0; l < 3; ++l) _mm_prefetch(line + 64 * l, _MM_HINT_T1);
      line += kStepBytes;
      --left;
    }
    const int64_t s1 = std::min(steps, s0 + chunk);
    for (int64_t s = s0; s < s1; ++s) step(s);
  }
  alignas(32) float res[MR][V][8];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < V; ++v) _mm256_store_ps(res[m][v], acc[m][v]);
  epilogue<MR, V>(res, g, bias, out, ldo, origin, n0, cols);
}

// One row against two panels at once (a decode step): each panel's 6 vectors in one pass, as
// the 1 x 6 tile takes one panel (each output the same FMA chain, the same bits), so two
// weight streams flow at a time instead of one. 12 accumulators, the broadcast, a weight
// vector and the bf16 mask: 15 of the 16 registers.
template <typename W, typename O>
DOMINO_AVX2_TARGET inline void one_row_two_panels(const W* a, const W* b, int64_t steps, const float* x,
                                                  const float* bias, O* out, int64_t origin, int64_t n0, int64_t N) {
  using P = Panel<W>;
  __m256 acc_a[kPanelVectors], acc_b[kPanelVectors];
  for (int v = 0; v < kPanelVectors; ++v) acc_a[v] = acc_b[v] = _mm256_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    const W* wa = a + s * P::kStep;
    const W* wb = b + s * P::kStep;
    for (int sub = 0; sub < P::kSub; ++sub) {
      const __m256 x1 = _mm256_broadcast_ss(x + s * P::kSub + sub);
      for (int v = 0; v < kPanelVectors; ++v) {
        acc_a[v] = _mm256_fmadd_ps(P::template weights<true>(wa, v, sub), x1, acc_a[v]);
        acc_b[v] = _mm256_fmadd_ps(P::template weights<true>(wb, v, sub), x1, acc_b[v]);
      }
    }
  }
  alignas(32) float res[1][kPanelVectors][8];
  for (int v = 0; v < kPanelVectors; ++v) _mm256_store_ps(res[0][v], acc_a[v]);
  epilogue<1, kPanelVectors>(res, 0, bias, out, 0, origin, n0, std::min(kPanelCols, N - n0));
  for (int v = 0; v < kPanelVectors; ++v) _mm256_store_ps(res[0][v], acc_b[v]);
  epilogue<1, kPanelVectors>(res, 0, bias, out, 0, origin, n0 + kPanelCols, std::min(kPanelCols, N - n0 - kPanelCols));
}

constexpr int kRowsPerTile = 5;

// Tiles of `rows` x rows: 1-2 rows take the whole panel (6 vectors) in one pass that reads it
// front to back; 3-6 rows take it in 3 passes of 2 vectors.
constexpr int vectors_for(int rows) { return rows <= 2 ? kPanelVectors : 2; }
constexpr int passes_for(int rows) { return kPanelVectors / vectors_for(rows); }

template <int MR, typename W, typename O>
DOMINO_AVX2_TARGET inline void row_tile(const W* panel, int64_t steps, const float* x, const float* bias,
                                        O* out, int64_t ldo, int64_t origin, int64_t n0, int64_t cols, const W* next,
                                        int64_t& t, int64_t T) {
  constexpr int V = vectors_for(MR);
  for (int g = 0; g < kPanelVectors; g += V)
    tile<MR, V>(panel, steps, g, x, bias, out, ldo, origin, n0, cols, next, t++, T);
}

// The rows of a panel's tiles, in order: its first two rows (or its one) in a wide pass,
// which streams the panel from memory in order, so the hardware prefetchers follow it; then
// 5-row tiles from L1/L2; then the 1-4 rows left.
inline int64_t first_rows(int64_t M) { return std::min<int64_t>(M, 2); }

// f(m0, R) for the row groups of M rows in that order.
template <typename F>
inline void for_each_row_group(int64_t M, F&& f) {
  int64_t m = first_rows(M);
  f(int64_t{0}, m);
  for (; m + kRowsPerTile <= M; m += kRowsPerTile) f(m, int64_t{kRowsPerTile});
  if (m < M) f(m, M - m);
}

// The passes over a panel that M rows take: each row group's (row_tile's).
inline int64_t panel_passes(int64_t M) {
  int64_t T = 0;
  for_each_row_group(M, [&](int64_t, int64_t R) { T += passes_for(static_cast<int>(R)); });
  return T;
}

template <typename W, typename O>
DOMINO_AVX2_TARGET __attribute__((flatten)) void run_panels(const W* packed, int64_t steps, const float* x,
                                                            int64_t ldx, int64_t M, int64_t N, int64_t p0, int64_t p1,
                                                            const float* bias, O* out, int64_t ldo, int64_t origin) {
  const int64_t panels = (N + kPanelCols - 1) / kPanelCols;
  const int64_t T = panel_passes(M);
  const int64_t panel_elems = steps * Panel<W>::kStep;
  // x's rows interleaved per tile group (the groups run_panels' tiles take, in order):
  // group rows [m0, m0 + R) at xt[m0 * cols_x + c * R + r] = x[m0 + r, c], so a tile's
  // broadcasts at a column are R consecutive floats off one pointer.
  const int64_t cols_x = steps * Panel<W>::kSub;
  thread_local std::vector<float> xt;  // kept: no allocation per call
  xt.resize(M * cols_x);
  for_each_row_group(M, [&](int64_t m0, int64_t R) {
    float* dst = xt.data() + m0 * cols_x;
    for (int64_t c = 0; c < cols_x; ++c)
      for (int64_t r = 0; r < R; ++r) dst[c * R + r] = x[(m0 + r) * ldx + c];
  });
  p1 = std::min(p1, panels);
  if (M == 1) {  // a decode step: two panels at a time
    for (; p0 + 1 < p1; p0 += 2) {
      const W* panel = packed + p0 * panel_elems;
      one_row_two_panels<W>(panel, panel + panel_elems, steps, xt.data(), bias, out, origin, p0 * kPanelCols, N);
    }
  }
  for (int64_t p = p0; p < p1; ++p) {
    const W* panel = packed + p * panel_elems;
    const int64_t n0 = p * kPanelCols, cols = std::min(kPanelCols, N - n0);
    const W* next = T > 1 && p + 1 < panels ? panel + panel_elems : nullptr;
    int64_t t = 0;
    auto rows = [&](auto mr, int64_t m) {
      row_tile<decltype(mr)::value>(panel, steps, xt.data() + m * cols_x, bias, out + m * ldo, ldo, origin, n0, cols, next,
                                    t, T);
    };
    for_each_row_group(M, [&](int64_t m, int64_t r) {
      switch (r) {
        case 1: rows(std::integral_constant<int, 1>{}, m); break;
        case 2: rows(std::integral_constant<int, 2>{}, m); break;
        case 3: rows(std::integral_constant<int, 3>{}, m); break;
        case 4: rows(std::integral_constant<int, 4>{}, m); break;
        case 5: rows(std::integral_constant<int, 5>{}, m); break;
        default: break;
      }
    });
  }
}
static_assert(kRowsPerTile == 5, "run_panels' cases cover the row groups of up to 5 rows");

}  // namespace
#endif

template <typename O>
void packed_panels_avx2(const c10::BFloat16* packed, int64_t pairs, const float* x, int64_t ldx, int64_t M, int64_t N,
                        int64_t p0, int64_t p1, const float* bias, O* out, int64_t ldo, int64_t origin) {
#if DOMINO_SBLP_AVX2
  run_panels<c10::BFloat16, O>(packed, pairs, x, ldx, M, N, p0, p1, bias, out, ldo, origin);
#endif
}

template <typename O>
void packed_panels_avx2_f32(const float* packed, int64_t K, const float* x, int64_t ldx, int64_t M, int64_t N,
                            int64_t p0, int64_t p1, const float* bias, O* out, int64_t ldo, int64_t origin) {
#if DOMINO_SBLP_AVX2
  run_panels<float, O>(packed, K, x, ldx, M, N, p0, p1, bias, out, ldo, origin);
#endif
}

template void packed_panels_avx2<float>(const c10::BFloat16*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                        int64_t, const float*, float*, int64_t, int64_t);
template void packed_panels_avx2<c10::BFloat16>(const c10::BFloat16*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                       int64_t, const float*, c10::BFloat16*, int64_t, int64_t);
template void packed_panels_avx2_f32<float>(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                            int64_t, const float*, float*, int64_t, int64_t);
template void packed_panels_avx2_f32<c10::BFloat16>(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t,
                                           int64_t, const float*, c10::BFloat16*, int64_t, int64_t);

}  // namespace domino::cpu
