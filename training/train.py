"""Trains a Domino drafter on target-regenerated data (paper section 4.2 / appendix A.1).

    python -m training.train --data training/data/smollm2 --out training/runs/default --steps 800
    torchrun --nproc-per-node 2 -m training.train ...        # data-parallel (gloo on CPU)

Target frozen (its features are cached beside the data; its embedding and LM head are
borrowed). Per sequence, anchors are sampled over the response; each block
[x_p, MASK, ...] sees the context strictly before p, all blocks of a sequence in one
packed forward. The GRU is teacher-forced (``--ttt`` feeds it the drafter's own argmax
instead). Loss ``(1 - lam) * loss(final) + lam * loss(base)`` with lam going linearly
1 -> 0 (``--no-curriculum``: lam = 0), both weighted per draft position by exp(-k / gamma)
(``--position-weights acceptance``: by each position's share of the block's expected accepted
length under the drafter's own label probabilities, ``acceptance_weights``);
``--loss`` is CE on the target's greedy token (default) or a distillation of its stored
top-K distribution (KL, or CE + total variation). Every ``--eval-every`` steps the log gets
the acceptance generation would see on held-out conversations (training/evaluate.py) and,
with ``--eval-generator-prompts``, the acceptance through the real generator on HumanEval
prompts (the benchmark of record, benchmarks/eval_acceptance.py).
AdamW, cosine schedule with warmup, gradient clipping. A checkpoint is written atomically
every ``--ckpt-every`` steps; a killed run resumes from it with the same data order (the
batch of step s depends only on the seed and s).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from domino.budget import Calibration
from domino.model import DominoDraftModel
from training.chunked_loss import chunked_draft_loss, label_logprobs
from training.data import (AnchorBatch, Conversation, held_out_prompts, load_shards, make_batch, repeats_held_out,
                           restrict_to_draft_vocab, shard_index, shard_prompts, with_target_argmax_labels)
from training.draft_vocab import most_frequent, response_counts
from training.evaluate import generation_acceptance
from training.losses import LOSSES, per_token_loss


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls are faster than fp32 on ``device``: a GPU, or a CPU with bf16 dot
    products (AVX512-BF16 or AMX)."""
    if device.type != "cpu":
        return True
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def position_weights(n: int, gamma: float) -> torch.Tensor:
    """[n] float32 loss weights ``exp(-k / gamma)`` of draft positions k = 0 .. n-1 (the
    paper's position decay)."""
    return torch.exp(-torch.arange(n, dtype=torch.float32) / gamma)


POSITION_WEIGHTS = ("decay", "acceptance")


def acceptance_weights(q: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Loss weights [M, n], unnormalised, that make the CE gradient follow the expected
    accepted length.

    ``q`` [M, n]: the drafter's probability of each block position's label (teacher-forced,
    so position k sees the true tokens before it, as a round does once it reaches k);
    ``valid`` [M, n] bool: whether a position has a label (one that has none weighs 0 and
    ends its block's chain). With E[tau] = sum_m prod_{j<=m} q_j the block's expected
    accepted drafts, position k gets c_k = dE[tau]/dq_k = prod_{j<k} q_j * (1 + q_{k+1} +
    q_{k+1} q_{k+2} + ...): the chance a round reaches it times the run it would unlock.
    Since d(-log q_k) = -dq_k / q_k, sum_k c_k CE_k descends E[tau] with each term scaled
    by 1 / q_k, so a position the drafter gets wrong keeps its gradient. Detached."""
    q = torch.where(valid, q.detach().float(), torch.zeros_like(q, dtype=torch.float32))
    reach = torch.cumprod(torch.cat([torch.ones_like(q[:, :1]), q[:, :-1]], dim=1), dim=1)
    run = torch.ones_like(q)  # run[k] = 1 + q_{k+1} run[k+1]
    for k in range(q.shape[1] - 2, -1, -1):
        run[:, k] = 1 + q[:, k + 1] * run[:, k + 1]
    return torch.where(valid, reach * run, torch.zeros_like(q))


def forward_batch(model: DominoDraftModel, batch: AnchorBatch, *, kind: str, weights: torch.Tensor, lam: float,
                  ttt: bool, autocast: bool, acceptance: bool = False):
    """``(loss, loss_base, loss_final)`` float32 scalars for a packed anchor batch:
    ``(1 - lam) * final + lam * base``, the ``kind`` loss per draft position weighted by
    ``weights`` [N*A, n] (normaliser included), or with ``acceptance`` (teacher forcing
    only) by :func:`acceptance_weights` of the final logits' label probabilities (one more
    pass over the logits, without gradients), scaled to the total of ``weights`` over all
    ranks. Teacher forcing computes the logits a chunk
    of positions at a time (training/chunked_loss.py); training-time test (``ttt``) feeds
    each position's argmax to the next, so it builds the whole logits [N*A, n, V]. A batch
    restricted to a draft vocabulary (``batch.draft_vocab``) has its loss over those K
    tokens' logits only."""
    N, A = batch.anchors.shape
    c = model.config
    with torch.autocast(batch.anchors.device.type, dtype=torch.bfloat16, enabled=autocast):
        h = model.packed_draft_hidden(*batch.backbone_inputs())
        if ttt and c.has_head:
            base = model.lm_head(h)
            final = model.self_fed_logits(h, base, batch.anchors.reshape(-1))
            if batch.draft_vocab is not None:
                base, final = base[..., batch.draft_vocab], final[..., batch.draft_vocab]
            lb = weighted_loss(kind, base.float(), batch, weights)
            lf = weighted_loss(kind, final.float(), batch, weights)
            return (1 - lam) * lf + lam * lb, lb.detach(), lf.detach()
        R, n = h.shape[0] * h.shape[1], c.num_drafts
        lm_weight = model.lm_head.weight
        if batch.draft_vocab is not None:  # labels index the draft vocabulary: its K rows only
            lm_weight = lm_weight[batch.draft_vocab]
        if autocast:  # cast the frozen head once, not once per chunk (autocast caches leaves only)
            lm_weight = lm_weight.to(torch.bfloat16)
        if c.has_head:
            a = model.teacher_forced_head_input(h, batch.teacher.reshape(N * A, -1))
            w2 = model.embed_proj[2].weight
            if batch.draft_vocab is not None:
                w2 = w2[batch.draft_vocab]
        else:  # no head: final logits are the base logits
            a, w2 = h.new_zeros(R, 1), h.new_zeros(lm_weight.shape[0], 1)
        flat = (lambda t: None if t is None else t.reshape(R, t.shape[-1]))
        if acceptance:
            q = label_logprobs(h.reshape(R, -1), a.reshape(R, -1), w2, lm_weight, batch.labels.reshape(R)).exp()
            c = acceptance_weights(q.view(-1, n), batch.label_valid.reshape(-1, n))
            # scaled to the decay weights' total, over all ranks' blocks: the step's loss as
            # one process would make it from the global batch
            totals = torch.stack([weights.sum(), c.sum()]).float()
            if dist.is_available() and dist.is_initialized():
                dist.all_reduce(totals)
            weights = c * (totals[0] / totals[1].clamp_min(torch.finfo(torch.float32).tiny))
        return chunked_draft_loss(kind, h.reshape(R, -1), a.reshape(R, -1), w2, lm_weight,
                                  batch.labels.reshape(R), flat(batch.label_top_ids),
                                  flat(batch.label_top_logprobs), weights.reshape(R), lam)


def broadcast_from_rank0(params: list[torch.nn.Parameter]) -> None:
    """Rank 0's values of ``params`` on every rank, in place: the trained weights, whose
    random start may differ by rank (the rest come from the target or a saved drafter)."""
    for p in params:
        dist.broadcast(p.data, 0)


def check_same_data_on_every_rank(train: list[Conversation]) -> None:
    """Raises SystemExit (after closing the process group) unless every rank loaded the
    same training conversations (their count and response tokens): each rank draws the
    step's sequences by index from its own list, so ranks that see other shards would
    train on other data without an error."""
    n = torch.tensor([len(train), sum(len(x.tokens) - x.prompt_len for x in train)], dtype=torch.float64)
    lo, hi = n.clone(), n.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if not torch.equal(lo, hi):
        dist.destroy_process_group()
        raise SystemExit(f"--data: the ranks loaded different training data ({int(lo[0])} to {int(hi[0])} "
                         "conversations): every rank must see the same shards")


def sum_gradients_over_ranks(params: list[torch.nn.Parameter]) -> None:
    """Each gradient of ``params`` summed over the ranks, in place, in one all-reduce per
    dtype. Every rank runs the same forward, so the same parameters hold gradients on each.

    Each rank's loss is its share of the global batch's loss (the normaliser is the global
    batch's), so the sum is the global batch's gradient. An explicit collective and not
    DistributedDataParallel, whose reducer keeps the process group alive after
    ``destroy_process_group`` (torch 2.14; why that matters: where ``main`` starts the group)."""
    with_grad = [p for p in params if p.grad is not None]
    for dtype in dict.fromkeys(p.grad.dtype for p in with_grad):  # the same order on every rank
        group = [p for p in with_grad if p.grad.dtype == dtype]
        flat = torch.cat([p.grad.reshape(-1) for p in group])
        dist.all_reduce(flat)
        for p, g in zip(group, flat.split([p.numel() for p in group])):
            p.grad = g.view_as(p)


def weighted_loss(kind: str, logits: torch.Tensor, batch: AnchorBatch, weights: torch.Tensor) -> torch.Tensor:
    """The per-position loss of ``kind`` times ``weights`` [M, n] (normaliser included),
    summed; logits [M, n, V] for the M = N*A blocks of ``batch``."""
    n = logits.shape[1]
    flat = (lambda t: None if t is None else t.reshape(-1, n, t.shape[-1]))
    loss = per_token_loss(kind, logits, batch.labels.view(-1, n), flat(batch.label_top_ids),
                          flat(batch.label_top_logprobs))
    return (loss * weights).sum()


def lr_at(step: int, total: int, base_lr: float, warmup_frac: float) -> float:
    """The learning rate at ``step`` of ``total``: linear warm-up over ``warmup_frac`` of the
    steps, then cosine decay to 0."""
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return base_lr * (step + 1) / warm
    return 0.5 * base_lr * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def _plain_args(args: dict) -> dict:
    """The arguments with paths as strings: how a checkpoint stores them and compares them."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in args.items()}


def save_checkpoint(path: Path, model, optim, step: int, args) -> None:
    """Writes the resumable training state (weights, optimizer, step, config, arguments,
    draft vocabulary) to ``path`` atomically."""
    tmp = path.with_suffix(".tmp")
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
             "config": model.config.to_json_dict(), "args": _plain_args(vars(args))}
    if model.draft_vocab is not None:  # a buffer the state dict leaves out
        state["draft_vocab"] = model.draft_vocab.cpu()
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-write leaves the previous checkpoint


# What defines a run: resuming its checkpoint with any of these changed would silently
# train something else. The shards may change (new ones join at a restart), and so may
# evaluation, checkpointing and the device. (The drafter's shape, --layers/--rank/--gru, is
# checked by loading the weights.)
RUN_ARGS = ("target", "config", "layers", "rank", "gru", "mask_token_id", "block_size", "init_from_target",
            "draft_vocab_size", "init_from", "steps", "seqs_per_step", "anchors", "lr", "warmup", "clip", "gamma",
            "ttt", "no_curriculum", "loss", "labels", "seed", "position_weights")
# Run arguments added after runs were saved without them: such a run had this value.
RUN_ARG_DEFAULTS = {"position_weights": "decay"}


# Run arguments that name a file or directory: the same one by another spelling (relative
# or absolute, through a symlink) is the same argument.
PATH_RUN_ARGS = ("target", "config", "init_from")


def _same_arg(name: str, saved, now) -> bool:
    """Whether a run argument's saved value and its value now are the same: equal, or for
    :data:`PATH_RUN_ARGS` two spellings of one path (resolved against the current
    directory, as the run resolves them)."""
    if saved == now:
        return True
    if name not in PATH_RUN_ARGS or not isinstance(saved, str) or not isinstance(now, str):
        return False
    return os.path.realpath(saved) == os.path.realpath(now)


def check_same_run(saved: dict, args, ckpt: Path) -> None:
    """Raises SystemExit naming the arguments that differ from the checkpoint's run."""
    saved, now = {**RUN_ARG_DEFAULTS, **_plain_args(saved)}, _plain_args(vars(args))
    differ = [k for k in RUN_ARGS if k in saved and not _same_arg(k, saved[k], now.get(k))]
    if differ:
        said = ", ".join(f"--{k.replace('_', '-')} {saved[k]!r} (now {now.get(k)!r})" for k in differ)
        raise SystemExit(f"{ckpt} is another run's: it was made with {said}. Give its arguments to resume it, "
                         f"or another --out")


def read_manifest(data: Path) -> dict:
    """``data``'s dataset.json (written by training.generate_data), or {} for a dataset made
    before manifests."""
    from training.generate_data import MANIFEST

    path = data / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def check_data_target(data: Path, target) -> None:
    """Raises SystemExit when ``data``'s dataset.json (written by training.generate_data)
    says another target made it: its responses and features are that target's. Compares
    the architecture the manifest records (a fine-tune of the same shape passes)."""
    made = read_manifest(data).get("target", {})
    tc = target.config.get_text_config()
    differ = {k: (v, getattr(tc, k, None)) for k, v in made.items() if hasattr(tc, k) and getattr(tc, k) != v}
    if differ:
        said = ", ".join(f"{k} {a} there, {b} here" for k, (a, b) in differ.items())
        raise SystemExit(f"--target: {data} was generated by another target ({said}); train with the target that "
                         "made it, or generate data with this one")


def dataset_top_k(data: Path) -> int:
    """How many of the target's top tokens the shards of ``data`` store at each response
    position (its dataset.json; 32, generate_data's default, for datasets made before it)."""
    return read_manifest(data).get("top_k", 32)


def with_computed_features(target, convs: list[Conversation], layer_ids: list[int], top_k: int) -> list[Conversation]:
    """``convs`` with the target's features ([T - 1, n*H] bf16, on the CPU) and its top-``top_k``
    ids and log-probabilities at each response position, computed now by one teacher-forced
    forward of them all on the target's device: what the stored feature files hold (up to
    rounding; generate_data.features_from_ids writes those too)."""
    from training.generate_data import features_from_ids

    if not convs:  # --eval-convs 0
        return []
    records = [{"prompt_ids": c.tokens[:c.prompt_len].tolist(), "response_ids": c.tokens[c.prompt_len:].tolist()}
               for c in convs]
    # pad 0: right padding is invisible to the real tokens under causal attention
    data = features_from_ids(target, records, layer_ids, pad=0, top_k=top_k, batch_size=len(records))
    f, r = data.offsets, data.response_offsets
    return [replace(conv, features=data.features[f[i]:f[i + 1]], top_ids=data.top_ids[r[i]:r[i + 1]],
                    top_logprobs=data.top_logprobs[r[i]:r[i + 1]]) for i, conv in enumerate(convs)]


def drop_logged_steps_from(path: Path, start: int) -> None:
    """Removes the lines of ``path`` (log.jsonl) for steps >= ``start``, which a run resumed
    at ``start`` logs again (a kill between checkpoints had logged them once)."""
    if not path.exists():
        return
    def before(line: str) -> bool:  # a line cut by the kill is dropped too
        try:
            return json.loads(line).get("step", -1) < start
        except json.JSONDecodeError:
            return False

    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if before(line)]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)


def build_model(args, target):
    """The drafter to train, bound to ``target``, in training mode: a saved one
    (``--init-from``) or a new one (``--config`` or derived from the target, optionally
    started from the target's top layers)."""
    from domino.config import DominoConfig, default_drafter_config

    if args.init_from:  # continue from a saved drafter: its config and weights
        model = DominoDraftModel.from_pretrained(args.init_from).bind_target(target)
    else:
        if args.config:
            config = DominoConfig.load(args.config)
        else:
            config = default_drafter_config(target.config)
            if args.layers is not None:
                config.num_hidden_layers = args.layers
            if args.rank is not None:
                config.emb_dim = args.rank
            if args.gru is not None:
                config.gru_hidden_dim = args.gru
            if args.mask_token_id is not None:
                if not 0 <= args.mask_token_id < config.vocab_size:
                    raise SystemExit(f"--mask-token-id must be in [0, {config.vocab_size}), got {args.mask_token_id}")
                config.mask_token_id = args.mask_token_id
        torch.manual_seed(args.seed)
        model = DominoDraftModel(config).bind_target(target)
        if args.init_from_target:
            init_layers_from_target(model, target)
    if args.block_size is not None and (args.init_from or not args.config):
        # no weight depends on the block's length (rotary positions, the mask token's
        # embedding), so a saved drafter can also be trained on at another block size
        model.config.block_size = args.block_size
    # from_pretrained hands a model back in eval mode; on a GPU cuDNN then refuses the GRU's
    # backward ("cudnn RNN backward can only be called in training mode", the 2026-11-28 lease)
    return model.train()


def init_layers_from_target(model: DominoDraftModel, target) -> None:
    """Starts the draft layers from the target's top layers (same shapes by construction);
    parameters the target lacks (q/k norms of a Llama target) keep their init."""
    src_layers = target.model.layers
    L, n = len(src_layers), len(model.layers)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            src = dict(src_layers[L - n + i].named_parameters())
            for name, p in layer.named_parameters():
                if name in src and src[name].shape == p.shape:
                    p.copy_(src[name])


def parse_args(argv=None):
    """The trainer's command-line arguments (``python -m training.train --help``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--target", type=Path, default=None, help="HF target dir (default: SmolLM2-135M-Instruct)")
    p.add_argument("--config", type=Path, default=None, help="drafter config dir (default: derived from the target)")
    p.add_argument("--layers", type=int, default=None, help="draft layers of a new drafter (default 2)")
    p.add_argument("--rank", type=int, default=None, help="the head's low rank r of a new drafter (default 64)")
    p.add_argument("--gru", type=int, default=None, help="the head's GRU width of a new drafter (default 256)")
    p.add_argument("--mask-token-id", type=int, default=None,
                   help="a new drafter's mask token (the block is [anchor, MASK, ...]): a special token the target "
                        "never writes. Required with --target; SmolLM2's default is 16 (<empty_output>)")
    p.add_argument("--block-size", type=int, default=None,
                   help="draft block length (default: the default drafter config's, 16; with --init-from, the "
                        "saved drafter's)")
    p.add_argument("--init-from-target", action="store_true", help="start the draft layers from the target's top layers")
    p.add_argument("--draft-vocab-size", type=int, default=0,
                   help="a new drafter drafts from (and trains over) the K response tokens most frequent in "
                        "the training shards (training/draft_vocab.py); 0: all tokens. --init-from keeps its own")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from a saved drafter (config + weights), e.g. the shipped one, to train it further")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--seqs-per-step", type=int, default=16, help="global batch, in sequences")
    p.add_argument("--anchors", type=int, default=8, help="anchors per sequence")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=float, default=0.04)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=7.0)
    p.add_argument("--position-weights", choices=POSITION_WEIGHTS, default="decay",
                   help="decay: each draft position's loss weighted by exp(-k / gamma) (the paper); acceptance: by "
                        "how much it moves the block's expected accepted length under the drafter's own label "
                        "probabilities (acceptance_weights; teacher forcing only), scaled to the decay's total")
    p.add_argument("--ttt", action="store_true", help="training-time test instead of teacher forcing")
    p.add_argument("--no-curriculum", action="store_true", help="lam = 0 throughout")
    p.add_argument("--loss", choices=LOSSES, default="ce",
                   help="ce: the target's greedy token; kl / ce_tv: distil its stored top-K distribution")
    p.add_argument("--labels", choices=("tokens", "target_argmax"), default="tokens",
                   help="what each drafted position is trained to predict: the response's own next token (tokens), "
                        "or the target's greedy choice at that position from the stored top-K (target_argmax: on "
                        "sampled responses a quarter of the next tokens are not it; needs the shards' top-K)")
    p.add_argument("--target-features", choices=("stored", "computed"), default="stored",
                   help="the target's features and top-K: read from the shards' feature files (stored; ~113 MB a "
                        "SmolLM2 shard, rebuilt by generate_data --target-tokens 0), or computed by the target for "
                        "each step's conversations (computed: token shards only; one teacher-forced forward of "
                        "--seqs-per-step conversations a step: for a GPU, where rebuilding files is the slower way)")
    p.add_argument("--eval-shards", type=int, nargs="+", default=[0], help="held out for evaluation")
    p.add_argument("--train-shards", type=int, nargs="+", default=None,
                   help="shards trained on (default: every shard in --data but the held-out ones)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-convs", type=int, default=32, help="held-out conversations stepped through per evaluation")
    p.add_argument("--eval-max-new-tokens", type=int, default=128)
    p.add_argument("--eval-generator-prompts", type=int, default=0,
                   help="also measure acceptance through the generator on this many HumanEval prompts")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--bf16", nargs="?", const="on", default="off", choices=("off", "on", "auto"),
                   help="bf16 autocast for the matmuls (fp32 weights and optimizer): on, off, or auto = on where "
                        "bf16 is fast (a GPU; a CPU with AVX512-BF16 or AMX: 1.09 s vs 2.71 s a step on a Zen 5 "
                        "EPYC). On an AVX2 CPU PyTorch's bf16 GEMMs are ~25x slower than fp32 (166 s vs 6.5 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="where the target and the drafter run (e.g. cuda)")
    p.add_argument("--max-shards", type=int, default=None)
    p.add_argument("--export-dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--stop-after", type=int, default=None,
                   help="leave after this many steps of this invocation (as if killed; resume continues)")
    args = p.parse_args(argv)
    if args.draft_vocab_size < 0:
        p.error(f"--draft-vocab-size must be >= 0, got {args.draft_vocab_size}")
    if not args.gamma > 0:  # the position decay exp(-k / gamma)
        p.error(f"--gamma must be > 0, got {args.gamma}")
    if args.position_weights == "acceptance" and args.ttt:
        p.error("--position-weights acceptance reads teacher-forced label probabilities: drop --ttt")
    for name, least in (("layers", 1), ("rank", 1), ("gru", 1), ("block_size", 2), ("max_shards", 1)):
        if getattr(args, name) is not None and getattr(args, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    for name in ("steps", "seqs_per_step", "anchors", "eval_every", "ckpt_every", "eval_max_new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("eval_convs", "eval_generator_prompts"):  # a negative count would slice from the end
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.stop_after is not None and args.stop_after < 1:
        p.error(f"--stop-after must be >= 1, got {args.stop_after}")
    # a negative clip flips the gradients (training climbs the loss), a zero one stops them
    for name in ("lr", "clip"):
        if not 0 < getattr(args, name) < math.inf:
            p.error(f"--{name} must be a finite number > 0, got {getattr(args, name)}")
    if not 0 <= args.warmup <= 1:  # a fraction of the steps
        p.error(f"--warmup must be a fraction of the steps in [0, 1], got {args.warmup}")
    # a new drafter's shape comes from one place: flags that another source would override are refused
    shape = [f"--{n.replace('_', '-')}" for n in ("layers", "rank", "gru", "mask_token_id")
             if getattr(args, n) is not None]
    if args.init_from and (shape or args.config or args.init_from_target):
        p.error(f"--init-from takes the saved drafter's config and weights: drop "
                f"{', '.join(shape + ['--config'] * bool(args.config) + ['--init-from-target'] * args.init_from_target)}")
    if args.config and (shape or args.block_size is not None):
        p.error(f"--config gives the drafter's shape: drop {', '.join(shape + ['--block-size'] * (args.block_size is not None))}")
    if args.target and not (args.init_from or args.config) and args.mask_token_id is None:
        p.error("--mask-token-id: a new drafter for --target needs a mask token the target never writes "
                "(a reserved or unused special token of its tokenizer)")
    return args


def main(argv=None) -> dict:
    """Trains a drafter (module docstring); returns {"history": a record (dict) per step run,
    with its losses, learning rate and any evaluation made at it}."""
    args = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    # torchrun's rank and world size; the process group itself starts after the target is loaded
    rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if distributed else (0, 1)
    if distributed:
        if args.seqs_per_step < world:  # a rank with no sequence would have nothing to train on
            raise SystemExit(f"--seqs-per-step {args.seqs_per_step}: fewer sequences a step than the {world} ranks "
                             "that share them")
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    log = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)

    from transformers import AutoModelForCausalLM

    from domino.loading import smollm2_dir

    if not args.data.is_dir():
        raise SystemExit(f"--data: no directory {args.data} (make one with python -m training.generate_data --out ...)")
    device = torch.device(args.device)
    # a checkpoint to resume is checked before the target and the data are loaded
    ckpt = args.out / "checkpoint.pt"
    state = torch.load(ckpt, map_location=device, weights_only=False) if ckpt.exists() else None
    if state is not None:
        check_same_run(state.get("args", {}), args, ckpt)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on a GPU too (the target's features)
    target = AutoModelForCausalLM.from_pretrained(args.target or smollm2_dir(quiet=True), dtype=torch.float32)
    target = target.to(device).eval()
    target.requires_grad_(False)
    check_data_target(args.data, target)
    all_shards = sorted(shard_index(f) for f in args.data.glob("shard_*.jsonl"))
    train_shards = [s for s in (args.train_shards or all_shards) if s not in args.eval_shards]
    if missing := sorted(set(train_shards) - set(all_shards)):
        raise SystemExit(f"--train-shards: no shard {missing} in {args.data}")
    # a later pass over the prompt order holds the held-out prompts again (generate_data --passes)
    held_prompts = held_out_prompts(args.data, args.eval_shards)
    leaking = [s for s in train_shards if repeats_held_out(shard_prompts(args.data, s), held_prompts)]
    if leaking and args.train_shards:
        raise SystemExit(f"--train-shards: shards {leaking} hold prompts of the held-out shards {args.eval_shards} "
                         "(another pass over the same prompts): leave them out")
    if leaking:
        log(f"left out shards {leaking}: they hold prompts of the held-out shards {args.eval_shards}")
        train_shards = [s for s in train_shards if s not in leaking]
    if not train_shards:
        raise SystemExit(f"no training data: {args.data} holds shards {all_shards}, all held out by --eval-shards "
                         f"{args.eval_shards} (or left out of --train-shards)")
    model = build_model(args, target)
    if state is not None and "draft_vocab" in state:  # the run's own, whatever the shards on disk say now
        model.set_draft_vocab(state["draft_vocab"])
    elif args.draft_vocab_size and not args.init_from:  # from the data (as again on resuming an older checkpoint)
        if args.draft_vocab_size > model.config.vocab_size:
            raise SystemExit(f"--draft-vocab-size must be at most the target's vocabulary ({model.config.vocab_size}), "
                             f"got {args.draft_vocab_size}")
        counts, _ = response_counts(args.data, set(all_shards) - set(train_shards))
        vocab = most_frequent(counts, args.draft_vocab_size)
        if len(vocab) < args.draft_vocab_size:
            log(f"warning: --draft-vocab-size {args.draft_vocab_size}, but the training responses hold only "
                f"{len(vocab)} distinct tokens: the draft vocabulary has {len(vocab)}")
        model.set_draft_vocab(vocab)
    model = model.to(device)
    c = model.config
    stored = args.target_features == "stored"
    try:
        train = load_shards(args.data, train_shards, args.max_shards, layer_ids=c.target_layer_ids, features=stored)
        held = load_shards(args.data, args.eval_shards, layer_ids=c.target_layer_ids, features=stored)
    except ValueError as e:
        raise SystemExit(f"--data: {e}")
    top_k = dataset_top_k(args.data)
    if not stored:  # the held-out conversations evaluated get theirs once
        held = with_computed_features(target, held[:args.eval_convs], c.target_layer_ids, top_k)
    written = sum(int((conv.tokens[conv.prompt_len:] == c.mask_token_id).sum()) for conv in train)
    if written:  # the block [anchor, MASK, ...] must not look like text the target writes
        raise SystemExit(f"--mask-token-id: the target writes token {c.mask_token_id} ({written} times in the "
                         "training responses): choose a special token it never writes")
    # the options that read the target's stored top-k, and what to use without it
    need_top_k = [(f"--loss {args.loss}", "--loss ce")] if args.loss != "ce" else []
    need_top_k += [("--labels target_argmax", "--labels tokens")] if args.labels == "target_argmax" else []
    if need_top_k and stored and any(conv.top_ids is None for conv in train):
        raise SystemExit(f"{' and '.join(o for o, _ in need_top_k)}: needs the target's stored top-k, and some shards "
                         f"of {args.data} have none (made before they were stored): rebuild their features "
                         "(training.generate_data --target-tokens 0 after deleting them) or use "
                         f"{' and '.join(alt for _, alt in need_top_k)}")
    log(f"train: {len(train)} conversations, {sum(len(x.tokens) - x.prompt_len for x in train)} response tokens; "
        f"eval: {len(held)} conversations; drafter {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params")

    autocast = args.bf16 == "on" or (args.bf16 == "auto" and fast_bf16(device))
    if autocast and not fast_bf16(device):
        log(f"warning: --bf16 on a {torch.backends.cpu.get_cpu_capability()} CPU without bf16 dot products: "
            "PyTorch's bf16 matmuls fall back to slow generic code here; fp32 (no --bf16) trains ~25x faster")
    log(f"matmuls in {'bf16 (autocast)' if autocast else 'fp32'}")
    trained = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = state["step"] + 1
        log(f"resumed from {ckpt} at step {start}")
    if distributed:
        # Started here, after the target is loaded and every argument and data check has
        # passed: a model loaded while a process group is up keeps that group alive past
        # destroy_process_group (transformers 5.25, torch 2.14; so does
        # DistributedDataParallel, hence sum_gradients_over_ranks), and so does an exit by
        # SystemExit; gloo's worker threads then ran into the interpreter's exit and aborted
        # a rank there ("terminate called without an active exception") now and then;
        # tests/train_rank.py checks none is left.
        # Rank 0 evaluates (held-out conversations, generator prompts) while the others wait
        # in the next step's gradient all-reduce: that can outlast gloo's default 30 minutes.
        dist.init_process_group("gloo", timeout=datetime.timedelta(hours=12))
        check_same_data_on_every_rank(train)
        broadcast_from_rank0(trained)
    weights = position_weights(c.num_drafts, args.gamma).to(device)
    eval_convs = held[:args.eval_convs]
    history = []
    if rank == 0:  # a resumed run logs them again; a run killed before its first checkpoint, all of them
        drop_logged_steps_from(args.out / "log.jsonl", start)
    log_file = (args.out / "log.jsonl").open("a") if rank == 0 else None
    t0 = time.time()
    end = args.steps if args.stop_after is None else min(args.steps, start + args.stop_after)
    for step in range(start, end):
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        idx = torch.randint(0, len(train), (args.seqs_per_step,), generator=g).tolist()
        convs = [train[i] for i in idx]
        if not stored:
            convs = with_computed_features(target, convs, c.target_layer_ids, top_k)
        batch = make_batch(convs, args.anchors, c.block_size, c.num_drafts, c.mask_token_id, g)
        if args.labels == "target_argmax":
            batch = with_target_argmax_labels(batch)
        if model.draft_vocab is not None:
            batch = restrict_to_draft_vocab(batch, model.draft_vocab.cpu(), c.vocab_size)
        batch = batch.to(device)
        if distributed:  # this rank's share of the global batch; the loss is normalised globally
            batch = _slice_batch(batch, rank, world)
        lam = 0.0 if args.no_curriculum else max(0.0, 1.0 - step / max(1, args.steps - 1))
        for group in optim.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        w = weights[None, None, :] * batch.label_valid
        w_total = w.sum()
        if distributed:
            dist.all_reduce(w_total)
        # No valid label in the step (every one outside a small draft vocabulary): a zero
        # loss, not 0 / 0, whose NaN gradients AdamW would write into every weight.
        w_total = w_total.clamp_min(torch.finfo(w_total.dtype).tiny)
        loss, loss_base, loss_final = forward_batch(
            model, batch, kind=args.loss, weights=w.view(-1, c.num_drafts) / w_total, lam=lam, ttt=args.ttt,
            autocast=autocast, acceptance=args.position_weights == "acceptance")
        optim.zero_grad(set_to_none=True)
        loss.backward()
        if distributed:
            sum_gradients_over_ranks(trained)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optim.step()
        lb, lf = loss_base.clone(), loss_final.clone()
        if distributed:
            for t in (lb, lf):
                dist.all_reduce(t)
        rec = {"step": step, "loss_base": float(lb), "loss_final": float(lf), "lam": lam,
               "lr": optim.param_groups[0]["lr"], "elapsed_s": round(time.time() - t0, 1),
               # draft positions trained on so far (each a target token to predict), the x axis
               # of the acceptance curve (benchmarks/eval_acceptance.py curve)
               "train_tokens": (step + 1) * args.seqs_per_step * args.anchors * c.num_drafts}
        if eval_convs and rank == 0 and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
            model.eval()  # acceptance as generation gets it: tokens / rounds, stepping through responses
            for head, key in ((True, "tau_head_on"), (False, "tau_head_off")):
                rec[key] = generation_acceptance(model, eval_convs, use_head=head,
                                                 max_new_tokens=args.eval_max_new_tokens)
            if args.eval_generator_prompts:
                rec["generator_tau_head_on"] = generator_acceptance(model, target, args)
            model.train()
        history.append(rec)
        if rank == 0:
            log_file.write(json.dumps(rec) + "\n")
            log_file.flush()
            if step % 10 == 0 or "tau_head_on" in rec:
                log(json.dumps(rec))
        if rank == 0 and ((step + 1) % args.ckpt_every == 0 or step + 1 == args.steps):
            save_checkpoint(ckpt, model, optim, step, args)
    if rank == 0 and end == args.steps:
        # new weights: any calibration they came with (--init-from) is not theirs
        # (benchmarks/calibration.py --write fits one)
        model.calibration = Calibration()
        model.save_pretrained(args.out / "drafter", dtype=getattr(torch, args.export_dtype))
        log(f"saved {args.out / 'drafter'}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return {"history": history}


def _slice_batch(batch: AnchorBatch, rank: int, world: int) -> AnchorBatch:
    parts = {f: getattr(batch, f) for f in AnchorBatch.__dataclass_fields__}
    return AnchorBatch(**{f: t if t is None or f == "draft_vocab" else t[rank::world].contiguous()
                          for f, t in parts.items()})


def generator_acceptance(model: DominoDraftModel, target, args) -> float:
    """Greedy acceptance (tokens / rounds, head on) through the generator on the first
    ``--eval-generator-prompts`` HumanEval prompts, as benchmarks/eval_acceptance.py measures
    it: the drafter as checkpointed (bf16) and the target, run as deployed on the CPU
    (``DEFAULT_OPTIONS``: bf16, the batch-invariant kernels; 2.7x faster than the fp32
    training target, same tau: benchmarks/results/tau.txt), loaded apart from the models being trained."""
    import sys
    import tempfile

    import domino
    from domino.loading import DEFAULT_OPTIONS, smollm2_dir

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from eval_acceptance import humaneval_prompts, mean_tau

    device = torch.device(args.device)
    options = DEFAULT_OPTIONS if device.type == "cpu" else dict(dtype=next(target.parameters()).dtype)
    with tempfile.TemporaryDirectory() as drafter_dir:
        model.save_pretrained(drafter_dir)
        gen = domino.load(args.target or smollm2_dir(quiet=True), drafter_dir, device=device, **options)
    return mean_tau(gen, humaneval_prompts(args.eval_generator_prompts), use_head=True, temperature=0.0,
                    max_new_tokens=args.eval_max_new_tokens)


if __name__ == "__main__":
    main()
