// CPU kernel of small_batch_attention: causal attention of a few query rows (one decode
// token, or the k + 1 tokens of a speculative verification, or a prompt) against a KV
// cache, each row computed exactly as a one-token decoding step would compute it.
//
//   q [B, Hq, M, D], k / v [B, Hkv, N, D] (Hq a multiple of Hkv: grouped-query heads share
//   kv head h / (Hq / Hkv)), mask None or [B or 1, Hq or 1, M, N] (bool: False hides a key;
//   float: added to the score, -inf hides a key), out [B, Hq, M, D]. Any strides with the
//   last dimension contiguous: HF's transposed query and its cache are read in place.
//   Query row m is the token at cache position N - M + m and sees keys j <= N - M + m
//   (bottom-right causal, as decoding with a cache does) that the mask does not hide.
//
// Bytes it must move: per (sequence, kv head) the key and value rows its query rows may
// see, 2 * N * D elements at most (keys that the mask hides from every row of a block,
// before its first visible key or after its last, are never read), read once for a task
// of up to 4 query positions times the Hq / Hkv query heads of that kv head: attend_block
// walks them in chunks of 64 keys (at D = 64) that stay in L1 while every row of the task
// uses them; q and out once. Work ~4 * n * D flops and n exponentials per query row, plus
// one transposition of the keys per task. A decode step of SmolLM2-135M (9 heads of 64,
// 3 kv heads, a few hundred cached tokens, 30 layers) is ~10 M flops: the cost is the call
// itself, which is why this exists next to SDPA (its CPU kernels pay a setup per call and,
// for one query row, run a general blocked path). A 16-row verification is FMA-bound.
// Long caches: with the keys transposed whole into a buffer of D * N floats (the version
// before the chunks) a decode call over 2,000 keys ran ~1.4x slower (benchmarks/README.md).
//
// Batch invariance, by construction: each query row's visible keys are those the mask
// lets it see at positions up to its own; the instruction-set build's attend_block
// (cpu/vec.cpp) computes the row from q and those keys alone: each score one FMA chain
// over d (keys in vector lanes: the same operations for a key wherever it sits), the max
// (exact in any order), the sum of exp in key order (a key under a large finite bias, above
// kHiddenBias, stays visible with weight 0: the vector path's sequential sums absorb it
// without a trace, but on AMX tiles it still takes a place in the row's chunks of 32 keys,
// so a mask should hide a key by False, -inf or a dtype's lowest), exp elementwise,
// the value sum per lane over the visible keys in key order (a key hidden from the row,
// even one that other rows of its block see, is skipped: its value is never read into the
// row), one division, one rounding to out's dtype. Nothing depends on M, on the row's
// place in the call or its block, on the thread split or on where hidden keys (padding,
// holes, other branches of a draft tree) sit in the cache: a verification row, a tree
// node and the one-token step of the same path give the same bits (on one instruction-set
// build and score path).
//
// Scores and value sums on AMX tiles: on a CPU with AMX-BF16 the bf16 scores (q . k_j, D a
// multiple of 32) run as TDPBF16PS tile products (the Kernels table's attention_scores_amx,
// cpu/vec.cpp) with the keys loaded as the cache holds them, instead of transposed for the
// vector FMAs; and the value sums too (cpu/attention_values_amx.h): each row's visible keys,
// in order, 32 a tile product with the weights rounded to bf16, the last len % 32 by FMAs.
// Other bits than the vector path's (a tile sums each 32 elements in its own order), the
// same batch invariance (a row's result depends on its own query and visible keys alone;
// the value sums' chunks follow the row's list of visible keys, so a hidden key, wherever
// it sits, takes no place in them). The softmax stays the vector code's. 2-core Xeon VM,
// bf16, 9 heads of 64 over 3 kv heads, 2 threads, the fifty-eighth session against the
// vector value sums (benchmarks/README.md): a 2,000-token prompt's causal attention ~20 ->
// ~13 ms, 16 rows over 2,000 keys ~0.27 -> ~0.17 ms, one row over 2,000 keys ~0.044 ->
// ~0.046 ms. DOMINO_SMALL_BATCH_ATTENTION_SCORES=vector turns both off.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernel_switches.h"
#include "cpu/small_batch_linear_packed_amx.h"
#include "cpu/layer_kernels.h"
#include "ops.h"

namespace domino::cpu {
namespace {

// A float mask hides a key with -inf, and with anything at or below bfloat16's lowest finite
// value (-3.39e38; float32's lowest is below it): HF's eager-style masks, and the engine's
// tree mask, add torch.finfo(dtype).min for "hidden". Such a key would weigh exactly 0 in any
// row that sees another key, but as a key of the row it would still take a place in the
// row's list of keys, which the AMX value sums chunk (cpu/attention_values_amx.h); hidden,
// it takes none, so a tree node's row gives the bits of its path's decode step.
constexpr float kHiddenBias = -3.3895313892515355e38f;


// The bytes [first, last) a strided tensor's elements can occupy.
std::pair<uintptr_t, uintptr_t> byte_extent(const at::Tensor& t) {
  auto lo = reinterpret_cast<uintptr_t>(t.data_ptr()), hi = lo;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d) * static_cast<int64_t>(t.element_size());
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi + t.element_size()};
}

bool extents_intersect(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = byte_extent(a);
  const auto [b0, b1] = byte_extent(b);
  return a0 < b1 && b0 < a1;
}

void check_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const std::optional<at::Tensor>& mask, const at::Tensor& out) {
  auto check = [](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.defined(), name, " must be a tensor");
    TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU, got ", t.device());
    TORCH_CHECK(t.dim() == 4, name, " must have 4 dimensions, got shape ", t.sizes());
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
                " must be float32 or bfloat16, got ", t.scalar_type());
    TORCH_CHECK(t.size(3) <= 1 || t.stride(3) == 1, name, " must be contiguous in its last dimension");
  };
  check(q, "q");
  check(k, "k");
  check(v, "v");
  check(out, "out");
  const int64_t B = q.size(0), Hq = q.size(1), M = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), N = k.size(2);
  for (const auto* t : {&k, &v, &out})
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "q, k, v and out must share a dtype, got ",
                q.scalar_type(), " and ", t->scalar_type());
  TORCH_CHECK(k.size(0) == B && k.size(3) == D && Hkv > 0,
              "k must have shape [", B, ", Hkv, N, ", D, "] to match q ", q.sizes(), ", got ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "v must have k's shape ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK(Hq % Hkv == 0, "q's heads (", Hq, ") must be a multiple of k's (", Hkv, ")");
  TORCH_CHECK(N >= M, "k must hold at least q's ", M, " positions (the cache includes the queries), got ", N);
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have q's shape ", q.sizes(), ", got ", out.sizes());
  if (mask.has_value() && mask->defined()) {
    const at::Tensor& m = *mask;
    TORCH_CHECK(m.device().is_cpu(), "mask must be on the CPU, got ", m.device());
    TORCH_CHECK(m.scalar_type() == at::kBool || m.scalar_type() == at::kFloat ||
                    m.scalar_type() == at::kBFloat16,
                "mask must be bool, float32 or bfloat16, got ", m.scalar_type());
    TORCH_CHECK(m.dim() == 4 && (m.size(0) == B || m.size(0) == 1) && (m.size(1) == Hq || m.size(1) == 1) &&
                    m.size(2) == M && m.size(3) == N,
                "mask must have shape [", B, " or 1, ", Hq, " or 1, ", M, ", ", N, "], got ", m.sizes());
  }
  // out is written while q, k, v and the mask are read: their byte ranges must be
  // disjoint (a strided out, as HF's transposed output, is compared by its extent), and
  // out must not overlap itself (a stride-0 view)
  TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes, "out must not overlap itself (a broadcast view)");
  const at::Tensor* m = mask.has_value() && mask->defined() ? &*mask : nullptr;
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{m, "mask"}})
    TORCH_CHECK(t == nullptr || !extents_intersect(out, *t), "out must not share memory with ", name);
}

// Whether a bf16 call's scores and value sums run on AMX tiles (the Kernels table's
// attention_scores_amx, then attend_block's value sums) instead of the vector FMAs: where the
// CPU has AMX-BF16 (and the active build is avx512), D is a multiple of 32 up to 128, and
// DOMINO_SMALL_BATCH_ATTENTION_SCORES is unset, "auto" or "amx" ("vector": never; read once;
// domino_ops.cpu.kernel_switch switches it for a test or a benchmark; a process keeps one for
// all its forwards, as the two paths round differently). A 16-row verification over 1,000 keys
// spent ~40 % of its attention on the scores and the keys' transposition the vector path
// needs; the tiles take the keys as the cache holds them. (The variable is checked on float32
// calls too; their attention is the vector path's whatever it says.)
bool amx_tiles(const Kernels& K, int64_t D, bool bf16) {
  const char* env = kernel_switch(KernelSwitch::kAttentionScores);
  const bool forced = env != nullptr && std::strcmp(env, "amx") == 0;
  if (env != nullptr && *env != '\0' && !forced && std::strcmp(env, "auto") != 0) {
    TORCH_CHECK_VALUE(std::strcmp(env, "vector") == 0,
                      "DOMINO_SMALL_BATCH_ATTENTION_SCORES must be auto, amx or vector, got '", env, "'");
    return false;
  }
  if (!bf16) return false;
  const bool usable = K.attention_scores_amx != nullptr && amx_available() && D >= 32 && D % 32 == 0 && D <= 128;
  TORCH_CHECK_VALUE(usable || !forced, "DOMINO_SMALL_BATCH_ATTENTION_SCORES=amx needs a CPU with AMX-BF16, the avx512 "
                    "build and a head dimension that is a multiple of 32 up to 128 (got ", D, ")");
  return usable;
}

// One query row's mask over keys [0, limit), its entries `mn` apart: vr[j] whether key j is
// visible, and for a float mask its bias br[j] (0 where hidden); returns whether some
// visible key has a nonzero bias. A float at or below kHiddenBias (-inf, a dtype's lowest)
// hides its key; NaN stays visible (it propagates). kContiguous (mn == 1, the usual case)
// makes loops the compiler vectorizes: a 16-token verification's scalar loop here showed in
// its profile.
template <bool kContiguous, typename MaskT>
bool mask_row(const MaskT* __restrict row, int64_t mn, int64_t limit, uint8_t* __restrict vr, float* __restrict br) {
  const int64_t step = kContiguous ? 1 : mn;
  if constexpr (std::is_same_v<MaskT, bool>) {
    if constexpr (kContiguous) std::memcpy(vr, row, limit);  // a bool tensor holds 0 or 1
    else for (int64_t j = 0; j < limit; ++j) vr[j] = row[j * step];
    return false;
  } else {
    int any = 0;
    for (int64_t j = 0; j < limit; ++j) {
      const float f = static_cast<float>(row[j * step]);
      const bool keep = !(f <= kHiddenBias);
      vr[j] = keep;
      br[j] = keep ? f : 0.0f;
      any |= keep & (f != 0.0f);
    }
    return any != 0;
  }
}

template <typename T, typename MaskT>
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor* mask,
             double scale, at::Tensor& out) {
  const Kernels& K = kernels();
  const bool amx = amx_tiles(K, q.size(3), std::is_same_v<T, c10::BFloat16>);
  const int64_t B = q.size(0), Hq = q.size(1), M = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), N = k.size(2), group = Hq / Hkv;
  const T* qp = static_cast<const T*>(q.data_ptr());
  const T* kp = static_cast<const T*>(k.data_ptr());
  const T* vp = static_cast<const T*>(v.data_ptr());
  T* op = static_cast<T*>(out.data_ptr());
  const MaskT* mp = mask ? static_cast<const MaskT*>(mask->data_ptr()) : nullptr;
  // A broadcast mask dimension (size 1) has stride 0.
  const int64_t mb = mask && mask->size(0) > 1 ? mask->stride(0) : 0;
  const int64_t mh = mask && mask->size(1) > 1 ? mask->stride(1) : 0;
  const int64_t mm = mask ? mask->stride(2) : 0, mn = mask ? mask->stride(3) : 0;
  const bool per_head_mask = mask && mask->size(1) > 1;
  const float sc = static_cast<float>(scale);
  // One task: one (sequence, kv head) and up to task_positions query positions, with every query
  // head of that kv head: nq = rows * group query rows that share the key and value loads.
  // Eight positions where that still splits evenly over the threads: a 12- to 16-token
  // verification then runs 6 tasks of 24 query rows (SmolLM2's 3 kv heads), a whole 16-row
  // block for the AMX scores and value sums and the values' chunks packed for 24 rows
  // instead of 12 (with this file's other changes of the fifty-ninth session, bf16, 16 rows
  // over 100 keys 28.2-28.9 -> 25.9-26.1 us on the 2-core Xeon VM, benchmarks/bench_attention.py
  // in benchmarks/README.md); an odd number of tasks (24 positions: 9) would leave a thread a task
  // behind, so there four: 12 query rows a task. From 64 positions (a prompt) sixteen: 16 *
  // group rows, whole blocks of 16 tile rows and one key chunk shared by more rows on the
  // vector path (2-core Xeon VM: a 2,000-token prefill 913/921 -> 845/813 ms,
  // benchmarks/prefill_speed.py in benchmarks/README.md). Which rows share a task changes
  // no bit.
  const int64_t threads = at::get_num_threads();
  const bool eights = M >= 12 && B * Hkv * ((M + 7) / 8) % threads == 0;
  const int64_t task_positions = M >= 64 ? 16 : eights ? 8 : 4;
  const int64_t rows_per_task = std::min<int64_t>(task_positions, M), chunks = (M + rows_per_task - 1) / rows_per_task;
  const int64_t tasks = B * Hkv * chunks;
  const int64_t lds = (N + K.lanes - 1) / K.lanes * K.lanes;  // the longest row of scores
  const int64_t lda = (D + K.lanes - 1) / K.lanes * K.lanes;
  // Below ~256K multiply-adds per thread's share a fork costs more than it saves (a decode
  // step's 3 tasks run on the calling thread).
  const int64_t grain =
      std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, rows_per_task * group * N * D));
  // Strides as plain integers: Tensor::stride() is a call the compiler cannot hoist out of
  // a loop (it checks the tensor's stride policy each time).
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), qs2 = q.stride(2);
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const int64_t os0 = out.stride(0), os1 = out.stride(1), os2 = out.stride(2);
  at::parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
    // per-thread scratch, looked up once per chunk of tasks (each thread_local access is a
    // TLS lookup)
    thread_local std::vector<float> kt_buf, q_buf, bias_buf, scores_buf, acc_buf;
    thread_local std::vector<uint8_t> vis_buf, class_buf;
    thread_local std::vector<T*> out_buf;
    const int64_t nq_max = rows_per_task * group;
    kt_buf.resize(std::max<int64_t>(kAttendChunkFloats, K.lanes * lda));
    q_buf.resize(nq_max * D);
    scores_buf.resize(nq_max * lds);
    acc_buf.resize(nq_max * (lda + 1));
    vis_buf.resize(nq_max * N);
    bias_buf.resize(mp && !std::is_same_v<MaskT, bool> ? nq_max * N : 0);
    class_buf.resize(2 * N);
    out_buf.resize(nq_max);
    float* q_rows = q_buf.data();
    uint8_t* vis = vis_buf.data();
    uint8_t* key_class = class_buf.data();
    float* bias = bias_buf.data();
    T** outs = out_buf.data();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / (Hkv * chunks), g = t / chunks % Hkv, c = t % chunks;
      const int64_t m0 = c * rows_per_task, m1 = std::min(M, m0 + rows_per_task), nq = (m1 - m0) * group;
      const int64_t n = N - M + m1;  // keys the block's last row may see
      bool any_bias = false;
      for (int64_t m = m0; m < m1; ++m) {
        const int64_t limit = N - M + m + 1;  // keys at positions <= this row's own
        for (int64_t hh = 0; hh < group; ++hh) {
          const int64_t i = (m - m0) * group + hh, h = g * group + hh;
          for (int64_t d = 0; d < D; ++d) q_rows[i * D + d] = static_cast<float>(qp[b * qs0 + h * qs1 + m * qs2 + d]);
          outs[i] = op + b * os0 + h * os1 + m * os2;
          uint8_t* vr = vis + i * n;
          float* br = bias + (mp && !std::is_same_v<MaskT, bool> ? i * n : 0);
          if (hh > 0 && !per_head_mask) {  // the same mask row as the position's first head
            std::memcpy(vr, vr - n, n);
            if constexpr (!std::is_same_v<MaskT, bool>)
              if (mp) std::memcpy(br, br - n, n * sizeof(float));
            continue;
          }
          std::memset(vr + limit, 0, n - limit);
          if (!mp) {
            std::memset(vr, 1, limit);
            continue;
          }
          const MaskT* row = mp + b * mb + h * mh + m * mm;
          any_bias |= mn == 1 ? mask_row<true>(row, mn, limit, vr, br) : mask_row<false>(row, mn, limit, vr, br);
          if constexpr (!std::is_same_v<MaskT, bool>) std::fill(br + limit, br + n, 0.0f);
        }
      }
      // Each key's class over the block's rows: seen by all, by none, or by some (rows
      // outer, so the byte loops vectorize).
      uint8_t* seen_by_some = key_class + N;
      std::memcpy(key_class, vis, n);
      std::memcpy(seen_by_some, vis, n);
      for (int64_t i = 1; i < nq; ++i)
        for (int64_t j = 0; j < n; ++j) {
          key_class[j] &= vis[i * n + j];
          seen_by_some[j] |= vis[i * n + j];
        }
      for (int64_t j = 0; j < n; ++j)
        key_class[j] = key_class[j] ? kKeyVisible : seen_by_some[j] ? kKeyMixed : kKeyHidden;
      // The keys some row of the block sees lie in [lo, hi): the block attends to those
      // alone (a hidden key adds nothing to any row), so a mask that hides a static cache's
      // unwritten tail and a left-padded batch's padding costs nothing. Same bits: a key's
      // score and weight do not depend on its place, and the sums run in key order.
      int64_t lo = 0, hi = n;
      while (lo < n && !seen_by_some[lo]) ++lo;
      if (lo == n) lo = 0;  // no key visible: the block as it is (every row empty)
      else while (!seen_by_some[hi - 1]) --hi;
      const int64_t nv = hi - lo;
      if (nv < n) {  // rows re-laid at stride nv, in place (each moves down: no overlap lost)
        for (int64_t i = 0; i < nq; ++i) std::memmove(vis + i * nv, vis + i * n + lo, nv);
        if (any_bias)
          for (int64_t i = 0; i < nq; ++i) std::memmove(bias + i * nv, bias + i * n + lo, nv * sizeof(float));
        std::memmove(key_class, key_class + lo, nv);
      }
      const float* bp = any_bias ? bias : nullptr;  // all zeros: no bias, same bits
      const T* kr = kp + b * ks0 + g * ks1 + lo * ks2;
      const T* vr = vp + b * vs0 + g * vs1 + lo * vs2;
      if constexpr (std::is_same_v<T, float>) {
        K.attend_block_f32(q_rows, nq, D, kr, ks2, vr, vs2, vis, key_class, bp, nv, sc, false, scores_buf.data(),
                           kt_buf.data(), acc_buf.data(), outs);
      } else {
        const auto* k16 = reinterpret_cast<const uint16_t*>(kr);
        if (amx) {  // the scores by AMX tiles, 16 rows at a time, rows round_up(nv, lanes) apart (the value
          // sums follow them onto the tiles: `scored`)
          const int64_t ld = (nv + K.lanes - 1) / K.lanes * K.lanes;
          for (int64_t r = 0; r < nq; r += 16)
            K.attention_scores_amx(q_rows + r * D, std::min<int64_t>(16, nq - r), D, k16, ks2, nv, sc,
                                   scores_buf.data() + r * ld, ld);
        }
        K.attend_block_bf16(q_rows, nq, D, k16, ks2, reinterpret_cast<const uint16_t*>(vr), vs2, vis, key_class,
                            bp, nv, sc, amx, scores_buf.data(), kt_buf.data(), acc_buf.data(),
                            reinterpret_cast<uint16_t* const*>(outs));
      }
    }
  });
}

template <typename T>
void dispatch_mask(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double scale, at::Tensor& out) {
  if (!mask.has_value() || !mask->defined()) return forward<T, float>(q, k, v, nullptr, scale, out);
  switch (mask->scalar_type()) {
    case at::kBool: return forward<T, bool>(q, k, v, &*mask, scale, out);
    case at::kFloat: return forward<T, float>(q, k, v, &*mask, scale, out);
    default: return forward<T, c10::BFloat16>(q, k, v, &*mask, scale, out);
  }
}

}  // namespace

void small_batch_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::optional<at::Tensor>& mask, double scale, at::Tensor out) {
  check_args(q, k, v, mask, out);
  // the kernels multiply in float32: a double past float32's range would make every score inf
  TORCH_CHECK(finite_in_float32(scale), "scale must be finite in float32, got ", scale);
  if (out.numel() == 0) return;
  if (q.scalar_type() == at::kFloat) dispatch_mask<float>(q, k, v, mask, scale, out);
  else dispatch_mask<c10::BFloat16>(q, k, v, mask, scale, out);
}

}  // namespace domino::cpu

// The CPU implementation of the op's schema (bindings/schemas.h).
TORCH_LIBRARY_IMPL(domino_ops, CPU, m) { m.impl("small_batch_attention", &domino::cpu::small_batch_attention_cpu); }
