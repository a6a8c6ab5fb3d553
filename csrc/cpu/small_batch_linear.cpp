// CPU kernel of small_batch_linear: out[M, N] = x[M, K] @ weight[N, K]^T (+ bias[N]) for a
// handful of rows: one decode token (M = 1) or the k + 1 tokens of a speculative
// verification (M up to 64 per pass; more rows run as further 64-row passes).
//
// Bytes it must move: the weight once, N*K*2 (bf16) or N*K*4 (fp32), whatever M is; x
// (M*K), out (M*N) and the bias (N) are noise next to it at M <= 64. Work: 2*M*N*K flops.
// So at M = 1 the weight stream is the floor (memory bandwidth), and the kernel is built
// so that a verification over M rows still reads each weight byte from memory exactly
// once and multiplies it into all M rows while it sits in registers/L1: the cost grows
// with M only through the FMAs, M flop per bf16 weight byte (M/2 per fp32 byte). On this
// project's CPUs (2 Zen 3 cores, ~200 GFLOP/s of FMAs, ~15 GB/s) the ridge is ~13 flop per
// byte: a 16-row fp32 verification is still memory-bound in principle, a 16-row bf16 one
// is FMA-bound (about 1.2x the one-row time at the FMA peak, more at the ~70 % reached).
//
// Layout: x is converted once per call (on the avx512_bf16 path: copied as bf16 rows of Kp
// columns in their own order, zero-padded) to fp32 rows of Kp columns (zero-padded to a whole
// vector step; for bf16 weights each 2L-column block is permuted to [L even | L odd]
// columns, matching how one 2L-wide bf16 load widens into two fp32 vectors with a shift
// and a mask, no shuffles). Weight rows are read in place; a K tail that is not a whole
// step is copied into a zero-padded stack buffer, so no load ever passes the end of a row.
// Threads split N into contiguous blocks of NR weight rows (at::parallel_for); within a
// block, tiles of NR weight rows x MR x rows accumulate over all of K in registers, the
// block's weights staying in L1 across the M/MR tiles. Every weight line of a block comes
// with a software prefetch (to L2) of the line kPrefetchAheadWeights further on, issued by
// one of the block's tiles (spread over them, so the requests flow evenly): the rows
// of a thread's blocks are one contiguous range, so that is ~2 blocks ahead, past the
// 4 KB page where the hardware prefetchers stop. Without it the stream and the arithmetic
// do not overlap at all (16 rows cost the one-row stream plus the in-cache compute).
//
// Per instruction-set path (chosen at run time from CPUID; the environment variable
// DOMINO_SMALL_BATCH_LINEAR_ISA=avx512_bf16|avx512|avx2|generic forces a lower path, e.g. for
// tests):
// - avx512 (AVX-512F): 32 zmm; tiles of 4 weight rows x 6 x rows = 24 accumulators of 16
//   lanes + 4 weight + 1 x register. Per 16 fp32 (32 bf16) columns: 4 weight loads, 6 (12)
//   x loads, 24 (48) FMAs; limited by the 2 FMA ports once M >= ~12, by the weight
//   stream below that. Compiled everywhere; tested and timed where the CPU has AVX-512F
//   (the lent GPU machine's Xeon; the 2026-11-24 project VM, AMD EPYC Zen 5).
// - avx512_bf16 (AVX512-BF16: AMD Zen 4/5, Intel Cooper Lake and later; taken only when x
//   and the weights are both bf16, as in a bf16 model, else avx512): x is packed as bf16
//   and each VDPBF16PS multiplies 32 bf16 weights into 32 bf16 x columns, accumulating
//   pairs into 16 fp32 lanes: per 32 columns 4 weight loads, 6 x loads and 24 instructions
//   where avx512 needs 4 loads + 8 integer ops to widen the weights and 48 FMAs. The
//   products of two bf16 are exact in fp32, so only the accumulation rounds, as in the
//   FMA paths (VDPBF16PS flushes denormal inputs and results to zero: a bf16 activation
//   below 1.2e-38 counts as 0). Twice avx512's multiply-adds per instruction: on the Zen 5
//   VM, M = 16 with weights in cache 1.8-2x faster than avx512 (~250 G multiply-adds/s on
//   2 cores), and with the prefetch the same rate streaming from memory: the 49152 x 576
//   LM head at M = 16 in 1.7 ms on 2 cores (3.3 ms when no prefetch was emitted), M = 1
//   in ~1.05 ms (~54 GB/s).
// - avx2 (AVX2 + FMA): 16 ymm. fp32 weights: tiles of 3 weight rows x
//   4 x rows = 12 accumulators of 8 lanes + 3 weight registers, x taken from L1/L2 as the
//   FMAs' memory operand: per 8 columns 3 + 12 loads for 12 FMAs, so the 2 load ports
//   bound it at ~80 % of the FMA peak (measured ~80 GFLOP/s per core of ~100 in cache).
//   bf16 weights: 3 x 3 tiles with each x vector pinned in a register: per 16 columns 6
//   raw weight loads + 2 integer ops per row + 6 x loads for 18 FMAs (~70 GFLOP/s per
//   core in cache). Streaming weights from memory costs ~30 % more at M = 16 (memory and
//   FMAs overlap imperfectly); at M = 1 the weight stream (~10-15 GB/s per core) is the
//   limit.
// - generic (any other CPU): GCC vectors of 8 floats, tiles of 2 x 4, multiply then add
//   (fused only if the compiler's target has FMA); correct and batch-invariant, not tuned.
//
// Batch invariance, by construction: out[m, n] is computed by one tile, always as: one
// L-lane accumulator (L = 8 avx2/generic, 16 avx512) starting at +0; for each vector step
// s in order (a K tail zero-padded to a whole step), acc = fma(w, x, acc) over its columns,
// for bf16 weights the even columns, then the odd ones (generic: a multiply, then an add,
// unless the compiler fuses every one of them alike; avx512_bf16: one VDPBF16PS, which
// adds each lane's column pair into it); then a fixed tree over the L lanes
// (avx512 first adds lane i + 8 to lane i), then + bias[n] in fp32, then one rounding to
// out's dtype. None of that depends on M, on m's position in its tile or the batch, on
// the tile shape, on the thread split or on the 64-row passes: only on K, the dtypes and
// the instruction-set path. So a row computed alone (M = 1) is bit-identical to the same
// row computed among 63 others.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DOMINO_SBL_X86 1
#else
#define DOMINO_SBL_X86 0
#endif

#include "cpu/aligned.h"
#include "cpu/kernel_switches.h"
#include "ops.h"

// GCC 12 flags the _mm512_undefined_* inside avx512fintrin.h's shifts once inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace domino::cpu {
namespace {

using BF16 = c10::BFloat16;

// Rows of x per pass: x's packed copy (64 * Kp floats) stays in L2.
constexpr int64_t kMaxRowsPerPass = 64;
// Rows the packed x always has (zeros past the pass's own): a whole tile of every path.
constexpr int64_t kPackedRowsMin = 8;
// How far ahead of the line a tile reads in a weight row it prefetches, in weights (8 KB
// of bf16, 16 KB of fp32), to L2 (to L1, T0, measured ~2x slower at M >= 4: it evicts the
// block the tiles are reusing). A block's NR rows are contiguous and a thread walks its
// blocks in order, so that is a line the thread reads ~2 blocks later. Zen 5 VM, 2 threads:
// the 49152 x 576 bf16 LM head alone, avx512_bf16 M = 16 3.3 -> 1.8 ms, avx2 path M = 1
// 1.5 -> 1.0 ms and M = 16 6.5 -> 4.3 ms; SmolLM2's whole 16-token forward bf16 26.5 ->
// 19.5 ms, fp32 37 -> 29 ms, each against no prefetch, the one-token forward within 3 %.
// Half or twice the distance: bf16 within noise; fp32 at 8 KB made one token 8 % slower.
constexpr int64_t kPrefetchAheadWeights = 4096;

// The builtin, not _mm_prefetch in a target("avx512f") member of the Traits: called from
// the tile templates (compiled for the default target, inlined only by `flatten` later),
// such a void member was first judged free of side effects and its calls deleted, so
// the x86 paths ran with no software prefetch at all.
// The address is computed as an integer: near the end of the weights it points past them
// (a prefetch never faults), which pointer arithmetic may not.
template <typename W>
inline void prefetch_ahead(const W* p) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) +
                                                   kPrefetchAheadWeights * sizeof(W)),
                     0, 2);
}

// ---- instruction sets -------------------------------------------------------------------
// Each Traits type gives the vector type and the few primitives the tiles use. The tiles
// are plain templates; each path's entry point carries its target attribute and
// `flatten`, so everything is inlined and compiled for that instruction set.

struct Generic {
  static constexpr int kLanes = 8;
  template <typename W> static constexpr int kNR = 2;
  template <typename W> static constexpr int kMR = 4;
  typedef float V __attribute__((vector_size(32)));
  typedef uint32_t U __attribute__((vector_size(32)));
  static V zero() { return V{}; }
  static V load(const float* p) {
    V v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  }
  static V fma(V a, V b, V c) { return a * b + c; }
  // 2 * kLanes bf16 at p: the even ones (word << 16) and the odd ones (word & 0xffff0000).
  static V bf16_even(const BF16* p) {
    U u;
    std::memcpy(&u, p, sizeof(u));
    u = u << 16;
    V v;
    std::memcpy(&v, &u, sizeof(v));
    return v;
  }
  static V bf16_odd(const BF16* p) {
    U u;
    std::memcpy(&u, p, sizeof(u));
    u = u & 0xffff0000u;
    V v;
    std::memcpy(&v, &u, sizeof(v));
    return v;
  }
  static void pin(V&) {}
  // out[i] = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of a[i].
  static void reduce4(const V* a, float* out) {
    for (int i = 0; i < 4; ++i) {
      const V& v = a[i];
      out[i] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
  }
};

#if DOMINO_SBL_X86
#define DOMINO_AVX2 __attribute__((target("avx2,fma"))) inline
#define DOMINO_AVX512 __attribute__((target("avx512f,avx2,fma"))) inline

struct Avx2 {
  static constexpr int kLanes = 8;
  // fp32 weights: 3 x 4 (12 accumulators + 3 weight registers; x comes from memory as the
  // FMAs' operand). bf16 weights: 3 x 3, x pinned in a register (see pin).
  template <typename W> static constexpr int kNR = 3;
  template <typename W> static constexpr int kMR = std::is_same_v<W, BF16> ? 3 : 4;
  using V = __m256;
  DOMINO_AVX2 static V zero() { return _mm256_setzero_ps(); }
  DOMINO_AVX2 static V load(const float* p) { return _mm256_loadu_ps(p); }
  DOMINO_AVX2 static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  DOMINO_AVX2 static V bf16_even(const BF16* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), 16));
  }
  DOMINO_AVX2 static V bf16_odd(const BF16* p) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                                _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  // Keeps v in a register: otherwise GCC folds the x load into every FMA that uses it
  // (NR loads instead of one), which makes the tile load-bound.
  DOMINO_AVX2 static void pin(V& v) { asm("" : "+x"(v)); }
  // Same tree as Generic::reduce4: hadd pairs lanes (0,1), (2,3); the second hadd adds
  // those pairs; the last add joins the two 128-bit halves.
  DOMINO_AVX2 static void reduce4(const V* a, float* out) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);  // a0:01 23 a1:01 23 | a0:45 67 a1:45 67
    const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(t0, t1);  // a0..a3: 0123 | a0..a3: 4567
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1)));
  }
};

struct Avx512 {
  static constexpr int kLanes = 16;
  template <typename W> static constexpr int kNR = 4;
  template <typename W> static constexpr int kMR = 6;
  using V = __m512;
  DOMINO_AVX512 static V zero() { return _mm512_setzero_ps(); }
  DOMINO_AVX512 static V load(const float* p) { return _mm512_loadu_ps(p); }
  DOMINO_AVX512 static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  DOMINO_AVX512 static V bf16_even(const BF16* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16));
  }
  DOMINO_AVX512 static V bf16_odd(const BF16* p) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
  DOMINO_AVX512 static void pin(V& v) { asm("" : "+v"(v)); }
  DOMINO_AVX512 static __m256 fold(V v) {  // lane i + lane i + 8
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  DOMINO_AVX512 static void reduce4(const V* a, float* out) {
    const __m256 f[4] = {fold(a[0]), fold(a[1]), fold(a[2]), fold(a[3])};
    Avx2::reduce4(f, out);
  }
};

#define DOMINO_AVX512_BF16 __attribute__((target("avx512f,avx512bf16,avx2,fma"))) inline

// bf16 x times bf16 weights by VDPBF16PS (lane i += w[2i+1] x[2i+1] + w[2i] x[2i]); the
// tiles, prefetch and lane reduction are avx512's.
struct Avx512Bf16 : Avx512 {
  static constexpr bool kDotBf16 = true;
  DOMINO_AVX512_BF16 static __m512i load_bf16(const BF16* p) { return _mm512_loadu_si512(p); }
  DOMINO_AVX512_BF16 static void pin(__m512i& v) { asm("" : "+v"(v)); }
  DOMINO_AVX512_BF16 static V dot2(V acc, __m512i w, __m512i x) {
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
  }
};
#endif

// Whether a path multiplies bf16 pairs (x packed as bf16) instead of widening to fp32.
template <class T, class = void>
struct DotBf16 : std::false_type {};
template <class T>
struct DotBf16<T, std::void_t<decltype(T::kDotBf16)>> : std::bool_constant<T::kDotBf16> {};
// The packed x's element type of a path.
template <class T>
using PackedX = std::conditional_t<DotBf16<T>::value, BF16, float>;

// ---- tiles ------------------------------------------------------------------------------

template <class T, typename W>
constexpr int64_t kStep = std::is_same_v<W, BF16> ? 2 * T::kLanes : T::kLanes;

// One vector step of an NR x MR tile: weight rows wr[r] at column kw, x rows at column kx.
template <class T, int NR, int MR, typename W>
inline void tile_step(typename T::V (&acc)[NR][MR], const W* const (&wr)[NR], int64_t kw,
                      const PackedX<T>* x, int64_t Kp, int64_t kx) {
  using V = typename T::V;
  if constexpr (DotBf16<T>::value) {
    // One VDPBF16PS per weight row and x row: NR weight + 1 x + NR*MR accumulator registers.
    using Raw = decltype(T::load_bf16(x));  // the raw 32-bf16 register
    Raw wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = T::load_bf16(wr[r] + kw);
    for (int j = 0; j < MR; ++j) {
      Raw xv = T::load_bf16(x + j * Kp + kx);
      T::pin(xv);
      for (int r = 0; r < NR; ++r) acc[r][j] = T::dot2(acc[r][j], wv[r], xv);
    }
  } else if constexpr (std::is_same_v<W, BF16>) {
    // Even columns, then odd ones: NR weight + 1 x + NR*MR accumulator registers.
    V wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = T::bf16_even(wr[r] + kw);
    for (int j = 0; j < MR; ++j) {
      V xv = T::load(x + j * Kp + kx);
      T::pin(xv);
      for (int r = 0; r < NR; ++r) acc[r][j] = T::fma(wv[r], xv, acc[r][j]);
    }
    for (int r = 0; r < NR; ++r) wv[r] = T::bf16_odd(wr[r] + kw);
    for (int j = 0; j < MR; ++j) {
      V xv = T::load(x + j * Kp + kx + T::kLanes);
      T::pin(xv);
      for (int r = 0; r < NR; ++r) acc[r][j] = T::fma(wv[r], xv, acc[r][j]);
    }
  } else {
    V wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = T::load(wr[r] + kw);
    for (int j = 0; j < MR; ++j) {
      const V xv = T::load(x + j * Kp + kx);
      for (int r = 0; r < NR; ++r) acc[r][j] = T::fma(wv[r], xv, acc[r][j]);
    }
  }
}

// sums[j * NR + r] = dot(w[r, :K], x[j, :K]) for an NR x MR tile. w: the tile's first
// weight row (rows K apart); x: the tile's first packed x row (rows Kp apart). Every cache
// line that a step reads in a weight row r in prefetch_rows (bit r) has the line
// kPrefetchAheadWeights further on in memory prefetched with it.
template <class T, int NR, int MR, typename W>
inline void tile(const W* w, int64_t K, const PackedX<T>* x, int64_t Kp, float* sums, unsigned prefetch_rows) {
  using V = typename T::V;
  constexpr int64_t step = kStep<T, W>;
  constexpr int64_t step_bytes = step * static_cast<int64_t>(sizeof(W));  // 32 or 64
  static_assert(step_bytes == 32 || step_bytes == 64);
  const int64_t full = K / step;
  V acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < MR; ++j) acc[r][j] = T::zero();
  const W* wr[NR];
  for (int r = 0; r < NR; ++r) wr[r] = w + r * K;
  for (int64_t s = 0; s < full; ++s) {
    // One prefetch per line: every step when a step reads a whole line, every other one
    // when it reads half of one.
    if (step_bytes == 64 || (s & 1) == 0)
      for (int r = 0; r < NR; ++r)
        if (prefetch_rows & (1u << r)) prefetch_ahead(wr[r] + s * step);
    tile_step<T, NR, MR>(acc, wr, s * step, x, Kp, s * step);
  }
  if (full * step < K) {  // the tail, from zero-padded copies of the rows' last columns
    const int64_t rest = K - full * step;
    alignas(64) W tail[NR][step];
    const W* tr[NR];
    for (int r = 0; r < NR; ++r) {
      std::memset(tail[r], 0, sizeof(tail[r]));
      std::memcpy(tail[r], wr[r] + full * step, rest * sizeof(W));
      tr[r] = tail[r];
    }
    tile_step<T, NR, MR>(acc, tr, 0, x, Kp, full * step);
  }
  // Reduce 4 accumulators at a time (the tree is the same for each; padding slots are
  // reduced and dropped).
  constexpr int kAcc = NR * MR, kGroups = (kAcc + 3) / 4;
  V flat[kGroups * 4];
  for (int j = 0; j < MR; ++j)
    for (int r = 0; r < NR; ++r) flat[j * NR + r] = acc[r][j];
  for (int i = kAcc; i < kGroups * 4; ++i) flat[i] = T::zero();
  float red[kGroups * 4];
  for (int g = 0; g < kGroups; ++g) T::reduce4(flat + 4 * g, red + 4 * g);
  for (int i = 0; i < kAcc; ++i) sums[i] = red[i];
}

// out[(m0 + j) * N + n0 + r] = sums[j * nr + r] (+ bias[n0 + r]), rounded to O. Out of
// line (flatten does not inline noinline functions): inlined, the bf16 rounding made GCC
// allocate the tile loops' registers worse (bf16 output ran at 2/3 of the speed).
template <typename O>
__attribute__((noinline)) void store_tile(O* out, int64_t N, int64_t m0, int mr, int64_t n0, int nr,
                                          const float* sums, const float* bias) {
  for (int j = 0; j < mr; ++j) {
    O* row = out + (m0 + j) * N + n0;
    for (int r = 0; r < nr; ++r) {
      const float v = bias != nullptr ? sums[j * nr + r] + bias[n0 + r] : sums[j * nr + r];
      row[r] = static_cast<O>(v);
    }
  }
}

struct Problem {
  const void* w;       // [N, K]
  const void* x;       // packed [M, Kp]: fp32, or bf16 for a path that multiplies bf16 pairs
  const float* bias;   // [N] fp32 or null
  void* out;           // [M, N]
  int64_t M, N, K, Kp;
};

// Rows [n0, n0 + NR) of the output for all M x rows (NR = 1: one row of a partial block).
template <class T, int NR, int MR, typename W, typename O>
inline void block_rows(const Problem& p, int64_t n0) {
  const W* w = static_cast<const W*>(p.w) + n0 * p.K;
  O* out = static_cast<O*>(p.out);
  float sums[NR * MR];
  static_assert(MR <= kPackedRowsMin, "the packed x must hold a whole tile of rows");
  const int64_t tiles = (p.M + MR - 1) / MR;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t m0 = t * MR;
    const int mr = static_cast<int>(std::min<int64_t>(MR, p.M - m0));
    // A lone partial tile (all of a call's 2..MR-1 rows) is computed as a whole MR-row tile
    // over the packed x's zero rows and stored for its own rows (every row's accumulators
    // are its own, so its bits do not change). Streaming from memory, a lone 2-5-row tile
    // ran up to 1.5x slower than the 6-row one (avx512_bf16, 49152 x 576 LM head, one
    // thread: M = 4 2.9 ms, M = 6 1.9 ms, M = 1 1.9 ms); why the smaller tile streams worse
    // is not understood. A partial tile after a whole one reads its weights from L1.
    const int rows = tiles == 1 && mr > 1 ? MR : mr;
    const PackedX<T>* x = static_cast<const PackedX<T>*>(p.x) + m0 * p.Kp;
    // The tiles of a block share its prefetches: tile t prefetches ahead of the weight
    // rows r with r % tiles == t (all rows when the block has one tile). Only the first
    // tile reads the block's weights from L2; the others reuse them from L1. When the
    // first tile alone prefetched, the next blocks' lines were requested in a burst during
    // 1/tiles of the block's time and the memory sat idle through the other tiles: spread
    // over all of them, the requests flow at the rate the FMAs consume weights. Zen 5 VM,
    // SmolLM2's linear layers streamed from memory at M = 16, fp32: 21.6-22.3 -> 18.6-19.0
    // ms (3 alternating runs); in the whole 16-token forward fp32 -0.5-0.8 ms, bf16
    // (FMA-bound) -0.2-0.4 ms; M = 1 unchanged (one tile).
    unsigned prefetch_rows = 0;
    for (int r = 0; r < NR; ++r)
      if (r % tiles == t) prefetch_rows |= 1u << r;
    switch (rows) {  // MR is a template parameter: one register tile per remainder size
#define DOMINO_SBL_CASE(c)                                          \
  case c:                                                           \
    if constexpr (c <= MR) tile<T, NR, c>(w, p.K, x, p.Kp, sums, prefetch_rows); \
    break;
      DOMINO_SBL_CASE(1)
      DOMINO_SBL_CASE(2)
      DOMINO_SBL_CASE(3)
      DOMINO_SBL_CASE(4)
      DOMINO_SBL_CASE(5)
      DOMINO_SBL_CASE(6)
#undef DOMINO_SBL_CASE
      default:
        break;
    }
    store_tile(out, p.N, m0, mr, n0, NR, sums, p.bias);
  }
}

// Weight blocks [b0, b1) (NR rows each; the last may be partial).
template <class T, typename W, typename O>
inline void run_blocks(const Problem& p, int64_t b0, int64_t b1) {
  constexpr int NR = T::template kNR<W>, MR = T::template kMR<W>;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n0 = b * NR;
    const int64_t nr = std::min<int64_t>(NR, p.N - n0);
    if (nr == NR) {
      block_rows<T, NR, MR, W, O>(p, n0);
    } else {
      for (int64_t n = n0; n < n0 + nr; ++n) block_rows<T, 1, MR, W, O>(p, n);
    }
  }
}

// One entry point per (instruction set, weight dtype, output dtype); `flatten` compiles
// the whole tile machinery for that instruction set.
template <typename W, typename O>
__attribute__((flatten)) void run_generic(const Problem& p, int64_t b0, int64_t b1) {
  run_blocks<Generic, W, O>(p, b0, b1);
}
#if DOMINO_SBL_X86
template <typename W, typename O>
__attribute__((target("avx2,fma"), flatten)) void run_avx2(const Problem& p, int64_t b0, int64_t b1) {
  run_blocks<Avx2, W, O>(p, b0, b1);
}
template <typename W, typename O>
__attribute__((target("avx512f,avx2,fma"), flatten)) void run_avx512(const Problem& p, int64_t b0,
                                                                    int64_t b1) {
  run_blocks<Avx512, W, O>(p, b0, b1);
}
template <typename O>
__attribute__((target("avx512f,avx512bf16,avx2,fma"), flatten)) void run_avx512_bf16(const Problem& p, int64_t b0,
                                                                                     int64_t b1) {
  run_blocks<Avx512Bf16, BF16, O>(p, b0, b1);
}
#endif

enum class Isa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Bf16: return "avx512_bf16";
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "generic";
  }
}

Isa best_isa() {
#if DOMINO_SBL_X86
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
      return __builtin_cpu_supports("avx512bf16") ? Isa::kAvx512Bf16 : Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
    return Isa::kGeneric;
  }();
  return best;
#else
  return Isa::kGeneric;
#endif
}

// The path a call takes now: the best one, or a lower one forced by
// DOMINO_SMALL_BATCH_LINEAR_ISA (read once; domino_ops.cpu.kernel_switch switches it for a
// test).
Isa current_isa() {
  const Isa best = best_isa();
  const char* env = kernel_switch(KernelSwitch::kLinearIsa);
  if (env == nullptr || *env == '\0') return best;
  const std::string want(env);
  Isa isa;
  if (want == "avx512_bf16") isa = Isa::kAvx512Bf16;
  else if (want == "avx512") isa = Isa::kAvx512;
  else if (want == "avx2") isa = Isa::kAvx2;
  else if (want == "generic") isa = Isa::kGeneric;
  else TORCH_CHECK_VALUE(false, "DOMINO_SMALL_BATCH_LINEAR_ISA must be avx512_bf16, avx512, avx2 or generic, got '", want, "'");
  TORCH_CHECK_VALUE(static_cast<int>(isa) <= static_cast<int>(best), "DOMINO_SMALL_BATCH_LINEAR_ISA=", want,
              " but this CPU (or build) supports at most ", isa_name(best));
  return isa;
}

template <typename W, typename O>
void run(Isa isa, const Problem& p, int64_t b0, int64_t b1) {
#if DOMINO_SBL_X86
  if constexpr (std::is_same_v<W, BF16>)
    if (isa == Isa::kAvx512Bf16) return run_avx512_bf16<O>(p, b0, b1);
  if (isa == Isa::kAvx512) return run_avx512<W, O>(p, b0, b1);
  if (isa == Isa::kAvx2) return run_avx2<W, O>(p, b0, b1);
#endif
  run_generic<W, O>(p, b0, b1);
}

template <typename W>
int nr_of(Isa isa) {
  switch (isa) {
#if DOMINO_SBL_X86
    case Isa::kAvx512Bf16:
    case Isa::kAvx512: return Avx512::kNR<W>;
    case Isa::kAvx2: return Avx2::kNR<W>;
#endif
    default: return Generic::kNR<W>;
  }
}

int lanes_of(Isa isa) {
  switch (isa) {
#if DOMINO_SBL_X86
    case Isa::kAvx512Bf16:
    case Isa::kAvx512: return Avx512::kLanes;
    case Isa::kAvx2: return Avx2::kLanes;
#endif
    default: return Generic::kLanes;
  }
}

// x rows [m0, m0 + mc) as fp32, Kp columns, zero-padded; bf16 weights: each 2L block
// permuted to [L even columns | L odd columns].
template <typename X>
void pack_x(const X* x, int64_t m0, int64_t mc, int64_t K, int64_t Kp, int64_t L, bool permute,
            float* dst) {
  for (int64_t j = 0; j < mc; ++j) {
    const X* src = x + (m0 + j) * K;
    float* d = dst + j * Kp;
    if (!permute) {
      for (int64_t c = 0; c < K; ++c) d[c] = static_cast<float>(src[c]);
      for (int64_t c = K; c < Kp; ++c) d[c] = 0.0f;
      continue;
    }
    for (int64_t c0 = 0; c0 < Kp; c0 += 2 * L)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t ce = c0 + 2 * l, co = ce + 1;
        d[c0 + l] = ce < K ? static_cast<float>(src[ce]) : 0.0f;
        d[c0 + L + l] = co < K ? static_cast<float>(src[co]) : 0.0f;
      }
  }
}

// bf16 x rows [m0, m0 + mc) as bf16, Kp columns in their own order, zero-padded (the
// layout VDPBF16PS pairs with the weight rows).
void pack_x_bf16(const BF16* x, int64_t m0, int64_t mc, int64_t K, int64_t Kp, BF16* dst) {
  for (int64_t j = 0; j < mc; ++j) {
    std::memcpy(dst + j * Kp, x + (m0 + j) * K, K * sizeof(BF16));
    std::memset(static_cast<void*>(dst + j * Kp + K), 0, (Kp - K) * sizeof(BF16));
  }
}

void check_args(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                const at::Tensor& out) {
  auto check = [](const at::Tensor& t, const char* name, int64_t dim) {
    TORCH_CHECK(t.defined(), name, " must be a tensor");
    TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
    TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got shape ", t.sizes());
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
                " must be float32 or bfloat16, got ", t.scalar_type());
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  };
  check(x, "x", 2);
  check(weight, "weight", 2);
  check(out, "out", 2);
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(N > 0 && weight.size(1) > 0, "weight must be non-empty, got shape ", weight.sizes());
  TORCH_CHECK(weight.size(1) == K, "weight must have shape [N, ", K, "] to match x ", x.sizes(),
              ", got ", weight.sizes());
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "out must have x's dtype ", x.scalar_type(),
              ", got ", out.scalar_type());
  TORCH_CHECK(out.size(0) == M && out.size(1) == N, "out must have shape [", M, ", ", N, "], got ",
              out.sizes());
  auto no_overlap = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(out.numel() == 0 || t.numel() == 0 ||
                    at::get_overlap_status(out, t) == at::MemOverlapStatus::No,
                "out must not overlap ", name);
  };
  no_overlap(x, "x");
  no_overlap(weight, "weight");
  if (bias.has_value() && bias->defined()) {
    check(*bias, "bias", 1);
    TORCH_CHECK(bias->scalar_type() == weight.scalar_type(), "bias must have weight's dtype ",
                weight.scalar_type(), ", got ", bias->scalar_type());
    TORCH_CHECK(bias->size(0) == N, "bias must have shape [", N, "], got ", bias->sizes());
    no_overlap(*bias, "bias");
  }
}

template <typename W, typename O>
void forward(Isa isa, const at::Tensor& x, const at::Tensor& weight, const float* bias, at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  const int64_t L = lanes_of(isa);
  const bool bf16_w = std::is_same_v<W, BF16>;
  const int64_t step = bf16_w ? 2 * L : L;
  const int64_t Kp = (K + step - 1) / step * step;
  const int64_t NR = nr_of<W>(isa);
  const int64_t blocks = (N + NR - 1) / NR;
  // At least ~32 KB of weights per thread, so tiny layers do not pay for a fork.
  const int64_t grain = std::max<int64_t>(1, (32 << 10) / (NR * K * static_cast<int64_t>(sizeof(W))));
  const bool dot_bf16 = isa == Isa::kAvx512Bf16;  // the caller took it only for bf16 x and weights
  thread_local CacheLineVector<float> xp;  // cache-line aligned: every x load is one line
  thread_local CacheLineVector<BF16> xb;
  // At least kPackedRowsMin rows; past a pass's own 2-7 rows, zeros (see block_rows).
  const int64_t rows = std::max(std::min(M, kMaxRowsPerPass), kPackedRowsMin);
  if (dot_bf16) xb.resize(rows * Kp);
  else xp.resize(rows * Kp);
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRowsPerPass) {
    const int64_t mc = std::min(kMaxRowsPerPass, M - m0);
    if (dot_bf16)
      pack_x_bf16(x.data_ptr<BF16>(), m0, mc, K, Kp, xb.data());
    else if (x.scalar_type() == at::kBFloat16)
      pack_x(x.data_ptr<BF16>(), m0, mc, K, Kp, L, bf16_w, xp.data());
    else
      pack_x(x.data_ptr<float>(), m0, mc, K, Kp, L, bf16_w, xp.data());
    if (mc > 1 && mc < kPackedRowsMin) {  // a lone partial tile reads the zero rows
      if (dot_bf16) std::fill(xb.data() + mc * Kp, xb.data() + kPackedRowsMin * Kp, BF16(0.0f));
      else std::fill(xp.data() + mc * Kp, xp.data() + kPackedRowsMin * Kp, 0.0f);
    }
    const void* packed = dot_bf16 ? static_cast<const void*>(xb.data()) : xp.data();
    Problem p{weight.data_ptr(), packed, bias, static_cast<O*>(out.data_ptr()) + m0 * N, mc, N, K, Kp};
    at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) { run<W, O>(isa, p, b0, b1); });
  }
}

}  // namespace

const char* small_batch_linear_isa() { return isa_name(current_isa()); }

void small_batch_linear_cpu(const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::Tensor out) {
  check_args(x, weight, bias, out);
  if (x.size(0) == 0) return;
  const bool w16 = weight.scalar_type() == at::kBFloat16, o16 = out.scalar_type() == at::kBFloat16;
  Isa isa = current_isa();
  // bf16 pairs only when x and the weights are both bf16: rounding fp32 x to bf16 would
  // change the result.
  if (isa == Isa::kAvx512Bf16 && !(w16 && x.scalar_type() == at::kBFloat16)) isa = Isa::kAvx512;
  // The bias as fp32 (N floats: nothing next to the N*K weights).
  at::Tensor bias32;
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    bias32 = bias->scalar_type() == at::kFloat ? *bias : bias->to(at::kFloat);
    b = bias32.data_ptr<float>();
  }
  if (w16 && o16) forward<BF16, BF16>(isa, x, weight, b, out);
  else if (w16) forward<BF16, float>(isa, x, weight, b, out);
  else if (o16) forward<float, BF16>(isa, x, weight, b, out);
  else forward<float, float>(isa, x, weight, b, out);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("small_batch_linear", &domino::cpu::small_batch_linear_cpu); }
