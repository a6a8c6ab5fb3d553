// One instruction-set build of the CPU kernels' vector code: CMakeLists.txt compiles this
// file once per build with its -march and DOMINO_ISA, and isa.cpp picks one table.
#include "cpu/vec.h"
#include "cpu/amx_tile_config.h"

#include <algorithm>
#include <cstring>
#include <vector>

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
// The first n < L lanes of v stored to p, rounded to p's dtype.
template <typename T>
DOMINO_INLINE void store_partial(T* p, int64_t n, vf v) {
  float t[L];
  storeu(t, v);
  for (int64_t i = 0; i < n; ++i) store_one(p + i, t[i]);
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
void logits_tile(float* d, int64_t n, const BT* base, BT* base_out, float* row_out, TileStats* st,
                 const char* prefetch, int64_t ahead) {
  const int64_t nv = n - n % L;
  // two lines of the caller's stream per vector of each pass, while this arithmetic runs
  // (~10 GB/s a core on the AMX Xeon VM at the exp pass's pace: about one core's share of
  // the memory bandwidth)
  int64_t line = 0;
  auto prefetch_one = [&] {
    for (int i = 0; i < 2 && line < ahead; ++i) __builtin_prefetch(prefetch + 64 * line++, 0, 2);  // to L2
  };
  vf vm = splat(-kInf);
  vf probe = vf{};  // NaN iff some L is NaN or infinite (L - L)
  for (int64_t i = 0; i < nv; i += L) {
    prefetch_one();
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
  for (int64_t i = 0; i < nv; i += L) {
    prefetch_one();
    acc += exp_approx(loadu(d + i) - m);
  }
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
                     TileStats* st, const char* prefetch, int64_t ahead) {
  logits_tile(d, n, base, base_out, row_out, st, prefetch, ahead);
}
void logits_tile_bf16(float* d, int64_t n, const uint16_t* base, uint16_t* base_out,
                      float* row_out, TileStats* st, const char* prefetch, int64_t ahead) {
  logits_tile(d, n, base, base_out, row_out, st, prefetch, ahead);
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

// ---- silu_mul: a gated MLP's activation, out = silu(gate) * up --------------------------
// HF's order and roundings (LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)): silu(g) =
// g / (1 + exp(-g)) in float, rounded to the tensors' dtype, times up in float, rounded
// again. Elementwise, every lane the same operations: an element's bits do not depend on
// where it sits, so a row alone equals the row among others.
DOMINO_INLINE vf round_like(vf v, const float*) { return v; }
DOMINO_INLINE vf round_like(vf v, const uint16_t*) { return bit_cast<vf>(bf16_rounded_bits(v)); }

// Below g = -88 exp(-g) leaves exp_approx's range (it clamps its argument at 88; float
// overflows past 88.72), while silu(g) is a normal float down to about -91.8 and a
// subnormal below: there silu(g) = g * e^g to float's precision (the 1 in 1 + e^-g is
// below e^-g's last bit), computed as (g * e^(g + 20)) * e^-20 to keep the exponential in
// range. Below -107 the exact value is under 4e-45 (float's smallest subnormal is 1.4e-45):
// -0 there. (PyTorch's float g / (1 + exp(-g)) gives -0 from -88.72 down.)
// One exponential per lane: e^-g, or e^(g + 20) in the tail.
template <typename T>
DOMINO_INLINE vf silu_mul_vec(vf g, vf u, const T* tag) {
  const auto in_tail = g < -88.0f;
  const vf e = exp_approx(in_tail ? g + 20.0f : -g);
  const vf silu = in_tail ? (g * e) * 2.0611536e-9f : g / (1.0f + e);  // e^-20
  const vf act = round_like(g < -107.0f ? g * 0.0f : silu, tag);
  return act * u;
}

template <typename T>
void silu_mul(const T* gate, const T* up, int64_t n, T* out) {
  const int64_t nv = n - n % L;
  for (int64_t i = 0; i < nv; i += L) storeu(out + i, silu_mul_vec(loadu(gate + i), loadu(up + i), gate));
  if (nv < n)
    store_partial(out + nv, n - nv,
                  silu_mul_vec(load_partial(gate + nv, n - nv, 0.0f), load_partial(up + nv, n - nv, 0.0f), gate));
}

void silu_mul_f32(const float* gate, const float* up, int64_t n, float* out) { silu_mul(gate, up, n, out); }
void silu_mul_bf16(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  silu_mul(gate, up, n, out);
}

// ---- rms_norm: one row of HF's LlamaRMSNorm ---------------------------------------------
// out = round(w * round(x * (1 / sqrt(sum(x^2) / n + eps)))): HF's order (the normalized
// value rounded to the dtype before the weight product; bf16: nearest even), float math.
// The sum of squares runs in L lanes over the row, then hsum's fixed lane tree: the same
// operations for a row whatever rows are around it.
template <typename T>
void rms_norm_row(const T* x, const T* w, int64_t n, float eps, T* out) {
  const int64_t nv = n - n % L;
  vf acc = splat(0.0f);
  for (int64_t i = 0; i < nv; i += L) {
    const vf v = loadu(x + i);
    acc += v * v;
  }
  if (nv < n) {
    const vf v = load_partial(x + nv, n - nv, 0.0f);
    acc += v * v;
  }
  const float r = 1.0f / __builtin_sqrtf(hsum(acc) / static_cast<float>(n) + eps);  // no <cmath>: see vec.h
  for (int64_t i = 0; i < nv; i += L) storeu(out + i, loadu(w + i) * round_like(loadu(x + i) * r, x));
  if (nv < n)
    store_partial(out + nv, n - nv,
                  load_partial(w + nv, n - nv, 0.0f) * round_like(load_partial(x + nv, n - nv, 0.0f) * r, x));
}

void rms_norm_f32(const float* x, const float* w, int64_t n, float eps, float* out) { rms_norm_row(x, w, n, eps, out); }
void rms_norm_bf16(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* out) {
  rms_norm_row(x, w, n, eps, out);
}

// sum = x + y, each element rounded to the dtype by its store (float math, bf16: nearest
// even), then rms_norm_row of the row just written (in L1).
template <typename T>
void add_rms_norm_row(const T* x, const T* y, const T* w, int64_t n, float eps, T* sum, T* out) {
  const int64_t nv = n - n % L;
  for (int64_t i = 0; i < nv; i += L) storeu(sum + i, loadu(x + i) + loadu(y + i));
  if (nv < n) store_partial(sum + nv, n - nv, load_partial(x + nv, n - nv, 0.0f) + load_partial(y + nv, n - nv, 0.0f));
  rms_norm_row(sum, w, n, eps, out);
}

void add_rms_norm_f32(const float* x, const float* y, const float* w, int64_t n, float eps, float* sum, float* out) {
  add_rms_norm_row(x, y, w, n, eps, sum, out);
}
void add_rms_norm_bf16(const uint16_t* x, const uint16_t* y, const uint16_t* w, int64_t n, float eps, uint16_t* sum,
                       uint16_t* out) {
  add_rms_norm_row(x, y, w, n, eps, sum, out);
}

// ---- apply_rotary_pos_emb: one row of HF's rotary embedding ------------------------------
// out = round(round(x * c) + round(rotate_half(x) * s)), rotate_half(x) = (-x[h:], x[:h]),
// h = D / 2: PyTorch's roundings (each product and the sum rounded to the dtype; bf16:
// nearest even). The products are kept apart from the sum even in float32: this file's
// -ffp-contract=fast would fuse one of them into an FMA, which rounds once where PyTorch
// rounds twice. Elementwise (lane i of the first half pairs with lane i of the second):
// a row's bits do not depend on the rows around it.
// (An empty asm the value passes through: GCC 12 lowers __builtin_assoc_barrier on a
// vector lane by lane.)
DOMINO_INLINE vf apart(vf v) {
#if defined(__x86_64__) || defined(__i386__)
  asm("" : "+v"(v));
#elif defined(__aarch64__)
  asm("" : "+w"(v));
#else
  v = __builtin_assoc_barrier(v);  // GCC 12+
#endif
  return v;
}
template <typename T>
DOMINO_INLINE void rotary_pair(vf a, vf b, vf c_lo, vf s_lo, vf c_hi, vf s_hi, vf& lo, vf& hi, const T* tag) {
  lo = round_like(apart(a * c_lo), tag) + round_like(apart(-b * s_lo), tag);
  hi = round_like(apart(b * c_hi), tag) + round_like(apart(a * s_hi), tag);
}

template <typename T>
void rotary_row(const T* x, const T* c, const T* s, int64_t D, T* out) {
  const int64_t h = D / 2, hv = h - h % L;
  vf lo, hi;
  for (int64_t i = 0; i < hv; i += L) {
    rotary_pair(loadu(x + i), loadu(x + h + i), loadu(c + i), loadu(s + i), loadu(c + h + i), loadu(s + h + i), lo,
                hi, x);
    storeu(out + i, lo);
    storeu(out + h + i, hi);
  }
  if (hv < h) {
    const int64_t n = h - hv;
    rotary_pair(load_partial(x + hv, n, 0.0f), load_partial(x + h + hv, n, 0.0f), load_partial(c + hv, n, 0.0f),
                load_partial(s + hv, n, 0.0f), load_partial(c + h + hv, n, 0.0f), load_partial(s + h + hv, n, 0.0f),
                lo, hi, x);
    store_partial(out + hv, n, lo);
    store_partial(out + h + hv, n, hi);
  }
}

void rotary_row_f32(const float* x, const float* c, const float* s, int64_t D, float* out) {
  rotary_row(x, c, s, D, out);
}
void rotary_row_bf16(const uint16_t* x, const uint16_t* c, const uint16_t* s, int64_t D, uint16_t* out) {
  rotary_row(x, c, s, D, out);
}

// ---- attention of a block of query rows against one kv head (small_batch_attention) ---
// Bytes: the key and value rows of one kv head, 2 * U * D elements, read once for the nq
// query rows of a block (the query heads of the kv head times a few query positions); q
// and out nq * D. Work ~4 * nq * U * D flops and nq * U exponentials.
//
// Keys as lanes: the keys are transposed once per (sequence, kv head) into kt [D][ldk], so
// a score tile is L keys x one query row accumulated over d with one FMA per (row, d, L
// keys), the q value a broadcast: no horizontal sums (with lanes over D, the reduction of
// each (row, key) dot product cost ~40 % of the score pass at D = 64). Values keep lanes
// over D: out_r = sum_j p_rj v_j, one broadcast of p_rj per key shared by the vectors of a
// row, the value loads shared by the rows of the block. The price is the transposition,
// 64 shuffles per L x L block, paid once per (sequence, kv head) and thread whatever the
// number of rows: a decode step (3 query rows per kv head) pays it for few rows. Zen 4, 2
// threads, bf16, 9 heads of 64 over 3 kv heads, against the previous lanes-over-D kernel
// (benchmarks/compare_builds.sh with bench_attention.py, two alternating rounds;
// benchmarks/results/attention_zen4_session18_compare_builds.txt), over 100 / 300 / 600
// keys: 16 rows 43.6 / 115 / 222 -> 36-42 / 90-95 / 171-183 us; 4 rows 23.6 / 33.3 / 60
// -> 22.7 / 39-42 / 71-73 us; one row 8.3 / 17.0 / 22.3 -> 11.4-12.4 / 25-28 / 33-38 us.
// Lanes over D with the new task layout (blocks of rows from several positions, key
// classes, broadcast loads) measured as the old kernel at 16 rows: the gain is the score
// layout, and so is the cost at one row.

// *p in every lane, read straight from memory (one broadcast load; splat(x) is vf{} + x, a
// scalar add before the broadcast, since 0 + x is not x for x = -0).
DOMINO_INLINE vf broadcast(const float* p) {
#if defined(__AVX512F__)
  return bit_cast<vf>(_mm512_set1_ps(*p));
#elif defined(__AVX2__)
  return bit_cast<vf>(_mm256_set1_ps(*p));
#else
  return splat(*p);
#endif
}

// The L x L block of vectors r transposed in registers: stage H swaps bit H of the row and
// column indices (a two-source shuffle per row pair); after every bit, r[c][l] = old r[l][c].
template <int H, size_t... I>
DOMINO_INLINE void swap_bit(vf& a, vf& b, std::index_sequence<I...>) {
  const vf na = __builtin_shufflevector(a, b, ((I & H) ? int(L + I - H) : int(I))...);
  const vf nb = __builtin_shufflevector(a, b, ((I & H) ? int(L + I) : int(I + H))...);
  a = na;
  b = nb;
}
template <int H>
DOMINO_INLINE void transpose_stage(vf* r) {
  DOMINO_UNROLL
  for (int i = 0; i < L; ++i)
    if ((i & H) == 0) swap_bit<H>(r[i], r[i + H], std::make_index_sequence<L>{});
  if constexpr (H > 1) transpose_stage<H / 2>(r);
}

// The L x L block r transposed in place. AVX-512: the four-stage unpack / lane-shuffle
// transpose (64 shuffles, half of them two per cycle); the other builds: transpose_stage.
DOMINO_INLINE void transpose_block(vf* r) {
#if defined(__AVX512F__)
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {  // t[i]: rows i, i+1 interleaved by 32 bits, low / high pairs
    t[i] = _mm512_unpacklo_ps(bit_cast<__m512>(r[i]), bit_cast<__m512>(r[i + 1]));
    t[i + 1] = _mm512_unpackhi_ps(bit_cast<__m512>(r[i]), bit_cast<__m512>(r[i + 1]));
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + c]: column 4 * lane + c of rows g..g+3, per 128-bit lane
    u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[g]), _mm512_castps_pd(t[g + 2])));
    u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[g]), _mm512_castps_pd(t[g + 2])));
    u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[g + 1]), _mm512_castps_pd(t[g + 3])));
    u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[g + 1]), _mm512_castps_pd(t[g + 3])));
  }
  for (int c = 0; c < 4; ++c) {  // gather each column's four 128-bit pieces
    const __m512 v_even = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), v_odd = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
    const __m512 w_even = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 w_odd = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = bit_cast<vf>(_mm512_shuffle_f32x4(v_even, w_even, 0x88));
    r[8 + c] = bit_cast<vf>(_mm512_shuffle_f32x4(v_even, w_even, 0xdd));
    r[4 + c] = bit_cast<vf>(_mm512_shuffle_f32x4(v_odd, w_odd, 0x88));
    r[12 + c] = bit_cast<vf>(_mm512_shuffle_f32x4(v_odd, w_odd, 0xdd));
  }
#else
  transpose_stage<L / 2>(r);
#endif
}

// kt[d * ldk + j] = k[j * ks + d] as float for j < n, 0 for n <= j < ldk (ldk a multiple
// of L, at least n). Exact (a move, and bf16 widening). The keys move as 32-bit words: a
// float32 element, or a pair of bf16 elements (d even and d + 1), so an L x L block of
// words moves 2L bf16 elements of each of L keys, half the shuffles of widening first (the
// shuffles' one port bounds the pass: a decode step's 3 rows spent ~40 % of their attention
// transposing). A bf16 word row then gives two rows of kt: the low halves shifted up
// (element d) and the high halves kept (element d + 1); an odd D's last element is
// widened alone.
template <typename T>
void transpose_keys(const T* k, int64_t ks, int64_t n, int64_t D, float* kt, int64_t ldk) {
  constexpr int64_t E = sizeof(float) / sizeof(T);  // elements a word holds
  const int64_t W = D / E;                          // whole words a key
  for (int64_t j0 = 0; j0 < ldk; j0 += L) {
    const int64_t nj = n - j0;  // key rows present in this block (<= 0: padding only)
    for (int64_t w0 = 0; w0 < W; w0 += L) {
      const int64_t nw = W - w0 < L ? W - w0 : L;
      vf r[L];
      if (nj >= L && nw == L) {  // a whole block
        DOMINO_UNROLL
        for (int l = 0; l < L; ++l) std::memcpy(&r[l], k + (j0 + l) * ks + E * w0, sizeof(vf));
      } else {
        for (int l = 0; l < L; ++l) {
          r[l] = vf{};  // +0: the padding keys' elements
          if (l < nj) std::memcpy(&r[l], k + (j0 + l) * ks + E * w0, 4 * nw);
        }
      }
      transpose_block(r);
      for (int64_t w = 0; w < nw; ++w) {
        if constexpr (E == 1) {
          storeu(kt + (w0 + w) * ldk + j0, r[w]);
        } else {
          const vu u = bit_cast<vu>(r[w]);
          storeu(kt + (2 * (w0 + w)) * ldk + j0, bit_cast<vf>(u << 16));
          storeu(kt + (2 * (w0 + w) + 1) * ldk + j0, bit_cast<vf>(u & 0xffff0000u));
        }
      }
    }
    if (D % E) {
      float* row = kt + (D - 1) * ldk + j0;
      for (int l = 0; l < L; ++l) row[l] = l < nj ? to_float(k[(j0 + l) * ks + D - 1]) : 0.0f;
    }
  }
}

#if defined(__AVX512F__) && defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
// ---- attention scores on AMX tiles (the avx512 build; the caller checks amx_available()) --
// scores[r * lds + j] = scale * (q_r . k_j) for r < nq <= 16, j < n, bf16 keys, D a
// multiple of 32 up to 128. TDPBF16PS with the keys as the A tile (16 keys x 32 elements,
// loaded straight from the cache rows: no transposition of the keys) and the query rows as
// B (their element pairs, 16 rows wide), so C is 16 keys x 16 rows: one L x L transposition
// of C (4 shuffles a key, against 4 D / 32 for the keys' own: 8 at D = 64) puts it in score
// rows. A row's score of a key depends on the two rows alone, and the D / 32 chunks add in
// order: the same bits whatever nq, the row's place or the key's (batch-invariant); not the
// vector path's bits (TDPBF16PS sums each chunk in its own order, and flushes denormals).
#define DOMINO_AMX_SCORES_TARGET __attribute__((target("amx-tile,amx-bf16")))

DOMINO_AMX_SCORES_TARGET void attention_scores_amx(const float* q, int64_t nq, int64_t D, const uint16_t* k,
                                                   int64_t ks, int64_t n, float scale, float* scores, int64_t lds) {
  constexpr int kMaxChunks = 4;  // tiles 2..5: D up to 128
  const int chunks = static_cast<int>(D / 32);
  // B tiles: [chunk c][pair p][row r] = row r's elements 32 c + 2 p, + 1 as one word, 0
  // past nq: each row's chunk narrowed to bf16 (the floats' high halves, exact: q holds bf16
  // values widened), 16 words per row, then one L x L transposition per chunk.
  alignas(64) uint32_t b[kMaxChunks][16][16];
  for (int ch = 0; ch < chunks; ++ch) {
    vf r[L];
    for (int64_t row = 0; row < L; ++row) {
      r[row] = vf{};
      if (row >= nq) continue;
      const float* x = q + row * D + 32 * ch;
      const __m256i lo = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(x)), 16));
      const __m256i hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(_mm512_loadu_ps(x + 16)), 16));
      r[row] = bit_cast<vf>(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    transpose_block(r);
    for (int p = 0; p < 16; ++p) std::memcpy(b[ch][p], &r[p], sizeof(vf));
  }
  AmxTileConfig cfg;
  for (int t = 0; t < 2 + chunks; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;  // C, A, then B per chunk
  _tile_loadconfig(&cfg);
  _tile_loadd(2, b[0], 64);
  if (chunks > 1) _tile_loadd(3, b[1], 64);
  if (chunks > 2) _tile_loadd(4, b[2], 64);
  if (chunks > 3) _tile_loadd(5, b[3], 64);
  alignas(64) float c[16][16];
  alignas(64) uint16_t tail[16 * 32 * kMaxChunks];
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t nj = n - j0 < 16 ? n - j0 : 16;
    const uint16_t* a = k + j0 * ks;
    int64_t stride = ks * 2;
    if (nj < 16) {  // the last keys, zero-padded to a whole tile (nothing read past them)
      for (int64_t j = 0; j < nj; ++j) std::memcpy(tail + j * D, a + j * ks, D * 2);
      std::memset(tail + nj * D, 0, (16 - nj) * D * 2);
      a = tail;
      stride = D * 2;
    }
    _tile_zero(0);
    _tile_loadd(1, a, stride);
    _tile_dpbf16ps(0, 1, 2);
    if (chunks > 1) {
      _tile_loadd(1, a + 32, stride);
      _tile_dpbf16ps(0, 1, 3);
    }
    if (chunks > 2) {
      _tile_loadd(1, a + 64, stride);
      _tile_dpbf16ps(0, 1, 4);
    }
    if (chunks > 3) {
      _tile_loadd(1, a + 96, stride);
      _tile_dpbf16ps(0, 1, 5);
    }
    _tile_stored(0, c, 64);
    vf r[L];
    for (int i = 0; i < L; ++i) std::memcpy(&r[i], c[i], sizeof(vf));
    transpose_block(r);  // r[row]: the row's scores of keys j0 ..
    for (int64_t row = 0; row < nq; ++row) {
      if (nj == 16) storeu(scores + row * lds + j0, r[row] * scale);
      else store_partial(scores + row * lds + j0, nj, r[row] * scale);
    }
  }
  _tile_release();
}
#undef DOMINO_AMX_SCORES_TARGET
#include "cpu/attention_values_amx.h"
#define DOMINO_HAS_AMX_SCORES 1
#else
#define DOMINO_HAS_AMX_SCORES 0
#endif

// Scores of NQ query rows (q, D floats each) against KB * L keys (kt at the first key):
// s[r * lds + j] = scale * sum_d q_r[d] kt[d][j], the sum one FMA chain per lane, d in
// order. The same per-lane operations whatever NQ, KB or the tile's place.
template <int NQ, int KB>
DOMINO_INLINE void score_tile(const float* q, int64_t D, const float* kt, int64_t ldk, float scale, float* s,
                              int64_t lds) {
  vf acc[NQ][KB];
  DOMINO_UNROLL
  for (int r = 0; r < NQ; ++r)
    DOMINO_UNROLL
    for (int kb = 0; kb < KB; ++kb) acc[r][kb] = splat(0.0f);
  for (int64_t d = 0; d < D; ++d) {
    vf kv[KB];
    DOMINO_UNROLL
    for (int kb = 0; kb < KB; ++kb) kv[kb] = loadu(kt + d * ldk + kb * L);
    DOMINO_UNROLL
    for (int r = 0; r < NQ; ++r) {
      const vf qb = broadcast(q + r * D + d);
      DOMINO_UNROLL
      for (int kb = 0; kb < KB; ++kb) acc[r][kb] += qb * kv[kb];
    }
  }
  DOMINO_UNROLL
  for (int r = 0; r < NQ; ++r)
    DOMINO_UNROLL
    for (int kb = 0; kb < KB; ++kb) storeu(s + r * lds + kb * L, acc[r][kb] * scale);
}

template <int NQ>
constexpr int kScoreVectors = kAcc / NQ < 1 ? 1 : kAcc / NQ;

// Scores of NQ rows against the nk keys (a multiple of L) of kt, rows lds apart in s: tiles
// of KB key vectors, then of KB / 2, ... 1 for what is left. (A chunk holds fewer keys than
// a full tile of few rows: at D = 64, 64 keys, against 5 vectors of 16 for a decode step's
// 3 rows, which then all ran one vector at a time, 4 loads to 3 FMAs.)
template <int NQ, int KB = kScoreVectors<NQ>>
void score_rows(const float* q, int64_t D, const float* kt, int64_t ldk, int64_t nk, float scale, float* s,
                int64_t lds) {
  int64_t j = 0;
  for (; j + KB * L <= nk; j += KB * L) score_tile<NQ, KB>(q, D, kt + j, ldk, scale, s + j, lds);
  if constexpr (KB > 1)
    if (j < nk) score_rows<NQ, KB / 2>(q, D, kt + j, ldk, nk - j, scale, s + j, lds);
}

// The L bytes at p, each zero-extended to a 32-bit lane: one widening load where the build
// has one (GCC builds __builtin_convertvector of a byte vector lane by lane, ~60
// instructions for 16 bytes: the visibility test cost more than the softmax's exponentials).
DOMINO_INLINE vi load_bytes(const uint8_t* p) {
#if defined(__AVX512F__)
  return bit_cast<vi>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return bit_cast<vi>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  typedef uint8_t vb __attribute__((vector_size(L)));
  vb b;
  std::memcpy(&b, p, sizeof(b));
  return __builtin_convertvector(b, vi);
#endif
}

// Row r's weights over keys [0, n): a hidden key (vis 0) counts as -inf, bias added to the
// rest; p = exp(s - max), exactly 0 below exp(-87) ~ 1.6e-38 (where exp_approx would
// clamp), so a key under a huge finite negative bias adds exactly nothing. The max is exact
// in any order; NaN sticks. Returns the max (-inf: no visible key, or every score -inf).
DOMINO_INLINE float softmax_weights(float* s, const uint8_t* vis, const float* bias, int64_t n) {
  const int64_t nv = n - n % L;
  // four running maxima (each a chain of compare-and-blend: one alone left the loop waiting
  // on its latency), merged at the end: the max is exact in any order
  vf mv[4] = {splat(-kInf), splat(-kInf), splat(-kInf), splat(-kInf)};
  auto keep_max = [](vf& m, vf x) { m = (x > m) | (x != x) ? x : m; };  // NaN sticks
  auto masked = [&](int64_t j) {
    vf x = loadu(s + j);
    if (bias) x = x + loadu(bias + j);
    x = load_bytes(vis + j) != 0 ? x : splat(-kInf);
    storeu(s + j, x);
    return x;
  };
  int64_t j0 = 0;
  for (; j0 + 4 * L <= nv; j0 += 4 * L) {
    DOMINO_UNROLL
    for (int u = 0; u < 4; ++u) keep_max(mv[u], masked(j0 + u * L));
  }
  for (; j0 < nv; j0 += L) keep_max(mv[0], masked(j0));
  for (int64_t j = nv; j < n; ++j) {
    s[j] = vis[j] ? (bias ? s[j] + bias[j] : s[j]) : -kInf;
  }
  if (nv < n) keep_max(mv[0], load_partial(s + nv, n - nv, -kInf));
  for (int u = 1; u < 4; ++u) keep_max(mv[0], mv[u]);
  float m = -kInf;
  for (int l = 0; l < L; ++l)
    if (m == m && (mv[0][l] > m || mv[0][l] != mv[0][l])) m = mv[0][l];
  const float mr = m == -kInf ? 0.0f : m;
  auto weights = [mr](vf x) {
    x = x - mr;
    return x < -87.0f ? splat(0.0f) : exp_approx(x);
  };
  for (int64_t j = 0; j < nv; j += L) storeu(s + j, weights(loadu(s + j)));
  if (nv < n) store_partial(s + nv, n - nv, weights(load_partial(s + nv, n - nv, 0.0f)));
  return m;
}

// Columns [d0, d0 + NB * L) of the value pass of NQ rows over keys [0, n) of a chunk (the
// last vector may be cut at D): acc_r += p_rj v_j for the keys j row r sees, in key order,
// the NQ x NB partial sums loaded from and stored back to acc (rows lda apart: exact, so a
// chain cut at chunk boundaries is the same chain). A key no row of the block sees is
// skipped, one every row sees is added to every row, one some rows see is added to those:
// each row's sum is that of its own visible keys in order (a hidden key's value, NaN or
// not, is never read into a row). The block count is a compile-time constant so the
// accumulators stay in registers across the chunk's keys. (Widening a chunk's bf16 values
// into an L1 buffer once, instead of at every row block, measured no faster.)
template <int NQ>
constexpr int64_t kValueVectors = kAcc / NQ < 1 ? 1 : (kAcc / NQ > 4 ? 4 : kAcc / NQ);

template <int NQ, int64_t NB, typename T>
DOMINO_INLINE void value_block(const T* v, int64_t vs, const uint8_t* vis, int64_t ldv, const uint8_t* key_class,
                               int64_t n, int64_t D, int64_t d0, const float* p, int64_t ldp, float* acc_rows,
                               int64_t lda) {
  vf acc[NQ][NB];
  DOMINO_UNROLL
  for (int r = 0; r < NQ; ++r)
    DOMINO_UNROLL
    for (int64_t b = 0; b < NB; ++b) acc[r][b] = loadu(acc_rows + r * lda + d0 + b * L);
  const bool whole = d0 + NB * L <= D;
  for (int64_t j = 0; j < n; ++j) {
    const uint8_t c = key_class[j];
    if (c == kKeyHidden) continue;
    const T* vr = v + j * vs + d0;
    vf vv[NB];
    DOMINO_UNROLL
    for (int64_t b = 0; b < NB; ++b) vv[b] = whole ? loadu(vr + b * L) : load_partial(vr + b * L, D - d0 - b * L, 0.0f);
    if (c == kKeyVisible) {
      DOMINO_UNROLL
      for (int r = 0; r < NQ; ++r) {
        const vf pr = broadcast(p + r * ldp + j);
        DOMINO_UNROLL
        for (int64_t b = 0; b < NB; ++b) acc[r][b] += pr * vv[b];
      }
    } else {
      DOMINO_UNROLL
      for (int r = 0; r < NQ; ++r) {
        if (!vis[r * ldv + j]) continue;
        const vf pr = broadcast(p + r * ldp + j);
        DOMINO_UNROLL
        for (int64_t b = 0; b < NB; ++b) acc[r][b] += pr * vv[b];
      }
    }
  }
  DOMINO_UNROLL
  for (int r = 0; r < NQ; ++r)
    DOMINO_UNROLL
    for (int64_t b = 0; b < NB; ++b) storeu(acc_rows + r * lda + d0 + b * L, acc[r][b]);
}

template <int NQ, typename T>
void value_rows(const T* v, int64_t vs, const uint8_t* vis, int64_t ldv, const uint8_t* key_class, int64_t n,
                int64_t D, const float* p, int64_t ldp, float* acc_rows, int64_t lda) {
  constexpr int64_t NB = kValueVectors<NQ>;
  int64_t d0 = 0;
  for (; d0 + NB * L <= D; d0 += NB * L)
    value_block<NQ, NB>(v, vs, vis, ldv, key_class, n, D, d0, p, ldp, acc_rows, lda);
  for (; d0 < D; d0 += L) value_block<NQ, 1>(v, vs, vis, ldv, key_class, n, D, d0, p, ldp, acc_rows, lda);
}

// Row blocks of up to 4 (then the remainder): the blocking shares loads, never arithmetic.
template <typename F>
DOMINO_INLINE void for_row_blocks(int64_t nq, F&& f) {
  int64_t r = 0;
  for (; r + 4 <= nq; r += 4) f(std::integral_constant<int, 4>{}, r);
  switch (nq - r) {
    case 3: f(std::integral_constant<int, 3>{}, r); break;
    case 2: f(std::integral_constant<int, 2>{}, r); break;
    case 1: f(std::integral_constant<int, 1>{}, r); break;
    default: break;
  }
}

// Keys per chunk of the score and value passes: a multiple of L with the chunk's
// transposed keys (D x C floats) within kAttendChunkFloats, so they stay in L1 while every
// row of the block scores them, as the chunk's values do while every row and column block
// sums them. Whole passes over the keys (the version before) transposed all of a long
// cache into a buffer of D x n floats (512 KB for 2048 keys of 64) that every row block
// then read back from L2/L3, and read the values once per row block and column block
// from there: at 2048 cached keys 4x slower than the arithmetic.
DOMINO_INLINE int64_t chunk_keys(int64_t lda) {
  const int64_t c = kAttendChunkFloats / (lda > 0 ? lda : 1) / L * L;
  return c < L ? L : c;
}

template <typename T>
void attend_block(const float* q, int64_t nq, int64_t D, const T* k, int64_t ks, const T* v, int64_t vs,
                  const uint8_t* vis, const uint8_t* key_class, const float* bias, int64_t n, float scale,
                  bool scored, float* scores, float* kt, float* acc, T* const* out) {
  const int64_t lds = (n + L - 1) / L * L;  // scores rows: n rounded up to whole vectors
  const int64_t lda = (D + L - 1) / L * L;
  const int64_t C = chunk_keys(lda);  // D x C floats fit kt
  // Scores, chunk by chunk (unless the caller's AMX tiles made them): the chunk's keys
  // transposed (exact) into kt, then every row block's scores of them.
  for (int64_t j0 = 0; !scored && j0 < n; j0 += C) {
    const int64_t nc = n - j0 < C ? n - j0 : C, ldc = (nc + L - 1) / L * L;
    transpose_keys(k + j0 * ks, ks, nc, D, kt, ldc);
    for_row_blocks(nq, [&](auto nq_block, int64_t r) {
      constexpr int NQ = decltype(nq_block)::value;
      score_rows<NQ>(q + r * D, D, kt, ldc, ldc, scale, scores + r * lds + j0, lds);
    });
  }
  // Weights row by row, then each row's sum, key by key in key order (a hidden key's exact 0
  // adding nothing), L rows at a time: an L x L block of weights transposed puts one key's
  // weights of the L rows in one vector, so lane i runs row i's chain (the additions of a
  // one-row loop, in its order; the scalar loop before took ~10 % of a long block).
  // Row r's final factor: 1 / sum, or 0 for a row that sees no key (one that sees a key has
  // sum >= its max's weight exp(0) = 1, so a factor of 0 means none; NaN stays NaN).
  float* factor = acc + nq * lda;
  for (int64_t row = 0; row < nq; ++row)  // 0 marks a row that sees no key
    factor[row] = softmax_weights(scores + row * lds, vis + row * n, bias ? bias + row * n : nullptr, n) == -kInf
                      ? 0.0f
                      : 1.0f;
  for (int64_t r0 = 0; r0 < nq; r0 += L) {
    const int64_t nr = nq - r0 < L ? nq - r0 : L;
    vf sum = splat(0.0f);
    for (int64_t j0 = 0; j0 < n; j0 += L) {
      vf w[L];
      for (int64_t i = 0; i < L; ++i) w[i] = i < nr ? loadu(scores + (r0 + i) * lds + j0) : splat(0.0f);
      transpose_block(w);  // w[t]: key j0 + t's weights of the rows (past n: unused)
      const int64_t keys = n - j0 < L ? n - j0 : L;
      for (int64_t t = 0; t < keys; ++t) sum += w[t];
    }
    for (int64_t i = 0; i < nr; ++i) factor[r0 + i] = factor[r0 + i] == 0.0f ? 0.0f : 1.0f / sum[i];
  }
  // Values, chunk by chunk: each chunk read from memory once, then from L1 by every row
  // block and column block, their partial sums kept in acc between chunks. Where the scores
  // ran on AMX tiles the value sums do too (cpu/attention_values_amx.h): one path per call.
  std::memset(acc, 0, sizeof(float) * nq * lda);
#if DOMINO_HAS_AMX_SCORES
  const bool amx_values = std::is_same_v<T, uint16_t> && scored;
  if constexpr (std::is_same_v<T, uint16_t>)
    if (amx_values) attention_values_amx(scores, lds, vis, key_class, nq, n, v, vs, D, acc, lda);
#else
  constexpr bool amx_values = false;
#endif
  for (int64_t j0 = 0; !amx_values && j0 < n; j0 += C) {
    const int64_t nc = n - j0 < C ? n - j0 : C;
    for_row_blocks(nq, [&](auto nq_block, int64_t r0) {
      constexpr int NQ = decltype(nq_block)::value;
      value_rows<NQ>(v + j0 * vs, vs, vis + r0 * n + j0, n, key_class + j0, nc, D, scores + r0 * lds + j0, lds,
                     acc + r0 * lda, lda);
    });
  }
  for (int64_t r = 0; r < nq; ++r) {
    const bool none = factor[r] == 0.0f;
    for (int64_t c = 0; c < D; c += L) {
      const vf o = none ? splat(0.0f) : loadu(acc + r * lda + c) * factor[r];
      if (c + L <= D) storeu(out[r] + c, o);
      else store_partial(out[r] + c, D - c, o);
    }
  }
}

void attend_block_f32(const float* q, int64_t nq, int64_t D, const float* k, int64_t ks, const float* v,
                      int64_t vs, const uint8_t* vis, const uint8_t* key_class, const float* bias, int64_t n,
                      float scale, bool scored, float* scores, float* kt, float* acc, float* const* out) {
  attend_block(q, nq, D, k, ks, v, vs, vis, key_class, bias, n, scale, scored, scores, kt, acc, out);
}
void attend_block_bf16(const float* q, int64_t nq, int64_t D, const uint16_t* k, int64_t ks, const uint16_t* v,
                       int64_t vs, const uint8_t* vis, const uint8_t* key_class, const float* bias, int64_t n,
                       float scale, bool scored, float* scores, float* kt, float* acc, uint16_t* const* out) {
  attend_block(q, nq, D, k, ks, v, vs, vis, key_class, bias, n, scale, scored, scores, kt, acc, out);
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
    .rms_norm_f32 = &rms_norm_f32,
    .rms_norm_bf16 = &rms_norm_bf16,
    .add_rms_norm_f32 = &add_rms_norm_f32,
    .add_rms_norm_bf16 = &add_rms_norm_bf16,
    .silu_mul_f32 = &silu_mul_f32,
    .silu_mul_bf16 = &silu_mul_bf16,
    .rotary_row_f32 = &rotary_row_f32,
    .rotary_row_bf16 = &rotary_row_bf16,
    .attend_block_f32 = &attend_block_f32,
    .attend_block_bf16 = &attend_block_bf16,
#if DOMINO_HAS_AMX_SCORES
    .attention_scores_amx = &attention_scores_amx,
#else
    .attention_scores_amx = nullptr,
#endif
};

}  // namespace domino::cpu::DOMINO_ISA
