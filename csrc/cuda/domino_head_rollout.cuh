// CUDA kernels of domino_head_rollout, as plain CUDA (no torch headers) behind a launcher.
#pragma once

#include "cuda/portable.cuh"
#include "sampling_params.h"

namespace domino::cuda {

struct HeadRolloutArgs {
  void* base_logits;  // [b, k, V] float or bf16 (logits_bf16); rewritten when write_logits
  bool logits_bf16;
  const float* hproj;   // [b, k, r]
  const float* state;   // [b, G]
  const void* gru_input;  // [V, 3G] table (w_ih == nullptr) or [V, H] embedding
  const void* w_ih;       // [3G, H] or nullptr
  const void* w_hh;       // [3G, G]
  const void* w1s;        // [r, G]
  const void* w2;         // [V, r]
  bool weights_bf16;      // all weights and gru_input: bf16, else float
  int64_t b, k, V, r, G, H;
  SamplingParams sampling;  // per row: temperature (0: greedy), top_k (0: off), top_p (1: off)
  const double* uniforms;  // [b, k] when sampling.may_sample()
  bool write_logits;
  int64_t* tokens;    // [b, k]
  float* logprobs;    // [b, k]
  float* state_out;   // [b, G], also the running GRU state
  float* workspace;   // head_rollout_workspace_floats(...) floats
  float* logits_rows;  // set by the launchers: where the logits kernel writes full rows, or nullptr
  // domino_head_expand only (launch_domino_head_expand; nullptr / 0 for the rollout): row s
  // of the batch (b = n) is frontier node s, whose base-logit and hproj row is
  // node_seq[s] * k + node_depth[s] (indices clamped into [0, seqs) x [0, k): a bad value
  // is never an address); its m children's tokens, log-probs and GRU states are rows
  // s * m .. s * m + m - 1 of tokens, logprobs and state_out; its logits go to node_logits.
  const int64_t* node_seq;
  const int64_t* node_depth;
  int64_t seqs, m;
  float* node_logits;  // [n, V]
};

// Workspace the launcher needs: the correction input a [b, r], per-tile partial
// reductions [b, tiles], two GRU states [2, b, G], and when some row may use top-k/top-p
// (SamplingParams::may_filter) one float row of logits per sequence [b, V].
int64_t head_rollout_workspace_floats(int64_t b, int64_t V, int64_t r, int64_t G, bool filtered_sampling);
// Limit of the kernels' shared memory; checked by the binding before launching. (The rank
// has none: the logits kernel stages a chunk of a's columns at a time.)
constexpr int64_t kHeadMaxGruFloats = 10000;       // G + H floats per GRU block

// Launches the 4k kernels of a k-step rollout on `stream`: no host synchronisation, no
// allocation, launch shapes that depend only on the shapes, so the rollout can be
// captured in a CUDA graph. Requires args.b <= 65535 (the sequences are the grids' y
// dimension).
cudaError_t launch_domino_head_rollout(const HeadRolloutArgs& args, cudaStream_t stream);

}  // namespace domino::cuda
