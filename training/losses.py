"""Per-position losses of the drafter's logits against the target (CE on its greedy token,
or a distillation of its stored top-K distribution)."""

from __future__ import annotations

import torch

LOSSES = ("ce", "kl", "ce_tv")


def per_token_loss(kind: str, logits: torch.Tensor, labels: torch.Tensor, top_ids: torch.Tensor | None,
                   top_logprobs: torch.Tensor | None) -> torch.Tensor:
    """Loss [M, n] of draft logits [M, n, V] against the target at each position:

    - "ce": cross-entropy with the target's greedy token ``labels`` [M, n];
    - "kl": KL(p || q) from the target's top-K distribution p (ids / log-probabilities
      [M, n, K], renormalised over the K) to the draft's q = softmax(logits);
    - "ce_tv": cross-entropy plus the total variation 0.5 * sum |p - q| (q's mass outside
      the K counts fully), which bounds the rejection rate of rejection sampling.
    """
    logq = torch.log_softmax(logits.float(), dim=-1)
    if kind == "ce":
        return -logq.gather(-1, labels[..., None])[..., 0]
    if top_ids is None:
        raise ValueError(f"--loss {kind} needs the target's top-K log-probabilities in the data "
                         "(shards written by training.generate_data with --top-k)")
    logp = torch.log_softmax(top_logprobs, dim=-1)  # renormalised over the stored top-K
    logp = torch.where(torch.isfinite(logp), logp, torch.full_like(logp, -1e4))  # padded (invalid) rows
    logq_k = logq.gather(-1, top_ids)
    if kind == "kl":
        return (logp.exp() * (logp - logq_k)).sum(-1)
    if kind == "ce_tv":
        q_k = logq_k.exp()
        tv = 0.5 * ((logp.exp() - q_k).abs().sum(-1) + (1 - q_k.sum(-1)).clamp(min=0))
        return -logq.gather(-1, labels[..., None])[..., 0] + tv
    raise ValueError(f"loss must be one of {LOSSES}, got {kind!r}")
