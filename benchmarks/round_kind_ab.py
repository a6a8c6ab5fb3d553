"""What ``tree="auto"`` costs or gains against always playing one kind of round: greedy
``generate`` over HumanEval prompts with ``tree="auto"`` (the round-kind chooser,
:mod:`domino.round_kind`), with :data:`domino.tree.DEFAULT_TREE` every round, and with the
adaptive chain every round (``tree=None``), the three alternating pass by pass (the order
reversed every other repeat) in one process, on one generator. Prints each method's
tokens/s per pass and the median, tokens per round, and how many rounds of each kind
"auto" played; every method's output must be identical (greedy), and the script checks it.

The chooser lives on the generator across calls (as in a server), so the first pass of
"auto" includes its warm-up; a warm-up call of each method before the timed passes pages
in the caches and measures the budget's costs.

    python benchmarks/round_kind_ab.py [--prompts 16] [--repeats 4] [--max-new-tokens 96]
    python benchmarks/round_kind_ab.py --isa avx2   # the kernels' AVX2 builds on an AVX-512 CPU

``--isa avx2`` runs the CPU kernels as their AVX2 builds (``DOMINO_CPU_ISA``, and the
packed product's AVX2 path), where a 16-token verification forward is compute-bound, as on
an AVX2-only CPU: the regime in which the chain can be the faster kind.

Another version of ``domino`` runs from a directory first on PYTHONPATH (engine_speed.py's
docstring); compare versions by each run's auto / best-fixed ratio, in ABBA order.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def timed_pass(gen, prompts, max_new_tokens: int, tree) -> tuple[int, int, list, float]:
    """Greedy ``gen.generate`` of each prompt with ``tree``: (tokens kept, rounds, the
    outputs' token ids, seconds)."""
    tokens = rounds = 0
    texts = []
    t0 = time.perf_counter()
    for p in prompts:
        r = gen.generate(p, max_new_tokens=max_new_tokens, tree=tree)
        tokens += sum(r.acceptance_lengths)
        rounds += len(r.acceptance_lengths)
        texts.append(r.token_ids)
    return tokens, rounds, texts, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--isa", choices=["avx2"], default=None, help="run the CPU kernels' AVX2 builds")
    args = ap.parse_args()
    if args.isa:
        os.environ["DOMINO_CPU_ISA"] = args.isa
        os.environ["DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH"] = args.isa

    import torch

    import domino
    import domino_ops
    import domino_ops.cpu
    from domino.tree import DEFAULT_TREE
    from eval_acceptance import humaneval_prompts

    gen = domino.load_default()
    prompts = humaneval_prompts(args.prompts)
    methods = {"auto": "auto", "tree": DEFAULT_TREE, "chain": None}
    print(f"domino from {Path(domino.__file__).parent}; CPU {domino_ops.cpu.model()}; kernels "
          f"{domino_ops.cpu.isa()}, packed product {domino_ops.small_batch_linear_packed_path()}; "
          f"{torch.get_num_threads()} threads; {args.prompts} HumanEval prompts x {args.max_new_tokens} tokens")
    for tree in methods.values():
        gen.generate(prompts[0], max_new_tokens=32, tree=tree)
    speed = {m: [] for m in methods}
    tau, first_output = {}, None
    kinds_played = []  # per pass of "auto": the rounds it played as each kind
    for rep in range(args.repeats):
        for m in (list(methods) if rep % 2 == 0 else list(methods)[::-1]):
            chooser = gen._round_kinds.get(1)  # the generator's chooser for batches of 1
            before = dict(chooser.rounds) if chooser is not None else dict.fromkeys(("tree", "chain"), 0)
            tokens, rounds, texts, seconds = timed_pass(gen, prompts, args.max_new_tokens, methods[m])
            speed[m].append(tokens / seconds)
            tau.setdefault(m, []).append(tokens / rounds)
            first_output = first_output or texts
            assert texts == first_output, f"{m}: output differs from the first pass's"
            if m == "auto":
                kinds_played.append({k: n - before[k] for k, n in gen._round_kinds[1].rounds.items()})
    med = {m: statistics.median(v) for m, v in speed.items()}
    print("\n| method | tok/s per pass | median | tokens a round |")
    print("|---|---|---|---|")
    for m in methods:
        print(f"| {m} | {' '.join(f'{x:.1f}' for x in speed[m])} | {med[m]:.1f} | "
              f"{' '.join(f'{x:.2f}' for x in tau[m])} |")
    best = max(("tree", "chain"), key=med.get)
    print(f"\nauto / {best} (the faster fixed kind): {med['auto'] / med[best]:.3f}; tree / chain: "
          f"{med['tree'] / med['chain']:.3f}; rounds auto played per pass (tree, chain): "
          + ", ".join(f"{k['tree']}/{k['chain']}" for k in kinds_played) + "; every output identical")


if __name__ == "__main__":
    main()
