// The Domino head's per-step math on the CPU, shared by domino_head_rollout (a chain per
// sequence) and domino_head_expand (a frontier of tree nodes): weight matrices streamed
// once against a batch of activations through the instruction-set build of isa.h, the
// logits tiles, and the thread split. See domino_head_rollout.cpp for what limits each.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu/aligned.h"
#include "cpu/isa.h"

namespace domino::cpu {

// Vocabulary rows per rows_dot call: the tile's dot products ([b][tile] floats) stay in L1.
constexpr int64_t kVocabTile = 256;
// Vocabulary rows a thread claims at a time (dynamic: a thread slowed by another process
// takes fewer). Partials are kept per chunk and merged in chunk order, so results do not
// depend on the schedule.
constexpr int64_t kVocabChunk = 16 * kVocabTile;

// A row's running max, its first index and sum(exp(L - max)) over vocabulary tiles
// (log-sum-exp with rescaling): the greedy choice and its log-probability without storing L.
struct RunningLse {
  float max = -std::numeric_limits<float>::infinity();
  int64_t arg = std::numeric_limits<int64_t>::max();
  float sum = 0.0f;  // sum of exp(L - max)

  // Merged in vocabulary order, so a NaN (max NaN: see TileStats) met first stays.
  void merge(float other_max, int64_t other_arg, float other_sum) {
    if (max != max) return;
    if (other_max != other_max) {
      *this = RunningLse{other_max, other_arg, other_sum};
      return;
    }
    if (other_max > max || (other_max == max && other_arg < arg)) {
      if (other_max > max) sum = sum * std::exp(max - other_max) + other_sum;
      else sum += other_sum;
      max = other_max;
      arg = other_arg;
    } else if (other_sum != 0.0f) {  // an all -inf tile adds nothing (and -inf - -inf is NaN)
      sum += other_sum * std::exp(other_max - max);
    }
  }

  // One row's total from its per-chunk partials partial[c * stride], merged in chunk order
  // (so the result does not depend on which thread computed which chunk).
  static RunningLse of_chunks(const RunningLse* partial, int64_t n_chunks, int64_t stride) {
    RunningLse total;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const RunningLse& q = partial[c * stride];
      if (q.arg != std::numeric_limits<int64_t>::max()) total.merge(q.max, q.arg, q.sum);
    }
    return total;
  }
};

// Splits [0, n) into one contiguous range per thread, aligned to `align`, at least
// `min_per_thread` long.
template <typename F>
void parallel_ranges(int64_t n, int64_t align, int64_t min_per_thread, const F& f) {
  const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(min_per_thread, 1));
  const int64_t parts = std::min<int64_t>(at::get_num_threads(), max_parts);
  int64_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  if (parts == 1) {
    f(0, 0, n);
    return;
  }
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t begin = std::min(n, p * per), end = std::min(n, (p + 1) * per);
      f(p, begin, end);
    }
  });
}

// Weight matrices of dtype W against nb activation vectors through the active build.
template <typename W>
struct Gemv {
  const Kernels& K;
  static constexpr bool kBf16 = std::is_same_v<W, c10::BFloat16>;

  // Rows per thread so that a thread's share is worth a fork (>= 512 KB of weights): w1s
  // (0.5 MB at the paper shape) then runs on one thread, ~20 us more than on two on a
  // quiet machine, but one fork/join less per step, and on a shared machine every
  // fork/join can wait a scheduler slice for its second thread.
  static int64_t min_rows(int64_t cols) {
    return std::max<int64_t>(16, (int64_t{512} << 10) / std::max<int64_t>(1, cols * int64_t(sizeof(W))));
  }
  // The activations [nb][cols] in the layout rows_dot reads (permuted for bf16 weights),
  // starting on a cache line (copied into buf when x does not).
  const float* prepare(const float* x, int64_t nb, int64_t cols, AlignedFloats& buf) const {
    if constexpr (!kBf16) {
      if (reinterpret_cast<uintptr_t>(x) % 64 == 0) return x;
      buf.assign(x, x + nb * cols);
      return buf.data();
    } else {
      buf.resize(nb * cols);
      K.pack_bf16_x(x, cols, nb, cols, buf.data());
      return buf.data();
    }
  }
  // y[j * ys + row] = dot(w[row, :cols], x_j) for rows [0, rows).
  void dot(const W* w, int64_t rows, int64_t cols, const float* xp, int64_t nb, float* y,
           int64_t ys) const {
    if constexpr (kBf16)
      K.rows_dot_bf16(reinterpret_cast<const uint16_t*>(w), rows, cols, xp, cols, nb, y, ys);
    else
      K.rows_dot_f32(w, rows, cols, xp, cols, nb, y, ys);
  }
  void widen(const W* x, int64_t n, float* out) const {
    if constexpr (kBf16)
      K.widen_bf16(reinterpret_cast<const uint16_t*>(x), n, out);
    else
      std::copy(x, x + n, out);
  }
};

template <typename BL>
void logits_tile(const Kernels& K, float* dots, int64_t n, BL* base, bool write, float* row,
                 TileStats* st, const char* prefetch = nullptr, int64_t ahead = 0) {
  if constexpr (std::is_same_v<BL, c10::BFloat16>) {
    auto* bits = reinterpret_cast<uint16_t*>(base);
    K.logits_tile_bf16(dots, n, bits, write ? bits : nullptr, row, st, prefetch, ahead);
  } else {
    K.logits_tile_f32(dots, n, base, write ? base : nullptr, row, st, prefetch, ahead);
  }
}

// act[f] = silu(hproj_row(f) + w1s @ S[f]) for n states (Sp: S in rows_dot's layout), the
// rows of w1s split across threads; hproj_row(f) points at state f's r floats of hproj.
template <typename W, typename HprojRow>
void correction_input(const Gemv<W>& gemv, const W* w1s, const float* Sp, int64_t n, int64_t r, int64_t G,
                      const HprojRow& hproj_row, float* w1s_out, float* act) {
  // a fork is worth it by multiply-adds, not bytes alone: one state keeps w1s on one thread
  // (min_rows), a tree step's 16 states (16x the multiply-adds over the same 0.5 MB at the
  // paper shape) split it
  parallel_ranges(r, 16, std::max<int64_t>(16, Gemv<W>::min_rows(G) / std::max<int64_t>(n, 1)),
                  [&](int64_t, int64_t r0, int64_t r1) {
    if (r0 >= r1) return;
    gemv.dot(w1s + r0 * G, r1 - r0, G, Sp, n, w1s_out + r0, r);
    for (int64_t f = 0; f < n; ++f) gemv.K.silu_add(hproj_row(f) + r0, w1s_out + f * r + r0, r1 - r0, act + f * r + r0);
  });
}

// S_out[c] = GRUCell(E[tokens[c]], S[c / m]) for the n * m children of n states, gates in
// torch.nn.GRUCell order (r, z, n), no biases: w_hh @ S once per state, the input gates per
// child (rows of the table gru_input [V, 3G], or w_ih [3G, H] @ the embedding rows). Each
// thread owns hidden units [j0, j1): the three gate rows of w_hh (and w_ih) for them, then
// their new state, so the whole GRU is one parallel phase. gi [n*m, 3G], gh [n, 3G]: with
// gh_given, gh already holds w_hh @ S (domino_head_expand's packed product) and w_hh is not read.
template <typename W>
void gru_step(const Gemv<W>& gemv, const W* gru_input, const W* w_ih, const W* w_hh, const float* S,
              const float* Sp, const int64_t* tokens, int64_t n, int64_t m, int64_t G, int64_t H, float* gi,
              float* gh, AlignedFloats& emb, AlignedFloats& emb_buf, float* S_out, bool gh_given = false) {
  const int64_t G3 = 3 * G, nc = n * m;
  const float* ep = nullptr;
  if (w_ih != nullptr) {
    emb.resize(nc * H);
    for (int64_t c = 0; c < nc; ++c) gemv.widen(gru_input + tokens[c] * H, H, emb.data() + c * H);
    ep = gemv.prepare(emb.data(), nc, H, emb_buf);
  }
  const int64_t gru_cols = G + (w_ih != nullptr ? H : 0);
  parallel_ranges(G, 16, std::max<int64_t>(1, Gemv<W>::min_rows(gru_cols) / 3), [&](int64_t, int64_t j0, int64_t j1) {
    if (j0 >= j1) return;
    for (int64_t g = 0; g < 3; ++g) {
      if (!gh_given) gemv.dot(w_hh + (g * G + j0) * G, j1 - j0, G, Sp, n, gh + g * G + j0, G3);
      if (w_ih != nullptr)
        gemv.dot(w_ih + (g * G + j0) * H, j1 - j0, H, ep, nc, gi + g * G + j0, G3);
      else
        for (int64_t c = 0; c < nc; ++c)
          gemv.widen(gru_input + tokens[c] * G3 + g * G + j0, j1 - j0, gi + c * G3 + g * G + j0);
    }
    for (int64_t c = 0; c < nc; ++c)
      gemv.K.gru_update(gi + c * G3, gh + (c / m) * G3, G, j0, j1, S + (c / m) * G, S_out + c * G);
  });
}

}  // namespace domino::cpu
