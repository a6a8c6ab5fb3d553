// The argument checks every op shares between its CPU and CUDA kernels.
//
// The Python wrappers in python/domino_ops/ validate arguments with friendly exceptions
// before calling the ops; the checks here keep a direct torch.ops caller from reading or
// writing out of bounds (they raise RuntimeError naming the argument).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <utility>

#include "sampling_params.h"

namespace domino {

// A call's sampling arguments as the schemas pass them: scalars, and optional [b] tensors
// (float32 temperature, int64 top_k, float32 top_p) that override them row by row.
struct SamplingArgs {
  double temperature;
  int64_t top_k;
  double top_p;
  const std::optional<at::Tensor>& row_temperature;
  const std::optional<at::Tensor>& row_top_k;
  const std::optional<at::Tensor>& row_top_p;

  // The kernels' view (sampling_params.h): pointers into the tensors.
  SamplingParams params() const;
};

// A double argument the kernels use as a float32 (a temperature, an eps, a scale) must be
// finite there: past float32's largest value it would be inf (every token tied, every
// norm 0). Compared in double, as the Python wrappers compare (NaN fails; no out-of-range
// float conversion).
inline bool finite_in_float32(double v) { return std::fabs(v) <= std::numeric_limits<float>::max(); }

// A tensor argument by name, or nullptr for an optional one not given (opt()).
using Named = std::pair<const char*, const at::Tensor*>;
const at::Tensor* opt(const std::optional<at::Tensor>& t);

// An output that shares memory with an input or another output would make the result
// depend on the order the kernel reads and writes in: refuse it, naming both (nullptr
// entries, optional tensors not given, are skipped).
void check_no_overlap(std::initializer_list<Named> outputs, std::initializer_list<Named> inputs);

// `out` written while `in` is read: refused, naming both, where they share memory, or
// with `in_place_ok` where they share it other than as the very same elements (an
// elementwise op may write in place). Where PyTorch cannot tell (a strided layout, e.g.
// an expanded cos table) it is taken, as at::assert_no_overlap takes it.
void check_apart(const at::Tensor& out, const char* out_name, const at::Tensor& in, const char* in_name,
                 bool in_place_ok = false);

// Uniforms a sampler consumes must be in [0, 1) (NaN rejected), or in [0, 1] where
// `closed` (sgl-kernel's target-only sampler, whose coin 1 still draws a token of positive
// weight): read on CPU tensors only (device values would cost a sync); an out-of-range
// coin would pick a token of weight 0.
void check_unit_interval(const at::Tensor& t, const char* name, bool closed = false);

void check_head_rollout_args(const at::Tensor& base_logits, const at::Tensor& hproj,
                             const at::Tensor& state, const at::Tensor& gru_input,
                             const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                             const at::Tensor& w1s, const at::Tensor& w2,
                             const SamplingArgs& sampling,
                             const std::optional<at::Tensor>& uniforms,
                             const at::Tensor& tokens, const at::Tensor& logprobs,
                             const at::Tensor& state_out);
void check_head_expand_args(const at::Tensor& base_logits, const at::Tensor& hproj,
                            const at::Tensor& node_state, const at::Tensor& node_seq,
                            const at::Tensor& node_depth, const at::Tensor& gru_input,
                            const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                            const at::Tensor& w1s, const at::Tensor& w2, const SamplingArgs& sampling,
                            const std::optional<at::Tensor>& uniforms, const at::Tensor& child_tokens,
                            const at::Tensor& child_logprobs, const at::Tensor& child_state,
                            const std::optional<at::Tensor>& node_logits);
void check_sample_args(const at::Tensor& logits, const SamplingArgs& sampling,
                       const std::optional<at::Tensor>& uniforms, const at::Tensor& tokens);
void check_filtered_probs_args(const at::Tensor& logits, const SamplingArgs& sampling, const at::Tensor& probs);
void check_verify_greedy_args(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                              const at::Tensor& out_tokens, const at::Tensor& num_accepted);
void check_verify_sampling_args(const at::Tensor& draft_tokens, const at::Tensor& draft_probs,
                                const at::Tensor& target_probs,
                                const at::Tensor& uniforms_accept,
                                const at::Tensor& uniforms_resample,
                                const at::Tensor& out_tokens, const at::Tensor& num_accepted);

// Each op's CPU kernel, <op>_cpu, is defined in csrc/cpu/<op>.cpp and registered there
// for the CPU dispatch key.
}  // namespace domino
