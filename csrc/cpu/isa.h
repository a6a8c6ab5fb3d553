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
// The environment variable is read once, when domino_ops._C is imported (bindings/
// module.cpp: with the GIL held, so no Python thread's os.environ write races it; else at
// the first call); an invalid value makes every
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

// attend_block's key classes over the rows of a block.
constexpr uint8_t kKeyHidden = 0, kKeyVisible = 1, kKeyMixed = 2;
// attend_block's chunk of transposed keys, in floats (16 KB: L1, with the chunk's values).
constexpr int64_t kAttendChunkFloats = 4096;

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
  // Meanwhile the `ahead` cache lines from `prefetch` on are prefetched to L2, at most two
  // per vector of each of its two passes over the tile (a memory stream that would
  // otherwise wait for this arithmetic to end).
  void (*logits_tile_f32)(float* dots, int64_t n, const float* base, float* base_out,
                          float* row_out, TileStats* stats, const char* prefetch, int64_t ahead);
  void (*logits_tile_bf16)(float* dots, int64_t n, const uint16_t* base, uint16_t* base_out,
                           float* row_out, TileStats* stats, const char* prefetch, int64_t ahead);

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

  // One row of n: out = round(w * round(x / sqrt(mean(x^2) + eps))), HF's LlamaRMSNorm
  // order, rounded to the dtype after each step (rms_norm.cpp).
  void (*rms_norm_f32)(const float* x, const float* w, int64_t n, float eps, float* out);
  void (*rms_norm_bf16)(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* out);
  // sum = x + y rounded to the dtype (at::add's bits, NaN payloads aside), then out =
  // rms_norm of that row as above: a layer's residual add and the next norm in one pass
  // (rms_norm.cpp's add_rms_norm_cpu).
  void (*add_rms_norm_f32)(const float* x, const float* y, const float* w, int64_t n, float eps, float* sum,
                           float* out);
  void (*add_rms_norm_bf16)(const uint16_t* x, const uint16_t* y, const uint16_t* w, int64_t n, float eps,
                            uint16_t* sum, uint16_t* out);
  // out[i] = round(round(silu(gate[i])) * up[i]) for i < n, rounded to the dtype (bf16:
  // nearest even) after each step, as HF's act_fn(gate) * up (silu_mul.cpp).
  void (*silu_mul_f32)(const float* gate, const float* up, int64_t n, float* out);
  void (*silu_mul_bf16)(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out);

  // One row of HF's rotary embedding (apply_rotary_pos_emb.cpp): out[i] = round(round(x[i] *
  // c[i]) + round(r[i] * s[i])) for i < D (even), r = (-x[D/2:], x[:D/2]), rounded to the
  // dtype (bf16: nearest even) after each product and the sum, as PyTorch's elementwise ops.
  void (*rotary_row_f32)(const float* x, const float* c, const float* s, int64_t D, float* out);
  void (*rotary_row_bf16)(const uint16_t* x, const uint16_t* c, const uint16_t* s, int64_t D, uint16_t* out);

  // Attention of a block of nq query rows against the keys [0, n) of one kv head
  // (small_batch_attention.cpp). q is nq rows of D floats (widened by the caller); k and v
  // the kv head's first key and value rows, k_stride / v_stride elements apart; vis
  // [nq][n] says which keys each row sees (1) and hides (0); key_class[j] is kKeyVisible
  // (every row sees j), kKeyHidden (no row does) or kKeyMixed; bias, when given, [nq][n]
  // added to the visible scores. Scratch: scores nq * round_up(n, lanes) floats, kt
  // max(kAttendChunkFloats, lanes * round_up(D, lanes)) floats, acc nq * (round_up(D, lanes) + 1) floats;
  // out[r] is row r's D outputs. For each row: out = sum_j p_j v_j / sum_j p_j over its
  // visible keys in order, p_j = exp(s_j - max s), s_j = scale * (q . k_j) + bias_j, the dot
  // product one FMA chain over d per key (keys in vector lanes), max and sums in key order,
  // exp elementwise. Which rows share the block, where hidden keys sit, which thread runs
  // it: none of it changes a bit. A row with no visible key, or every score -inf, gets zeros.
  // With `scored`, scores already holds scale * (q . k_j) (rows round_up(n, lanes) apart,
  // from attention_scores_amx): the block starts at the softmax, and (bf16, the avx512
  // build) its value sums run on AMX tiles too (cpu/attention_values_amx.h).
  void (*attend_block_f32)(const float* q, int64_t nq, int64_t D, const float* k, int64_t k_stride, const float* v,
                           int64_t v_stride, const uint8_t* vis, const uint8_t* key_class, const float* bias,
                           int64_t n, float scale, bool scored, float* scores, float* kt, float* acc,
                           float* const* out);
  void (*attend_block_bf16)(const float* q, int64_t nq, int64_t D, const uint16_t* k, int64_t k_stride,
                            const uint16_t* v, int64_t v_stride, const uint8_t* vis, const uint8_t* key_class,
                            const float* bias, int64_t n, float scale, bool scored, float* scores, float* kt,
                            float* acc, uint16_t* const* out);
  // scores[r * lds + j] = scale * (q_r . k_j) for r < nq <= 16 and the n bf16 keys, by AMX
  // tiles (TDPBF16PS: its own order within 32 elements, denormals flushed; batch-invariant,
  // not the vector path's bits). q as attend_block takes it (bf16 values widened). Needs
  // amx_available() and D a multiple of 32 up to 128. The avx512 build only: null in the
  // others.
  void (*attention_scores_amx)(const float* q, int64_t nq, int64_t D, const uint16_t* k, int64_t k_stride,
                               int64_t n, float scale, float* scores, int64_t lds);
};

// The active table (see the top of this file). Throws c10::ValueError for an invalid
// DOMINO_CPU_ISA.
const Kernels& kernels();

}  // namespace domino::cpu
