"""Fake (meta) implementations so torch.compile can trace the ops. Most ops write into
caller-provided outputs and return nothing, so their fakes only check devices; the layer
ops (``decoder_layers``, ``draft_layers``) return their outputs' shapes."""

import torch


@torch.library.register_fake("domino_ops::domino_head_rollout")
def _domino_head_rollout_fake(base_logits, hproj, state, gru_input, w_ih, w_hh, w1s, w2, temperature,
                              top_k, top_p, uniforms, write_logits, tokens, logprobs, state_out):
    return None


@torch.library.register_fake("domino_ops::domino_head_expand")
def _domino_head_expand_fake(base_logits, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2,
                             temperature, top_k, top_p, uniforms, child_tokens, child_logprobs, child_state,
                             node_logits, w2_packed=None, w_hh_packed=None, row_temperature=None, row_top_k=None,
                             row_top_p=None):
    return None


@torch.library.register_fake("domino_ops::sample")
def _sample_fake(logits, temperature, top_k, top_p, uniforms, tokens):
    return None


@torch.library.register_fake("domino_ops::filtered_probs")
def _filtered_probs_fake(logits, temperature, top_k, top_p, probs, row_temperature=None, row_top_k=None,
                         row_top_p=None):
    return None


@torch.library.register_fake("domino_ops::verify_greedy")
def _verify_greedy_fake(draft_tokens, target_logits, out_tokens, num_accepted):
    return None


@torch.library.register_fake("domino_ops::verify_sampling")
def _verify_sampling_fake(draft_tokens, draft_probs, target_probs, uniforms_accept, uniforms_resample,
                          out_tokens, num_accepted):
    return None


@torch.library.register_fake("domino_ops::build_tree_kernel_efficient")
def _build_tree_kernel_efficient_fake(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                      retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                      draft_token_num, tree_mask_mode):
    return None


@torch.library.register_fake("domino_ops::verify_tree_greedy")
def _verify_tree_greedy_fake(predicts, accept_index, accept_token_num, candidates, retrive_index,
                             retrive_next_token, retrive_next_sibling, target_predict):
    return None


@torch.library.register_fake("domino_ops::tree_speculative_sampling_target_only")
def _tree_speculative_sampling_target_only_fake(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                                retrive_next_token, retrive_next_sibling, uniform_samples,
                                                uniform_samples_for_final_sampling, target_probs, draft_probs,
                                                threshold_single, threshold_acc, deterministic):
    return None


@torch.library.register_fake("domino_ops::verify_tree_sampling")
def _verify_tree_sampling_fake(predicts, accept_index, accept_token_num, candidates, retrive_index,
                               retrive_next_token, retrive_next_sibling, uniform_samples,
                               uniform_samples_for_final_sampling, target_probs, draft_probs):
    return None


def _one_device(op: str, **tensors) -> None:
    """The fake kernels also run when a caller mixes a meta tensor with real ones (the
    dispatcher picks them for any meta argument): refuse that, as the kernels would, rather
    than leave a real ``out`` unwritten."""
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len({d.type for d in devices.values()}) > 1:
        raise RuntimeError(f"{op}: every tensor must be on one device, got "
                           + ", ".join(f"{name} on {d}" for name, d in devices.items()))


@torch.library.register_fake("domino_ops::small_batch_linear")
def _small_batch_linear_fake(x, weight, bias, out):
    _one_device("small_batch_linear", x=x, weight=weight, bias=bias, out=out)


@torch.library.register_fake("domino_ops::small_batch_linear_packed")
def _small_batch_linear_packed_fake(x, packed_weight, out_features, bias, out):
    _one_device("small_batch_linear_packed", x=x, packed_weight=packed_weight, bias=bias, out=out)


@torch.library.register_fake("domino_ops::small_batch_attention")
def _small_batch_attention_fake(q, k, v, mask, scale, out):
    _one_device("small_batch_attention", q=q, k=k, v=v, mask=mask, out=out)


@torch.library.register_fake("domino_ops::rms_norm")
def _rms_norm_fake(input, weight, eps, out):
    _one_device("rms_norm", input=input, weight=weight, out=out)


@torch.library.register_fake("domino_ops::silu_mul")
def _silu_mul_fake(gate, up, out):
    _one_device("silu_mul", gate=gate, up=up, out=out)


@torch.library.register_fake("domino_ops::apply_rotary_pos_emb")
def _apply_rotary_pos_emb_fake(q, k, cos, sin, q_out, k_out):
    _one_device("apply_rotary_pos_emb", q=q, k=k, cos=cos, sin=sin, q_out=q_out, k_out=k_out)


def _listed(name: str, tensors) -> dict:
    """A tensor list's entries by name (``name[i]``), Nones left out, for :func:`_one_device`."""
    return {f"{name}[{i}]": t for i, t in enumerate(tensors) if t is not None}


@torch.library.register_fake("domino_ops::draft_context")
def _draft_context_fake(features, cos, sin, fc_packed, fc_bias, hidden_norm_weight, hidden_eps, key_stores,
                        value_stores, past, weights, heads, eps):
    _one_device("draft_context", features=features, cos=cos, sin=sin, fc_packed=fc_packed, fc_bias=fc_bias,
                hidden_norm_weight=hidden_norm_weight, **_listed("key_stores", key_stores),
                **_listed("value_stores", value_stores), **_listed("weights", weights))


@torch.library.register_fake("domino_ops::decoder_layers")
def _decoder_layers_fake(x, cos, sin, mask, weights, heads, eps, scale, key_stores, value_stores, past, keep_hidden):
    _one_device("decoder_layers", x=x, cos=cos, sin=sin, mask=mask, **_listed("weights", weights),
                **_listed("key_stores", key_stores), **_listed("value_stores", value_stores))
    # every layer's output (keep_hidden), or the last one's, each of x's shape
    return [torch.empty_like(x) for _ in range(len(key_stores) if keep_hidden else 1)]


@torch.library.register_fake("domino_ops::draft_layers")
def _draft_layers_fake(x, cos, sin, mask, key_stores, value_stores, past, weights, heads, eps, row_start, row_stop):
    _one_device("draft_layers", x=x, cos=cos, sin=sin, mask=mask, **_listed("key_stores", key_stores),
                **_listed("value_stores", value_stores), **_listed("weights", weights))
    return x.new_empty(x.shape[0], row_stop - row_start, x.shape[2])
