"""Builds the retrieval datastore of a target's own outputs (domino.datastore).

    python -m training.build_datastore --data training/regenerated/smollm2_mix --upto 399 \
        --out python/domino/checkpoints/smollm2-135m-instruct/datastore.npz

Collects the response tokens of the regenerated training shards with index below
``--upto`` (the target's own greedy continuations of the training prompts, which are what
speculation must guess; HumanEval never enters the prompts, training/prompts.py), one
sequence per response, leaving out the held-out ``--eval-shards`` (whose prompts
``benchmarks/`` uses as held-out chat prompts), and writes them as a
:class:`domino.datastore.TokenDatastore`. Prompts are left out: the target writes its
responses, and they held nearly all of what the datastore matched on HumanEval prompts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from domino.datastore import TokenDatastore
from training.data import held_out_prompts, repeats_held_out, shard_index
from training.generate_data import read_shard_records


def responses(directory: Path, upto: int, exclude: set[int]) -> list[list[int]]:
    """The response token ids of every shard with index < ``upto``, leaving out the shards
    in ``exclude`` and every shard holding one of their prompts (a later pass over the
    prompt order, generate_data --passes, repeats them)."""
    held = held_out_prompts(directory, exclude)
    out = []
    for f in sorted(Path(directory).glob("shard_*.jsonl")):
        i = shard_index(f)
        if i < upto and i not in exclude:
            records = read_shard_records(f)
            if repeats_held_out((r["prompt_ids"] for r in records), held):
                continue
            out += [r["response_ids"] for r in records]
    return out


def main() -> None:
    """Command line (module docstring; ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a directory of regenerated shards")
    p.add_argument("--out", type=Path, required=True, help="the .npz to write")
    p.add_argument("--upto", type=int, required=True, help="shards with index below this (a fixed corpus)")
    p.add_argument("--eval-shards", type=int, nargs="*", default=[0], help="held out: never in the datastore")
    args = p.parse_args()
    seqs = responses(args.data, args.upto, set(args.eval_shards))
    if not seqs:
        p.error(f"--data: no responses in {args.data} below shard {args.upto} (outside --eval-shards)")
    store = TokenDatastore.from_sequences(seqs, sizes=(4,))  # the index is rebuilt on load
    store.save(args.out)
    print(f"{len(seqs)} responses, {sum(map(len, seqs))} tokens -> {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
