"""The round-kind chooser (:mod:`domino.round_kind`) on simulated rounds, no model: how
many rounds it plays as chains and the tokens per millisecond it gets, per scenario, for
the installed chooser and, with ``--old FILE``, another version of ``round_kind.py`` (for
instance ``git show REV:python/domino/round_kind.py > /tmp/old_round_kind.py``), over
``--seeds`` seeds.

Each scenario gives each kind's mean tokens a round and its milliseconds; a round's tokens
are drawn around the mean (normal, standard deviation 60 % of it, rounded, at least 1:
about the spread of real rounds). Scenarios:

- ``stretches``: the tree always faster at the same moment, but the text alternating
  between easy stretches of 150 rounds (tree 5 tokens in 22 ms, chain 3.5 in 18.5) and hard
  ones of 60 (tree 1.5 in 20, chain 1.2 in 18), as a response moves between boilerplate and
  harder code;
- ``tree-faster``: tree 3.4 tokens in 22 ms, chain 2.1 in 18.6 (the AMX Xeon VM's rates);
- ``chain-faster``: tree 3.4 in 30 ms, chain 2.4 in 19 (a CPU whose verification forward
  is compute-bound);
- ``close``: tree 3.4 in 25 ms, chain 2.5 in 19.

    python benchmarks/round_kind_sim.py [--seeds 12] [--old /tmp/old_round_kind.py]

It tunes constants (``CLEAR_LEAD``) and shows failure modes; tokens/s through the real
generator come from ``round_kind_ab.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import random

EASY, HARD = (5, 22, 3.5, 18.5), (1.5, 20, 1.2, 18)
SCENARIOS = {"stretches": [EASY + (150,), HARD + (60,)] * 6, "tree-faster": [(3.4, 22, 2.1, 18.6, 1000)],
             "chain-faster": [(3.4, 30, 2.4, 19, 1000)], "close": [(3.4, 25, 2.5, 19, 1000)]}


def simulate(chooser, phases, seed: int) -> tuple[int, float]:
    """Plays ``phases`` [(tree tokens, tree ms, chain tokens, chain ms, rounds)] with
    ``chooser``: (chain rounds, tokens per ms)."""
    rng = random.Random(seed)
    chains, tokens, ms = 0, 0, 0.0
    for tree_tokens, tree_ms, chain_tokens, chain_ms, rounds in phases:
        for _ in range(rounds):
            kind = chooser.choose()
            mean, t = (tree_tokens, tree_ms) if kind == "tree" else (chain_tokens, chain_ms)
            got = max(1, round(rng.gauss(mean, 0.6 * mean)))
            chooser.record(kind, got, t)
            chains += kind == "chain"
            tokens += got
            ms += t
    return chains, tokens / ms


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("old_round_kind", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--old", default=None, help="another round_kind.py to compare")
    args = ap.parse_args()
    import domino.round_kind as current

    versions = {"installed": current}
    if args.old:
        versions["old"] = load_module(args.old)
    print(f"{args.seeds} seeds a scenario; chain rounds of each seed, and tokens per ms (mean over the seeds)\n")
    print("| scenario | " + " | ".join(versions) + " |")
    print("|---|" + "---|" * len(versions))
    for name, phases in SCENARIOS.items():
        cells = []
        for module in versions.values():
            runs = [simulate(module.RoundKindChooser(), phases, s) for s in range(args.seeds)]
            cells.append(f"{sum(r for _, r in runs) / len(runs):.4f} tokens/ms; chains "
                         + " ".join(str(c) for c, _ in runs))
        print(f"| {name} ({sum(p[-1] for p in phases)} rounds) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
