// The kernels of the Domino head shared by domino_head_rollout.cu (k steps for a batch)
// and domino_head_expand.cu (one step for a frontier of tree nodes), with the
// workspace layout they share; the file comment of domino_head_rollout.cu describes them
// (what each kernel does, bytes moved, limits). Plain CUDA, also built for the SIMT emulator.
#pragma once

#include "cuda/domino_head_rollout.cuh"
#include "cuda/row_sampler.cuh"

namespace domino::cuda {
namespace {

// The logits kernel: one vocabulary row per thread, so a tile is one block's rows (594
// tiles at V = 151936: ~4.5 blocks per H100 SM, enough warps in flight to keep HBM busy).
constexpr int kTileRows = kBlockThreads;
constexpr int kGroup = 16;  // sequences (nodes) per pass over a w2 tile: accumulators per thread
// Columns of a [kGroup, r] staged in shared memory at a time; the rank has no limit (each
// (row, sequence) dot product still runs over c in ascending order, chunk after chunk).
// Under the emulator a chunk is 64 columns: bf16's 4 in-flight loads (32 columns) fit
// in it twice, and the tests' large ranks span many chunks.
#if defined(DOMINO_SIMT) && !defined(DOMINO_SIMT_GPU_SHAPES)
constexpr int kRankChunk = 64;
#else
constexpr int kRankChunk = 256;
#endif
constexpr int kW2LoadsInFlight = 4;  // 16-byte w2 loads each thread issues before their FMAs

// Per (sequence, tile): the log-sum-exp partial and the exponential race's winner.
struct TilePartial {
  float max;
  float sumexp;  // sum over the tile of exp(z - max)
  int arg;
  float race_key;
  int race_arg;
  float race_z;
};
static_assert(sizeof(TilePartial) == 6 * sizeof(float));

struct Lse {
  float m, s;
  int arg;
};
// A NaN max (greedy rows: torch.argmax's first NaN) beats every number; equal maxima add
// their sums (at +inf a sum counts the +inf entries).
__device__ __forceinline__ Lse lse_merge(Lse a, Lse b) {
  const bool a_nan = a.m != a.m, b_nan = b.m != b.m;
  if (a_nan || b_nan) return a_nan && b_nan ? (b.arg < a.arg ? b : a) : (a_nan ? a : b);
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  if (a.m == b.m) return {a.m, a.s + b.s, a.arg < b.arg ? a.arg : b.arg};
  if (b.m > a.m) return {b.m, b.s + a.s * __expf(a.m - b.m), b.arg};
  return {a.m, a.s + b.s * __expf(b.m - a.m), a.arg};
}
// Adds z at index v to a thread's running Lse (indices increasing).
__device__ __forceinline__ void lse_add(Lse& l, float z, int v) {
  if (l.m != l.m) return;  // an earlier NaN won
  if (z != z) l = {z, z, v};
  else if (z > l.m) l = {z, l.s * __expf(l.m - z) + 1.0f, v};
  else if (z == l.m) l.s += 1.0f;
  else if (z != -INFINITY) l.s += __expf(z - l.m);
}
struct Race {
  float key;
  int arg;
  float z;
};
// Entries with z = +inf race among themselves first (they share the mass evenly: their
// keys are -log(E)); then the larger key, then the lower index.
__device__ __forceinline__ Race race_merge(Race a, Race b) {
  const bool a_inf = a.z == INFINITY, b_inf = b.z == INFINITY;
  if (a_inf != b_inf) return b_inf ? b : a;
  return (b.key > a.key || (b.key == a.key && b.arg < a.arg)) ? b : a;
}

struct MergeScratch {
  Lse lse[kWarp];
  Race race[kWarp];
};

// Warp-wide merge; every lane gets the result.
__device__ __forceinline__ void warp_merge(Lse& l, Race& q) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off /= 2) {
    l = lse_merge(l, {__shfl_xor_sync(0xffffffffu, l.m, off), __shfl_xor_sync(0xffffffffu, l.s, off),
                      __shfl_xor_sync(0xffffffffu, l.arg, off)});
    q = race_merge(q, {__shfl_xor_sync(0xffffffffu, q.key, off), __shfl_xor_sync(0xffffffffu, q.arg, off),
                       __shfl_xor_sync(0xffffffffu, q.z, off)});
  }
}

// Block-wide merge; every thread gets the result.
__device__ __forceinline__ void block_merge(Lse& l, Race& q, MergeScratch& sh) {
  warp_merge(l, q);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    sh.lse[warp] = l;
    sh.race[warp] = q;
  }
  __syncthreads();
  l = sh.lse[0];
  q = sh.race[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / kWarp; ++w) {
    l = lse_merge(l, sh.lse[w]);
    q = race_merge(q, sh.race[w]);
  }
  __syncthreads();
}

// The launcher's workspace: a [b, r], tile partials [b, tiles], two GRU states [2, b, G]
// (step i reads S_i and writes S_{i+1}; every output row needs all of the old state), and
// with top-k/top-p one logit row per sequence [b, V].
struct Workspace {
  float* a;
  TilePartial* partials;
  float* S_even;  // two named buffers, not an array: a runtime index would put it in local memory
  float* S_odd;
  float* rows;  // [b, V] logits the logits kernel writes, or nullptr

  // S_i: the caller's state, the ping-pong buffers, and state_out after the last step
  // (an expand step: the nodes' states, then the children's).
  __host__ __device__ float* state(const HeadRolloutArgs& args, int64_t i) const {
    if (i == 0) return const_cast<float*>(args.state);
    if (args.node_seq != nullptr) return args.state_out;
    if (i == args.k) return args.state_out;
    return i % 2 == 0 ? S_even : S_odd;
  }
};

__host__ __device__ inline Workspace carve(const HeadRolloutArgs& args, int64_t tiles) {
  Workspace w;
  w.a = args.workspace;
  w.partials = reinterpret_cast<TilePartial*>(w.a + args.b * args.r);
  w.S_even = reinterpret_cast<float*>(w.partials + args.b * tiles);
  w.S_odd = w.S_even + args.b * args.G;
  w.rows = args.logits_rows;  // set by the launcher (head_rollout_rows, or an expand step's node_logits)
  return w;
}

// The rollout's logit rows: the workspace's [b, V] scratch when some row may use top-k/top-p.
inline float* head_rollout_rows(const HeadRolloutArgs& args, int64_t tiles) {
  const Workspace w = carve(args, tiles);
  return args.sampling.may_filter() ? w.S_odd + args.b * args.G : nullptr;
}

// The base-logit / hproj row of batch row s at a step: s * k + step in a rollout, the
// node's (sequence, depth) in an expand step, clamped into range.
__device__ __forceinline__ int64_t head_row(const HeadRolloutArgs& args, int64_t s, int64_t step) {
  if (args.node_seq == nullptr) return s * args.k + step;
  const int64_t seq = args.node_seq[s], depth = args.node_depth[s];
  return (seq < 0 ? 0 : seq >= args.seqs ? args.seqs - 1 : seq) * args.k +
         (depth < 0 ? 0 : depth >= args.k ? args.k - 1 : depth);
}

// Row s's log-sum-exp statistics and race winner, merged over its tile partials in tile
// order (every thread gets them).
__device__ __forceinline__ void merge_tile_partials(const Workspace& ws, int64_t s, int tiles, Lse& l, Race& q,
                                                    MergeScratch& sh) {
  l = {-INFINITY, 0.0f, INT_MAX};
  q = {-INFINITY, INT_MAX, 0.0f};
  for (int t = threadIdx.x; t < tiles; t += blockDim.x) {
    const TilePartial p = ws.partials[s * tiles + t];
    l = lse_merge(l, {p.max, p.sumexp, p.arg});
    q = race_merge(q, {p.race_key, p.race_arg, p.race_z});
  }
  block_merge(l, q, sh);
}

// acc[g] += the U 16-byte steps of w2 row columns [c, c + U * kv) . a_sh[g] over the same
// columns, g < ng: the U loads issued before their FMAs (several in flight per thread).
template <int U, typename TW>
__device__ __forceinline__ void accumulate_steps(float (&acc)[kGroup], const TW* wrow,
                                                 const float (*a_sh)[kRankChunk], int c, int ng) {
  constexpr int kv = Vec16<TW>::n;
  float w[U][kv];
#pragma unroll
  for (int u = 0; u < U; ++u) load16(wrow + c + u * kv, w[u]);
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (g < ng) {
        const float* x = a_sh[g] + c + u * kv;
#pragma unroll
        for (int e = 0; e < kv; ++e) acc[g] += w[u][e] * x[e];
      }
    }
  }
}

// acc[g] += w2 row . a_sh[g] over the chunk's cn columns, g < ng, c ascending: the same
// sequential fma chain per (row, sequence) whatever the group, batch or chunking.
template <typename TW>
__device__ __forceinline__ void accumulate_chunk(float (&acc)[kGroup], const TW* wrow, const float (*a_sh)[kRankChunk],
                                                 int cn, int ng, bool vec) {
  constexpr int kv = Vec16<TW>::n;
  int c = 0;
  if (vec) {
    for (; c + kW2LoadsInFlight * kv <= cn; c += kW2LoadsInFlight * kv)
      accumulate_steps<kW2LoadsInFlight>(acc, wrow, a_sh, c, ng);
    for (; c < cn; c += kv) accumulate_steps<1>(acc, wrow, a_sh, c, ng);
  } else {
    for (; c < cn; ++c) {
      const float w = to_float(wrow[c]);
#pragma unroll
      for (int g = 0; g < kGroup; ++g)
        if (g < ng) acc[g] += w * a_sh[g][c];
    }
  }
}

// L = base + w2 @ a for one tile of kTileRows vocabulary rows (one per thread) and every
// sequence, kGroup sequences per pass: phase 1 streams the thread's w2 row once per group
// against a's columns staged in shared memory chunk by chunk, and writes L (to the logits
// rows and into a shared tile); phase 2 reduces the tile per sequence, one warp per
// sequence, to its partial (log-sum-exp and, when racing, the exponential race's winner).
template <typename TL, typename TW>
__global__ void __launch_bounds__(kBlockThreads)
head_logits_kernel(HeadRolloutArgs args, int64_t step, int tiles) {
  alignas(16) __shared__ float a_sh[kGroup][kRankChunk];  // the group's a, columns [c0, c0 + kRankChunk)
  __shared__ float L_sh[kGroup][kTileRows];                   // the group's logits of this tile
  __shared__ int64_t row_sh[kGroup];                          // the group's base-logit rows (head_row)
  const int64_t b = args.b, k = args.k, V = args.V, r = args.r;
  TL* base = static_cast<TL*>(args.base_logits);
  const TW* w2 = static_cast<const TW*>(args.w2);
  const Workspace ws = carve(args, tiles);
  const float* a = ws.a;
  TilePartial* partials = ws.partials;
  float* rows = ws.rows;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;

  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int tile_len = static_cast<int>(min(V - tile_begin, static_cast<int64_t>(kTileRows)));
  const int64_t v = tile_begin + threadIdx.x;  // this thread's row
  const bool has_row = static_cast<int>(threadIdx.x) < tile_len;
  const bool vec = r % Vec16<TW>::n == 0 && aligned16(w2);
  const TW* wrow = w2 + (has_row ? v : 0) * r;
  for (int64_t g0 = 0; g0 < b; g0 += kGroup) {
    const int ng = static_cast<int>(b - g0 < kGroup ? b - g0 : kGroup);
    float acc[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) acc[g] = 0.0f;
    for (int64_t c0 = 0; c0 < r; c0 += kRankChunk) {
      const int cn = static_cast<int>(r - c0 < kRankChunk ? r - c0 : kRankChunk);
      __syncthreads();  // the block is done with the previous chunk (and group: a_sh, L_sh, row_sh)
      for (int i = threadIdx.x; i < ng * kRankChunk; i += blockDim.x) {
        const int g = i / kRankChunk, c = i % kRankChunk;
        a_sh[g][c] = c < cn ? a[(g0 + g) * r + c0 + c] : 0.0f;
      }
      if (c0 == 0 && threadIdx.x < static_cast<unsigned>(ng)) row_sh[threadIdx.x] = head_row(args, g0 + threadIdx.x, step);
      __syncthreads();
      if (has_row) accumulate_chunk<TW>(acc, wrow + c0, a_sh, cn, ng, vec);
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (g >= ng || !has_row) continue;
      TL* bl = base + row_sh[g] * V + v;
      const float L = to_float(*bl) + acc[g];
      if (args.write_logits) store_from_float(bl, L);
      if (rows != nullptr) rows[(g0 + g) * V + v] = L;
      L_sh[g][threadIdx.x] = L;
    }
    __syncthreads();
    for (int g = warp; g < ng; g += warps) {
      const int64_t s = g0 + g;
      // An expand step's row s is a node, not a sequence, and its partials serve only its
      // greedy nodes (sampled ones draw from the logit rows, no race): partials of L itself.
      const float temp = args.node_seq != nullptr ? 0.0f : args.sampling.temperature_at(s);  // 0: greedy
      const bool race = temp > 0.0f && !args.sampling.filters_at(s, V);
      // the race's Philox key: the bits of the sequence's step uniform
      const uint64_t seed = race ? static_cast<uint64_t>(__double_as_longlong(args.uniforms[s * k + step])) : 0;
      Lse l = {-INFINITY, 0.0f, INT_MAX};
      Race q = {-INFINITY, INT_MAX, 0.0f};
      for (int i = lane; i < tile_len; i += kWarp) {
        const float L = L_sh[g][i];
        const int idx = static_cast<int>(tile_begin + i);
        // greedy rows keep NaN (torch.argmax picks it); sampled rows count it as -inf
        const float z = temp > 0.0f ? (L == L ? L / temp : -INFINITY) : L;
        lse_add(l, z, idx);
        if (race) {
          const float e = -logf(exponential_variate(seed, idx));
          q = race_merge(q, {z == INFINITY ? e : z + e, idx, z});
        }
      }
      warp_merge(l, q);
      if (lane == 0) partials[s * tiles + blockIdx.x] = {l.m, l.s, l.arg, q.key, q.arg, q.z};
    }
  }
}

// S_out = GRUCell(E[token], S_in) for one state row (blockIdx.y) and one warp-sized group
// of outputs j per block (blockIdx.x): each warp computes its j's three gate rows of
// gh = w_hh @ S and gi (a table row, or w_ih @ embedding). Spreading the rows over
// G / warps blocks per row lets every SM stream w_hh (6.3 MB at the paper shape). A
// rollout row is a sequence with one token; an expand row is a node, whose gh serves all
// m of its children (gh once per node, gi and the new state per child).
// min blocks 2: ptxas's own choice of 64 registers spilled on sm_80 (fp32 weights), and so
// did a cap of 85 (min blocks 3).
template <typename TW>
__global__ void __launch_bounds__(kBlockThreads, 2)
head_gru_kernel(HeadRolloutArgs args, int64_t step, int tiles) {
  DOMINO_DYNAMIC_SHARED(float, gru_sh);  // S [G], embedding [H]
  const int64_t s = blockIdx.y, G = args.G, H = args.H;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const Workspace ws = carve(args, tiles);
  const float* S_in = ws.state(args, step);
  float* S_out = ws.state(args, step + 1);
  const TW* w_hh = static_cast<const TW*>(args.w_hh);
  const TW* w_ih = static_cast<const TW*>(args.w_ih);
  const TW* gru_input = static_cast<const TW*>(args.gru_input);
  const bool expand = args.node_seq != nullptr;
  const int64_t children = expand ? args.m : 1;
  float* S_sh = gru_sh;
  float* emb_sh = gru_sh + G;
  for (int64_t c = threadIdx.x; c < G; c += blockDim.x) S_sh[c] = S_in[s * G + c];
  __syncthreads();
  const int64_t j = static_cast<int64_t>(blockIdx.x) * warps + warp;
  const bool has_j = j < G;  // no early return: the children's loop has block barriers
  constexpr int kv = Vec16<TW>::n;
  const bool vec_hh = G % kv == 0 && aligned16(w_hh);
  const bool vec_ih = w_ih != nullptr && H % kv == 0 && aligned16(w_ih);
  float hr = 0.0f, hz = 0.0f, hn = 0.0f;
  if (has_j) {
    hr = warp_dot(w_hh + j * G, S_sh, static_cast<int>(G), vec_hh);
    hz = warp_dot(w_hh + (G + j) * G, S_sh, static_cast<int>(G), vec_hh);
    hn = warp_dot(w_hh + (2 * G + j) * G, S_sh, static_cast<int>(G), vec_hh);
  }
#pragma unroll 1
  for (int64_t child = 0; child < children; ++child) {
    const int64_t out = expand ? s * children + child : s;  // the new state's row
    const int64_t token = args.tokens[expand ? out : s * args.k + step];
    if (w_ih != nullptr) {
      __syncthreads();  // the previous child is done with emb_sh
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) emb_sh[c] = to_float(gru_input[token * H + c]);
      __syncthreads();
    }
    if (!has_j) continue;
    float ir, iz, in;
    if (w_ih == nullptr) {
      const TW* row = gru_input + token * 3 * G;
      ir = to_float(row[j]);
      iz = to_float(row[G + j]);
      in = to_float(row[2 * G + j]);
    } else {
      ir = warp_dot(w_ih + j * H, emb_sh, static_cast<int>(H), vec_ih);
      iz = warp_dot(w_ih + (G + j) * H, emb_sh, static_cast<int>(H), vec_ih);
      in = warp_dot(w_ih + (2 * G + j) * H, emb_sh, static_cast<int>(H), vec_ih);
    }
    if (lane == 0) {
      const float rg = 1.0f / (1.0f + __expf(-(ir + hr)));
      const float zg = 1.0f / (1.0f + __expf(-(iz + hz)));
      const float n = tanhf(in + rg * hn);
      S_out[out * G + j] = (1.0f - zg) * n + zg * S_sh[j];
    }
  }
}

// a[s] = silu(hproj[s, step] + w1s @ S) for one sequence (blockIdx.y), one row of w1s
// per warp (blockIdx.x selects the group of rows).
template <typename TW>
__global__ void __launch_bounds__(kBlockThreads)
head_input_kernel(HeadRolloutArgs args, int64_t step, int tiles) {
  DOMINO_DYNAMIC_SHARED(float, S_sh);  // S [G]
  const int64_t s = blockIdx.y, G = args.G, r = args.r;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const Workspace ws = carve(args, tiles);
  const float* S = ws.state(args, step);
  for (int64_t c = threadIdx.x; c < G; c += blockDim.x) S_sh[c] = S[s * G + c];
  __syncthreads();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (c >= r) return;
  const TW* w1s = static_cast<const TW*>(args.w1s);
  const bool vec = G % Vec16<TW>::n == 0 && aligned16(w1s);
  const float v = args.hproj[head_row(args, s, step) * r + c] + warp_dot(w1s + c * G, S_sh, static_cast<int>(G), vec);
  if (lane == 0) ws.a[s * r + c] = v / (1.0f + __expf(-v));
}

// launch.template operator()<TL, TW>() for the call's logits and weight dtypes (bf16 or float).
template <typename Launch>
cudaError_t with_head_dtypes(const HeadRolloutArgs& args, const Launch& launch) {
  if (args.logits_bf16) {
    return args.weights_bf16 ? launch.template operator()<__nv_bfloat16, __nv_bfloat16>()
                             : launch.template operator()<__nv_bfloat16, float>();
  }
  return args.weights_bf16 ? launch.template operator()<float, __nv_bfloat16>()
                           : launch.template operator()<float, float>();
}

}  // namespace
}  // namespace domino::cuda
