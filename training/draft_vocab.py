"""Chooses a drafter's draft vocabulary: the K tokens its target writes most often.

    python -m training.draft_vocab --data training/regenerated/smollm2_mix --size 16384 \
        --checkpoint python/domino/checkpoints/smollm2-135m-instruct

Counts the response tokens of the regenerated training shards (the target's own greedy
outputs, which are what a drafter must guess; the held-out ``--eval-shards``, and the
shards that repeat their prompts, are left out of the count), keeps the ``--size`` most frequent (FR-Spec's frequency ranking; EAGLE-3
ships the same as ``d2t``), prints the share of held-out response tokens they cover, and
with ``--checkpoint`` writes them into that drafter checkpoint
(:meth:`domino.model.DominoDraftModel.set_draft_vocab`; its weights and calibration are
rewritten unchanged). Drafting then costs K/V of the LM head's and of the head's ``w2``
bytes per position; a token outside the set is never drafted, so the coverage bounds the
acceptance this can cost.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import torch

from training.data import held_out_prompts, repeats_held_out, shard_index
from training.generate_data import read_shard_records


def response_counts(directory: Path, exclude: set[int]) -> tuple[Counter, list[int]]:
    """(token counts over the responses of every shard not in ``exclude`` and holding none
    of their prompts (a later pass over the prompt order, generate_data --passes, repeats
    them: the trainer leaves those shards out too), the response tokens of the shards in
    ``exclude``, concatenated)."""
    held_prompts = held_out_prompts(directory, exclude)
    counts, held = Counter(), []
    for f in sorted(Path(directory).glob("shard_*.jsonl")):
        records = read_shard_records(f)
        if shard_index(f) in exclude:
            held += [t for r in records for t in r["response_ids"]]
        elif not repeats_held_out((r["prompt_ids"] for r in records), held_prompts):
            for r in records:
                counts.update(r["response_ids"])
    return counts, held


def most_frequent(counts: Counter, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids [size] int64, ascending by id (ties in count
    broken by the smaller id, so the choice is deterministic). Fewer when fewer were seen."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
    return torch.tensor(sorted(t for t, _ in ranked), dtype=torch.int64)


def coverage(vocab: torch.Tensor, tokens: list[int]) -> float:
    """The share of ``tokens`` that lie in ``vocab``."""
    if not tokens:
        return float("nan")
    return float(torch.isin(torch.tensor(tokens), vocab).float().mean())


def main(argv=None) -> None:
    """Command line (module docstring; ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="regenerated shards (training/generate_data.py)")
    p.add_argument("--size", type=int, default=16384, help="tokens kept (K)")
    p.add_argument("--eval-shards", type=int, nargs="+", default=[0], help="held out: only measured")
    p.add_argument("--checkpoint", help="drafter checkpoint directory to write the vocabulary into")
    args = p.parse_args(argv)
    if args.size < 1:
        p.error(f"--size must be >= 1, got {args.size}")
    counts, held = response_counts(Path(args.data), set(args.eval_shards))
    if not counts:
        p.error(f"no response tokens in {args.data} outside shards {args.eval_shards}")
    vocab = most_frequent(counts, args.size)
    print(f"{sum(counts.values())} training response tokens, {len(counts)} distinct; kept {vocab.numel()}; "
          f"held-out coverage {coverage(vocab, held):.4f} of {len(held)} tokens")
    if args.checkpoint:
        from domino.model import DominoDraftModel

        model = DominoDraftModel.from_pretrained(args.checkpoint, dtype=torch.bfloat16)
        model.set_draft_vocab(vocab).save_pretrained(args.checkpoint, dtype=torch.bfloat16)
        print(f"wrote the draft vocabulary into {args.checkpoint}")


if __name__ == "__main__":
    main()
