"""Training data: regenerated conversations with their cached target features, and the
packed anchor batches the trainer consumes."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file


@dataclass
class Conversation:
    tokens: torch.Tensor  # [T] int64: prompt + response
    prompt_len: int
    features: torch.Tensor | None  # [T - 1, n*H] bf16: the target's features of tokens[:-1]
    # The target's top-K log-probabilities at each response token (shards written since the
    # distillation data exists): [T - prompt_len, K] int32 ids / float16 log-probabilities.
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None

    @property
    def anchor_range(self) -> tuple[int, int]:
        """Anchors p with a response token at p and p + 1: [prompt_len, T - 2]."""
        return self.prompt_len, len(self.tokens) - 2


def shard_path(directory: Path, i: int) -> Path:
    """Shard ``i``'s token file in a dataset directory (training.generate_data writes them)."""
    return Path(directory) / f"shard_{i:05d}.jsonl"


def shard_index(path: Path) -> int:
    """The index of a shard's token file (the inverse of :func:`shard_path`)."""
    return int(Path(path).stem.split("_")[1])


def shard_prompts(directory: Path, shard: int) -> set[tuple[int, ...]]:
    """The prompts (token ids) of shard ``shard`` in ``directory``."""
    return {tuple(json.loads(line)["prompt_ids"]) for line in shard_path(directory, shard).open() if line.strip()}


def held_out_prompts(directory: Path, shards) -> set[tuple[int, ...]]:
    """The prompts of the held-out ``shards`` that exist in ``directory``: a later pass over
    the prompt order (generate_data --passes) repeats them in other shards, which neither
    training nor the datastore may read."""
    return set().union(*(shard_prompts(directory, i) for i in shards if shard_path(directory, i).exists()))


def repeats_held_out(prompts, held: set[tuple[int, ...]]) -> bool:
    """Whether any of ``prompts`` (token-id sequences: one shard's) is one of the ``held``
    out prompts (:func:`held_out_prompts`): such a shard is read by neither training, the
    draft vocabulary nor the datastore."""
    return not held.isdisjoint(tuple(p) for p in prompts)


def load_shards(directory: Path, shards: list[int] | None = None, max_shards: int | None = None,
                layer_ids: list[int] | None = None, features: bool = True) -> list[Conversation]:
    """Reads complete shards (the jsonl marks completion) and their features; with
    ``layer_ids`` (a drafter's ``target_layer_ids``), raises ValueError for a shard whose
    features come from other target layers. With ``features=False``, the token ids only
    (``features`` and the top-k are None: the trainer's ``--target-features computed``
    has the target compute them for each step's conversations)."""
    out = []
    files = sorted(Path(directory).glob("shard_*.jsonl"))
    if shards is not None:
        files = [f for f in files if shard_index(f) in shards]
    for f in files[:max_shards]:
        feats = shard_features(f, layer_ids) if features else None
        offsets, r_off = (feats["offsets"], feats.get("response_offsets")) if feats is not None else (None, None)
        for i, line in enumerate(f.read_text().splitlines()):
            rec = json.loads(line)
            if len(rec["response_ids"]) < 2:
                continue
            conv = Conversation(torch.tensor(rec["prompt_ids"] + rec["response_ids"]), len(rec["prompt_ids"]), None)
            if feats is not None:
                conv.features = feats["features"][offsets[i]:offsets[i + 1]]
                if r_off is not None:
                    conv.top_ids = feats["top_ids"][r_off[i]:r_off[i + 1]]
                    conv.top_logprobs = feats["top_logprobs"][r_off[i]:r_off[i + 1]]
            out.append(conv)
    return out


def shard_features(shard: Path, layer_ids: list[int] | None) -> dict:
    """The tensors stored beside ``shard`` (its .features.safetensors), with "offsets" and
    "response_offsets" as lists; raises ValueError when there are none, or (with
    ``layer_ids``) when they come from other target layers."""
    path = str(shard.with_suffix(".features.safetensors"))
    if not Path(path).exists():
        raise ValueError(f"{shard.name} has no features ({Path(path).name}: token shards are committed, features "
                         f"are not): rebuild them with python -m training.generate_data --out {shard.parent} "
                         "--target-tokens 0 (and the same --target), train with --target-features computed, or "
                         "leave the shard out of --train-shards")
    if layer_ids is not None:
        with safe_open(path, "pt") as sf:
            made = json.loads((sf.metadata() or {}).get("layer_ids", "null"))
        if made is not None and list(made) != list(layer_ids):
            raise ValueError(f"{path} holds the features of target layers {made}, but the drafter reads "
                             f"{list(layer_ids)} (its config's target_layer_ids): regenerate the features, or "
                             f"train a drafter configured for these layers")
    feats = load_file(path)
    feats["offsets"] = feats["offsets"].tolist()
    if "response_offsets" in feats:
        feats["response_offsets"] = feats["response_offsets"].tolist()
    return feats


@dataclass
class AnchorBatch:
    """Several anchors per sequence, packed for one backbone forward.

    Each sequence's context (target features at positions [0, Tc)) is projected once; every
    block [x_p, MASK, ...] sees only context strictly before its anchor p and its own block.
    """

    features: torch.Tensor  # [N, Tc, n*H]
    ctx_valid: torch.Tensor  # [N, Tc] bool
    block_tokens: torch.Tensor  # [N, A*B]
    block_pos: torch.Tensor  # [N, A*B]
    attn_mask: torch.Tensor  # [N, A*B, Tc + A*B] bool
    anchors: torch.Tensor  # [N, A] token at each anchor
    teacher: torch.Tensor  # [N, A, n] GRU inputs under teacher forcing: x_p, x_{p+1}, ...
    labels: torch.Tensor  # [N, A, n] x_{p+1+k}
    label_valid: torch.Tensor  # [N, A, n] bool
    # The target's top-K distribution at each label (when the data has it): ids [N, A, n, K]
    # int64 and log-probabilities [N, A, n, K] float32 (-inf where the label is not valid).
    label_top_ids: torch.Tensor | None = None
    label_top_logprobs: torch.Tensor | None = None
    # None: labels and top-K ids are target token ids. Else the draft vocabulary [K] int64
    # (ascending target ids) they index into (restrict_to_draft_vocab).
    draft_vocab: torch.Tensor | None = None

    @property
    def num_anchors(self) -> int:
        """A: the anchors (draft blocks) per sequence."""
        return self.anchors.shape[1]

    def to(self, device: torch.device | str) -> "AnchorBatch":
        """The same batch with every tensor on ``device``."""
        return AnchorBatch(*[None if t is None else t.to(device, non_blocking=True)
                             for t in (getattr(self, f) for f in self.__dataclass_fields__)])

    def backbone_inputs(self) -> tuple[torch.Tensor, ...]:
        """The arguments of :meth:`DominoDraftModel.packed_draft_hidden`."""
        return self.features, self.ctx_valid, self.block_tokens, self.block_pos, self.attn_mask


def with_target_argmax_labels(batch: AnchorBatch) -> AnchorBatch:
    """The batch with every valid label replaced by the target's most likely token at that
    position (``label_top_ids[..., 0]``, the stored top-K sorted by log-probability), where
    ``labels`` [N, A, n] holds the response's own next tokens.

    On a response the target sampled (T > 0) about a quarter of the next tokens are not the
    target's greedy choice given the same prefix; greedy verification accepts the greedy
    choice, so these are the labels a drafter for greedy decoding should fit. The contexts,
    the target features and the GRU's teacher-forced inputs stay the sampled text: the
    stored top-K at each position was computed on exactly that prefix.
    """
    if batch.label_top_ids is None:
        raise ValueError("target-argmax labels need the target's stored top-K ids (the shards' features "
                         "hold none: rebuild them with training.generate_data --target-tokens 0)")
    if batch.draft_vocab is not None:
        raise ValueError("replace the labels before restrict_to_draft_vocab: its labels are draft-vocabulary indices")
    labels = torch.where(batch.label_valid, batch.label_top_ids[..., 0], batch.labels)
    return replace(batch, labels=labels)


def restrict_to_draft_vocab(batch: AnchorBatch, draft_vocab: torch.Tensor, vocab_size: int) -> AnchorBatch:
    """The batch with its labels and top-K ids as indices into ``draft_vocab`` [K] (ascending
    target ids; a drafter with a draft vocabulary drafts from those K tokens only), so the
    loss is over the K tokens drafting chooses from, at K/V of the LM head's cost. A label
    outside it is marked not valid (it can never be drafted, so there is nothing to learn
    there); a top-K entry outside it gets log-probability -inf (the rest renormalise)."""
    if batch.draft_vocab is not None:
        raise ValueError("batch is already restricted to a draft vocabulary")
    index = torch.full((vocab_size,), -1, dtype=torch.int64)
    index[draft_vocab] = torch.arange(draft_vocab.numel())
    labels = index[batch.labels]
    top_ids, top_lp = batch.label_top_ids, batch.label_top_logprobs
    if top_ids is not None:
        top_ids = index[top_ids]
        top_lp = torch.where(top_ids >= 0, top_lp, float("-inf"))
        top_ids = top_ids.clamp(min=0)
    return replace(batch, labels=labels.clamp(min=0), label_valid=batch.label_valid & (labels >= 0),
                   label_top_ids=top_ids, label_top_logprobs=top_lp, draft_vocab=draft_vocab.to(torch.int64))


def sample_anchors(convs: list[Conversation], anchors_per_seq: int, generator: torch.Generator) -> torch.Tensor:
    """Anchor positions [N, A] int64, uniform over each conversation's response."""
    ps = []
    for c in convs:
        lo, hi = c.anchor_range
        ps.append(torch.randint(lo, hi + 1, (anchors_per_seq,), generator=generator))
    return torch.stack(ps)


def make_batch(convs: list[Conversation], anchors_per_seq: int, block_size: int, num_drafts: int,
               mask_token_id: int, generator: torch.Generator | None, anchors: torch.Tensor | None = None) -> AnchorBatch:
    """Packs ``anchors_per_seq`` anchors per conversation: sampled uniformly over its
    response, or the given positions ``anchors`` [N, A] (then ``generator`` is unused)."""
    ps = sample_anchors(convs, anchors_per_seq, generator) if anchors is None else anchors
    N, A, B, n = len(convs), ps.shape[1], block_size, num_drafts
    Tc = int(ps.max())  # context needed: positions < max anchor
    nH = convs[0].features.shape[1]
    features = torch.zeros(N, Tc, nH, dtype=convs[0].features.dtype)
    ctx_valid = torch.zeros(N, Tc, dtype=torch.bool)
    labels = torch.zeros(N, A, n, dtype=torch.int64)
    label_valid = torch.zeros(N, A, n, dtype=torch.bool)
    teacher = torch.zeros(N, A, n, dtype=torch.int64)
    for s, c in enumerate(convs):
        T = len(c.tokens)
        m = min(Tc, c.features.shape[0])
        features[s, :m] = c.features[:m]
        ctx_valid[s, :m] = True
        for a in range(A):
            p = int(ps[s, a])
            idx = p + 1 + torch.arange(n)
            ok = idx < T
            labels[s, a, ok] = c.tokens[idx[ok]]
            label_valid[s, a] = ok
            tidx = p + torch.arange(n)
            tok = tidx < T
            teacher[s, a, tok] = c.tokens[tidx[tok]]
    top_ids = top_lp = None
    if all(c.top_ids is not None for c in convs):
        K = convs[0].top_ids.shape[1]
        top_ids = torch.zeros(N, A, n, K, dtype=torch.int64)
        top_lp = torch.full((N, A, n, K), float("-inf"))
        for s, c in enumerate(convs):
            for a in range(A):
                idx = int(ps[s, a]) + 1 + torch.arange(n)
                ok = idx < len(c.tokens)
                r = idx[ok] - c.prompt_len  # response index of each label: its target distribution
                top_ids[s, a, ok] = c.top_ids[r].long()
                top_lp[s, a, ok] = c.top_logprobs[r].float()
    anchors = torch.stack([c.tokens[ps[s]] for s, c in enumerate(convs)])
    block_tokens = torch.full((N, A, B), mask_token_id, dtype=torch.int64)
    block_tokens[:, :, 0] = anchors
    block_pos = ps[:, :, None] + torch.arange(B)
    # context part: key position < anchor; block part: same block only
    ctx_part = torch.arange(Tc)[None, None, :] < ps[:, :, None]  # [N, A, Tc]
    ctx_part = (ctx_part & ctx_valid[:, None, :])[:, :, None, :].expand(N, A, B, Tc).reshape(N, A * B, Tc)
    block_id = torch.arange(A).repeat_interleave(B)
    blk_part = (block_id[:, None] == block_id[None, :])[None].expand(N, -1, -1)
    return AnchorBatch(features, ctx_valid, block_tokens.view(N, A * B), block_pos.view(N, A * B),
                       torch.cat([ctx_part, blk_part], dim=2), anchors, teacher, labels, label_valid, top_ids, top_lp)
