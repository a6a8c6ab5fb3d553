"""Inputs shared by the kernel tests of every backend (the C++ CPU kernels, the CUDA
kernels under the SIMT emulator, the Triton kernels): random cases built on the CPU from a
seed, so a failing case is reproducible from its parameters alone."""

import math

import numpy as np
import torch
from hypothesis import strategies as st

from oracles import filtered_probs, head_rollout_oracle

HEAD_DTYPES = [torch.float32, torch.bfloat16]  # the head's weight and base-logit dtypes


def head_rollout_inputs(b, k, V, r, G, H, wdtype, base_dtype, table, seed):
    """Random ``domino_head_rollout`` inputs, scaled so the correction and the GRU path
    change the argmax. A tuple of 8 CPU tensors in the op's order:

    base [b, k, V] base_dtype, hproj [b, k, r] f32, state [b, G] f32, gru_input ([V, 3G] if
    ``table`` else [V, H]) wdtype, w_ih (None if ``table`` else [3G, H] wdtype),
    w_hh [3G, G], w1s [r, G], w2 [V, r] wdtype.
    """
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0, dtype=wdtype):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    base = rnd(b, k, V, scale=1.5, dtype=base_dtype)
    hproj = rnd(b, k, r, dtype=torch.float32)
    state = rnd(b, G, scale=0.5, dtype=torch.float32)
    w_hh = rnd(3 * G, G, scale=1.5 / math.sqrt(G))
    w1s = rnd(r, G, scale=2.0 / math.sqrt(G))
    w2 = rnd(V, r, scale=1.5 / math.sqrt(r))
    if table:
        return base, hproj, state, rnd(V, 3 * G), None, w_hh, w1s, w2
    return base, hproj, state, rnd(V, H), rnd(3 * G, H, scale=1.0 / math.sqrt(H)), w_hh, w1s, w2


def head_input_strategy(*, b, k, V, r, G, H):
    """Hypothesis strategy of ``head_rollout_inputs`` keyword arguments: each size drawn from
    its list, both dtypes, table and projected GRU inputs, any seed. The size lists are the
    caller's because they follow its kernel's tile sizes (and its speed)."""
    return st.fixed_dictionaries({
        "b": st.sampled_from(b), "k": st.sampled_from(k), "V": st.sampled_from(V),
        "r": st.sampled_from(r), "G": st.sampled_from(G), "H": st.sampled_from(H),
        "wdtype": st.sampled_from(HEAD_DTYPES), "base_dtype": st.sampled_from(HEAD_DTYPES),
        "table": st.booleans(), "seed": st.integers(0, 2**31 - 1),
    })


def weights_as_float64(inputs):
    """The head inputs (as from ``head_rollout_inputs``) with the weights (index 3 on)
    in float64: the eager reference computes in the weights' dtype, so this makes it an
    exact float64 reference. base, hproj and state are left as they are."""
    return [x.double() if x is not None and i >= 3 else x for i, x in enumerate(inputs)]


def head_two_step_population(V, N, wdtype, temperature, top_k=0, top_p=1.0, table=True):
    """N identical 2-step head rollouts and their exact law under the given filter.

    Returns (inputs: the 8 head inputs with b = N (base, hproj, state repeated), joint:
    float64 [V*V] law of x0 * V + x1, p0: float64 [V] law of x0). x1's law depends on x0
    through the GRU, so the oracle is run once per forced x0."""
    one = head_rollout_inputs(1, 2, V, 4, 5, 3, wdtype, torch.float32, table, seed=11)
    inputs = [x.expand(N, *x.shape[1:]).contiguous() if i < 3 else x for i, x in enumerate(one)]
    forced = torch.stack([torch.arange(V), torch.zeros(V, dtype=torch.int64)], 1)
    rows = [x.expand(V, *x.shape[1:]) if i < 3 else x for i, x in enumerate(one)]
    _, _, _, L, _ = head_rollout_oracle(*rows, forced=forced)
    p0 = filtered_probs(L[0, 0].numpy(), temperature, top_k, top_p)
    joint = np.stack([p0[x0] * filtered_probs(L[x0, 1].numpy(), temperature, top_k, top_p) for x0 in range(V)])
    return inputs, joint.ravel(), p0


def uniforms(shape, seed, device="cpu"):
    """float64 uniforms in [0, 1) of ``shape`` on ``device``, drawn on the CPU from ``seed``
    (so every device gets the same values)."""
    return torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(device)


def sample_case(b, V, dtype, ties, seed):
    """logits [b, V] of ``dtype`` (CPU); with ``ties`` rounded to halves, so that repeated
    values exercise top-k's ">= k-th" and top-p's index-ordered ties."""
    logits = torch.randn(b, V, generator=torch.Generator().manual_seed(seed))
    if ties:
        logits = (logits * 2).round() / 2
    return logits.to(dtype)


def verify_greedy_case(b, k, V, dtype, seed):
    """(draft int64 [b, k], logits ``dtype`` [b, k+1, V]) on the CPU: each sequence's drafts
    match the target's argmax up to a random first mismatch (or all the way)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, V, generator=g).to(dtype)
    draft = logits[:, :k].float().argmax(-1)
    cut = torch.randint(0, k + 1, (b,), generator=g)
    for s in range(b):
        if cut[s] < k and V > 1:
            draft[s, cut[s]] = (draft[s, cut[s]] + 1) % V
    return draft, logits


def verify_sampling_case(b, k, V):
    """(draft int64 [b, k], q f32 [b, k, V], p f32 [b, k+1, V]) on the CPU, with varied
    acceptance lengths and one row whose residual max(0, p - q) is all zero (resample
    from p)."""
    g = torch.Generator().manual_seed(b * 100 + k)
    q = torch.softmax(torch.randn(b, k, V, generator=g) * 2, -1)
    p = torch.softmax(torch.randn(b, k + 1, V, generator=g) * 2, -1)
    p[:, :k] = 0.5 * p[:, :k] + 0.5 * q
    p[0, 0] = q[0, 0]
    draft = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(b, k)
    return draft, q, p


def verify_sampling_population(V, N):
    """N rounds of one draft from q, verified against p: (draft int64 [N, 1], q f32 [N, 1, V],
    p f32 [N, 2, V], target: float64 numpy [V], the law p[0] the first output token must
    follow). CPU tensors."""
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(2, V, generator=g), -1)
    q = torch.softmax(torch.randn(1, V, generator=g) * 3, -1)
    draft = torch.multinomial(q[0], N, replacement=True, generator=g)[:, None]
    return draft, q.expand(N, 1, V).contiguous(), p.expand(N, 2, V).contiguous(), p[0].double().numpy()
