"""Inputs and exact expectations shared by the tests of every kernel backend (the CUDA
kernels under the SIMT emulator, the Triton kernels under the interpreter)."""

import numpy as np
import torch

from conftest import POISON_TOKEN
from test_domino_head_rollout import filtered_probs, make_inputs, oracle


def run_head_poisoned(op, inputs, *, temperature=0.0, top_k=0, top_p=1.0, u=None, write_logits=False):
    """Calls a schema-shaped ``domino_head_rollout`` (outputs passed in) with outputs
    pre-filled with garbage, so an unwritten element fails. Returns (tokens, logprobs,
    state_out) on the inputs' device."""
    base, hproj, state, gru_input, w_ih, w_hh, w1s, w2 = inputs
    b, k, _ = base.shape
    tokens = torch.full((b, k), POISON_TOKEN, dtype=torch.int64, device=base.device)
    logprobs = torch.full((b, k), float("nan"), device=base.device)
    state_out = torch.full_like(state, float("nan"))
    op(base, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k, top_p, u, write_logits, tokens,
       logprobs, state_out)
    return tokens, logprobs, state_out


def verify_greedy_case(b, k, V, dtype, seed):
    """(draft [b, k], logits [b, k+1, V]): each sequence's drafts match the target's argmax
    up to a random first mismatch (or all the way)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, V, generator=g).to(dtype)
    draft = logits[:, :k].float().argmax(-1)
    cut = torch.randint(0, k + 1, (b,), generator=g)
    for s in range(b):
        if cut[s] < k and V > 1:
            draft[s, cut[s]] = (draft[s, cut[s]] + 1) % V
    return draft, logits


def verify_sampling_case(b, k, V):
    """(draft [b, k], q [b, k, V], p [b, k+1, V]) with varied acceptance lengths and one
    row whose residual max(0, p - q) is all zero (resample from p)."""
    g = torch.Generator().manual_seed(b * 100 + k)
    q = torch.softmax(torch.randn(b, k, V, generator=g) * 2, -1)
    p = torch.softmax(torch.randn(b, k + 1, V, generator=g) * 2, -1)
    p[:, :k] = 0.5 * p[:, :k] + 0.5 * q
    p[0, 0] = q[0, 0]
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(b, k)
    return draft, q, p


def verify_sampling_population(V, N):
    """N rounds of one draft from q, verified against p: (draft [N, 1], q [N, 1, V],
    p [N, 2, V], the target row p[0] the first output token must follow)."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, V, generator=g), -1)
    q = torch.softmax(torch.randn(1, V, generator=g) * 3, -1)
    draft = torch.multinomial(q[0], N, replacement=True, generator=g)[:, None]
    return draft, q.expand(N, 1, V).contiguous(), p.expand(N, 2, V).contiguous(), p[0].double().numpy()


def race_population(V, N, temperature, wdtype):
    """N identical 2-step head rollouts and their exact law: (inputs, joint [V*V] of
    (x0, x1), p0 [V] the law of x0)."""
    one = make_inputs(1, 2, V, 4, 5, 3, wdtype, torch.float32, True, seed=11)
    inputs = [x.expand(N, *x.shape[1:]).contiguous() if i < 3 else x for i, x in enumerate(one)]
    forced = torch.stack([torch.arange(V), torch.zeros(V, dtype=torch.int64)], 1)
    rows = [x.expand(V, *x.shape[1:]) if i < 3 else x for i, x in enumerate(one)]
    _, _, _, L, _ = oracle(*rows, forced=forced)
    p0 = filtered_probs(L[0, 0].numpy(), temperature, 0, 1.0)
    joint = np.stack([p0[x0] * filtered_probs(L[x0, 1].numpy(), temperature, 0, 1.0) for x0 in range(V)])
    return inputs, joint.ravel(), p0
