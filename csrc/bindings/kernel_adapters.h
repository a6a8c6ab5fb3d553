// Tensors -> the plain launchers in csrc/cuda/, written once as the dispatcher kernels of
// the ops (the six Domino ops and the four tree ops) over a
// `Device` policy, and registered for both builds of those launchers:
// the real CUDA ops (bindings/cuda_impls.cpp: a CUDAGuard and torch's current stream) and
// their emulated twins (simt/emulated_module.cpp, test infrastructure: no guard, no
// stream), so the emulator tests exercise this marshalling too. A policy provides
//   Guard     constructed from the output's device for the duration of the call
//   stream()  the stream to launch on.
// ATen comes first: in the emulator build the kernel headers bring in simt.h's macros.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "ops.h"
#include "tree_ops.h"
#include "cuda/build_tree_kernel_efficient.cuh"
#include "cuda/domino_head_expand.cuh"
#include "cuda/domino_head_rollout.cuh"
#include "cuda/filtered_probs.cuh"
#include "cuda/sample.cuh"
#include "cuda/tree_speculative_sampling_target_only.cuh"
#include "cuda/verify_tree_greedy.cuh"
#include "cuda/verify_greedy.cuh"
#include "cuda/verify_sampling.cuh"
#include "cuda/verify_tree_sampling.cuh"

namespace domino::cuda {

inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " kernel launch failed: ", cudaGetErrorString(err));
}

inline void check_grid_rows(int64_t b, const char* what) {
  TORCH_CHECK(b <= std::numeric_limits<int>::max(), what, ": batch ", b, " exceeds the grid limit");
}

// The head kernels (rollout and expand) put their rows (sequences, frontier nodes) on the
// grid's y axis, which CUDA caps at 65535 blocks.
inline void check_grid_y_rows(int64_t rows, const char* what, const char* arg) {
  TORCH_CHECK_VALUE(rows <= 65535, what, ": ", arg, " has ", rows,
                    " rows; the CUDA kernel takes at most 65535 per call (its grid's y dimension): split the call");
}

template <class Device>
void filtered_probs(const at::Tensor& logits, double temperature, int64_t top_k, double top_p, at::Tensor probs,
                    const std::optional<at::Tensor>& row_temperature, const std::optional<at::Tensor>& row_top_k,
                    const std::optional<at::Tensor>& row_top_p) {
  const typename Device::Guard guard(logits.device());
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_filtered_probs_args(logits, sampling, probs);
  check_grid_rows(logits.size(0), "filtered_probs");
  check_launch(launch_filtered_probs(logits.data_ptr(), logits.scalar_type() == at::kBFloat16, logits.size(0),
                                     logits.size(1), sampling.params(), probs.data_ptr<float>(), Device::stream()),
               "filtered_probs");
}

template <class Device>
void verify_greedy(const at::Tensor& draft_tokens, const at::Tensor& target_logits, at::Tensor out_tokens,
                   at::Tensor num_accepted) {
  const typename Device::Guard guard(target_logits.device());
  check_verify_greedy_args(draft_tokens, target_logits, out_tokens, num_accepted);
  check_grid_rows(draft_tokens.size(0), "verify_greedy");
  check_launch(launch_verify_greedy(draft_tokens.data_ptr<int64_t>(), target_logits.data_ptr(),
                                    target_logits.scalar_type() == at::kBFloat16, draft_tokens.size(0),
                                    draft_tokens.size(1), target_logits.size(2),
                                    out_tokens.data_ptr<int64_t>(), num_accepted.data_ptr<int64_t>(),
                                    Device::stream()),
               "verify_greedy");
}

template <class Device>
void sample(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
            const std::optional<at::Tensor>& uniforms, at::Tensor tokens,
            const std::optional<at::Tensor>& row_temperature, const std::optional<at::Tensor>& row_top_k,
            const std::optional<at::Tensor>& row_top_p) {
  const typename Device::Guard guard(logits.device());
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_sample_args(logits, sampling, uniforms, tokens);
  check_grid_rows(logits.size(0), "sample");
  const SamplingParams sp = sampling.params();
  const double* u = sp.may_sample() ? uniforms->data_ptr<double>() : nullptr;
  check_launch(launch_sample(logits.data_ptr(), logits.scalar_type() == at::kBFloat16, logits.size(0),
                             logits.size(1), sp, u, tokens.data_ptr<int64_t>(), Device::stream()),
               "sample");
}

template <class Device>
void verify_sampling(const at::Tensor& draft_tokens, const at::Tensor& draft_probs,
                     const at::Tensor& target_probs, const at::Tensor& uniforms_accept,
                     const at::Tensor& uniforms_resample, at::Tensor out_tokens, at::Tensor num_accepted) {
  const typename Device::Guard guard(target_probs.device());
  check_verify_sampling_args(draft_tokens, draft_probs, target_probs, uniforms_accept,
                             uniforms_resample, out_tokens, num_accepted);
  check_grid_rows(draft_tokens.size(0), "verify_sampling");
  check_launch(launch_verify_sampling(draft_tokens.data_ptr<int64_t>(), draft_probs.data_ptr<float>(),
                                      target_probs.data_ptr<float>(), uniforms_accept.data_ptr<double>(),
                                      uniforms_resample.data_ptr<double>(), draft_tokens.size(0),
                                      draft_tokens.size(1), target_probs.size(2),
                                      out_tokens.data_ptr<int64_t>(), num_accepted.data_ptr<int64_t>(),
                                      Device::stream()),
               "verify_sampling");
}

// The head's weights and shape limits, shared by the rollout and the expand step.
inline void fill_head_weights(HeadRolloutArgs& args, const at::Tensor& hproj_f, const at::Tensor& gru_input,
                              const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh, const at::Tensor& w1s,
                              const at::Tensor& w2, int64_t V, const char* op) {
  const int64_t r = w1s.size(0), G = w1s.size(1), H = w_ih ? w_ih->size(1) : 0;
  TORCH_CHECK(V < std::numeric_limits<int>::max(), op, ": vocabulary ", V, " does not fit the kernel's int32 token ids");
  TORCH_CHECK(G + H <= kHeadMaxGruFloats, op, ": GRU width G = ", G, " and embedding width H = ", H,
              " exceed the kernel's shared-memory limit (G + H <= ", kHeadMaxGruFloats, ")");
  args.hproj = hproj_f.data_ptr<float>();
  args.gru_input = gru_input.data_ptr();
  args.w_ih = w_ih ? w_ih->data_ptr() : nullptr;
  args.w_hh = w_hh.data_ptr();
  args.w1s = w1s.data_ptr();
  args.w2 = w2.data_ptr();
  args.weights_bf16 = w2.scalar_type() == at::kBFloat16;
  args.V = V;
  args.r = r;
  args.G = G;
  args.H = H;
}

// A head launch (rollout or expand step) over b rows: its arguments and the tensors they
// point into (float32 hproj, the workspace of workspace_floats(r, G) floats).
struct HeadCall {
  HeadRolloutArgs args{};
  at::Tensor hproj_f, workspace;
};

template <class WorkspaceFloats>
HeadCall head_call(const at::Tensor& base_logits, const at::Tensor& hproj, const at::Tensor& state,
                   const at::Tensor& gru_input, const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                   const at::Tensor& w1s, const at::Tensor& w2, int64_t b, const SamplingParams& sp,
                   const std::optional<at::Tensor>& uniforms, const at::Tensor& tokens, const at::Tensor& logprobs,
                   const at::Tensor& state_out, const WorkspaceFloats& workspace_floats, const char* op) {
  HeadCall call;
  HeadRolloutArgs& args = call.args;
  call.hproj_f = hproj.to(at::kFloat).contiguous();
  fill_head_weights(args, call.hproj_f, gru_input, w_ih, w_hh, w1s, w2, base_logits.size(2), op);
  call.workspace = at::empty({workspace_floats(args.r, args.G)}, state.options().dtype(at::kFloat));
  args.base_logits = base_logits.data_ptr();
  args.logits_bf16 = base_logits.scalar_type() == at::kBFloat16;
  args.state = state.data_ptr<float>();
  args.b = b;
  args.k = base_logits.size(1);
  args.sampling = sp;
  args.uniforms = sp.may_sample() ? uniforms->data_ptr<double>() : nullptr;
  args.tokens = tokens.data_ptr<int64_t>();
  args.logprobs = logprobs.data_ptr<float>();
  args.state_out = state_out.data_ptr<float>();
  args.workspace = call.workspace.data_ptr<float>();
  return call;
}

// Workspace comes from torch's caching allocator (no cudaMalloc once warm, and legal
// inside torch.cuda.graph capture, where it is served from the graph's private pool).
template <class Device>
void domino_head_rollout(at::Tensor base_logits, const at::Tensor& hproj, const at::Tensor& state,
                         const at::Tensor& gru_input, const std::optional<at::Tensor>& w_ih,
                         const at::Tensor& w_hh, const at::Tensor& w1s, const at::Tensor& w2,
                         double temperature, int64_t top_k, double top_p,
                         const std::optional<at::Tensor>& uniforms, bool write_logits,
                         at::Tensor tokens, at::Tensor logprobs, at::Tensor state_out,
                         const std::optional<at::Tensor>& row_temperature,
                         const std::optional<at::Tensor>& row_top_k, const std::optional<at::Tensor>& row_top_p) {
  const typename Device::Guard guard(base_logits.device());
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_head_rollout_args(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, sampling, uniforms,
                          tokens, logprobs, state_out);
  const SamplingParams sp = sampling.params();
  const int64_t b = base_logits.size(0), V = base_logits.size(2);
  check_grid_y_rows(b, "domino_head_rollout", "base_logits");
  HeadCall call = head_call(
      base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, b, sp, uniforms, tokens, logprobs, state_out,
      [&](int64_t r, int64_t G) { return head_rollout_workspace_floats(b, V, r, G, sp.may_filter()); },
      "domino_head_rollout");
  call.args.write_logits = write_logits;
  check_launch(launch_domino_head_rollout(call.args, Device::stream()), "domino_head_rollout");
}

template <class Device>
void domino_head_expand(const at::Tensor& base_logits, const at::Tensor& hproj, const at::Tensor& node_state,
                        const at::Tensor& node_seq, const at::Tensor& node_depth, const at::Tensor& gru_input,
                        const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh, const at::Tensor& w1s,
                        const at::Tensor& w2, double temperature, int64_t top_k, double top_p,
                        const std::optional<at::Tensor>& uniforms, at::Tensor child_tokens, at::Tensor child_logprobs,
                        at::Tensor child_state, const std::optional<at::Tensor>& node_logits,
                        const std::optional<at::Tensor>& w2_packed,
                        const std::optional<at::Tensor>& w_hh_packed,
                        const std::optional<at::Tensor>& row_temperature,
                        const std::optional<at::Tensor>& row_top_k, const std::optional<at::Tensor>& row_top_p) {
  TORCH_CHECK(!w2_packed.has_value(), "w2_packed is a CPU layout (the CUDA kernel reads w2 as it is): pass None");
  TORCH_CHECK(!w_hh_packed.has_value(), "w_hh_packed is a CPU layout (the CUDA kernel reads w_hh as it is): pass None");
  const typename Device::Guard guard(base_logits.device());
  const SamplingArgs sampling{temperature, top_k, top_p, row_temperature, row_top_k, row_top_p};
  check_head_expand_args(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
                         sampling, uniforms, child_tokens, child_logprobs, child_state, node_logits);
  const int64_t n = node_state.size(0), m = child_tokens.size(1), V = base_logits.size(2);
  check_grid_y_rows(n, "domino_head_expand", "node_state");
  if (n == 0) return;
  const SamplingParams sp = sampling.params();
  HeadCall call = head_call(
      base_logits, hproj, node_state, gru_input, w_ih, w_hh, w1s, w2, n, sp, uniforms, child_tokens, child_logprobs,
      child_state, [&](int64_t r, int64_t G) { return head_expand_workspace_floats(n, V, r, G, sp.may_sample()); },
      "domino_head_expand");
  HeadRolloutArgs& args = call.args;
  args.node_seq = node_seq.data_ptr<int64_t>();
  args.node_depth = node_depth.data_ptr<int64_t>();
  args.seqs = base_logits.size(0);
  args.m = m;
  // Without node_logits (a caller that does not read them, as a greedy tree): the kernels
  // still write the rows and read them back to choose the children, so they go to a scratch
  // tensor from the caching allocator (legal inside graph capture).
  const at::Tensor rows = node_logits.has_value() ? *node_logits : at::empty({n, V}, child_logprobs.options());
  args.node_logits = rows.data_ptr<float>();
  check_launch(launch_domino_head_expand(args, Device::stream()), "domino_head_expand");
}

// The tree and outputs of a tree verification kernel's arguments.
inline TreeVerifyArgs tree_verify_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                                       const at::Tensor& accept_token_num, const at::Tensor& candidates,
                                       const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
                                       const at::Tensor& retrive_next_sibling) {
  TreeVerifyArgs t{};
  t.predicts = predicts.data_ptr<int32_t>();
  t.accept_index = accept_index.data_ptr<int32_t>();
  t.accept_token_num = accept_token_num.data_ptr<int32_t>();
  t.candidates = candidates.data_ptr<int64_t>();
  t.retrive_index = retrive_index.data_ptr<int64_t>();
  t.retrive_next_token = retrive_next_token.data_ptr<int64_t>();
  t.retrive_next_sibling = retrive_next_sibling.data_ptr<int64_t>();
  t.bs = candidates.size(0);
  t.n = candidates.size(1);
  t.steps = accept_index.size(1);
  t.slot_limit = predicts.numel();
  return t;
}

// A tree sampler's arguments (U: the coins' dtype), the vocabulary checked against the
// kernels' int32 token ids.
template <typename U>
TreeSamplerArgs<U> tree_sampler_args(const at::Tensor& predicts, const at::Tensor& accept_index,
                                     const at::Tensor& accept_token_num, const at::Tensor& candidates,
                                     const at::Tensor& retrive_index, const at::Tensor& retrive_next_token,
                                     const at::Tensor& retrive_next_sibling, const at::Tensor& uniform_samples,
                                     const at::Tensor& final_uniforms, const at::Tensor& target_probs,
                                     const std::optional<at::Tensor>& draft_probs, const char* op) {
  TreeSamplerArgs<U> a{};
  static_cast<TreeVerifyArgs&>(a) = tree_verify_args(predicts, accept_index, accept_token_num, candidates,
                                                     retrive_index, retrive_next_token, retrive_next_sibling);
  a.uniform_samples = uniform_samples.data_ptr<U>();
  a.final_uniforms = final_uniforms.data_ptr<U>();
  a.target_probs = target_probs.data_ptr<float>();
  a.draft_probs = draft_probs.has_value() ? draft_probs->data_ptr<float>() : nullptr;
  a.V = target_probs.size(2);
  TORCH_CHECK(a.V < std::numeric_limits<int>::max(), op, ": vocabulary ", a.V,
              " does not fit the kernel's int32 token ids");
  return a;
}

// The tree ops: the shape/dtype/aliasing checks of tree_checks.cpp; index values are not
// read here (that would need a device sync): the kernels never use a bad one as an address
// (csrc/cuda/tree_common.cuh).
inline void check_tree_nodes(int64_t n, int64_t limit, const char* op) {
  TORCH_CHECK(n <= limit, op, ": ", n, " nodes per request exceed the CUDA kernel's shared-memory limit of ", limit);
}

template <class Device>
void build_tree_kernel_efficient(const at::Tensor& parent_list, const at::Tensor& selected_index,
                                 const at::Tensor& verified_seq_len, at::Tensor tree_mask, at::Tensor positions,
                                 at::Tensor retrive_index, at::Tensor retrive_next_token,
                                 at::Tensor retrive_next_sibling, int64_t topk, int64_t depth, int64_t draft_token_num,
                                 int64_t tree_mask_mode) {
  const typename Device::Guard guard(selected_index.device());
  check_build_tree_args(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                        retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num, tree_mask_mode);
  const int64_t bs = selected_index.size(0);
  check_grid_rows(bs, "build_tree_kernel_efficient");
  check_tree_nodes(draft_token_num, kBuildTreeMaxNodes, "build_tree_kernel_efficient");
  if (bs == 0) return;
  BuildTreeArgs args{};
  args.parent_list = parent_list.numel() > 0 ? parent_list.data_ptr<int64_t>() : nullptr;
  args.selected_index = selected_index.data_ptr<int64_t>();
  args.verified_seq_len = verified_seq_len.data_ptr<int64_t>();
  args.tree_mask = static_cast<uint8_t*>(tree_mask.data_ptr());
  args.mask_numel = tree_mask.numel();
  args.positions = positions.data_ptr<int64_t>();
  args.retrive_index = retrive_index.data_ptr<int64_t>();
  args.retrive_next_token = retrive_next_token.data_ptr<int64_t>();
  args.retrive_next_sibling = retrive_next_sibling.data_ptr<int64_t>();
  args.bs = bs;
  args.topk = topk;
  args.parents = topk * (depth - 1) + 1;
  args.n = draft_token_num;
  args.mode = tree_mask_mode;
  check_launch(launch_build_tree_kernel_efficient(args, Device::stream()), "build_tree_kernel_efficient");
}

template <class Device>
void verify_tree_greedy(at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num,
                        const at::Tensor& candidates, const at::Tensor& retrive_index,
                        const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
                        const at::Tensor& target_predict) {
  const typename Device::Guard guard(candidates.device());
  check_verify_tree_greedy_args(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                retrive_next_token, retrive_next_sibling, target_predict);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  check_grid_rows(bs, "verify_tree_greedy");
  if (bs == 0) return;
  check_launch(launch_verify_tree_greedy(predicts.data_ptr<int32_t>(), accept_index.data_ptr<int32_t>(),
                                         accept_token_num.data_ptr<int32_t>(), candidates.data_ptr<int64_t>(),
                                         retrive_index.data_ptr<int64_t>(), retrive_next_token.data_ptr<int64_t>(),
                                         retrive_next_sibling.data_ptr<int64_t>(), target_predict.data_ptr<int64_t>(),
                                         bs, n, accept_index.size(1), std::min<int64_t>(predicts.numel(), bs * n),
                                         Device::stream()),
               "verify_tree_greedy");
}

template <class Device>
void tree_speculative_sampling_target_only(
    at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num, const at::Tensor& candidates,
    const at::Tensor& retrive_index, const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
    const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
    const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs, double threshold_single,
    double threshold_acc, bool deterministic) {
  (void)deterministic;  // always deterministic
  const typename Device::Guard guard(candidates.device());
  check_tree_sampling_args(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                           retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                           draft_probs, threshold_single, threshold_acc);
  const int64_t bs = candidates.size(0), n = candidates.size(1);
  check_grid_rows(bs, "tree_speculative_sampling_target_only");
  check_tree_nodes(n, kTreeSamplingMaxNodes, "tree_speculative_sampling_target_only");
  TreeSamplingArgs args{};
  static_cast<TreeSamplerArgs<float>&>(args) = tree_sampler_args<float>(
      predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
      uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
      "tree_speculative_sampling_target_only");
  if (bs == 0) return;
  args.threshold_single = static_cast<float>(threshold_single);
  args.threshold_acc = static_cast<float>(threshold_acc);
  check_launch(launch_tree_speculative_sampling_target_only(args, Device::stream()),
               "tree_speculative_sampling_target_only");
}

template <class Device>
void verify_tree_sampling(at::Tensor predicts, at::Tensor accept_index, at::Tensor accept_token_num,
                          const at::Tensor& candidates, const at::Tensor& retrive_index,
                          const at::Tensor& retrive_next_token, const at::Tensor& retrive_next_sibling,
                          const at::Tensor& uniform_samples, const at::Tensor& uniform_samples_for_final_sampling,
                          const at::Tensor& target_probs, const at::Tensor& draft_probs) {
  const typename Device::Guard guard(candidates.device());
  check_verify_tree_sampling_args(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                  retrive_next_token, retrive_next_sibling, uniform_samples,
                                  uniform_samples_for_final_sampling, target_probs, draft_probs);
  const int64_t bs = candidates.size(0);
  check_grid_rows(bs, "verify_tree_sampling");
  VerifyTreeSamplingArgs args{};
  static_cast<TreeSamplerArgs<double>&>(args) = tree_sampler_args<double>(
      predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token, retrive_next_sibling,
      uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs, "verify_tree_sampling");
  if (bs == 0) return;
  at::Tensor workspace =
      at::empty({verify_tree_sampling_workspace_doubles(bs, args.V)}, target_probs.options().dtype(at::kDouble));
  args.workspace = workspace.data_ptr<double>();
  check_launch(launch_verify_tree_sampling(args, Device::stream()), "verify_tree_sampling");
}

// The ops' implementations for one dispatch key of a library, e.g.
//   TORCH_LIBRARY_IMPL(domino_ops, CUDA, m) { domino::cuda::impl_ops<CudaDevice>(m); }
template <class Device>
void impl_ops(torch::Library& m) {
  m.impl("domino_head_rollout", &domino_head_rollout<Device>);
  m.impl("domino_head_expand", &domino_head_expand<Device>);
  m.impl("sample", &sample<Device>);
  m.impl("filtered_probs", &filtered_probs<Device>);
  m.impl("verify_greedy", &verify_greedy<Device>);
  m.impl("verify_sampling", &verify_sampling<Device>);
  m.impl("build_tree_kernel_efficient", &build_tree_kernel_efficient<Device>);
  m.impl("verify_tree_greedy", &verify_tree_greedy<Device>);
  m.impl("tree_speculative_sampling_target_only", &tree_speculative_sampling_target_only<Device>);
  m.impl("verify_tree_sampling", &verify_tree_sampling<Device>);
}

}  // namespace domino::cuda
