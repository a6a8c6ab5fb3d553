"""Runs a benchmark script with the target's decoder layers computed one kernel call at a
time (``domino.fast_forward``'s Python loop, as every forward ran before
``domino_ops.decoder_layers``): the "before" of an A/B on the same code and the same bits.
The adaptive budget's round costs are measured afresh into a temporary directory, so the
run neither plans with costs measured on the one-call path nor leaves its own behind for
a later run (they share the source fingerprint that keys the cost cache).

    python benchmarks/without_decoder_layers.py bench_e2e.py [its arguments]
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path

from domino import budget
from domino import fast_forward


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    script = Path(__file__).parent / sys.argv[1]
    costs = Path(tempfile.mkdtemp(prefix="round_costs."))
    fast_forward._decoder_layers_in_one_call = fast_forward._decoder_layers_in_python
    budget.cost_cache_dir = lambda: costs
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))
    print(f"[without_decoder_layers] the target's layers one kernel call at a time; round costs in {costs}",
          flush=True)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
