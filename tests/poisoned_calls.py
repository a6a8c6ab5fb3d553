"""Calls of the schema-shaped ops (outputs passed in, as torch.ops.domino_ops.*, the
emulated CUDA ops and the Triton kernels take them) with every output pre-filled with
garbage, so that an element a kernel forgets to write fails the comparison."""

import torch

from conftest import POISON_TOKEN


def _poisoned_tokens(*shape, device):
    return torch.full(shape, POISON_TOKEN, dtype=torch.int64, device=device)


def run_head_poisoned(op, inputs, *, device="cpu", temperature=0.0, top_k=0, top_p=1.0, u=None,
                      write_logits=False):
    """Runs ``op`` (a ``domino_head_rollout`` with outputs passed in) on ``device``.

    ``inputs``: the 8 head inputs (see ``kernel_cases.head_rollout_inputs``), moved to
    ``device``; ``u``: float64 uniforms [b, k] or None (greedy). Returns CPU tensors
    (tokens int64 [b, k], logprobs f32 [b, k], state_out f32 [b, G], base [b, k, V]): base is
    the base logits after the call, the final logits if ``write_logits``. On the CPU the
    call writes into ``inputs[0]`` itself, so clone it first to keep the original.
    """
    base, hproj, state, gru_input, w_ih, w_hh, w1s, w2 = [x.to(device) if x is not None else None for x in inputs]
    b, k, _ = base.shape
    tokens = _poisoned_tokens(b, k, device=device)
    logprobs = torch.full((b, k), float("nan"), device=device)
    state_out = torch.full_like(state, float("nan"))
    op(base, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature, top_k, top_p,
       u.to(device) if u is not None else None, write_logits, tokens, logprobs, state_out)
    return tokens.cpu(), logprobs.cpu(), state_out.cpu(), base.cpu()


def run_sample_poisoned(op, logits, temperature, top_k, top_p, u):
    """Runs ``op`` (a ``sample`` with outputs passed in) on logits [b, V] (f32/bf16) with
    uniforms u (float64 [b], or None when greedy) on the logits' device: tokens int64 [b]."""
    tokens = _poisoned_tokens(logits.shape[0], device=logits.device)
    op(logits, temperature, top_k, top_p, u, tokens)
    return tokens


def run_verify_poisoned(op, draft, *args):
    """Runs ``op`` (``verify_greedy`` or ``verify_sampling`` with outputs passed in) as
    op(draft, *args, out, accepted) on the draft's device; draft int64 [b, k]. Returns
    (out int64 [b, k+1], accepted int64 [b])."""
    b, k = draft.shape
    out = _poisoned_tokens(b, k + 1, device=draft.device)
    accepted = _poisoned_tokens(b, device=draft.device)
    op(draft, *args, out, accepted)
    return out, accepted
