"""Fake (meta) implementations so torch.compile can trace the ops. Every op writes into
caller-provided outputs and returns nothing, so the fakes only need to exist."""

import torch


@torch.library.register_fake("domino_ops::domino_head_rollout")
def _domino_head_rollout_fake(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature,
                              top_k, top_p, uniforms, write_logits, tokens, logprobs, state_out):
    return None


@torch.library.register_fake("domino_ops::sample")
def _sample_fake(logits, temperature, top_k, top_p, uniforms, tokens):
    return None


@torch.library.register_fake("domino_ops::verify_greedy")
def _verify_greedy_fake(draft_tokens, target_logits, out_tokens, num_accepted):
    return None


@torch.library.register_fake("domino_ops::verify_sampling")
def _verify_sampling_fake(draft_tokens, draft_probs, target_probs, uniforms_accept, uniforms_resample,
                          out_tokens, num_accepted):
    return None


@torch.library.register_fake("domino_ops::small_batch_linear")
def _small_batch_linear_fake(x, weight, bias, out):
    return None
