"""Does a bigger datastore of the target's outputs (:mod:`domino.datastore`) take more tokens
a round? Builds one datastore per ``--upto`` (the responses of the regenerated shards with
index below it, as ``training/build_datastore.py`` does; the held-out shard 0 and every
shard holding its prompts left out), indexed in memory, then runs greedy
``generate`` with :data:`domino.tree.DEFAULT_TREE` every round (not "auto": its choice of
round kind depends on timing) over HumanEval or held-out chat prompts with each datastore
and with none, and prints tokens per round (deterministic: the same on every run of one
build and VM) and tokens/s (alternating passes, medians), and checks every output
identical.

    python benchmarks/datastore_size_ab.py [--upto 469 540 2024] [--prompts 32] [--chat]

The shipped datastore is ``--upto 469`` (README, "Retrieval from the target's own outputs").
In ``training/regenerated/smollm2_mix`` shards 0-539 hold greedy responses (the first pass
over the prompt order) and 540-2023 responses sampled at T = 0.7 (later passes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upto", type=int, nargs="+", default=[469, 540, 2024])
    ap.add_argument("--data", type=Path, default=ROOT / "training/regenerated/smollm2_mix")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chat", action="store_true", help="held-out chat prompts instead of HumanEval")
    args = ap.parse_args()

    import domino
    from domino.datastore import TokenDatastore
    from domino.tree import DEFAULT_TREE
    from eval_acceptance import chat_prompts, humaneval_prompts
    from round_kind_ab import timed_pass
    from training.build_datastore import responses

    gen = domino.load_default()
    prompts = chat_prompts(args.prompts) if args.chat else humaneval_prompts(args.prompts)
    stores = {}
    for upto in args.upto:  # indexed in memory (~40 bytes a token)
        seqs = responses(args.data, upto, {0})
        stores[f"upto {upto}"] = TokenDatastore.from_sequences(seqs)
        print(f"datastore upto {upto}: {len(seqs)} responses, {sum(map(len, seqs))} tokens")
    stores["none"] = None
    gen.generate(prompts[0], max_new_tokens=16, tree=DEFAULT_TREE)
    speed = {k: [] for k in stores}
    tau, outputs = {}, {}
    for rep in range(args.repeats):
        for name in (list(stores) if rep % 2 == 0 else list(stores)[::-1]):
            gen.datastore = stores[name]
            tokens, rounds, texts, seconds = timed_pass(gen, prompts, args.max_new_tokens, DEFAULT_TREE)
            speed[name].append(tokens / seconds)
            tau[name] = (tokens, rounds)
            outputs.setdefault(name, texts)
    first = next(iter(outputs.values()))
    assert all(o == first for o in outputs.values()), "the outputs differ between datastores"
    kind = "held-out chat" if args.chat else "HumanEval"
    print(f"\n{args.prompts} {kind} prompts x {args.max_new_tokens} tokens, DEFAULT_TREE every round; every output identical\n")
    print("| datastore | tokens a round | tok/s per pass | median |")
    print("|---|---|---|---|")
    for name in stores:
        t, r = tau[name]
        print(f"| {name} | {t / r:.3f} ({t} / {r}) | {' '.join(f'{x:.1f}' for x in speed[name])} | "
              f"{statistics.median(speed[name]):.1f} |")


if __name__ == "__main__":
    main()
