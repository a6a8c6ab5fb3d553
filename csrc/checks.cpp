// Argument checks shared by every device's entry points (see ops.h).
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <initializer_list>
#include <utility>

#include "ops.h"

namespace domino {

void check_unit_interval(const at::Tensor& t, const char* name, bool closed) {
  if (!t.device().is_cpu() || t.numel() == 0) return;
  // A plain scan of the few uniforms a call takes: these checks run on every sampling
  // call, where a chain of tensor ops would allocate temporaries each time.
  const at::Tensor u = t.contiguous();  // the callers' tensors already are: no copy
  AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "check_unit_interval", [&] {
    const scalar_t* p = u.const_data_ptr<scalar_t>();
    for (int64_t i = 0; i < u.numel(); ++i)  // NaN fails both comparisons
      TORCH_CHECK(p[i] >= scalar_t(0) && (p[i] < scalar_t(1) || (closed && p[i] == scalar_t(1))), name,
                  closed ? " must be in [0, 1], got " : " must be in [0, 1), got ", static_cast<double>(p[i]),
                  " at flat index ", i);
  });
}

void check_apart(const at::Tensor& out, const char* out_name, const at::Tensor& in, const char* in_name,
                 bool in_place_ok) {
  const at::MemOverlapStatus status = at::get_overlap_status(out, in);
  TORCH_CHECK(status != at::MemOverlapStatus::Partial, out_name, " must not share memory with ", in_name,
              in_place_ok ? " (unless it is that very tensor)" : "");
  TORCH_CHECK(in_place_ok || status != at::MemOverlapStatus::Full, out_name, " must not share memory with ", in_name);
}

namespace {

bool is_float_or_bf16(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16;
}

void check_tensor(const at::Tensor& t, const char* name, int64_t dim, const at::Device& device) {
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got shape ", t.sizes());
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but the op runs on ", device);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void check_sampling_params(double temperature, int64_t top_k, double top_p) {
  TORCH_CHECK(temperature >= 0.0 && finite_in_float32(temperature),
              "temperature must be finite and >= 0 (finite in float32: <= 3.403e+38), got ", temperature);
  TORCH_CHECK(top_k >= 0, "top_k must be >= 0, got ", top_k);
  TORCH_CHECK(top_p > 0.0 && top_p <= 1.0, "top_p must be in (0, 1], got ", top_p);
}

// A per-row parameter: [b], contiguous, on the op's device, of its dtype; on the CPU its
// values are checked too (on a GPU that would need a device sync: the wrappers check).
void check_row_param(const std::optional<at::Tensor>& t, const char* name, at::ScalarType dtype,
                     int64_t b, const at::Device& device) {
  if (!t.has_value()) return;
  check_tensor(*t, name, 1, device);
  TORCH_CHECK(t->scalar_type() == dtype, name, " must be ", dtype, ", got ", t->scalar_type());
  TORCH_CHECK(t->size(0) == b, name, " must have shape [", b, "] (one value per row), got ", t->sizes());
}

void check_sampling_args(const SamplingArgs& a, int64_t b, const at::Device& device) {
  check_sampling_params(a.temperature, a.top_k, a.top_p);
  check_row_param(a.row_temperature, "row_temperature", at::kFloat, b, device);
  check_row_param(a.row_top_k, "row_top_k", at::kLong, b, device);
  check_row_param(a.row_top_p, "row_top_p", at::kFloat, b, device);
  if (device.is_cpu()) {
    if (a.row_temperature)
      TORCH_CHECK(at::all(a.row_temperature->ge(0).logical_and(a.row_temperature->isfinite())).item<bool>(),
                  "row_temperature must be finite and >= 0 in every row");
    if (a.row_top_k) TORCH_CHECK(at::all(a.row_top_k->ge(0)).item<bool>(), "row_top_k must be >= 0 in every row");
    if (a.row_top_p)
      TORCH_CHECK(at::all(a.row_top_p->gt(0).logical_and(a.row_top_p->le(1))).item<bool>(),
                  "row_top_p must be in (0, 1] in every row");
  }
}

void check_uniforms(const std::optional<at::Tensor>& uniforms, const SamplingArgs& sampling,
                    at::IntArrayRef shape, const at::Device& device) {
  if (!sampling.params().may_sample()) return;
  TORCH_CHECK(uniforms.has_value(), "uniforms are required when temperature > 0 or row_temperature is given");
  check_tensor(*uniforms, "uniforms", static_cast<int64_t>(shape.size()), device);
  TORCH_CHECK(uniforms->scalar_type() == at::kDouble, "uniforms must be float64");
  TORCH_CHECK(uniforms->sizes() == shape, "uniforms must have shape ", shape, ", got ",
              uniforms->sizes());
  check_unit_interval(*uniforms, "uniforms");
}

}  // namespace

const at::Tensor* opt(const std::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; }

namespace {

// Whether every value of the int64 CPU vector t is in [lo, hi): a plain loop, since a
// tensor min()/max() pair costs tens of microseconds of dispatch and thread wake-up, a
// noticeable part of a small tree step (domino_head_expand checks two such vectors a call).
bool values_in(const at::Tensor& t, int64_t lo, int64_t hi) {
  const auto a = t.accessor<int64_t, 1>();
  for (int64_t i = 0; i < a.size(0); ++i)
    if (a[i] < lo || a[i] >= hi) return false;
  return true;
}

}  // namespace

void check_no_overlap(std::initializer_list<Named> outputs, std::initializer_list<Named> inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    if (o->second == nullptr) continue;  // an optional output not given
    for (const Named& i : inputs) {
      if (i.second == nullptr) continue;
      TORCH_CHECK(at::get_overlap_status(*o->second, *i.second) == at::MemOverlapStatus::No,
                  o->first, " must not share memory with ", i.first);
    }
    for (auto o2 = std::next(o); o2 != outputs.end(); ++o2) {
      if (o2->second == nullptr) continue;
      TORCH_CHECK(at::get_overlap_status(*o->second, *o2->second) == at::MemOverlapStatus::No,
                  o->first, " must not share memory with ", o2->first);
    }
  }
}

namespace {

// base_logits [b, k, V] and hproj [b, k, r] (float32 or bfloat16, non-empty), w1s [r, G]
// non-empty: the per-position inputs of both head ops.
void check_head_positions(const at::Tensor& base_logits, const at::Tensor& hproj, const at::Tensor& w1s,
                          const at::Device& dev) {
  check_tensor(base_logits, "base_logits", 3, dev);
  check_tensor(hproj, "hproj", 3, dev);
  check_tensor(w1s, "w1s", 2, dev);
  const int64_t b = base_logits.size(0), k = base_logits.size(1), V = base_logits.size(2);
  const int64_t r = w1s.size(0), G = w1s.size(1);
  TORCH_CHECK(b > 0 && k > 0 && V > 0, "base_logits must be non-empty, got shape ", base_logits.sizes());
  TORCH_CHECK(r > 0 && G > 0, "w1s must be non-empty, got shape ", w1s.sizes());
  TORCH_CHECK(is_float_or_bf16(base_logits), "base_logits must be float32 or bfloat16");
  TORCH_CHECK(is_float_or_bf16(hproj), "hproj must be float32 or bfloat16");
  TORCH_CHECK(hproj.size(0) == b && hproj.size(1) == k && hproj.size(2) == r,
              "hproj must have shape [", b, ", ", k, ", ", r, "], got ", hproj.sizes());
}

// The head's weights (dtypes, shapes) for a vocabulary of V, w1s [r, G] non-empty.
void check_head_weights(const at::Tensor& gru_input, const std::optional<at::Tensor>& w_ih,
                        const at::Tensor& w_hh, const at::Tensor& w1s, const at::Tensor& w2, int64_t V,
                        const at::Device& dev) {
  check_tensor(gru_input, "gru_input", 2, dev);
  check_tensor(w_hh, "w_hh", 2, dev);
  check_tensor(w1s, "w1s", 2, dev);
  check_tensor(w2, "w2", 2, dev);
  const int64_t r = w1s.size(0), G = w1s.size(1);
  TORCH_CHECK(r > 0 && G > 0, "w1s must be non-empty, got shape ", w1s.sizes());
  const auto wt = w2.scalar_type();
  TORCH_CHECK(wt == at::kFloat || wt == at::kBFloat16, "w2 must be float32 or bfloat16");
  TORCH_CHECK(w1s.scalar_type() == wt && w_hh.scalar_type() == wt && gru_input.scalar_type() == wt,
              "w1s, w_hh and gru_input must have the dtype of w2");
  TORCH_CHECK(w_hh.size(0) == 3 * G && w_hh.size(1) == G, "w_hh must have shape [", 3 * G,
              ", ", G, "], got ", w_hh.sizes());
  TORCH_CHECK(w2.size(0) == V && w2.size(1) == r, "w2 must have shape [", V, ", ", r, "], got ",
              w2.sizes());
  TORCH_CHECK(gru_input.size(0) == V, "gru_input must have ", V, " rows, got ", gru_input.sizes());
  if (w_ih.has_value()) {
    check_tensor(*w_ih, "w_ih", 2, dev);
    TORCH_CHECK(gru_input.size(1) > 0, "gru_input (the embedding, since w_ih is given) must have at least "
                "one column, got shape ", gru_input.sizes());
    TORCH_CHECK(w_ih->scalar_type() == wt, "w_ih must have the dtype of w2");
    TORCH_CHECK(w_ih->size(0) == 3 * G && w_ih->size(1) == gru_input.size(1),
                "w_ih must have shape [", 3 * G, ", ", gru_input.size(1), "], got ", w_ih->sizes());
  } else {
    TORCH_CHECK(gru_input.size(1) == 3 * G, "gru_input without w_ih is the table E @ w_ih.T and "
                "must have shape [", V, ", ", 3 * G, "], got ", gru_input.sizes());
  }
}

}  // namespace

SamplingParams SamplingArgs::params() const {
  SamplingParams p;
  p.temperature = static_cast<float>(temperature);
  p.top_k = top_k;
  p.top_p = top_p;
  p.row_temperature = row_temperature ? row_temperature->data_ptr<float>() : nullptr;
  p.row_top_k = row_top_k ? row_top_k->data_ptr<int64_t>() : nullptr;
  p.row_top_p = row_top_p ? row_top_p->data_ptr<float>() : nullptr;
  return p;
}

void check_head_rollout_args(const at::Tensor& base_logits, const at::Tensor& hproj,
                             const at::Tensor& state, const at::Tensor& gru_input,
                             const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                             const at::Tensor& w1s, const at::Tensor& w2,
                             const SamplingArgs& sampling,
                             const std::optional<at::Tensor>& uniforms,
                             const at::Tensor& tokens, const at::Tensor& logprobs,
                             const at::Tensor& state_out) {
  const at::Device dev = base_logits.device();
  check_head_positions(base_logits, hproj, w1s, dev);
  check_tensor(state, "state", 2, dev);
  check_tensor(tokens, "tokens", 2, dev);
  check_tensor(logprobs, "logprobs", 2, dev);
  check_tensor(state_out, "state_out", 2, dev);
  const int64_t b = base_logits.size(0), k = base_logits.size(1), V = base_logits.size(2);
  check_sampling_args(sampling, b, dev);
  const int64_t G = w1s.size(1);
  TORCH_CHECK(state.scalar_type() == at::kFloat, "state must be float32");
  TORCH_CHECK(state.size(0) == b && state.size(1) == G, "state must have shape [", b, ", ", G,
              "], got ", state.sizes());
  check_head_weights(gru_input, w_ih, w_hh, w1s, w2, V, dev);
  check_uniforms(uniforms, sampling, {b, k}, dev);
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.size(0) == b && tokens.size(1) == k,
              "tokens must be int64 of shape [", b, ", ", k, "]");
  TORCH_CHECK(logprobs.scalar_type() == at::kFloat && logprobs.size(0) == b && logprobs.size(1) == k,
              "logprobs must be float32 of shape [", b, ", ", k, "]");
  TORCH_CHECK(state_out.scalar_type() == at::kFloat && state_out.sizes() == state.sizes(),
              "state_out must be float32 of shape ", state.sizes());
  const at::Tensor* u = uniforms.has_value() ? &*uniforms : nullptr;
  const at::Tensor* wi = w_ih.has_value() ? &*w_ih : nullptr;
  check_no_overlap({{"base_logits", &base_logits}, {"tokens", &tokens}, {"logprobs", &logprobs},
                    {"state_out", &state_out}},
                   {{"hproj", &hproj}, {"state", &state}, {"gru_input", &gru_input}, {"w_ih", wi},
                    {"w_hh", &w_hh}, {"w1s", &w1s}, {"w2", &w2}, {"uniforms", u},
                    {"row_temperature", opt(sampling.row_temperature)}, {"row_top_k", opt(sampling.row_top_k)},
                    {"row_top_p", opt(sampling.row_top_p)}});
}

void check_head_expand_args(const at::Tensor& base_logits, const at::Tensor& hproj,
                            const at::Tensor& node_state, const at::Tensor& node_seq,
                            const at::Tensor& node_depth, const at::Tensor& gru_input,
                            const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                            const at::Tensor& w1s, const at::Tensor& w2, const SamplingArgs& sampling,
                            const std::optional<at::Tensor>& uniforms, const at::Tensor& child_tokens,
                            const at::Tensor& child_logprobs, const at::Tensor& child_state,
                            const std::optional<at::Tensor>& node_logits) {
  const at::Device dev = base_logits.device();
  check_head_positions(base_logits, hproj, w1s, dev);
  check_tensor(node_state, "node_state", 2, dev);
  check_tensor(node_seq, "node_seq", 1, dev);
  check_tensor(node_depth, "node_depth", 1, dev);
  check_tensor(child_tokens, "child_tokens", 2, dev);
  check_tensor(child_logprobs, "child_logprobs", 2, dev);
  check_tensor(child_state, "child_state", 3, dev);
  if (node_logits.has_value()) check_tensor(*node_logits, "node_logits", 2, dev);
  const int64_t b = base_logits.size(0), k = base_logits.size(1), V = base_logits.size(2);
  const int64_t n = node_state.size(0), m = child_tokens.size(1);
  const int64_t G = w1s.size(1);
  check_head_weights(gru_input, w_ih, w_hh, w1s, w2, V, dev);
  TORCH_CHECK(node_state.scalar_type() == at::kFloat && node_state.size(1) == G,
              "node_state must be float32 of shape [nodes, ", G, "], got ", node_state.scalar_type(), " ",
              node_state.sizes());
  TORCH_CHECK(node_seq.scalar_type() == at::kLong && node_seq.size(0) == n, "node_seq must be int64 of shape [", n,
              "]");
  TORCH_CHECK(node_depth.scalar_type() == at::kLong && node_depth.size(0) == n,
              "node_depth must be int64 of shape [", n, "]");
  TORCH_CHECK(m >= 1 && m <= V, "child_tokens must have between 1 and ", V, " columns (children per node), got ",
              child_tokens.sizes());
  TORCH_CHECK(child_tokens.scalar_type() == at::kLong && child_tokens.size(0) == n,
              "child_tokens must be int64 of shape [", n, ", children]");
  TORCH_CHECK(child_logprobs.scalar_type() == at::kFloat && child_logprobs.sizes() == child_tokens.sizes(),
              "child_logprobs must be float32 of shape ", child_tokens.sizes());
  TORCH_CHECK(child_state.scalar_type() == at::kFloat && child_state.size(0) == n && child_state.size(1) == m &&
                  child_state.size(2) == G,
              "child_state must be float32 of shape [", n, ", ", m, ", ", G, "]");
  TORCH_CHECK(!node_logits.has_value() || (node_logits->scalar_type() == at::kFloat && node_logits->size(0) == n &&
                                           node_logits->size(1) == V),
              "node_logits must be None or float32 of shape [", n, ", ", V, "]");
  check_sampling_args(sampling, b, dev);  // per-row parameters: one per sequence
  check_uniforms(uniforms, sampling, {n, m}, dev);
  if (dev.is_cpu() && n > 0) {  // the indices address base_logits and hproj rows
    TORCH_CHECK(values_in(node_seq, 0, b), "node_seq must hold sequence indices in [0, ", b, ")");
    TORCH_CHECK(values_in(node_depth, 0, k), "node_depth must hold depths in [0, ", k, ")");
  }
  const at::Tensor* u = uniforms.has_value() ? &*uniforms : nullptr;
  check_no_overlap({{"child_tokens", &child_tokens}, {"child_logprobs", &child_logprobs},
                    {"child_state", &child_state}, {"node_logits", opt(node_logits)}},
                   {{"base_logits", &base_logits}, {"hproj", &hproj}, {"node_state", &node_state},
                    {"node_seq", &node_seq}, {"node_depth", &node_depth}, {"gru_input", &gru_input},
                    {"w_ih", opt(w_ih)}, {"w_hh", &w_hh}, {"w1s", &w1s}, {"w2", &w2}, {"uniforms", u},
                    {"row_temperature", opt(sampling.row_temperature)}, {"row_top_k", opt(sampling.row_top_k)},
                    {"row_top_p", opt(sampling.row_top_p)}});
}

void check_sample_args(const at::Tensor& logits, const SamplingArgs& sampling,
                       const std::optional<at::Tensor>& uniforms, const at::Tensor& tokens) {
  const at::Device dev = logits.device();
  check_tensor(logits, "logits", 2, dev);
  check_tensor(tokens, "tokens", 1, dev);
  TORCH_CHECK(is_float_or_bf16(logits), "logits must be float32 or bfloat16");
  TORCH_CHECK(logits.size(0) > 0 && logits.size(1) > 0, "logits must be non-empty, got shape ",
              logits.sizes());
  check_sampling_args(sampling, logits.size(0), dev);
  check_uniforms(uniforms, sampling, {logits.size(0)}, dev);
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.size(0) == logits.size(0),
              "tokens must be int64 of shape [", logits.size(0), "]");
  const at::Tensor* u = uniforms.has_value() ? &*uniforms : nullptr;
  check_no_overlap({{"tokens", &tokens}},
                   {{"logits", &logits}, {"uniforms", u}, {"row_temperature", opt(sampling.row_temperature)},
                    {"row_top_k", opt(sampling.row_top_k)}, {"row_top_p", opt(sampling.row_top_p)}});
}

void check_filtered_probs_args(const at::Tensor& logits, const SamplingArgs& sampling, const at::Tensor& probs) {
  const at::Device dev = logits.device();
  check_tensor(logits, "logits", 2, dev);
  check_tensor(probs, "probs", 2, dev);
  TORCH_CHECK(is_float_or_bf16(logits), "logits must be float32 or bfloat16");
  TORCH_CHECK(logits.size(0) > 0 && logits.size(1) > 0, "logits must be non-empty, got shape ", logits.sizes());
  check_sampling_args(sampling, logits.size(0), dev);
  TORCH_CHECK(probs.scalar_type() == at::kFloat && probs.sizes() == logits.sizes(),
              "probs must be float32 of shape ", logits.sizes(), ", got ", probs.scalar_type(), " ", probs.sizes());
  check_no_overlap({{"probs", &probs}},
                   {{"logits", &logits}, {"row_temperature", opt(sampling.row_temperature)},
                    {"row_top_k", opt(sampling.row_top_k)}, {"row_top_p", opt(sampling.row_top_p)}});
}

namespace {
void check_verify_outputs(int64_t b, int64_t k, const at::Tensor& out_tokens,
                          const at::Tensor& num_accepted, const at::Device& dev) {
  check_tensor(out_tokens, "out_tokens", 2, dev);
  check_tensor(num_accepted, "num_accepted", 1, dev);
  TORCH_CHECK(out_tokens.scalar_type() == at::kLong && out_tokens.size(0) == b &&
                  out_tokens.size(1) == k + 1,
              "out_tokens must be int64 of shape [", b, ", ", k + 1, "]");
  TORCH_CHECK(num_accepted.scalar_type() == at::kLong && num_accepted.size(0) == b,
              "num_accepted must be int64 of shape [", b, "]");
}
}  // namespace

void check_verify_greedy_args(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                              const at::Tensor& out_tokens, const at::Tensor& num_accepted) {
  const at::Device dev = target_logits.device();
  check_tensor(draft_tokens, "draft_tokens", 2, dev);
  check_tensor(target_logits, "target_logits", 3, dev);
  TORCH_CHECK(draft_tokens.scalar_type() == at::kLong, "draft_tokens must be int64");
  TORCH_CHECK(is_float_or_bf16(target_logits), "target_logits must be float32 or bfloat16");
  const int64_t b = draft_tokens.size(0), k = draft_tokens.size(1);
  TORCH_CHECK(b > 0 && k > 0, "draft_tokens must be non-empty, got shape ", draft_tokens.sizes());
  TORCH_CHECK(target_logits.size(0) == b && target_logits.size(1) == k + 1 && target_logits.size(2) > 0,
              "target_logits must have shape [", b, ", ", k + 1, ", V], got ", target_logits.sizes());
  check_verify_outputs(b, k, out_tokens, num_accepted, dev);
  check_no_overlap({{"out_tokens", &out_tokens}, {"num_accepted", &num_accepted}},
                   {{"draft_tokens", &draft_tokens}, {"target_logits", &target_logits}});
}

void check_verify_sampling_args(const at::Tensor& draft_tokens, const at::Tensor& draft_probs,
                                const at::Tensor& target_probs,
                                const at::Tensor& uniforms_accept,
                                const at::Tensor& uniforms_resample,
                                const at::Tensor& out_tokens, const at::Tensor& num_accepted) {
  const at::Device dev = target_probs.device();
  check_tensor(draft_tokens, "draft_tokens", 2, dev);
  check_tensor(draft_probs, "draft_probs", 3, dev);
  check_tensor(target_probs, "target_probs", 3, dev);
  check_tensor(uniforms_accept, "uniforms_accept", 2, dev);
  check_tensor(uniforms_resample, "uniforms_resample", 1, dev);
  TORCH_CHECK(draft_tokens.scalar_type() == at::kLong, "draft_tokens must be int64");
  TORCH_CHECK(draft_probs.scalar_type() == at::kFloat, "draft_probs must be float32");
  TORCH_CHECK(target_probs.scalar_type() == at::kFloat, "target_probs must be float32");
  TORCH_CHECK(uniforms_accept.scalar_type() == at::kDouble &&
                  uniforms_resample.scalar_type() == at::kDouble,
              "uniforms_accept and uniforms_resample must be float64");
  const int64_t b = draft_tokens.size(0), k = draft_tokens.size(1), V = target_probs.size(2);
  TORCH_CHECK(b > 0 && k > 0 && V > 0, "draft_tokens must be non-empty, got shape ", draft_tokens.sizes());
  TORCH_CHECK(draft_probs.size(0) == b && draft_probs.size(1) == k && draft_probs.size(2) == V,
              "draft_probs must have shape [", b, ", ", k, ", ", V, "], got ", draft_probs.sizes());
  TORCH_CHECK(target_probs.size(0) == b && target_probs.size(1) == k + 1,
              "target_probs must have shape [", b, ", ", k + 1, ", V], got ", target_probs.sizes());
  TORCH_CHECK(uniforms_accept.size(0) == b && uniforms_accept.size(1) == k,
              "uniforms_accept must have shape [", b, ", ", k, "]");
  TORCH_CHECK(uniforms_resample.size(0) == b, "uniforms_resample must have shape [", b, "]");
  check_unit_interval(uniforms_accept, "uniforms_accept");
  check_unit_interval(uniforms_resample, "uniforms_resample");
  check_verify_outputs(b, k, out_tokens, num_accepted, dev);
  check_no_overlap({{"out_tokens", &out_tokens}, {"num_accepted", &num_accepted}},
                   {{"draft_tokens", &draft_tokens}, {"draft_probs", &draft_probs},
                    {"target_probs", &target_probs}, {"uniforms_accept", &uniforms_accept},
                    {"uniforms_resample", &uniforms_resample}});
}

}  // namespace domino
