"""Independent float64 oracles: the exact results a kernel must reproduce, written from
the paper's equations with torch.nn.GRUCell and numpy, sharing no code with domino_ops."""

import math

import numpy as np
import torch
import torch.nn.functional as F

# fp32 accumulation differs from the float64 oracle by far less than this; an argmax whose
# margin is below it is a coin toss for any implementation, so such examples are skipped.
ARGMAX_MARGIN = 1e-3


def head_rollout_oracle(base, hproj, state, gru_input, w_ih, w_hh, w1s, w2, forced=None):
    """float64 greedy rollout of the Domino head.

    Inputs as built by ``kernel_cases.head_rollout_inputs`` (base [b, k, V], hproj [b, k, r],
    state [b, G], gru_input [V, 3G] with w_ih None (table mode) or [V, H] with w_ih [3G, H],
    w_hh [3G, G], w1s [r, G], w2 [V, r]; any float dtypes). With ``forced`` [b, k] int64
    tokens the GRU is fed those instead of the argmax (to get the exact conditional
    distributions of a sampled rollout).

    Returns float64 / int64 tensors: tokens [b, k], logprobs of those tokens [b, k], final
    state [b, G], final logits [b, k, V] and the top-1 margin per step [b, k] (inf if V = 1).
    """
    d = torch.float64
    b, k, V = base.shape
    G = w_hh.shape[1]
    if w_ih is None:  # table mode == GRUCell over one-hot inputs with weight_ih = table.T
        cell = torch.nn.GRUCell(V, G, bias=False, dtype=d)
        cell.weight_ih.data.copy_(gru_input.to(d).T)
        embed = lambda x: F.one_hot(x, V).to(d)  # noqa: E731
    else:
        cell = torch.nn.GRUCell(w_ih.shape[1], G, bias=False, dtype=d)
        cell.weight_ih.data.copy_(w_ih.to(d))
        embed = lambda x: gru_input.to(d)[x]  # noqa: E731
    cell.weight_hh.data.copy_(w_hh.to(d))
    S = state.to(d)
    tokens, logprobs, logits, margins = [], [], [], []
    with torch.no_grad():
        for i in range(k):
            a = F.silu(hproj[:, i].to(d) + S @ w1s.to(d).T)
            L = base[:, i].to(d) + a @ w2.to(d).T
            top2 = L.topk(min(2, V), dim=-1).values
            margins.append(top2[:, 0] - top2[:, -1] if V > 1 else torch.full((b,), math.inf, dtype=d))
            x = L.argmax(-1) if forced is None else forced[:, i]
            tokens.append(x)
            logprobs.append(torch.log_softmax(L, -1).gather(-1, x[:, None])[:, 0])
            logits.append(L)
            S = cell(embed(x), S)
    return (torch.stack(tokens, 1), torch.stack(logprobs, 1), S, torch.stack(logits, 1),
            torch.stack(margins, 1))


def filtered_probs(L, temperature, top_k, top_p):
    """Exact filtered distribution (numpy float64 [V], sums to 1) of one logit row ``L``
    (array-like [V]): temperature, then top-k by value (ties at the k-th kept), then top-p
    in descending order with ties in index order."""
    z = np.asarray(L, dtype=np.float64) / temperature
    keep = np.ones_like(z, dtype=bool)
    if 0 < top_k < z.size:
        keep &= z >= np.sort(z)[::-1][top_k - 1]
    p = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p /= p.sum()
    if top_p < 1:
        order = np.argsort(-z, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        drop = np.zeros_like(keep)
        drop[order] = before >= top_p
        p = np.where(drop, 0.0, p)
        p /= p.sum()
    return p
