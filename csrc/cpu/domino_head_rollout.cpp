// CPU kernel of domino_head_rollout: k sequential steps of the Domino head.
//
// Per step i, for every sequence of the batch:
//   a   = silu(hproj[:, i] + w1s @ S)                      w1s   [r, G]
//   L   = base_logits[:, i] + w2 @ a                       w2    [V, r]
//   x_i = argmax(L) or a sample of softmax(filter(L / T))
//   S   = GRUCell(E[x_i], S)                               w_hh  [3G, G], w_ih [3G, H] or table [V, 3G]
//
// Bytes per step (the floor): w2 (V*r), w_hh (3G*G), w1s (r*G), w_ih (3G*H) or b table rows
// (b*3G), one base-logit row per sequence (b*V). At the paper shape in bf16 that is ~85 MB
// per step with the table, dominated by w2 (78 MB), so the kernel is bound by the read
// bandwidth of the w2 stream. Every weight is streamed once per step for the whole batch
// (rows_dot multiplies a loaded weight chunk into all b activations), so batch 8 costs
// little more memory traffic than batch 1.
//
// Greedy (T = 0) never materialises logits: each thread keeps, per sequence, the running
// max/argmax and the sum of exp(L - max) over its vocabulary range, merged across threads
// at the end of the step (log-sum-exp with rescaling). Sampling (T > 0) needs the filtered
// distribution, so L is written once into one [b, V] float row that the sampler reads.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu/row_sampler.h"
#include "cpu/vec.h"
#include "ops.h"

namespace domino::cpu {
namespace {

// Vocabulary rows handled per tile: the tile's dot products ([tile][b] floats) and one
// sequence's logits stay in L1.
constexpr int64_t kVocabTile = 256;

struct RunningLse {
  float max = -std::numeric_limits<float>::infinity();
  int64_t arg = std::numeric_limits<int64_t>::max();
  float sum = 0.0f;  // sum of exp(L - max)

  void merge(float other_max, int64_t other_arg, float other_sum) {
    if (other_max > max || (other_max == max && other_arg < arg)) {
      if (other_max > max) sum = sum * std::exp(max - other_max) + other_sum;
      else sum += other_sum;
      max = other_max;
      arg = other_arg;
    } else {
      sum += other_sum * std::exp(other_max - max);
    }
  }
};

// Splits [0, n) into one contiguous range per thread, aligned to `align`.
template <typename F>
void parallel_ranges(int64_t n, int64_t align, int64_t min_per_thread, const F& f) {
  const int64_t max_parts = std::max<int64_t>(1, n / std::max<int64_t>(min_per_thread, 1));
  const int64_t parts = std::min<int64_t>(at::get_num_threads(), max_parts);
  int64_t per = (n + parts - 1) / parts;
  per = (per + align - 1) / align * align;
  at::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t begin = std::min(n, p * per), end = std::min(n, (p + 1) * per);
      f(p, begin, end);
    }
  });
}

template <typename W>
void parallel_rows_dot(const W* w, int64_t rows, int64_t cols, const float* x, int64_t nb,
                       float* y) {
  // y is [rows][nb]; work is split by rows so every weight byte is read by one thread.
  parallel_ranges(rows, 16, 64, [&](int64_t, int64_t r0, int64_t r1) {
    if (r0 < r1) rows_dot(w, r0, r1, cols, x, cols, nb, y, nb);
  });
}

template <typename W, typename BL>
void rollout(BL* base, const float* hproj, float* S, const W* gru_input, const W* w_ih,
             const W* w_hh, const W* w1s, const W* w2, int64_t b, int64_t k, int64_t V,
             int64_t r, int64_t G, int64_t H, float temperature, int64_t top_k, float top_p,
             const double* uniforms, bool write_logits, int64_t* tokens, float* logprobs) {
  const bool greedy = temperature == 0.0f;
  const int64_t G3 = 3 * G;
  std::vector<float> w1s_out(r * b), act(b * r), gi(G3 * b), gh(G3 * b), emb;
  std::vector<float> row;  // the one [b, V] logits row, only when sampling
  if (!greedy) row.resize(b * V);
  if (w_ih != nullptr) emb.resize(b * H);

  const int64_t max_parts = at::get_num_threads();
  std::vector<RunningLse> partial(max_parts * b);
  std::vector<int64_t> x(b);
  std::vector<SampleScratch> scratch(b);

  for (int64_t i = 0; i < k; ++i) {
    // a = silu(hproj[:, i] + w1s @ S)
    parallel_rows_dot(w1s, r, G, S, b, w1s_out.data());
    for (int64_t s = 0; s < b; ++s)
      for (int64_t j = 0; j < r; ++j)
        act[s * r + j] = silu(hproj[(s * k + i) * r + j] + w1s_out[j * b + s]);

    // L = base + w2 @ a over vocabulary tiles; reduce or write the row.
    for (auto& p : partial) p = RunningLse{};
    parallel_ranges(V, 64, kVocabTile, [&](int64_t part, int64_t v_begin, int64_t v_end) {
      std::vector<float> dots(kVocabTile * b), lrow(kVocabTile);
      for (int64_t v0 = v_begin; v0 < v_end; v0 += kVocabTile) {
        const int64_t n = std::min(kVocabTile, v_end - v0);
        rows_dot(w2 + v0 * r, 0, n, r, act.data(), r, b, dots.data(), b);
        for (int64_t s = 0; s < b; ++s) {
          BL* base_row = base + (s * k + i) * V + v0;
          for (int64_t t = 0; t < n; ++t) lrow[t] = to_float(base_row[t]) + dots[t * b + s];
          if (write_logits)
            for (int64_t t = 0; t < n; ++t) base_row[t] = static_cast<BL>(lrow[t]);
          if (!greedy) {
            std::copy(lrow.begin(), lrow.begin() + n, row.begin() + s * V + v0);
            continue;
          }
          float tmax = lrow[0];
          int64_t targ = 0;
          for (int64_t t = 1; t < n; ++t)
            if (lrow[t] > tmax) { tmax = lrow[t]; targ = t; }
          partial[part * b + s].merge(tmax, v0 + targ, sum_exp_shifted(lrow.data(), n, tmax));
        }
      }
    });

    // Choose the token of every sequence.
    if (greedy) {
      for (int64_t s = 0; s < b; ++s) {
        RunningLse total;
        for (int64_t p = 0; p < max_parts; ++p) {
          const RunningLse& q = partial[p * b + s];
          if (q.arg != std::numeric_limits<int64_t>::max()) total.merge(q.max, q.arg, q.sum);
        }
        x[s] = total.arg;
        logprobs[s * k + i] = -std::log(total.sum);  // L[x] - lse with L[x] = max
      }
    } else {
      at::parallel_for(0, b, 1, [&](int64_t s0, int64_t s1) {
        for (int64_t s = s0; s < s1; ++s) {
          const Sampled got = sample_row(row.data() + s * V, V, temperature, top_k, top_p,
                                         uniforms[s * k + i], scratch[s]);
          x[s] = got.token;
          logprobs[s * k + i] = got.logprob;
        }
      });
    }
    for (int64_t s = 0; s < b; ++s) tokens[s * k + i] = x[s];

    // S = GRUCell(E[x], S), gates in torch.nn.GRUCell order (r, z, n), no biases.
    if (w_ih != nullptr) {
      for (int64_t s = 0; s < b; ++s) {
        const W* e = gru_input + x[s] * H;
        for (int64_t j = 0; j < H; ++j) emb[s * H + j] = to_float(e[j]);
      }
      parallel_rows_dot(w_ih, G3, H, emb.data(), b, gi.data());
    } else {
      for (int64_t s = 0; s < b; ++s) {
        const W* t = gru_input + x[s] * G3;
        for (int64_t j = 0; j < G3; ++j) gi[j * b + s] = to_float(t[j]);
      }
    }
    parallel_rows_dot(w_hh, G3, G, S, b, gh.data());
    for (int64_t s = 0; s < b; ++s) {
      for (int64_t j = 0; j < G; ++j) {
        const float rg = sigmoid(gi[j * b + s] + gh[j * b + s]);
        const float zg = sigmoid(gi[(G + j) * b + s] + gh[(G + j) * b + s]);
        const float ng = std::tanh(gi[(2 * G + j) * b + s] + rg * gh[(2 * G + j) * b + s]);
        float& h = S[s * G + j];
        h = (1.0f - zg) * ng + zg * h;
      }
    }
  }
}

}  // namespace

void domino_head_rollout_cpu(at::Tensor base_logits, const at::Tensor& hproj,
                             const at::Tensor& state, const at::Tensor& gru_input,
                             const std::optional<at::Tensor>& w_ih, const at::Tensor& w_hh,
                             const at::Tensor& w1s, const at::Tensor& w2, double temperature,
                             int64_t top_k, double top_p,
                             const std::optional<at::Tensor>& uniforms, bool write_logits,
                             at::Tensor tokens, at::Tensor logprobs, at::Tensor state_out) {
  check_head_rollout_args(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2,
                          temperature, top_k, top_p, uniforms, tokens, logprobs, state_out);
  const int64_t b = base_logits.size(0), k = base_logits.size(1), V = base_logits.size(2);
  const int64_t r = w1s.size(0), G = w1s.size(1);
  const int64_t H = w_ih.has_value() ? w_ih->size(1) : 0;
  state_out.copy_(state);
  const at::Tensor hproj_f = hproj.to(at::kFloat).contiguous();
  const double* u = temperature > 0 ? uniforms->data_ptr<double>() : nullptr;

  AT_DISPATCH_SWITCH(w2.scalar_type(), "domino_head_rollout_cpu",
    AT_DISPATCH_CASE_FLOATING_TYPES_AND(at::kBFloat16, [&] {
      using W = scalar_t;
      AT_DISPATCH_SWITCH(base_logits.scalar_type(), "domino_head_rollout_cpu_base",
        AT_DISPATCH_CASE_FLOATING_TYPES_AND(at::kBFloat16, [&] {
          using BL = scalar_t;
          if constexpr (std::is_same_v<W, double> || std::is_same_v<BL, double>) {
            TORCH_CHECK(false, "domino_head_rollout: float64 is not supported");
          } else {
            rollout<W, BL>(base_logits.data_ptr<BL>(), hproj_f.data_ptr<float>(),
                           state_out.data_ptr<float>(), gru_input.data_ptr<W>(),
                           w_ih.has_value() ? w_ih->data_ptr<W>() : nullptr,
                           w_hh.data_ptr<W>(), w1s.data_ptr<W>(), w2.data_ptr<W>(), b, k, V,
                           r, G, H, static_cast<float>(temperature), top_k,
                           static_cast<float>(top_p), u, write_logits,
                           tokens.data_ptr<int64_t>(), logprobs.data_ptr<float>());
          }
        }));
    }));
}

}  // namespace domino::cpu
