"""Runs a benchmark script with the named ``domino_ops`` ops on their PyTorch references
(``backend="reference"``) instead of their kernels: the "before" of an A/B for an op whose
kernel replaced a PyTorch path (``filtered_probs``'s reference is the PyTorch code the
engine ran before its kernels). Every module's reference to the op's public function is
patched, so imported names are caught too. The adaptive budget's round costs are measured
afresh into a temporary directory (as without_layer_ops.py does, for the same reason).

    python benchmarks/with_reference_ops.py filtered_probs bench_e2e.py --temperature 0.7 [its arguments]
"""

from __future__ import annotations

import functools
import runpy
import sys
import tempfile
from pathlib import Path

import domino  # noqa: F401  (imports every module that may hold an op's name)
import domino_ops
from domino import budget


def on_reference(op: str) -> None:
    """Rebinds every module attribute that is ``domino_ops.<op>`` to it with backend="reference"."""
    kernel_path = getattr(domino_ops, op)
    reference_path = functools.partial(kernel_path, backend="reference")
    for module in list(sys.modules.values()):
        for name, value in list(getattr(module, "__dict__", {}).items()):
            if value is kernel_path:
                setattr(module, name, reference_path)


def main() -> None:
    ops = []
    while len(sys.argv) > 1 and not sys.argv[1].endswith(".py"):
        ops.append(sys.argv.pop(1))
    if not ops or len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for op in ops:
        if op not in domino_ops.ops.__all__:
            raise SystemExit(f"{op!r} is not one of domino_ops.ops' ops: {domino_ops.ops.__all__}")
        on_reference(op)
    costs = Path(tempfile.mkdtemp(prefix="round_costs."))
    budget.cost_cache_dir = lambda: costs
    script = Path(__file__).parent / sys.argv[1]
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))
    print(f"[with_reference_ops] {', '.join(ops)} on the reference; round costs in {costs}", flush=True)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
