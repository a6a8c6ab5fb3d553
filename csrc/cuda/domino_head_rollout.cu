// CUDA kernels of domino_head_rollout: the fused Domino head step, k times.
//
// Per step i and sequence s:
//   a   = silu(hproj[s, i] + w1s @ S)                 w1s [r, G]
//   L   = base_logits[s, i] + w2 @ a                  w2  [V, r]
//   x_i = argmax(L), or a sample of softmax(filter(L / T))
//   S   = GRUCell(E[x_i], S)                          w_hh [3G, G]; table [V, 3G] or w_ih [3G, H]
//
// Four fixed-shape kernels per step, 4k launches per rollout:
//   head_input_kernel (grid (r / warps, b)): a = silu(hproj[s, i] + w1s @ S_i).
//   head_logits_kernel (grid = vocabulary tiles of blockDim rows, one row per thread):
//     streams its tile of w2 with 16-byte loads (4 in flight per thread) against a's
//     columns staged in shared memory, adds base_logits, and reduces each sequence's
//     tile (one warp per sequence, from a shared tile of the logits) to a partial (max,
//     sum exp(L - max), argmax) and, when sampling, the winner of an exponential race
//     argmax_j z_j - log(E_j), E_j ~ Exp(1) from Philox4x32-10 keyed by the 64 bits of
//     the step's uniform (the "seed tensor"), counter j. Full logits are
//     written only with write_logits (or into a scratch row for top-k/top-p, which need
//     the whole row: the choose kernel then samples it with row_sampler.cuh).
//   head_choose_kernel (grid b): merges the tile partials into the token and its
//     log-probability (log-sum-exp across tiles).
//   head_gru_kernel (grid (G / warps, b)): S_{i+1} = GRUCell(E[x_i], S_i), one warp per
//     output, so w_hh is streamed by G / warps blocks per sequence, not by one SM.
// Why not one persistent kernel: the token choice and the GRU state are grid-wide
// dependencies between these phases, so a persistent kernel needs grid barriers
// (cooperative launch), which the emulator cannot run and which pin the grid to
// co-resident blocks. Fixed-shape launches capture into one CUDA graph instead (no host
// sync, no allocation inside: the workspace comes with the call); launch gaps inside a
// graph are ~1-2 us per kernel, 4 per step.
//
// Bytes per step (the floor), paper shape (H = 4096, G = 1024, r = 256, V = 151936, bf16,
// GRU table): w2 V*r*2 = 77.8 MB, w_hh 3G*G*2 = 6.3 MB, w1s r*G*2 = 0.5 MB, per sequence a
// base-logit row V*2 = 0.3 MB and a table row 3G*2 = 6 KB: 84.9 MB per step at b = 1, a
// 25 us floor at 3.35 TB/s, 0.38 ms for k = 15. With fp32 weights and logits every term
// doubles: 170 MB per step, a 51 us floor, 0.76 ms for k = 15. The w2 tile is read once per group of 16
// sequences (16 accumulators per thread), so b = 16 moves the same w2 bytes as b = 1 and
// b = 32 re-reads each tile twice, from L1/L2 (a 256-row tile is 128 KB at r = 256).
// Limits: the logits kernel is HBM-bound at small b (594 blocks of 256 threads, 16-byte
// loads); at b = 16 its 16 x V x r FMAs (622 M at the paper shape, with one broadcast
// shared-memory read per 4 of them) cost about as much as the stream; the
// GRU kernel (128 blocks per sequence at G = 1024) and the input kernel (32 blocks) are
// small bandwidth-bound GEMVs; at ~25-30 us of w2 per step, the four launch gaps in a
// graph (~5 us) are the next cost.
#include "cuda/head_kernels.cuh"

namespace domino::cuda {
namespace {

// One block per sequence: merges the tile partials of step i into the token and its
// log-probability (or, with top-k/top-p, samples the scratch row like `sample`).
// min blocks 1 gives ptxas the registers to keep the row sampler out of local memory.
__global__ void __launch_bounds__(kBlockThreads, 1)
head_choose_kernel(HeadRolloutArgs args, int64_t step, int tiles) {
  __shared__ MergeScratch merge_sh;
  __shared__ RowScratch row_sh;
  const int64_t s = blockIdx.x, k = args.k;
  const Workspace ws = carve(args, tiles);
  const float temperature = args.sampling.temperature_at(s);
  int64_t token;
  float logprob;
  if (args.sampling.filters_at(s, args.V)) {
    const Pick pick = sample_row(ws.rows + s * args.V, args.V, temperature, args.sampling.top_k_at(s),
                                 args.sampling.top_p_at(s), args.uniforms[s * k + step], row_sh);
    token = pick.token;
    logprob = pick.logprob;
  } else {
    Lse l;
    Race q;
    merge_tile_partials(ws, s, tiles, l, q, merge_sh);
    const float lse = l.m + logf(l.s);
    if (temperature > 0.0f) {
      // no mass (every z -inf, NaN included: the race may still have ranked a -inf key):
      // token 0 with probability 1, as the reference; a +inf winner has probability
      // 1 / (number of +inf entries) = 1 / l.s
      const bool no_mass = l.m == -INFINITY || q.arg == INT_MAX;
      token = no_mass ? 0 : q.arg;
      logprob = no_mass ? 0.0f : q.z == INFINITY ? -logf(l.s) : q.z - lse;
    } else {
      token = l.arg == INT_MAX ? 0 : l.arg;  // a row of -inf: torch.argmax's 0 (log-prob NaN)
      logprob = l.arg == INT_MAX ? NAN : l.m - lse;
    }
  }
  if (threadIdx.x == 0) {
    args.tokens[s * k + step] = token;
    args.logprobs[s * k + step] = logprob;
  }
}

template <typename TL, typename TW>
cudaError_t launch_typed(const HeadRolloutArgs& args, cudaStream_t stream) {
  const int tiles = static_cast<int>((args.V + kTileRows - 1) / kTileRows);
  const unsigned b = static_cast<unsigned>(args.b);
  const unsigned warps = kBlockThreads / kWarp;
  const dim3 block(kBlockThreads);
  const dim3 input_grid(static_cast<unsigned>((args.r + warps - 1) / warps), b);
  const dim3 gru_grid(static_cast<unsigned>((args.G + warps - 1) / warps), b);
  const size_t input_smem = static_cast<size_t>(args.G) * sizeof(float);
  const size_t gru_smem = static_cast<size_t>(args.G + (args.w_ih ? args.H : 0)) * sizeof(float);
  auto logits_kernel = head_logits_kernel<TL, TW>;
  for (int64_t step = 0; step < args.k; ++step) {
    cudaError_t err = DOMINO_LAUNCH(head_input_kernel<TW>, input_grid, block, input_smem, stream, args, step, tiles);
    if (err == cudaSuccess)
      err = DOMINO_LAUNCH(logits_kernel, dim3(static_cast<unsigned>(tiles)), block, 0, stream, args, step, tiles);
    if (err == cudaSuccess)
      err = DOMINO_LAUNCH(head_choose_kernel, dim3(b), block, 0, stream, args, step, tiles);
    if (err == cudaSuccess)
      err = DOMINO_LAUNCH(head_gru_kernel<TW>, gru_grid, block, gru_smem, stream, args, step, tiles);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

int64_t head_rollout_workspace_floats(int64_t b, int64_t V, int64_t r, int64_t G, bool filtered_sampling) {
  const int64_t tiles = (V + kTileRows - 1) / kTileRows;
  return b * r + b * tiles * static_cast<int64_t>(sizeof(TilePartial) / sizeof(float)) + 2 * b * G +
         (filtered_sampling ? b * V : 0);
}

cudaError_t launch_domino_head_rollout(const HeadRolloutArgs& rollout, cudaStream_t stream) {
  HeadRolloutArgs args = rollout;
  args.logits_rows = head_rollout_rows(args, (args.V + kTileRows - 1) / kTileRows);
  return with_head_dtypes(args, [&]<typename TL, typename TW>() { return launch_typed<TL, TW>(args, stream); });
}

}  // namespace domino::cuda
