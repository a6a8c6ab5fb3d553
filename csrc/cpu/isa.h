// The CPU kernels' instruction-set builds and the table of entry points each one exports.
//
// csrc/cpu/vec.cpp (with the shared vector code of vec.h) is compiled once per instruction
// set, each time into its own namespace (CMakeLists.txt: avx512 = -march=x86-64-v4, avx2 =
// -march=x86-64-v3, sse2 = the x86-64 baseline; "generic" on other architectures). Each
// build exports one `Kernels` table; the ops call through `kernels()`, the table of the
// build chosen once per process:
//
//   DOMINO_CPU_ISA unset, empty or "auto": the widest build this CPU (and OS) supports;
//   DOMINO_CPU_ISA=avx512|avx2|sse2|generic: that build, or an error naming the builds
//   this machine supports when the CPU lacks it or it was not compiled in.
//
// The environment variable is read once, on the first call; an invalid value makes every
// CPU op raise the same ValueError. `force_isa` (tests and benchmarks only, through
// domino_ops.cpu.forced_isa) switches the table for the rest of the process.
//
// This header is included by the per-ISA translation units, so it holds only plain
// declarations: no inline function with external linkage may be compiled there for one
// instruction set and picked by the linker for another.
#pragma once

#include <cstdint>

namespace domino::cpu {

// Greedy statistics of one vocabulary tile of one sequence.
struct TileStats {
  float max;    // max of the tile's logits; NaN if the tile has a NaN (torch.argmax)
  int64_t arg;  // first index of the max (or of the first NaN) within the tile
  float sum;    // sum of exp(L - max) over the tile; 0 when max is -inf
};

struct ArgMax {
  float value;
  int64_t index;  // first index of the max; 0 when no element compares (all NaN)
};

// Entry points of one instruction-set build. Layouts: "x" holds nb activation vectors of
// `cols` floats, `x_stride` apart; y[j * y_stride + row] is the dot product of weight row
// `row` with activation j. bf16 is passed as its raw uint16_t bits.
struct Kernels {
  const char* name;  // "avx512", "avx2", "sse2" or "generic"
  int lanes;         // floats per vector register

  // rows_dot_bf16 reads activations in a permuted layout (see vec.h); pack_bf16_x writes
  // it: out[j * cols + ...] for j < nb. rows_dot_f32 takes activations as they are.
  void (*pack_bf16_x)(const float* x, int64_t x_stride, int64_t nb, int64_t cols, float* out);
  void (*rows_dot_f32)(const float* w, int64_t rows, int64_t cols, const float* x,
                       int64_t x_stride, int64_t nb, float* y, int64_t y_stride);
  void (*rows_dot_bf16)(const uint16_t* w, int64_t rows, int64_t cols, const float* x_packed,
                        int64_t x_stride, int64_t nb, float* y, int64_t y_stride);

  // One vocabulary tile of one sequence of the head: L = base + dots (n values; dots is
  // overwritten with L). Then, each when non-null: base_out = L rounded to the base dtype
  // (write_logits), row_out = L (the sampling row), *stats = the tile's greedy statistics.
  void (*logits_tile_f32)(float* dots, int64_t n, const float* base, float* base_out,
                          float* row_out, TileStats* stats);
  void (*logits_tile_bf16)(float* dots, int64_t n, const uint16_t* base, uint16_t* base_out,
                           float* row_out, TileStats* stats);

  // dst[j] = src[j] for j < n, the whole vectors from dst's first vector boundary on with
  // non-temporal stores (a row written once and not read back soon: no read-for-ownership,
  // no cache pollution).
  // The caller fences (_mm_sfence) before another thread reads dst.
  void (*stream_copy)(const float* src, int64_t n, float* dst);

  // out[j] = silu(a[j] + b[j]).
  void (*silu_add)(const float* a, const float* b, int64_t n, float* out);
  // GRU cell without biases, for hidden units [j0, j1) of one sequence: gi and gh are the
  // [3G] input and hidden projections in (r, z, n) order, h the old state, h_new the new.
  void (*gru_update)(const float* gi, const float* gh, int64_t G, int64_t j0, int64_t j1,
                     const float* h, float* h_new);
  void (*widen_bf16)(const uint16_t* x, int64_t n, float* out);

  ArgMax (*argmax_f32)(const float* x, int64_t n);
  ArgMax (*argmax_bf16)(const uint16_t* x, int64_t n);
  // The first j in [j0, n) with x[j] > t or x[j] NaN (!(x[j] <= t)); n when there is none.
  int64_t (*first_above)(const float* x, int64_t j0, int64_t n, float t);

  // Sampling: z = (x - max x) / temperature with the extreme-value rules of row_sampler.h
  // (NaN -> -inf, +inf entries share the mass); returns max(z): 0, or -inf for no mass.
  float (*temper_f32)(const float* x, int64_t n, float temperature, float* z);
  float (*temper_bf16)(const uint16_t* x, int64_t n, float temperature, float* z);
  // w[j] = exp(double(z[j] - m)) (0 where z[j] == -inf); returns the sum of w (summed in
  // vector lanes, so not in index order).
  double (*exp_weights)(const float* z, int64_t n, float m, double* w);

  // Attention of nq query rows that see the same n keys (the query heads of one kv head,
  // small_batch_attention.cpp): for each row r (q + r * q_stride, out + r * out_stride),
  // out[0, D) = sum_j p_j v_{idx[j]} / sum_j p_j, p_j = exp(s_j - max s),
  // s_j = scale * (q_r . k_{idx[j]}) + (bias ? bias[j] : 0); key row i of k starts at
  // k + i * k_stride (v likewise). scores: nq * n floats of scratch. Every step of a row
  // depends only on its q and the visible keys' values in order: lanes run over D (a fixed
  // sum tree per dot product), max and sum run in key order, exp is elementwise. Where the
  // keys sit, how many rows the call or the group carries, which thread runs it: none of
  // it changes a bit. A row with no key, or every score -inf, gets zeros.
  void (*attend_rows_f32)(const float* q, int64_t q_stride, int64_t nq, const float* k,
                          int64_t k_stride, const float* v, int64_t v_stride, const int64_t* idx,
                          const float* bias, int64_t n, int64_t D, float scale, float* scores,
                          float* out, int64_t out_stride);
  // bf16 k, v and out; q widened to float by the caller (exact), once per call rather than
  // once per key.
  void (*attend_rows_bf16)(const float* q, int64_t q_stride, int64_t nq, const uint16_t* k,
                           int64_t k_stride, const uint16_t* v, int64_t v_stride,
                           const int64_t* idx, const float* bias, int64_t n, int64_t D,
                           float scale, float* scores, uint16_t* out, int64_t out_stride);
};

// The active table (see the top of this file). Throws c10::ValueError for an invalid
// DOMINO_CPU_ISA.
const Kernels& kernels();

}  // namespace domino::cpu
