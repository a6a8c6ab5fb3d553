"""Acceptance measured the way generation runs, on cached held-out conversations.

Generation drafts after the first response token (the target picks it at prefill), keeps
the accepted drafts plus one target token, and drafts again from there. Stepping through
a held-out response the same way, with the target's cached features as context and its
greedy response as the verifier's choice, visits exactly the anchors generation visits;
acceptance is pooled as tokens ÷ rounds over all conversations (a long response weighs
as many rounds as it takes), the number :mod:`benchmarks.eval_acceptance` reports through
the real generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from domino.model import DominoDraftModel
from training.data import Conversation, make_batch


@dataclass
class Round:
    conversation: int  # index into the evaluated conversations
    anchor_pos: int  # position of the anchor (the last verified token)
    drafts: list[int]  # the drafted tokens (as the generator drafts them: no more than max_new_tokens can take)
    advanced: int  # tokens this round adds: accepted drafts + the target's own, cut at the end


@torch.no_grad()
def stepped_rounds(model: DominoDraftModel, convs: list[Conversation], *, use_head: bool,
                   max_new_tokens: int | None = None, batch_size: int = 32) -> Iterator[Round]:
    """The verification rounds greedy generation makes on each conversation's response
    (up to ``max_new_tokens`` response tokens), ``batch_size`` conversations in lockstep.
    Each round drafts a whole block; like the generator's, a round's drafts stop where
    ``max_new_tokens`` can take no more (the generator drafts the first tokens of the same
    block, so the same tokens; what a round advances is the same either way)."""
    c = model.config
    for first in range(0, len(convs), batch_size):
        group = convs[first:first + batch_size]
        pos = [cv.prompt_len for cv in group]  # anchor: response[0], the target's pick at prefill
        end = [len(cv.tokens) - 1 if max_new_tokens is None else min(len(cv.tokens), cv.prompt_len + max_new_tokens) - 1
               for cv in group]
        active = [j for j in range(len(group)) if pos[j] < end[j]]
        while active:
            batch = make_batch([group[j] for j in active], 1, c.block_size, c.num_drafts, c.mask_token_id, None,
                               anchors=torch.tensor([[pos[j]] for j in active])).to(model.fc.weight.device)
            h = model.packed_draft_hidden(*batch.backbone_inputs())
            drafts = model.choose_tokens(h, model.base_logits(h), batch.anchors.reshape(-1), use_head=use_head).tokens
            ok = (drafts == batch.labels[:, 0]) & batch.label_valid[:, 0]
            accepted = torch.cumprod(ok.to(torch.int64), dim=1).sum(1).tolist()
            for row, j in enumerate(active):
                advanced = min(accepted[row] + 1, end[j] - pos[j])
                # as the generator's: no more drafts than max_new_tokens still takes after the
                # response's first `taken` tokens (the anchor's included), less the target's own
                taken = pos[j] - group[j].prompt_len + 1
                room = c.num_drafts if max_new_tokens is None else max_new_tokens - taken - 1
                yield Round(first + j, pos[j], drafts[row, :room].tolist(), advanced)
                pos[j] += advanced
            active = [j for j in active if pos[j] < end[j]]


def generation_acceptance(model: DominoDraftModel, convs: list[Conversation], *, use_head: bool,
                          max_new_tokens: int | None = None) -> float:
    """Mean tokens per verification round (accepted drafts + 1), pooled over every round
    greedy generation makes on the held-out responses."""
    tokens = rounds = 0
    for r in stepped_rounds(model, convs, use_head=use_head, max_new_tokens=max_new_tokens):
        tokens += r.advanced
        rounds += 1
    return tokens / max(rounds, 1)
