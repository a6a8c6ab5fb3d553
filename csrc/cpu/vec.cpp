// One instruction-set build of the CPU kernels' vector code: CMakeLists.txt compiles this
// file once per build with its -march and DOMINO_ISA, and isa.cpp picks one table.
#include "cpu/vec.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define DOMINO_STR2(x) #x
#define DOMINO_STR(x) DOMINO_STR2(x)

namespace domino::cpu::DOMINO_ISA {
namespace {

template <size_t... I>
DOMINO_INLINE vf2 low_half(vf v, std::index_sequence<I...>) { return __builtin_shufflevector(v, v, int(I)...); }
template <size_t... I>
DOMINO_INLINE vf2 high_half(vf v, std::index_sequence<I...>) { return __builtin_shufflevector(v, v, int(L / 2 + I)...); }

// The last n < L values of an array as a vector, padded with `fill`.
template <typename T>
DOMINO_INLINE vf load_partial(const T* p, int64_t n, float fill) {
  float t[L];
  for (int i = 0; i < L; ++i) t[i] = i < n ? to_float(p[i]) : fill;
  return loadu(t);
}
DOMINO_INLINE void store_partial(float* p, int64_t n, vf v) {
  float t[L];
  storeu(t, v);
  for (int64_t i = 0; i < n; ++i) p[i] = t[i];
}

void pack_bf16_x(const float* x, int64_t xs, int64_t nb, int64_t cols, float* out) {
  const int64_t cv = cols - cols % (2 * L);
  for (int64_t j = 0; j < nb; ++j) {
    const float* src = x + j * xs;
    float* dst = out + j * cols;
    for (int64_t c = 0; c < cv; c += 2 * L)
      for (int l = 0; l < L; ++l) {
        dst[c + l] = src[c + 2 * l];
        dst[c + L + l] = src[c + 2 * l + 1];
      }
    for (int64_t c = cv; c < cols; ++c) dst[c] = src[c];
  }
}

void rows_dot_f32(const float* w, int64_t rows, int64_t cols, const float* x, int64_t xs,
                  int64_t nb, float* y, int64_t ys) {
  rows_dot_impl(w, rows, cols, x, xs, nb, y, ys);
}

void rows_dot_bf16(const uint16_t* w, int64_t rows, int64_t cols, const float* x, int64_t xs,
                   int64_t nb, float* y, int64_t ys) {
  rows_dot_impl(w, rows, cols, x, xs, nb, y, ys);
}

// The scans' two tests of a value v against t: above t or NaN, !(v <= t) ("not less or
// equal, unordered"), and equal to t (ordered: a NaN never is).
enum class Test { kAboveOrNan, kEqual };

template <Test kTest>
DOMINO_INLINE bool passes(float v, float t) {
  return kTest == Test::kAboveOrNan ? !(v <= t) : v == t;
}

// Whether any of the 4L values at p passes the test against t: one compare per vector and
// one test of the four masks.
template <Test kTest>
DOMINO_INLINE bool any4(const float* p, float t) {
#if defined(__AVX512F__) || defined(__AVX2__)
  constexpr int kCmp = kTest == Test::kAboveOrNan ? _CMP_NLE_UQ : _CMP_EQ_OQ;
#endif
#if defined(__AVX512F__)
  const __m512 tv = _mm512_set1_ps(t);
  const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(p), tv, kCmp) |
                      _mm512_cmp_ps_mask(_mm512_loadu_ps(p + L), tv, kCmp) |
                      _mm512_cmp_ps_mask(_mm512_loadu_ps(p + 2 * L), tv, kCmp) |
                      _mm512_cmp_ps_mask(_mm512_loadu_ps(p + 3 * L), tv, kCmp);
  return m != 0;
#elif defined(__AVX2__)
  const __m256 tv = _mm256_set1_ps(t);
  const __m256 m = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), tv, kCmp),
                                             _mm256_cmp_ps(_mm256_loadu_ps(p + L), tv, kCmp)),
                                _mm256_or_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + 2 * L), tv, kCmp),
                                             _mm256_cmp_ps(_mm256_loadu_ps(p + 3 * L), tv, kCmp)));
  return _mm256_movemask_ps(m) != 0;
#else
  for (int i = 0; i < 4 * L; ++i)
    if (passes<kTest>(p[i], t)) return true;
  return false;
#endif
}

// The first i in [j0, n) whose x[i] passes the test against t (n if none): 4L values per
// test, since the scans' hits are rare.
template <Test kTest>
DOMINO_INLINE int64_t first_passing(const float* x, int64_t j0, int64_t n, float t) {
  int64_t i = j0;
  while (i + 4 * L <= n && !any4<kTest>(x + i, t)) i += 4 * L;
  for (; i < n; ++i)  // the block that has it (or the tail): at most 4L - 1 more values
    if (passes<kTest>(x[i], t)) return i;
  return n;
}

// L = base + dots; optional write-back and sampling row; greedy statistics with
// torch.argmax's rules: the first NaN if the tile has one (then max and sum are NaN), else
// the max, its first index, and sum(exp(L - max)) (0 for a tile that is all -inf, so it
// adds nothing when merged).
template <typename BT>
void logits_tile(float* d, int64_t n, const BT* base, BT* base_out, float* row_out, TileStats* st) {
  const int64_t nv = n - n % L;
  vf vm = splat(-kInf);
  vf probe = vf{};  // NaN iff some L is NaN or infinite (L - L)
  for (int64_t i = 0; i < nv; i += L) {
    const vf l = loadu(base + i) + loadu(d + i);
    storeu(d + i, l);
    if (base_out) storeu(base_out + i, l);
    if (row_out) storeu(row_out + i, l);
    vm = l > vm ? l : vm;
    probe += l - l;
  }
  float m = hmax(vm);
  float tail_probe = 0.0f;
  for (int64_t i = nv; i < n; ++i) {
    const float l = to_float(base[i]) + d[i];
    d[i] = l;
    if (base_out) store_one(base_out + i, l);
    if (row_out) row_out[i] = l;
    if (l > m) m = l;
    tail_probe += l - l;
  }
  if (st == nullptr) return;
  const float p = hsum(probe) + tail_probe;
  if (p != p) {
    for (int64_t i = 0; i < n; ++i)
      if (d[i] != d[i]) {
        *st = TileStats{d[i], i, d[i]};
        return;
      }
  }
  if (m == -kInf) {
    *st = TileStats{m, 0, 0.0f};
    return;
  }
  const int64_t arg = first_passing<Test::kEqual>(d, 0, n, m);  // m is finite or +inf: some d[i] is m
  vf acc = vf{};
  for (int64_t i = 0; i < nv; i += L) acc += exp_approx(loadu(d + i) - m);
  if (nv < n) {
    const vf e = exp_approx(load_partial(d + nv, n - nv, m) - m);
    float t[L];
    storeu(t, e);
    for (int64_t i = n - nv; i < L; ++i) t[i] = 0.0f;
    acc += loadu(t);
  }
  *st = TileStats{m, arg, hsum(acc)};
}

void logits_tile_f32(float* d, int64_t n, const float* base, float* base_out, float* row_out,
                     TileStats* st) {
  logits_tile(d, n, base, base_out, row_out, st);
}
void logits_tile_bf16(float* d, int64_t n, const uint16_t* base, uint16_t* base_out,
                      float* row_out, TileStats* st) {
  logits_tile(d, n, base, base_out, row_out, st);
}

void stream_copy(const float* src, int64_t n, float* dst) {
  int64_t i = 0;
  if (reinterpret_cast<uintptr_t>(dst) % sizeof(float) == 0) {
    // plain stores up to dst's first vector boundary, then whole vectors streamed
    for (; i < n && reinterpret_cast<uintptr_t>(dst + i) % (4 * L) != 0; ++i) dst[i] = src[i];
    for (; i + L <= n; i += L) {
#if defined(__AVX512F__)
      _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#elif defined(__AVX2__)
      _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#else
      storeu(dst + i, loadu(src + i));
#endif
    }
  }
  for (; i < n; ++i) dst[i] = src[i];
}

void silu_add(const float* a, const float* b, int64_t n, float* out) {
  const int64_t nv = n - n % L;
  for (int64_t i = 0; i < nv; i += L) {
    const vf x = loadu(a + i) + loadu(b + i);
    storeu(out + i, x * sigmoid(x));
  }
  if (nv < n) {
    const vf x = load_partial(a + nv, n - nv, 0.0f) + load_partial(b + nv, n - nv, 0.0f);
    store_partial(out + nv, n - nv, x * sigmoid(x));
  }
}

// tanh(x) = 2 sigmoid(2x) - 1: absolute error ~2e-7 near 0.
DOMINO_INLINE vf gru_cell(vf ir, vf hr, vf iz, vf hz, vf in, vf hn, vf h) {
  const vf r = sigmoid(ir + hr);
  const vf z = sigmoid(iz + hz);
  const vf n = 2.0f * sigmoid(2.0f * (in + r * hn)) - 1.0f;
  return (1.0f - z) * n + z * h;
}

void gru_update(const float* gi, const float* gh, int64_t G, int64_t j0, int64_t j1,
                const float* h, float* h_new) {
  int64_t j = j0;
  for (; j + L <= j1; j += L)
    storeu(h_new + j, gru_cell(loadu(gi + j), loadu(gh + j), loadu(gi + G + j), loadu(gh + G + j),
                               loadu(gi + 2 * G + j), loadu(gh + 2 * G + j), loadu(h + j)));
  if (j < j1) {
    const int64_t n = j1 - j;
    store_partial(h_new + j, n,
                  gru_cell(load_partial(gi + j, n, 0.0f), load_partial(gh + j, n, 0.0f),
                           load_partial(gi + G + j, n, 0.0f), load_partial(gh + G + j, n, 0.0f),
                           load_partial(gi + 2 * G + j, n, 0.0f),
                           load_partial(gh + 2 * G + j, n, 0.0f), load_partial(h + j, n, 0.0f)));
  }
}

void widen_bf16(const uint16_t* x, int64_t n, float* out) {
  const int64_t nv = n - n % L;
  for (int64_t i = 0; i < nv; i += L) storeu(out + i, loadu(x + i));
  for (int64_t i = nv; i < n; ++i) out[i] = to_float(x[i]);
}

// First index of the max (torch.argmax semantics: the first NaN wins if there is one).
// Four independent (max, index) chains of L lanes; each lane keeps its first maximum
// (strict >), and lanes are merged by value, then by lowest index.
template <typename T>
ArgMax argmax_block(const T* x, int64_t n, int64_t offset) {  // n < 2^31
  constexpr int U = 4;
  vf best[U];
  vi idx[U];
  vi lane;
  for (int l = 0; l < L; ++l) lane[l] = l;
  vi nan = vi{};
  for (int u = 0; u < U; ++u) {
    best[u] = splat(-kInf);
    idx[u] = vi{} - 1;
  }
  int64_t i = 0;
  for (; i + U * L <= n; i += U * L) {
    DOMINO_UNROLL
    for (int u = 0; u < U; ++u) {
      const vf v = loadu(x + i + u * L);
      const vi gt = v > best[u];
      best[u] = gt ? v : best[u];
      idx[u] = gt ? lane + static_cast<int32_t>(i + u * L) : idx[u];
      nan |= v != v;
    }
  }
  for (; i + L <= n; i += L) {
    const vf v = loadu(x + i);
    const vi gt = v > best[0];
    best[0] = gt ? v : best[0];
    idx[0] = gt ? lane + static_cast<int32_t>(i) : idx[0];
    nan |= v != v;
  }
  float bv = -kInf;
  int64_t bi = -1;
  for (int u = 0; u < U; ++u)
    for (int l = 0; l < L; ++l)
      if (idx[u][l] >= 0 && (best[u][l] > bv || (best[u][l] == bv && idx[u][l] < bi))) {
        bv = best[u][l];
        bi = idx[u][l];
      }
  bool any_nan = false;
  for (int l = 0; l < L; ++l) any_nan |= nan[l] != 0;
  for (; i < n; ++i) {
    const float v = to_float(x[i]);
    any_nan |= v != v;
    if (v > bv) {
      bv = v;
      bi = i;
    }
  }
  if (any_nan)
    for (int64_t j = 0; j < n; ++j) {
      const float v = to_float(x[j]);
      if (v != v) return ArgMax{v, offset + j};
    }
  if (bi < 0) return ArgMax{to_float(x[0]), offset};  // every value -inf
  return ArgMax{bv, offset + bi};
}

template <typename T>
ArgMax argmax_impl(const T* x, int64_t n) {
  constexpr int64_t kBlock = int64_t{1} << 30;
  ArgMax best = argmax_block(x, n < kBlock ? n : kBlock, 0);
  for (int64_t o = kBlock; o < n; o += kBlock) {
    if (best.value != best.value) break;
    const ArgMax b = argmax_block(x + o, n - o < kBlock ? n - o : kBlock, o);
    if (b.value != b.value || b.value > best.value) best = b;
  }
  return best;
}

int64_t first_above(const float* x, int64_t j0, int64_t n, float t) {
  return first_passing<Test::kAboveOrNan>(x, j0, n, t);
}

ArgMax argmax_f32(const float* x, int64_t n) { return argmax_impl(x, n); }
ArgMax argmax_bf16(const uint16_t* x, int64_t n) { return argmax_impl(x, n); }

// z = (x - m) / t with m the largest non-NaN x (the reference's order of operations, so a
// tiny t sends the non-maxima to -inf instead of overflowing the maximum), NaN -> -inf.
// When m is +inf, z is 0 at the +inf entries and -inf elsewhere (they share the mass);
// when no x is above -inf, every z is -inf. Returns the max of z: 0, or -inf for a row
// with no mass.
template <typename T>
float temper(const T* x, int64_t n, float temperature, float* z) {
  const int64_t nv = n - n % L;
  vf vm = splat(-kInf);
  for (int64_t i = 0; i < nv; i += L) {
    const vf v = loadu(x + i);
    vm = v > vm ? v : vm;  // NaN never wins
  }
  float m = hmax(vm);
  for (int64_t i = nv; i < n; ++i) {
    const float v = to_float(x[i]);
    if (v > m) m = v;
  }
  if (m == -kInf || m == kInf) {  // rare rows: scalar
    for (int64_t i = 0; i < n; ++i) z[i] = m == kInf && to_float(x[i]) == kInf ? 0.0f : -kInf;
    return m == kInf ? 0.0f : -kInf;
  }
  const vf t = splat(temperature), mv = splat(m), minf = splat(-kInf);
  for (int64_t i = 0; i < nv; i += L) {
    const vf v = loadu(x + i);
    const vf d = (v - mv) / t;  // a division, as the reference: same rounding
    storeu(z + i, v == v ? d : minf);
  }
  for (int64_t i = nv; i < n; ++i) {
    const float v = to_float(x[i]);
    z[i] = v == v ? (v - m) / temperature : -kInf;
  }
  return 0.0f;
}
float temper_f32(const float* x, int64_t n, float t, float* z) { return temper(x, n, t, z); }
float temper_bf16(const uint16_t* x, int64_t n, float t, float* z) { return temper(x, n, t, z); }

double exp_weights(const float* z, int64_t n, float m, double* w) {
  vd acc = vd{};
  auto block = [&](vf v, double* out, int64_t count) {
    const vf d = v - m;
    const vi minf = v == -kInf;
    const vd lo = exp_double(__builtin_convertvector(low_half(d, std::make_index_sequence<L / 2>{}), vd));
    const vd hi = exp_double(__builtin_convertvector(high_half(d, std::make_index_sequence<L / 2>{}), vd));
    vl mlo, mhi;
    for (int l = 0; l < L / 2; ++l) {
      mlo[l] = minf[l];
      mhi[l] = minf[L / 2 + l];
    }
    const vd wlo = bit_cast<vd>(bit_cast<vl>(lo) & ~mlo), whi = bit_cast<vd>(bit_cast<vl>(hi) & ~mhi);
    if (count == L) {
      std::memcpy(out, &wlo, sizeof(wlo));
      std::memcpy(out + L / 2, &whi, sizeof(whi));
      acc += wlo + whi;
    } else {
      double t[L];
      std::memcpy(t, &wlo, sizeof(wlo));
      std::memcpy(t + L / 2, &whi, sizeof(whi));
      for (int64_t i = 0; i < count; ++i) {
        out[i] = t[i];
        acc[0] += t[i];
      }
    }
  };
  const int64_t nv = n - n % L;
  for (int64_t i = 0; i < nv; i += L) block(loadu(z + i), w + i, L);
  if (nv < n) block(load_partial(z + nv, n - nv, -kInf), w + nv, n - nv);
  double s = 0.0;
  for (int l = 0; l < L / 2; ++l) s += acc[l];
  return s;
}

// ---- attention of query rows sharing their keys (small_batch_attention) ---------------
// Bytes: the n visible key and value rows, 2 * n * D elements, once for the nq query rows
// (the query heads of one kv head); q and out nq * D. Work ~4 * nq * n * D flops and nq * n
// exponentials. A decode step's keys (a few hundred rows of 64) sit in L1/L2: it runs at
// the FMA and load ports. Per key: D / L loads shared by the nq rows, nq * D / L FMAs and
// nq lane sums (reduced kScoreKeys keys at a time); the value pass keeps nq x up to 4
// accumulator vectors in registers. (bf16, 16 query rows of 9 heads against 300 keys,
// Zen 5, 2 threads: 162 us before the q rows were widened once, the value accumulators
// kept in registers, the lane sums batched and the rows' softmax sums interleaved; 56 us
// after: benchmarks/bench_attention.py.)

// Columns [d0, d0 + NB * L) of the value pass of NQ rows (the last vector may be cut at
// D): out_r = sum_j p_rj v_{idx[j]} in key order, times inv_r. The block count is a
// compile-time constant so the NQ x NB accumulators stay in registers (with a run-time
// count GCC kept them on the stack: a store-to-load forward per key and vector).
template <int NQ>
constexpr int64_t kValueVectors = kAcc / NQ < 1 ? 1 : (kAcc / NQ > 4 ? 4 : kAcc / NQ);

template <int NQ, int64_t NB, typename T>
DOMINO_INLINE void value_block(const T* v, int64_t vs, const int64_t* idx, int64_t n, int64_t D, int64_t d0,
                               const float* scores, const float* inv, const bool* empty, T* out, int64_t os) {
  vf acc[NQ][NB];
  DOMINO_UNROLL
  for (int r = 0; r < NQ; ++r)
    DOMINO_UNROLL
    for (int64_t b = 0; b < NB; ++b) acc[r][b] = splat(0.0f);
  const bool whole = d0 + NB * L <= D;
  for (int64_t j = 0; j < n; ++j) {
    const T* vr = v + idx[j] * vs + d0;
    DOMINO_UNROLL
    for (int64_t b = 0; b < NB; ++b) {
      const vf vv = whole ? loadu(vr + b * L) : load_partial(vr + b * L, D - d0 - b * L, 0.0f);
      DOMINO_UNROLL
      for (int r = 0; r < NQ; ++r) acc[r][b] += splat(scores[r * n + j]) * vv;
    }
  }
  DOMINO_UNROLL
  for (int r = 0; r < NQ; ++r)
    DOMINO_UNROLL
    for (int64_t b = 0; b < NB; ++b) {
      const int64_t c = d0 + b * L;
      const vf o = empty[r] ? splat(0.0f) : acc[r][b] * inv[r];
      if (c + L <= D) {
        storeu(out + r * os + c, o);
      } else {
        float t[L];
        storeu(t, o);
        for (int64_t i = 0; i < D - c; ++i) store_one(out + r * os + c + i, t[i]);
      }
    }
}

// Scores of KB keys (idx[0..KB)) for NQ query rows: scores[r * n + kb] = scale * (q_r .
// k_{idx[kb]}) + bias[kb], lanes over D and the lane-sum tree of reduce_lanes (the same
// tree as hsum, one shuffle-add per L sums rather than log2 L per sum). KB keys at a time
// give NQ x KB independent accumulator chains.
template <int NQ>
constexpr int kScoreKeys = (3 * kAcc / 2) / NQ < 1 ? 1 : (3 * kAcc / 2) / NQ;

template <int NQ, int KB, typename T>
DOMINO_INLINE void score_block(const float* q, int64_t qs, const T* k, int64_t ks, const int64_t* idx,
                               const float* bias, int64_t D, float scale, float* scores, int64_t n) {
  const int64_t Dv = D - D % L;
  const T* kr[KB];
  DOMINO_UNROLL
  for (int kb = 0; kb < KB; ++kb) kr[kb] = k + idx[kb] * ks;
  vf acc[NQ * KB];
  DOMINO_UNROLL
  for (int a = 0; a < NQ * KB; ++a) acc[a] = splat(0.0f);
  for (int64_t d = 0; d < Dv; d += L) {
    vf qv[NQ];
    DOMINO_UNROLL
    for (int r = 0; r < NQ; ++r) qv[r] = loadu(q + r * qs + d);
    DOMINO_UNROLL
    for (int kb = 0; kb < KB; ++kb) {
      const vf kv = loadu(kr[kb] + d);
      DOMINO_UNROLL
      for (int r = 0; r < NQ; ++r) acc[r * KB + kb] += qv[r] * kv;
    }
  }
  if (Dv < D) {
    vf qv[NQ];
    DOMINO_UNROLL
    for (int r = 0; r < NQ; ++r) qv[r] = load_partial(q + r * qs + Dv, D - Dv, 0.0f);
    DOMINO_UNROLL
    for (int kb = 0; kb < KB; ++kb) {
      const vf kv = load_partial(kr[kb] + Dv, D - Dv, 0.0f);
      DOMINO_UNROLL
      for (int r = 0; r < NQ; ++r) acc[r * KB + kb] += qv[r] * kv;
    }
  }
  float sums[NQ * KB];
  reduce_lanes<NQ * KB>(acc, sums);
  DOMINO_UNROLL
  for (int r = 0; r < NQ; ++r)
    DOMINO_UNROLL
    for (int kb = 0; kb < KB; ++kb) scores[r * n + kb] = sums[r * KB + kb] * scale + (bias ? bias[kb] : 0.0f);
}

template <int NQ, typename T>
void attend_rows_n(const float* q, int64_t qs, const T* k, int64_t ks, const T* v, int64_t vs,
                   const int64_t* idx, const float* bias, int64_t n, int64_t D, float scale,
                   float* scores, T* out, int64_t os) {
  // The scores, KB keys at a time (then one at a time)
  constexpr int KB = kScoreKeys<NQ>;
  int64_t j0 = 0;
  for (; j0 + KB <= n; j0 += KB) score_block<NQ, KB>(q, qs, k, ks, idx + j0, bias ? bias + j0 : nullptr, D, scale, scores + j0, n);
  for (; j0 < n; ++j0) score_block<NQ, 1>(q, qs, k, ks, idx + j0, bias ? bias + j0 : nullptr, D, scale, scores + j0, n);
  // p = exp(s - m), exactly 0 below exp(-87) ~ 1.6e-38 (where exp_approx would clamp), so
  // a key under a huge finite negative bias (an eager-style mask) adds exactly nothing.
  // A row with no key, or every score -inf, gets zeros; a NaN score makes the row NaN.
  // The max is exact in any order. The sum runs key by key in key order: a key hidden by a
  // finite bias (an eager-style mask of the dtype's lowest value, as the engine's tree
  // mask) is in the list with weight exactly 0, and adding 0 changes no bit only in a
  // sequential sum (summed per lane, it would shift the later keys' lanes: a tree row
  // would no longer give the bits of the one-token step of its path).
  float inv[NQ];
  bool empty[NQ];
  const int64_t nv = n - n % L;
  for (int r = 0; r < NQ; ++r) {
    float* sr = scores + r * n;
    vf mv = splat(-kInf);
    auto keep_max = [&mv](vf x) { mv = (x > mv) | (x != x) ? x : mv; };  // NaN sticks
    for (int64_t j = 0; j < nv; j += L) keep_max(loadu(sr + j));
    if (nv < n) keep_max(load_partial(sr + nv, n - nv, -kInf));
    float m = -kInf;
    for (int l = 0; l < L; ++l)
      if (m == m && (mv[l] > m || mv[l] != mv[l])) m = mv[l];
    empty[r] = m == -kInf;
    const float mr = empty[r] ? 0.0f : m;
    auto weights = [mr](vf x) {
      x = x - mr;
      return x < -87.0f ? splat(0.0f) : exp_approx(x);
    };
    for (int64_t j = 0; j < nv; j += L) storeu(sr + j, weights(loadu(sr + j)));
    if (nv < n) store_partial(sr + nv, n - nv, weights(load_partial(sr + nv, n - nv, 0.0f)));
  }
  // The NQ rows' sums interleaved: NQ independent dependency chains instead of one at a
  // time (each row's own sum still runs key by key in key order: the same bits).
  float sum[NQ];
  for (int r = 0; r < NQ; ++r) sum[r] = 0.0f;
  for (int64_t j = 0; j < n; ++j)
    for (int r = 0; r < NQ; ++r) sum[r] += scores[r * n + j];
  for (int r = 0; r < NQ; ++r) inv[r] = 1.0f / sum[r];
  // Blocks of up to kValueVectors<NQ> vectors of columns: that many independent FMA
  // chains per row over the keys, in registers.
  constexpr int64_t NB = kValueVectors<NQ>;
  int64_t d0 = 0;
  for (; d0 + NB * L <= D; d0 += NB * L) value_block<NQ, NB>(v, vs, idx, n, D, d0, scores, inv, empty, out, os);
  for (; d0 < D; d0 += L) value_block<NQ, 1>(v, vs, idx, n, D, d0, scores, inv, empty, out, os);
}

template <typename T>
void attend_rows(const float* q, int64_t qs, int64_t nq, const T* k, int64_t ks, const T* v, int64_t vs,
                 const int64_t* idx, const float* bias, int64_t n, int64_t D, float scale, float* scores,
                 T* out, int64_t os) {
  // Each query row's arithmetic is the same whatever NQ it is computed in (its own
  // accumulators, its own lane sums, its own exp and sum): the blocking only shares loads.
  int64_t r = 0;
  for (; r + 4 <= nq; r += 4)
    attend_rows_n<4>(q + r * qs, qs, k, ks, v, vs, idx, bias, n, D, scale, scores, out + r * os, os);
  switch (nq - r) {
    case 3: attend_rows_n<3>(q + r * qs, qs, k, ks, v, vs, idx, bias, n, D, scale, scores, out + r * os, os); break;
    case 2: attend_rows_n<2>(q + r * qs, qs, k, ks, v, vs, idx, bias, n, D, scale, scores, out + r * os, os); break;
    case 1: attend_rows_n<1>(q + r * qs, qs, k, ks, v, vs, idx, bias, n, D, scale, scores, out + r * os, os); break;
    default: break;
  }
}

void attend_rows_f32(const float* q, int64_t qs, int64_t nq, const float* k, int64_t ks, const float* v,
                     int64_t vs, const int64_t* idx, const float* bias, int64_t n, int64_t D, float scale,
                     float* scores, float* out, int64_t os) {
  attend_rows(q, qs, nq, k, ks, v, vs, idx, bias, n, D, scale, scores, out, os);
}
void attend_rows_bf16(const float* q, int64_t qs, int64_t nq, const uint16_t* k, int64_t ks,
                      const uint16_t* v, int64_t vs, const int64_t* idx, const float* bias, int64_t n,
                      int64_t D, float scale, float* scores, uint16_t* out, int64_t os) {
  attend_rows(q, qs, nq, k, ks, v, vs, idx, bias, n, D, scale, scores, out, os);
}

}  // namespace

extern const Kernels kKernels;
const Kernels kKernels = {
    .name = DOMINO_STR(DOMINO_ISA),
    .lanes = L,
    .pack_bf16_x = &pack_bf16_x,
    .rows_dot_f32 = &rows_dot_f32,
    .rows_dot_bf16 = &rows_dot_bf16,
    .logits_tile_f32 = &logits_tile_f32,
    .logits_tile_bf16 = &logits_tile_bf16,
    .stream_copy = &stream_copy,
    .silu_add = &silu_add,
    .gru_update = &gru_update,
    .widen_bf16 = &widen_bf16,
    .argmax_f32 = &argmax_f32,
    .argmax_bf16 = &argmax_bf16,
    .first_above = &first_above,
    .temper_f32 = &temper_f32,
    .temper_bf16 = &temper_bf16,
    .exp_weights = &exp_weights,
    .attend_rows_f32 = &attend_rows_f32,
    .attend_rows_bf16 = &attend_rows_bf16,
};

}  // namespace domino::cpu::DOMINO_ISA
