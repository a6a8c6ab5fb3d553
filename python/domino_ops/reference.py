"""Pure-PyTorch references of every op, with the same signatures as ``domino_ops.<op>``.

They are the test oracle: they define the semantics the kernels are tested against and
run on any device; no runtime path goes through them (the ``backend="reference"`` choice
of a public op is the one exception, asked for by name). Matmuls
run in the weights' dtype (as a plain eager loop would); pass float64 weights for an
exact oracle. Randomness is drawn from ``generator`` in the same order and shapes as the
kernels' wrappers draw it, so with equal generator states the reference and a kernel
make the same choices (up to float rounding at a CDF boundary).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from domino_ops.sampling import (as_kernel_temperature, draw_uniforms, effective_temperature, expand_uniforms,
                                 filtered_weights, may_sample, per_row, repeat_over_rows)

__all__ = ["domino_head_rollout", "domino_head_expand", "sample", "filtered_probs", "verify_greedy", "verify_sampling", "sample_from_logits",
           "small_batch_linear", "small_batch_attention", "rms_norm", "silu_mul", "apply_rotary_pos_emb"]

# A float attention mask hides a key with -inf or with anything at or below bfloat16's lowest
# finite value (HF's eager masks and the engine's tree mask add torch.finfo(dtype).min).
HIDDEN_BIAS = torch.finfo(torch.bfloat16).min


def sample_from_logits(logits: torch.Tensor, temperature, top_k, top_p,
                       uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples one token per row of ``logits`` [b, V] with uniforms [b] float64; each
    parameter a Python number or a [b] tensor (a row at temperature 0 takes the argmax).

    The token is the first index whose CDF under the filtered distribution (see
    :func:`filtered_probs`) exceeds u * total. Returns (tokens [b] int64, logprobs [b]
    float32), the log-probability under the filtered distribution.
    """
    V = logits.shape[-1]
    w = filtered_weights(logits, temperature, top_k, top_p)
    total = w.sum(dim=-1, keepdim=True)
    cdf = torch.cumsum(w, dim=-1)
    tokens = torch.searchsorted(cdf, uniforms.unsqueeze(-1) * total, right=True).clamp(max=V - 1)
    # Rounding can leave the target past the last positive weight: take that weight.
    last_positive = (V - 1) - torch.argmax((w > 0).flip(-1).to(torch.int8), dim=-1, keepdim=True)
    tokens = torch.minimum(tokens, last_positive).squeeze(-1)
    logprobs = (torch.log(w.gather(-1, tokens.unsqueeze(-1))) - torch.log(total)).squeeze(-1)
    return tokens, logprobs.float()


def filtered_probs(logits: torch.Tensor, temperature=0.0, top_k=0, top_p=1.0) -> torch.Tensor:
    """Reference of :func:`domino_ops.filtered_probs`: ``softmax(filter(logits /
    temperature))`` over the last axis of ``logits`` [b, ..., V] as float32 of the same
    shape, from :func:`domino_ops.sampling.filtered_weights` (float64) over their float64
    total; each parameter a Python number or a [b] tensor (one value per leading row,
    repeated over the middle axes)."""
    b, V = logits.shape[0], logits.shape[-1]
    rows = logits[0].numel() // V if logits.dim() > 1 else 1
    w = filtered_weights(logits.reshape(-1, V), *(repeat_over_rows(x, b, rows) for x in (temperature, top_k, top_p)))
    return (w / w.sum(dim=-1, keepdim=True)).float().reshape(logits.shape)


def gru_cell(gi: torch.Tensor, gh: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """torch.nn.GRUCell without biases, from precomputed input and hidden projections."""
    ir, iz, in_ = gi.chunk(3, dim=-1)
    hr, hz, hn = gh.chunk(3, dim=-1)
    r = torch.sigmoid(ir + hr)
    z = torch.sigmoid(iz + hz)
    n = torch.tanh(in_ + r * hn)
    return (1 - z) * n + z * S


def domino_head_rollout(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, *,
                        temperature=0.0, top_k=0, top_p=1.0, generator=None, write_logits=False, a_dtype=None):
    """Reference of :func:`domino_ops.domino_head_rollout` (see there for shapes).

    ``a_dtype``: the dtype the correction input ``a`` is rounded to before the w2 product
    (default: w2's, as a model in that dtype computes it). The kernels keep ``a`` in float32,
    except ``domino_head_expand``'s packed product (``w2_packed``), which rounds it to bf16:
    with float64 weights and ``a_dtype=torch.bfloat16`` this is an exact oracle of that path."""
    b, k, V = base_logits.shape
    acc = torch.float64 if w2.dtype == torch.float64 else torch.float32
    uniforms = draw_uniforms((b, k), base_logits.device, generator) if may_sample(temperature) else None
    greedy_rows = per_row(effective_temperature(as_kernel_temperature(temperature)), b, torch.float64,
                          base_logits.device)[:, 0] == 0
    S = state.to(acc).clone()
    tokens = torch.empty(b, k, dtype=torch.int64, device=base_logits.device)
    logprobs = torch.empty(b, k, dtype=torch.float32, device=base_logits.device)
    for i in range(k):
        a = F.silu(hproj[:, i].to(acc) + F.linear(S.to(w1s.dtype), w1s).to(acc))
        L = base_logits[:, i].to(acc) + F.linear(a.to(a_dtype or w2.dtype).to(w2.dtype), w2).to(acc)
        if write_logits:
            base_logits[:, i] = L.to(base_logits.dtype)
        # greedy rows: torch.argmax and the log-probability under softmax(L)
        x = L.argmax(dim=-1)
        lp = torch.log_softmax(L, dim=-1).gather(-1, x.unsqueeze(-1)).squeeze(-1)
        if uniforms is not None:
            xs, lps = sample_from_logits(L.float(), temperature, top_k, top_p, uniforms[:, i])
            x, lp = torch.where(greedy_rows, x, xs), torch.where(greedy_rows, lp, lps.to(lp.dtype))
        tokens[:, i] = x
        logprobs[:, i] = lp.float()
        if w_ih is None:
            gi = gru_input[x].to(acc)
        else:
            gi = F.linear(gru_input[x], w_ih).to(acc)
        gh = F.linear(S.to(w_hh.dtype), w_hh).to(acc)
        S = gru_cell(gi, gh, S)
    return tokens, logprobs, S.float()


def greedy_children(L: torch.Tensor, m: int) -> torch.Tensor:
    """The m best tokens of each row of L [F, V]: descending, NaN first (as torch.argmax),
    ties by index. [F, m] int64."""
    return torch.sort(L, dim=-1, descending=True, stable=True).indices[:, :m]


def sampled_children(L: torch.Tensor, m: int, temperature, top_k, top_p, uniforms) -> tuple[torch.Tensor, torch.Tensor]:
    """m tokens per row of L [F, V] drawn without replacement from the filtered distribution
    (draw j: the inverse CDF at ``uniforms[f, j]`` of the weights left), with their
    log-probabilities under the whole filtered distribution. Once no mass is left the next
    children are the best remaining tokens by L (log-probability -inf: a draft sampler never
    proposes them, so the tree verifier rejects them)."""
    w_all = filtered_weights(L, temperature, top_k, top_p)
    tokens = torch.empty(L.shape[0], m, dtype=torch.int64)
    logprobs = torch.empty(L.shape[0], m, dtype=torch.float32)
    order = greedy_children(L, m)  # the fallback's tokens: fewer than m are drawn, so among the m best
    for f in range(L.shape[0]):
        w = w_all[f].clone()
        total = float(torch.cumsum(w, 0)[-1])
        for j in range(m):
            if bool((w > 0).any()):
                x = inverse_cdf_pick(w, uniforms[f, j])
                logprobs[f, j] = math.log(float(w_all[f, x])) - math.log(total)
            else:
                taken = set(tokens[f, :j].tolist())
                x = next(int(t) for t in order[f] if int(t) not in taken)
                logprobs[f, j] = float("-inf")
            tokens[f, j] = x
            w[x] = 0.0
    return tokens, logprobs


def domino_head_expand(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2, *,
                       num_children, temperature=0.0, top_k=0, top_p=1.0, generator=None, a_dtype=None,
                       uniforms=None):
    """Reference of :func:`domino_ops.domino_head_expand` (see there for shapes);
    ``a_dtype`` as :func:`domino_head_rollout`'s; ``uniforms`` [n, num_children] float64:
    the draws to use instead of drawing them from ``generator``."""
    Fn = node_state.shape[0]
    acc = torch.float64 if w2.dtype == torch.float64 else torch.float32
    S = node_state.to(acc)
    rows = node_seq * base_logits.shape[1] + node_depth
    hp = hproj.reshape(-1, hproj.shape[-1])[rows].to(acc)
    a = F.silu(hp + F.linear(S.to(w1s.dtype), w1s).to(acc))
    L = base_logits.reshape(-1, base_logits.shape[-1])[rows].to(acc) + F.linear(a.to(a_dtype or w2.dtype).to(w2.dtype),
                                                                                 w2).to(acc)
    # greedy nodes (all at a scalar temperature 0; those of greedy sequences among sampled
    # ones): the best tokens and their log-probabilities under softmax(L)
    tokens = greedy_children(L, num_children)
    logprobs = torch.log_softmax(L, dim=-1).gather(-1, tokens).float()
    if may_sample(temperature):
        if uniforms is None:
            uniforms = expand_uniforms(node_seq, num_children, generator)

        T = temperature[node_seq] if isinstance(temperature, torch.Tensor) else temperature
        sampled = per_row(effective_temperature(as_kernel_temperature(T)), Fn, torch.float64, L.device)[:, 0] > 0

        def at_sampled(x):  # a [b] per-sequence parameter for the sampled nodes; a number as it is
            return x[node_seq][sampled] if isinstance(x, torch.Tensor) else x

        if bool(sampled.any()):
            s_tokens, s_logprobs = sampled_children(L[sampled], num_children, at_sampled(temperature),
                                                    at_sampled(top_k), at_sampled(top_p), uniforms[sampled])
            tokens[sampled], logprobs[sampled] = s_tokens.to(tokens.device), s_logprobs.to(logprobs.device)
    x = tokens.reshape(-1)
    gi = (gru_input[x] if w_ih is None else F.linear(gru_input[x], w_ih)).to(acc)
    gh = F.linear(S.to(w_hh.dtype), w_hh).to(acc).repeat_interleave(num_children, dim=0)
    child_state = gru_cell(gi, gh, S.repeat_interleave(num_children, dim=0))
    return tokens, logprobs, child_state.view(Fn, num_children, -1).float(), L.float()


def sample(logits, *, temperature=0.0, top_k=0, top_p=1.0, generator=None):
    """Reference of :func:`domino_ops.sample`."""
    if not may_sample(temperature):
        return logits.argmax(dim=-1)
    uniforms = draw_uniforms((logits.shape[0],), logits.device, generator)
    return sample_from_logits(logits, temperature, top_k, top_p, uniforms)[0]


def _pad_after(out: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(out.shape[1], device=out.device)
    return out.masked_fill(pos > num_accepted.unsqueeze(-1), -1)


def positive(d: torch.Tensor) -> torch.Tensor:
    """max(d, 0) with NaN -> 0, as the kernels' fmax."""
    return torch.where(d > 0, d, torch.zeros((), dtype=d.dtype))


def inverse_cdf_pick(w: torch.Tensor, coin) -> int:
    """The first token whose float64 running sum of the weights ``w`` [V] (>= 0; summed in
    index order, as the kernels do) exceeds ``coin * sum(w)``, else (rounding) the last token
    of positive weight, else (no positive weight) token 0."""
    if not 0.0 <= float(coin) < 1.0:  # NaN fails too; the kernels refuse such coins
        raise ValueError(f"a uniform must be in [0, 1), got {float(coin)}")
    if not bool((w > 0).any()):
        return 0
    cdf = torch.cumsum(w.double(), dim=0)
    tok = int(torch.searchsorted(cdf, float(coin) * cdf[-1], right=True).clamp(max=w.numel() - 1))
    while w[tok] <= 0:  # rounding past the last positive weight
        tok -= 1
    return tok


def verify_greedy(draft_tokens, target_logits):
    """Reference of :func:`domino_ops.verify_greedy`."""
    target = target_logits.argmax(dim=-1)
    match = (draft_tokens == target[:, :-1]).to(torch.int64)
    num_accepted = torch.cumprod(match, dim=-1).sum(dim=-1)
    return _pad_after(target, num_accepted), num_accepted


def verify_sampling(draft_tokens, draft_probs, target_probs, *, generator=None):
    """Reference of :func:`domino_ops.verify_sampling`."""
    b, k = draft_tokens.shape
    dev = target_probs.device
    u_accept = draw_uniforms((b, k), dev, generator)
    u_resample = draw_uniforms((b,), dev, generator)
    p = target_probs.double()
    q = draft_probs.double()
    px = p[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    qx = q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    accepted = (u_accept * qx < px).to(torch.int64)
    num_accepted = torch.cumprod(accepted, dim=-1).sum(dim=-1)
    out = torch.cat([draft_tokens, draft_tokens.new_zeros(b, 1)], dim=1)
    for s in range(b):
        n = int(num_accepted[s])
        row = p[s, n]
        w = positive(row - q[s, n]) if n < k else torch.zeros_like(row)
        if not w.sum() > 0:
            w = positive(row)
        out[s, n] = inverse_cdf_pick(w, u_resample[s])
    return _pad_after(out, num_accepted), num_accepted


@torch.no_grad()
def small_batch_linear(x, weight, bias=None):
    """Reference of :func:`domino_ops.small_batch_linear`: ``x @ weight.T + bias`` with
    fp32 accumulation (float64 when any operand is float64, the exact oracle), in x's dtype;
    not differentiable, as the kernel."""
    acc = torch.float64 if torch.float64 in (x.dtype, weight.dtype) else torch.float32
    b = None if bias is None else bias.to(acc)
    return F.linear(x.to(acc), weight.to(acc), b).to(x.dtype)


def unpack_small_batch_linear_weight(data, N, K):
    """The [N, K] weight of a packed ``data``, [P, ceil(K / 2), 48, 2] bfloat16 or
    [P, K, 48, 1] float32 (the inverse of :func:`domino_ops.pack_small_batch_linear_weight`)."""
    P, steps, cols, group = data.shape
    return data.permute(0, 2, 1, 3).reshape(P * cols, steps * group)[:N, :K]


def small_batch_attention(q, k, v, mask=None, scale=None):
    """Reference of :func:`domino_ops.small_batch_attention`: bottom-right causal attention
    of q [B, Hq, M, D] over k, v [B, Hkv, N, D] (query head h reads kv head h // (Hq / Hkv)),
    row m seeing keys j <= N - M + m that ``mask`` (None, bool: False hides, or additive
    float: -inf, or anything at or below bfloat16's lowest finite value, hides) leaves
    visible; fp32 math (float64 when any operand is float64, the exact oracle); a row with
    no visible key gives zeros. Returns [B, Hq, M, D] in q's dtype."""
    acc = torch.float64 if torch.float64 in (q.dtype, k.dtype, v.dtype) else torch.float32
    B, Hq, M, D = q.shape
    N = k.shape[2]
    group = Hq // k.shape[1]
    kk = k.to(acc).repeat_interleave(group, 1)
    vv = v.to(acc).repeat_interleave(group, 1)
    s = (q.to(acc) @ kk.transpose(-1, -2)) * (1.0 / math.sqrt(D) if scale is None else scale)
    pos = torch.arange(N, device=q.device)
    visible = (pos[None, :] <= (N - M + torch.arange(M, device=q.device))[:, None]).expand(B, Hq, M, N)
    if mask is not None:
        if mask.dtype == torch.bool:
            visible = visible & mask
        else:
            s = s + mask.to(acc)
            visible = visible & ~(mask.float() <= HIDDEN_BIAS)  # NaN stays visible: it propagates
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True)
    empty = m == float("-inf")  # no visible key (a NaN score is not "empty": it propagates, as in the kernel)
    p = torch.exp(s - m.masked_fill(empty, 0.0))
    # A hidden key adds nothing, whatever its value (the kernel never reads it: a static
    # cache's unwritten slots may hold NaN), where p @ vv would add 0 * NaN: the finite
    # values through the product, then each non-finite one where its key is visible, as
    # IEEE sums p * v (NaN, or +inf with -inf, is NaN; an underflowed p = 0 times inf is NaN)
    finite = torch.isfinite(vv)
    out = p @ vv.masked_fill(~finite, 0.0)
    seen = lambda rows, values: (rows.to(acc) @ values.to(acc)) > 0  # noqa: E731
    weighted = p > 0  # visible (a hidden key's p is 0; a NaN p already made its row NaN)
    nan = seen(visible, torch.isnan(vv)) | seen(visible & (p == 0), torch.isinf(vv))
    pos, neg = seen(weighted, vv == float("inf")), seen(weighted, vv == float("-inf"))
    out = torch.where(nan | (pos & neg), float("nan"), torch.where(pos, float("inf"), torch.where(neg, float("-inf"), out)))
    out = out / p.sum(-1, keepdim=True).masked_fill(empty, 1.0)
    return out.masked_fill(empty, 0.0).to(q.dtype)


def rms_norm(input, weight, eps):
    """Reference of :func:`domino_ops.rms_norm`: HF's LlamaRMSNorm over the last dimension,
    ``weight * (x / sqrt(mean(x^2) + eps))`` with float32 math (float64 when input is
    float64), the normalized value rounded to input's dtype before the weight product, the
    product in the dtypes' promotion (as HF writes it). input [..., n], weight [n]."""
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    x = input.to(acc)
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(input.dtype)
    return weight * y


def apply_rotary_pos_emb(q, k, cos, sin):
    """Reference of :func:`domino_ops.apply_rotary_pos_emb`: transformers'
    ``apply_rotary_pos_emb`` (``unsqueeze_dim=1``), ``x * cos + rotate_half(x) * sin`` with
    ``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``, each op in the tensors' dtype.
    q [b, Hq, T, D], k [b, Hk, T, D], cos / sin [b or 1, T, D]; returns (q', k')."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def silu_mul(gate, up):
    """Reference of :func:`domino_ops.silu_mul`: ``silu(gate) * up``, each step in the
    tensors' dtype as HF's gated MLPs compute it (``act_fn(gate_proj(x)) * up_proj(x)``)."""
    return F.silu(gate) * up
