"""What a batch's round costs look like at each batch size, and what they make the plan do
for the last request of a batch: for batch sizes 1-4 (``--batch-sizes``), the seconds
``domino.budget.measure_round_costs`` takes (what a first call at that size pays, once per
machine) and the verification and drafting milliseconds at 128 cached positions; then the
drafts the budget plans for one row left (``domino.budget.best_draft_length`` from the
calibration's acceptance per depth, ``DepthAcceptance``'s prior) with each size's table
(domino.budget.cost_batch_sizes: a call of b requests plans its later rounds with the
smaller sizes' tables). Default configuration (``domino.load_default``).

    python benchmarks/round_costs_by_batch.py [--batch-sizes 1 2 3 4]
"""

from __future__ import annotations

import argparse
import time

import domino
from domino import budget


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 3, 4])
    args = p.parse_args()
    gen = domino.load_default()
    rates = budget.DepthAcceptance(gen.drafter.config.num_drafts, gen.drafter.calibration.depth_rates or 0.5).rates()
    tables = {}
    for b in args.batch_sizes:
        t0 = time.perf_counter()
        tables[b] = budget.measure_round_costs(gen, b).at(128)
        c = tables[b]
        print(f"batch {b}: measured in {time.perf_counter() - t0:.1f} s; at 128 cached: verify ms t=1..9 "
              f"{[round(x, 1) for x in c.verify_ms[1:10]]}, draft ms n=1..9 {[round(x, 1) for x in c.draft_ms[1:10]]}",
              flush=True)
    for b, c in tables.items():
        print(f"one row left, planned with batch {b}'s table: {budget.best_draft_length(rates, c, 1)} drafts a round")


if __name__ == "__main__":
    main()
