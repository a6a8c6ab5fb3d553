// CUDA kernels of domino_head_expand: one step of Domino tree drafting for a frontier of n
// nodes, each with its own GRU state S (the CPU kernel csrc/cpu/domino_head_expand.cpp
// states the semantics). The rollout's kernels (head_kernels.cuh) do the arithmetic, with
// batch row s = frontier node s reading base-logit and hproj row (node_seq[s], node_depth[s]):
//   head_input_kernel  (grid (r / warps, n)): a = silu(hproj[seq, depth] + w1s @ S)
//   head_logits_kernel (grid = vocabulary tiles): L = base[seq, depth] + w2 @ a, written to
//     node_logits, with the rollout's per-tile log-sum-exp partials of L (for the greedy
//     nodes; a sampled node draws from its row); each w2 tile is loaded
//     once per group of 16 nodes, so a frontier of up to 16 nodes streams w2 once from HBM
//     (and re-reads each tile from L1/L2 per further group), never once per node
//   expand_chunk_best_kernel (grid (chunks, n), when some node may be greedy): each block
//     the greedy-order best min(m, 8) of one kChooseChunk-long slice of a greedy node's
//     logits row (a sampled node's blocks return at once), so the whole GPU scans the
//     rows, not one block per node
//   expand_choose_kernel (grid n, below): the node's m children
//   head_gru_kernel    (grid (G / warps, n)): S_child = GRUCell(E[child], S), one block
//     row per node: gh = w_hh @ S once per node, then gi and the new state per child.
// The same kernels and arithmetic as the rollout, so a chain of one-child greedy steps
// gives exactly the CUDA rollout's tokens, log-probabilities and states.
//
// Per-sequence parameters ([b] row tensors): node f reads its sequence node_seq[f]'s
// temperature, top-k and top-p (the index clamped into [0, b)); a node of a sequence at
// temperature 0 takes the T = 0 children below, exactly as a greedy call gives them (its
// uniforms unread), the others the T > 0 ones.
//
// Children, T = 0: the node's best m tokens of its logits row in the greedy order (NaN
// first, then descending, ties by index): the first 8 merged from the slices' candidates
// (each of the row's best 8 is among its own slice's best 8), any further one by one more
// block-wide argmax pass over the row each; each log-probability
// L[x] - (max + log(sum)) from the merged tile partials (for the first child exactly the
// rollout's). T > 0: the filtered weights of the row (row_sampler.cuh, as `sample`) into a
// float64 workspace row, then m inverse-CDF draws each followed by zeroing the drawn token;
// once no mass is left, the best remaining tokens by L with log-probability -inf. The
// totals are block reductions (per-thread chunks, then across the block), not the CPU's
// index-order sums: a draw changes only if its uniform lands within ~1e-16 of a CDF step.
//
// Bytes per step (the floor): w2 (V*r), w1s (r*G), w_hh (3G*G) and w_ih (3G*H) or n*m
// table rows, plus n base-logit rows read and n logits rows of V floats written and read
// back: a greedy node's by the slice kernel (one pass for m <= 8, L2-resident at small n), a
// sampled node's by its choose block, with a float64 weight row written and scanned once per
// draw (as in the scalar T > 0 call). At the paper shape in
// bf16 a frontier of 16 nodes moves w2 (77.8 MB) once: ~25 us at 3.35 TB/s, as in a batch-16
// rollout step; its 622 M FMAs (and a shared-memory read per 4) cost about as much. A node index out of
// range is clamped (head_row, node_sequence), never an address.
#include "cuda/domino_head_expand.cuh"
#include "cuda/head_kernels.cuh"

namespace domino::cuda {
namespace {

// Children per greedy node found in one pass over its logits row (more take one further
// pass each, best_remaining).
constexpr int kOnePassChildren = 8;
// Row loads each thread has in flight per iteration of that pass.
constexpr int kLoadsInFlight = 4;

// Logits per slice of a row in the T = 0 child search (expand_chunk_best_kernel): at the
// paper's V = 151936, 38 blocks per node, each thread 16 loads. Under the emulator a slice
// is one load per thread, so the tests' small rows span several slices.
#if defined(DOMINO_SIMT) && !defined(DOMINO_SIMT_GPU_SHAPES)
constexpr int64_t kChooseChunk = kBlockThreads;
#else
constexpr int64_t kChooseChunk = 4096;
#endif

// best[0, count) = the first `count` (<= kOnePassChildren) of the entries load(0..len) in
// the greedy order, {-inf, INT64_MAX} past the last entry, in one pass: each thread keeps
// its strided slice's best kOnePassChildren, sorted, in registers (indexed only by
// unrolled constants: a select by a run-time index, even written as a chain of selects,
// made nvcc put the array in local memory), with kLoadsInFlight loads issued before they
// are used: the first way, `count` block-wide argmax passes of one dependent load per
// thread per iteration, was bound by memory latency with one block per node (~225 us per
// pass at V = 151936 on an H100, 2026-11-23). Then `count` block-wide argmax rounds over
// the threads' next unused candidates (the head of its list, shifted out when taken).
// Exact: each of the best `count` is among its own thread's best kOnePassChildren.
// load(j) gives entry j's {value, token}; tokens are distinct. Written by thread 0; ends
// with a barrier.
template <typename Load>
__device__ void best_of_one_pass(Load load, int64_t len, int count, ArgMax* best, RowScratch& sh) {
  const ArgMax none{-INFINITY, INT64_MAX};  // after every real entry, a -inf one included
  ArgMax top[kOnePassChildren];
#pragma unroll
  for (int i = 0; i < kOnePassChildren; ++i) top[i] = none;
  ArgMax floor = none;  // top[kOnePassChildren - 1]: what a new entry must beat
  const int64_t stride = blockDim.x;
  for (int64_t j0 = threadIdx.x; j0 < len; j0 += kLoadsInFlight * stride) {
    ArgMax v[kLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) v[u] = j0 + u * stride < len ? load(j0 + u * stride) : none;
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      ArgMax x = v[u];
      if (greedy_before(x, floor)) {
#pragma unroll
        for (int i = 0; i < kOnePassChildren; ++i) {  // insert in order; the last drops out
          const bool move = greedy_before(x, top[i]);
          const ArgMax t = top[i];
          top[i] = move ? x : t;
          x = move ? t : x;
        }
        floor = top[kOnePassChildren - 1];
      }
    }
  }
  for (int c = 0; c < count; ++c) {
    const ArgMax b = block_argmax(top[0], sh.argmax);
    if (top[0].idx == b.idx && b.idx != INT64_MAX) {  // tokens are distinct: one thread
#pragma unroll
      for (int i = 0; i + 1 < kOnePassChildren; ++i) top[i] = top[i + 1];
      top[kOnePassChildren - 1] = none;
    }
    if (threadIdx.x == 0) best[c] = b;
  }
  __syncthreads();
}

// The T = 0 candidates of every slice of every node's row: [n, chunks, min(m, 8)].
struct ChunkCandidates {
  ArgMax* best;
  int64_t chunks;
  int per;  // candidates per slice: min(m, kOnePassChildren)
};

__host__ __device__ inline int64_t choose_chunks(int64_t V) { return (V + kChooseChunk - 1) / kChooseChunk; }

// Node f's sequence, whose sampling parameters it reads, clamped into range (as head_row).
__device__ __forceinline__ int64_t node_sequence(const HeadRolloutArgs& args, int64_t f) {
  const int64_t s = args.node_seq[f];
  return s < 0 ? 0 : s >= args.seqs ? args.seqs - 1 : s;
}

// Whether node f takes the greedy children: every node of a call without sampling, and in
// one with per-sequence parameters the nodes of sequences at temperature 0 (exactly what a
// greedy call gives them, so the same slice candidates and tile partials).
__device__ __forceinline__ bool greedy_node(const HeadRolloutArgs& args, int64_t f) {
  return !args.sampling.may_sample() || args.sampling.temperature_at(node_sequence(args, f)) == 0.0f;
}

// Where the workspace's slice candidates start, in floats: past the rollout's workspace,
// rounded up to 16 bytes (ArgMax holds an int64). The T > 0 weights follow them.
inline int64_t candidates_offset(int64_t n, int64_t V, int64_t r, int64_t G) {
  return (head_rollout_workspace_floats(n, V, r, G, false) + 3) / 4 * 4;
}

// Block (chunk, node): the greedy-order best `per` of the node's logits in its slice.
// Mixed: a call with per-sequence temperatures, whose sampled nodes' blocks return at once
// (a separate instance: the check cost the greedy call's kernel 9 registers on sm_90).
template <bool Mixed>
__global__ void __launch_bounds__(kBlockThreads)
expand_chunk_best_kernel(HeadRolloutArgs args, ChunkCandidates cand) {
  __shared__ RowScratch row_sh;
  const int64_t f = blockIdx.y, chunk = blockIdx.x, V = args.V;
  if (Mixed && !greedy_node(args, f)) return;  // draws from its whole row (block-uniform: no barrier yet)
  const int64_t begin = chunk * kChooseChunk, len = min(V - begin, kChooseChunk);
  const float* L = args.node_logits + f * V + begin;
  best_of_one_pass([&](int64_t j) { return ArgMax{L[j], begin + j}; }, len, cand.per,
                   cand.best + (f * cand.chunks + chunk) * cand.per, row_sh);
}

// Block-wide argmax of row[0:V] in the greedy order, skipping the `count` tokens in taken.
__device__ int64_t best_remaining(const float* row, int64_t V, const int64_t* taken, int64_t count,
                                  RowScratch& sh) {
  ArgMax best{-INFINITY, INT64_MAX};
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    bool skip = false;
    for (int64_t c = 0; c < count; ++c) skip = skip || taken[c] == j;
    if (!skip) best = argmax_merge(best, {row[j], j});
  }
  return block_argmax(best, sh.argmax).idx;
}

// One block per node: its m children and their log-probabilities.
__global__ void __launch_bounds__(kBlockThreads, 1)
expand_choose_kernel(HeadRolloutArgs args, int tiles, double* weights, ChunkCandidates cand) {
  __shared__ MergeScratch merge_sh;
  __shared__ RowScratch row_sh;
  const int64_t f = blockIdx.x, V = args.V, m = args.m;
  const Workspace ws = carve(args, tiles);
  const float* L = args.node_logits + f * V;
  int64_t* tokens = args.tokens + f * m;
  float* logprobs = args.logprobs + f * m;
  int64_t c = 0;
  if (!greedy_node(args, f)) {
    const int64_t s = node_sequence(args, f);  // the node draws with its sequence's parameters
    double* w = weights + f * V;
    int64_t begin, end;
    thread_chunk(V, begin, end);
    const double total = filtered_row(
        L, V, args.sampling.temperature_at(s), args.sampling.top_k_at(s), args.sampling.top_p_at(s), row_sh,
        [&] {
          for (int64_t j = threadIdx.x; j < V; j += blockDim.x) w[j] = 0.0;
          return 0.0;
        },
        [&](const auto& weight, long long rank) {
          double part = 0.0;
          for (int64_t j = begin; j < end; ++j) part += (w[j] = weight(j, rank));
          return block_sum(part, row_sh.dsum);
        });
    __syncthreads();  // every weight written before any thread scans
    auto left = [&](int64_t j, long long&) -> double { return w[j]; };
    for (; c < m; ++c) {
      const Pick pick = inverse_cdf_pick(left, V, args.uniforms[f * m + c], 0, row_sh);
      if (pick.token < 0) break;  // no mass left
      if (threadIdx.x == 0) {
        tokens[c] = pick.token;
        logprobs[c] = static_cast<float>(log(w[pick.token]) - log(total));
        w[pick.token] = 0.0;
      }
      __syncthreads();
    }
    for (; c < m; ++c) {  // the best remaining tokens by L
      const int64_t x = best_remaining(L, V, tokens, c, row_sh);
      if (threadIdx.x == 0) {
        tokens[c] = x;
        logprobs[c] = -INFINITY;
      }
      __syncthreads();
    }
    return;
  }
  Lse l;
  Race q;
  merge_tile_partials(ws, f, tiles, l, q, merge_sh);
  const float lse = l.m + logf(l.s);
  c = cand.per;  // the best of the slices' candidates, in one pass
  __shared__ ArgMax first[kOnePassChildren];
  const ArgMax* mine = cand.best + f * cand.chunks * cand.per;
  best_of_one_pass([&](int64_t j) { return mine[j]; }, cand.chunks * cand.per, static_cast<int>(c), first, row_sh);
  if (threadIdx.x == 0)
    for (int64_t i = 0; i < c; ++i) tokens[i] = first[i].idx;
  __syncthreads();
  for (; c < m; ++c) {  // beyond kOnePassChildren: one pass per child
    const int64_t x = best_remaining(L, V, tokens, c, row_sh);
    if (threadIdx.x == 0) tokens[c] = x;
    __syncthreads();
  }
  if (threadIdx.x == 0)
    for (int64_t i = 0; i < m; ++i)  // a row of -inf: NaN, as log_softmax
      logprobs[i] = l.arg == INT_MAX ? NAN : L[tokens[i]] - lse;
}

template <typename TL, typename TW>
cudaError_t launch_expand_typed(const HeadRolloutArgs& args, cudaStream_t stream) {
  const int tiles = static_cast<int>((args.V + kTileRows - 1) / kTileRows);
  const unsigned n = static_cast<unsigned>(args.b), warps = kBlockThreads / kWarp;
  const dim3 block(kBlockThreads);
  const size_t input_smem = static_cast<size_t>(args.G) * sizeof(float);
  const size_t gru_smem = static_cast<size_t>(args.G + (args.w_ih ? args.H : 0)) * sizeof(float);
  // the workspace past the rollout's: the T = 0 slice candidates, then the T > 0 weights
  const int per = static_cast<int>(args.m < kOnePassChildren ? args.m : kOnePassChildren);
  const ChunkCandidates cand{reinterpret_cast<ArgMax*>(args.workspace + candidates_offset(args.b, args.V, args.r,
                                                                                          args.G)),
                             choose_chunks(args.V), per};
  double* weights = reinterpret_cast<double*>(args.workspace + head_expand_workspace_floats(args.b, args.V, args.r,
                                                                                           args.G, false));
  auto logits_kernel = head_logits_kernel<TL, TW>;
  cudaError_t err = DOMINO_LAUNCH(head_input_kernel<TW>, dim3(static_cast<unsigned>((args.r + warps - 1) / warps), n),
                                  block, input_smem, stream, args, int64_t{0}, tiles);
  if (err == cudaSuccess)
    err = DOMINO_LAUNCH(logits_kernel, dim3(static_cast<unsigned>(tiles)), block, 0, stream, args, int64_t{0},
                        tiles);
  // the slice candidates whenever some node may be greedy: a greedy call, or per-sequence
  // temperatures (may_sample() then: the mixed instance)
  auto chunk_kernel = args.sampling.may_sample() ? expand_chunk_best_kernel<true> : expand_chunk_best_kernel<false>;
  if (err == cudaSuccess && (!args.sampling.may_sample() || args.sampling.row_temperature != nullptr))
    err = DOMINO_LAUNCH(chunk_kernel, dim3(static_cast<unsigned>(cand.chunks), n), block, 0, stream, args,
                        cand);
  if (err == cudaSuccess)
    err = DOMINO_LAUNCH(expand_choose_kernel, dim3(n), block, 0, stream, args, tiles, weights, cand);
  if (err == cudaSuccess)
    err = DOMINO_LAUNCH(head_gru_kernel<TW>, dim3(static_cast<unsigned>((args.G + warps - 1) / warps), n), block,
                        gru_smem, stream, args, int64_t{0}, tiles);
  return err;
}

}  // namespace

int64_t head_expand_workspace_floats(int64_t n, int64_t V, int64_t r, int64_t G, bool may_sample) {
  const int64_t floats = candidates_offset(n, V, r, G) +
                         n * choose_chunks(V) * kOnePassChildren * static_cast<int64_t>(sizeof(ArgMax) / sizeof(float));
  return floats + (may_sample ? 2 * n * V : 0);
}

cudaError_t launch_domino_head_expand(const HeadRolloutArgs& expand, cudaStream_t stream) {
  HeadRolloutArgs args = expand;
  args.logits_rows = args.node_logits;
  return with_head_dtypes(args, [&]<typename TL, typename TW>() { return launch_expand_typed<TL, TW>(args, stream); });
}

}  // namespace domino::cuda
