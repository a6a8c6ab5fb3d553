// The AMX path of small_batch_linear_packed (and of packed_panels_f32, domino_head_expand's
// w2 product): the same packed weight, the same outputs' meaning, the product done by Intel
// AMX tiles (TDPBF16PS) instead of AVX512-BF16 vectors. On Sapphire Rapids and later Xeons.
//
// Bytes it must move: the packed weight once (N*K*2, padded to whole panels), whatever M
// is, as the vector path. What changes is the work per weight byte: one TDPBF16PS takes a
// 1 KB weight tile (16 column pairs x 16 outputs) and multiplies it into up to 16 rows in
// ~16 cycles, where the vector path spends 16 VDPBF16PS per row on the same kilobyte. So
// the vector path becomes compute-bound from ~6 rows, this one stays bound by the weight
// stream up to 16 rows and beyond (benchmarks/bench_linear.py; on a 2-core Xeon VM a
// 16-token SmolLM2 forward's linears go from ~1.7x to ~1.1x a one-token forward's).
//
// Tiles (8 registers): 0-2 the accumulators of one panel's three 16-output blocks (rows x
// 16 fp32); 3 the x rows' next 16 column pairs; 4 and 5 weight tiles (16 pairs x 16 outputs
// x 2, loaded straight from the packed panel with a 192-byte row stride: the panel layout
// [Kh, 48, 2] holds each 16-output block's rows 192 bytes apart); 6 and 7 the x and weight
// tiles of K's last, partial chunk of column pairs (pairs % 16 of them), so nothing is read
// past x or the panel. Rows and panels run in groups of ~0.5 MB each (a prompt's many rows;
// decoding and verification are one block of up to 16 rows), each row block over its
// group's panels, so the group's x rows and panels are read from L2 after their first use
// (run(), where the numbers are). A group's first block prefetches the next panel to
// L2, one 3 KB chunk per chunk of its own: with the hardware prefetchers alone the tile
// loads streamed w2 ~20-30 % slower than a row-major GEMV (2-core Xeon VM, thirty-ninth
// session: benchmarks/results/tree_step_xeon_session39_amx_prefetch_ab.txt). Up to 16 rows
// (decoding, verification) are the exception since the sixty-first session: there a thread
// takes two panels at a time, chunk by chunk, with the hardware prefetchers alone
// (two_panel_block: tiles 0-5 the two panels' accumulators, 6 x, 7 each weight tile in
// turn; K a whole number of 16-pair chunks), two weight streams: SmolLM2's 211 bf16 layers
// at one row 12.1-12.6 -> 10.9 ms and at 16 rows 12.8-13.3 -> 11.4-11.7 ms, the engine's
// one-token forward 12.2-13.0 -> 11.5-11.9 ms and its 8- and 16-token ones ~3-4 % faster
// (benchmarks/compare_builds.sh over packed_placement_ab.py and engine_speed.py forward
// --fixed, results/amx_two_panels_xeon_session61.txt).
//
// Batch invariance, by construction: a tile product's row m depends on row m of x and the
// weight tile only, and the chunks of 16 column pairs are added to the accumulator in order
// (then + bias in fp32, then one rounding to out's dtype), so out[m, n] depends on K alone:
// not on M, the rows beside it, the block, the panel split or the thread count. Its bits
// are not the vector path's (TDPBF16PS sums inside a chunk in its own order: see
// tests/test_small_batch_linear_packed.py), so a process runs one path for all its forwards
// (small_batch_linear_packed_path()). TDPBF16PS treats denormal inputs as zero and flushes
// denormal results, as VDPBF16PS does.
//
// Linux hands out the 8 KB tile state only to a process that asks for it
// (arch_prctl(ARCH_REQ_XCOMP_PERM)); amx_available() asks once. The tile configuration is
// per thread: each run loads it and releases the tiles at the end.
#include "cpu/small_batch_linear_packed_amx.h"
#include "cpu/amx_tile_config.h"
#include "cpu/packed_outputs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define DOMINO_AMX 1
#else
#define DOMINO_AMX 0
#endif

namespace domino::cpu {
namespace {

constexpr int64_t kPanelCols = kPackedPanelCols;  // 48 outputs: three 16-output tiles
constexpr int kTileRows = 16;                     // x rows per tile, column pairs per chunk
constexpr int64_t kPairStride = 2 * kPanelCols * 2;  // bytes between a 16-output block's weight rows
constexpr int64_t kChunkBytes = kTileRows * kPairStride;  // a panel's chunk of 16 column pairs

#if DOMINO_AMX
bool request_amx() {
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  // the outputs' epilogue (the bf16 rounding among it) uses AVX-512 (BW, VL)
  if (!amx_bf16 || !amx_tile || !packed_outputs::cpu_supported()) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

#define DOMINO_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx2,fma")))

AmxTileConfig make_config(int rows, int64_t tail_pairs) {
  AmxTileConfig cfg;
  auto set = [&](int t, int r, int64_t bytes) {
    cfg.rows[t] = static_cast<uint8_t>(r);
    cfg.colsb[t] = static_cast<uint16_t>(bytes);
  };
  for (int t = 0; t < 3; ++t) set(t, rows, 64);  // accumulators: rows x 16 fp32
  set(3, rows, 64);                              // x: rows x 16 column pairs
  set(4, kTileRows, 64);                         // weights: 16 pairs x 16 outputs x 2
  set(5, kTileRows, 64);
  if (tail_pairs > 0) {
    set(6, rows, 4 * tail_pairs);                // x: rows x tail_pairs column pairs
    set(7, static_cast<int>(tail_pairs), 64);    // weights: tail_pairs pairs x 16 outputs x 2
  }
  return cfg;
}

// Up to 16 rows against two panels (decoding, verification; K a whole number of 16-pair
// chunks): tiles 0-2 panel a's accumulators, 3-5 panel b's, 6 the x chunk, 7 each weight
// tile in turn.
AmxTileConfig make_pair_config(int rows) {
  AmxTileConfig cfg;
  for (int t = 0; t < 7; ++t) {  // the accumulators and x: rows of 64 bytes
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = 64;
  }
  cfg.rows[7] = kTileRows;  // weights: 16 pairs x 16 outputs x 2
  cfg.colsb[7] = 64;
  return cfg;
}

// One chunk of column pairs: x tile X times the panel's three 16-output weight tiles (loaded
// into W0, W1, W0), added to the accumulators 0-2. A macro, not a template: GCC's tile
// intrinsics paste their tile numbers into the assembly text, so they must be literals.
#define DOMINO_AMX_CHUNK(X, W0, W1, x, ldx, w, stride) \
  do {                                                 \
    _tile_loadd(X, (x), (ldx) * 4);                    \
    _tile_loadd(W0, (w), (stride));                    \
    _tile_dpbf16ps(0, X, W0);                          \
    _tile_loadd(W1, (w) + 64, (stride));               \
    _tile_dpbf16ps(1, X, W1);                          \
    _tile_loadd(W0, (w) + 128, (stride));              \
    _tile_dpbf16ps(2, X, W0);                          \
  } while (0)

// x tile 6 times one panel's chunk at w (its three 16-output weight tiles, each loaded into
// tile 7 in turn), added to accumulator tiles T0-T2 (two_panel_block's configuration).
#define DOMINO_AMX_PANEL_CHUNK(T0, T1, T2, w, stride) \
  do {                                                \
    _tile_loadd(7, (w), (stride));                    \
    _tile_dpbf16ps(T0, 6, 7);                         \
    _tile_loadd(7, (w) + 64, (stride));               \
    _tile_dpbf16ps(T1, 6, 7);                         \
    _tile_loadd(7, (w) + 128, (stride));              \
    _tile_dpbf16ps(T2, 6, 7);                         \
  } while (0)

// Accumulator tiles T0-T2 (one panel's three 16-output blocks) into acc [16][48]; a macro
// for the same reason as DOMINO_AMX_CHUNK.
#define DOMINO_AMX_STORE_PANEL(T0, T1, T2, acc)  \
  do {                                           \
    _tile_stored(T0, (acc), kPanelCols * 4);      \
    _tile_stored(T1, (acc) + 16, kPanelCols * 4); \
    _tile_stored(T2, (acc) + 32, kPanelCols * 4); \
  } while (0)

// The outputs of one panel's accumulators (acc: [16][48] as the tiles were stored), `valid`
// rows of outputs [n0, n0 + cols), + bias, rounded once to O.
template <typename O>
DOMINO_AMX_TARGET inline void store_outputs(const float* acc, int valid, const float* bias, O* out, int64_t ldo,
                                            int64_t origin, int64_t n0, int64_t cols) {
  for (int v = 0; v < 3; ++v) {
    const int64_t c0 = 16 * v;
    if (c0 >= cols) break;
    const __mmask16 mask = packed_outputs::lanes(cols, c0);
    const __m512 b = packed_outputs::load_bias(bias == nullptr ? nullptr : bias + n0 + c0, mask);
    for (int m = 0; m < valid; ++m)
      packed_outputs::store(_mm512_loadu_ps(acc + m * kPanelCols + c0), bias != nullptr, b,
                            out + m * ldo + (n0 - origin) + c0, mask);
  }
}

// One block of `rows` x rows (x: pairs as 32-bit words, ldx words apart; rows past M are
// there, zero) times one panel; writes `valid` rows of outputs [n0, n0 + cols).
template <typename O>
DOMINO_AMX_TARGET inline void block(const c10::BFloat16* panel, int64_t pairs, const uint32_t* x, int64_t ldx,
                                    int valid, const float* bias, O* out, int64_t ldo, int64_t origin, int64_t n0,
                                    int64_t cols, float* acc /* [16][48] */, const char* next) {
  const int64_t chunks = pairs / kTileRows, tail = pairs % kTileRows;
  const char* w = reinterpret_cast<const char*>(panel);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  // `next` (the next panel, or null): its bytes matching each chunk of this one, to L2
  auto prefetch_next = [&](int64_t offset, int64_t bytes) {
    if (next != nullptr)
      for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(next + offset + b, _MM_HINT_T1);
  };
  for (int64_t c = 0; c < chunks; ++c) {
    prefetch_next(c * kChunkBytes, kChunkBytes);
    DOMINO_AMX_CHUNK(3, 4, 5, x + c * kTileRows, ldx, w + c * kChunkBytes, kPairStride);
  }
  if (tail > 0) {  // the last, partial chunk: its own x and weight tile shapes
    prefetch_next(chunks * kChunkBytes, tail * kPairStride);
    DOMINO_AMX_CHUNK(6, 7, 7, x + chunks * kTileRows, ldx, w + chunks * kChunkBytes, kPairStride);
  }
  DOMINO_AMX_STORE_PANEL(0, 1, 2, acc);
  store_outputs(acc, valid, bias, out, ldo, origin, n0, cols);
}

// `valid` rows of x (pairs as 32-bit words, ldx words apart) times panels a and b (outputs
// [n0, n0 + 96) below N), chunk by chunk: two weight streams at once, and the hardware
// prefetchers alone (a software prefetch of the next panel, as block() issues, made these
// rows slower). Each output's chunks are added in order, as in block(): the same bits.
// Needs the pair configuration for `valid` rows loaded and pairs a multiple of 16.
template <typename O>
DOMINO_AMX_TARGET inline void two_panel_block(const c10::BFloat16* a, const c10::BFloat16* b, int64_t pairs,
                                              const uint32_t* x, int64_t ldx, int valid, const float* bias, O* out,
                                              int64_t ldo, int64_t origin, int64_t n0, int64_t N,
                                              float* acc /* [16][48] */) {
  const char* wa = reinterpret_cast<const char*>(a);
  const char* wb = reinterpret_cast<const char*>(b);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_zero(4);
  _tile_zero(5);
  for (int64_t c = 0; c < pairs / kTileRows; ++c) {
    const int64_t off = c * kChunkBytes;
    _tile_loadd(6, x + c * kTileRows, ldx * 4);
    DOMINO_AMX_PANEL_CHUNK(0, 1, 2, wa + off, kPairStride);
    DOMINO_AMX_PANEL_CHUNK(3, 4, 5, wb + off, kPairStride);
  }
  DOMINO_AMX_STORE_PANEL(0, 1, 2, acc);
  store_outputs(acc, valid, bias, out, ldo, origin, n0, std::min(kPanelCols, N - n0));
  DOMINO_AMX_STORE_PANEL(3, 4, 5, acc);
  store_outputs(acc, valid, bias, out, ldo, origin, n0 + kPanelCols, std::min(kPanelCols, N - n0 - kPanelCols));
}

template <typename O>
DOMINO_AMX_TARGET void run(const c10::BFloat16* packed, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t M,
                           const float* bias, O* out, int64_t ldo, int64_t origin, int64_t N, int64_t p0,
                           int64_t p1) {
  if (M == 0 || p0 >= p1) return;  // a tile of 0 rows with 64-byte rows is an invalid configuration
  alignas(64) float acc[kTileRows * kPanelCols];
  if (M <= kTileRows && pairs % kTileRows == 0 && p0 + 1 < p1) {  // decoding, verification: two panels at a time
    const AmxTileConfig pair_cfg = make_pair_config(static_cast<int>(M));
    _tile_loadconfig(&pair_cfg);
    for (; p0 + 1 < p1; p0 += 2) {
      const c10::BFloat16* panel = packed + p0 * pairs * (2 * kPanelCols);
      two_panel_block<O>(panel, panel + pairs * (2 * kPanelCols), pairs, x, ldx, static_cast<int>(M), bias, out, ldo,
                         origin, p0 * kPanelCols, N, acc);
    }
    if (p0 == p1) {
      _tile_release();
      return;
    }
  }
  const int rows = static_cast<int>(std::min<int64_t>(M, kTileRows));
  const AmxTileConfig cfg = make_config(rows, pairs % kTileRows);
  _tile_loadconfig(&cfg);
  // Rows in groups and panels in groups of about kGroupBytes each, each row block then
  // running over its group's panels: a group's x rows and panels stay in L2 (a core's 2 MB
  // on the Xeon VM) and a row block's x tiles in L1 across its panels, where one pass of all
  // rows per panel re-read every x row from L3 once a panel (a 2,000-token prompt's x is 2.3
  // MB at K = 576; its products ran 1.2-1.7x faster so: benchmarks/bench_linear.py
  // --prompt-rows). Decoding and verification (M <= 16) are one row block: the panels in
  // order, as before. Each output is still one block call over all of K: the same bits
  // whatever the grouping.
  constexpr int64_t kGroupBytes = int64_t{1} << 19;
  const int64_t group_rows = std::max<int64_t>(kTileRows, kGroupBytes / (4 * pairs) / kTileRows * kTileRows);
  const int64_t group_panels = std::max<int64_t>(1, kGroupBytes / (pairs * 2 * kPanelCols * 2));
  for (int64_t g0 = 0; g0 < M; g0 += group_rows) {
    const int64_t g1 = std::min(M, g0 + group_rows);
    for (int64_t q0 = p0; q0 < p1; q0 += group_panels) {
      const int64_t q1 = std::min(p1, q0 + group_panels);
      for (int64_t m = g0; m < g1; m += kTileRows) {
        for (int64_t p = q0; p < q1; ++p) {
          const c10::BFloat16* panel = packed + p * pairs * (2 * kPanelCols);
          const int64_t n0 = p * kPanelCols, cols = std::min(kPanelCols, N - n0);
          // a group's first row block streams its panels from memory and prefetches each next one
          // (see the top of this file); the later blocks read them from L1/L2
          const char* next =
              M > 1 && m == g0 && p + 1 < p1 ? reinterpret_cast<const char*>(panel + pairs * (2 * kPanelCols)) : nullptr;
          block<O>(panel, pairs, x + m * ldx, ldx, static_cast<int>(std::min<int64_t>(kTileRows, M - m)), bias,
                   out + m * ldo, ldo, origin, n0, cols, acc, next);
        }
      }
    }
  }
  _tile_release();
}
#endif

}  // namespace

bool amx_available() {
#if DOMINO_AMX
  static const bool ok = request_amx();
  return ok;
#else
  return false;
#endif
}

int64_t amx_padded_rows(int64_t M) { return M <= kTileRows ? M : (M + kTileRows - 1) / kTileRows * kTileRows; }

void packed_panels_amx_f32(const c10::BFloat16* packed, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t M,
                           int64_t N, int64_t p0, int64_t p1, const float* bias, float* out, int64_t ldo,
                           int64_t origin) {
  TORCH_CHECK(amx_available(), "the AMX path needs a CPU with AMX-BF16 and an OS that grants the tile state");
#if DOMINO_AMX
  run<float>(packed, pairs, x, ldx, M, bias, out, ldo, origin, N, p0, p1);
#endif
}

void packed_panels_amx_bf16(const c10::BFloat16* packed, int64_t pairs, const uint32_t* x, int64_t ldx, int64_t M,
                            int64_t N, int64_t p0, int64_t p1, const float* bias, c10::BFloat16* out, int64_t ldo,
                            int64_t origin) {
  TORCH_CHECK(amx_available(), "the AMX path needs a CPU with AMX-BF16 and an OS that grants the tile state");
#if DOMINO_AMX
  run<c10::BFloat16>(packed, pairs, x, ldx, M, bias, out, ldo, origin, N, p0, p1);
#endif
}

}  // namespace domino::cpu
