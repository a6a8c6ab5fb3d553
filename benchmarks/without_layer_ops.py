"""Runs a benchmark script with the layers of the target (``decoder_layers``) and/or of the
drafter (``draft_layers``) computed one kernel call at a time in Python, as they ran before
those C++ ops: the "before" of an A/B on the same code and the same bits. The adaptive
budget's round costs are measured afresh into a temporary directory, so the run neither
plans with costs measured with the ops nor leaves its own behind for a later run (they
share the source fingerprint that keys the cost cache).

    python benchmarks/without_layer_ops.py decoder_layers draft_layers bench_e2e.py [its arguments]
"""

from __future__ import annotations

import runpy
import sys
import tempfile
from pathlib import Path

from domino import budget, fast_forward
from domino.model import DominoDraftModel

OPS = ("decoder_layers", "draft_layers")


def main() -> None:
    ops = []
    while len(sys.argv) > 1 and sys.argv[1] in OPS:
        ops.append(sys.argv.pop(1))
    if not ops or len(sys.argv) < 2 or not sys.argv[1].endswith(".py"):
        raise SystemExit(__doc__)
    if "decoder_layers" in ops:
        fast_forward._decoder_layers_in_one_call = fast_forward._decoder_layers_in_python
    if "draft_layers" in ops:
        DominoDraftModel._fused_layer_weights = lambda *args: None  # the layers' own forwards
    costs = Path(tempfile.mkdtemp(prefix="round_costs."))
    budget.cost_cache_dir = lambda: costs
    script = Path(__file__).parent / sys.argv[1]
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))
    print(f"[without_layer_ops] {', '.join(ops)} off: those layers one kernel call at a time; round costs in "
          f"{costs}", flush=True)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
