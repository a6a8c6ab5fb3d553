"""In-process A/B of two versions of the engine's tree round (``DominoGenerator._tree_round``
and the ``domino.tree`` functions it calls), round by round: one generator, every tree
round run by the old or the new version in ABBA order (each call twice, the second time
in BAAB order, so that a call's rounds are played once by each: nearly, since the
round-kind chooser and the budget read measured times, so the two passes may play a few
rounds differently, and a tree round the budget makes a plain step is timed too), its wall
time added to that version's sum. Both versions see the same machine at the same moments, so a change
of a few per cent a round shows where separate processes (``engine_speed.py e2e``) swing
±10 % on the 2-core VMs; the rounds of both must generate the same tokens (compared).

The old version is another checkout's ``python/domino`` (its ``tree.py`` and
``generate.py``; the rest of the package and the C++ extension are the installed ones)::

    mkdir -p /tmp/old && git archive <the commit before the change> python/domino | tar -x -C /tmp/old
    python benchmarks/tree_round_ab.py /tmp/old/python/domino --prompts 16

An A/A run (``--same``: the installed version in both slots) shows the noise floor: four
gave 0.994-1.028 on the Zen 4 VM (sixty-fourth session), so a ~1 % effect needs several
runs of each.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_acceptance import humaneval_prompts  # noqa: E402


def old_tree_round(old_package: Path):
    """The old checkout's ``DominoGenerator._tree_round``, its ``domino.tree`` imports
    resolved to the old ``tree.py`` (loaded as the module ``old_domino_tree``)."""
    spec = importlib.util.spec_from_file_location("old_domino_tree", old_package / "tree.py")
    tree = importlib.util.module_from_spec(spec)
    sys.modules["old_domino_tree"] = tree
    spec.loader.exec_module(tree)
    source = (old_package / "generate.py").read_text().replace("from domino.tree import", "from old_domino_tree import")
    generate = types.ModuleType("old_domino_generate")
    generate.__file__ = str(old_package / "generate.py")
    sys.modules["old_domino_generate"] = generate
    exec(compile(source, generate.__file__, "exec"), generate.__dict__)
    return generate.DominoGenerator._tree_round


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old", type=Path, nargs="?", help="the old checkout's python/domino directory")
    ap.add_argument("--same", action="store_true", help="A/A: the installed version in both slots")
    ap.add_argument("--prompts", type=int, default=16, help="HumanEval prompts, 96 new tokens each")
    args = ap.parse_args()
    if args.old is None and not args.same:
        ap.error("give the old checkout's python/domino directory, or --same")

    import domino
    import domino.generate

    new_round = domino.generate.DominoGenerator._tree_round
    rounds = {"old": new_round if args.same else old_tree_round(args.old), "new": new_round}
    gen = domino.load_default()
    seconds, counts, played = {"old": 0.0, "new": 0.0}, {"old": 0, "new": 0}, [0]

    def tree_round(self, *a, **kw):
        version = "old" if played[0] % 4 in (0, 3) else "new"  # ABBA, or BAAB from an offset of 2
        played[0] += 1
        t = time.perf_counter()
        out = rounds[version](self, *a, **kw)
        seconds[version] += time.perf_counter() - t
        counts[version] += 1
        return out

    ps = humaneval_prompts(args.prompts + 1)
    gen.generate(ps[0], max_new_tokens=32)  # warm-up
    reference = [gen.generate(p, max_new_tokens=96).token_ids for p in ps[1:]]  # the installed version alone
    gen._tree_round = types.MethodType(tree_round, gen)
    # each prompt twice, its rounds in ABBA then in BAAB order: every round of a call is
    # played once by each version (the first round after the prefill, say, is slower)
    for p, expected in zip(ps[1:], reference):
        for offset in (0, 2):
            played[0] = offset
            if gen.generate(p, max_new_tokens=96).token_ids != expected:
                raise SystemExit("the versions' rounds generated different tokens")
    old_ms, new_ms = (seconds[v] / max(counts[v], 1) * 1e3 for v in ("old", "new"))
    print(f"{'A/A' if args.same else args.old}: rounds old {counts['old']} / new {counts['new']}, "
          f"old {old_ms:.3f} ms a round, new {new_ms:.3f} ms a round, new/old {new_ms / old_ms:.4f}")


if __name__ == "__main__":
    main()
