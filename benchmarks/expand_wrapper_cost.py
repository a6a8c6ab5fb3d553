"""The Python wrapper's cost on a CPU tree step: the same greedy (by default paper-shape,
16-node) ``domino_head_expand`` call (w2 and w_hh packed, outputs reused, no node logits, as a greedy
``draft_tree`` steps) through ``domino_ops.domino_head_expand`` and straight through
``torch.ops.domino_ops.domino_head_expand.default``, interleaved, 6 rounds of 3 warm-up and
10 timed calls each, medians. Needs a CPU that runs the packed kernel (AVX2 + FMA, or AVX512-BF16).

    python benchmarks/expand_wrapper_cost.py
    python benchmarks/expand_wrapper_cost.py 4 engine   # frontier size and shape (tree_step_ab.py's)
"""

import statistics
import sys
import time
from pathlib import Path

import torch

import domino_ops
from domino_ops.ops import expand_outputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_head import make_inputs  # noqa: E402
from tree_step_ab import TREE_SHAPES  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    shape = sys.argv[2] if len(sys.argv) > 2 else "paper"
    H, G, r, V = TREE_SHAPES[shape]
    m = 4
    gen = torch.Generator().manual_seed(0)
    base, hproj, _, gru_input, _, w_hh, w1s, w2 = make_inputs(1, 1, H, G, r, V, torch.bfloat16, True, gen)
    w2_packed = domino_ops.pack_small_batch_linear_weight(w2)
    w_hh_packed = domino_ops.pack_small_batch_linear_weight(w_hh)
    node_state = torch.randn(n, G, generator=gen) * 0.5
    zeros = torch.zeros(n, dtype=torch.long)
    out = expand_outputs(n, m, G, V, "cpu", write_node_logits=False)
    op = torch.ops.domino_ops.domino_head_expand.default
    calls = {
        "wrapper": lambda: domino_ops.domino_head_expand(
            base, hproj, node_state, zeros, zeros, gru_input, None, w_hh, w1s, w2, num_children=m,
            w2_packed=w2_packed, w_hh_packed=w_hh_packed, write_node_logits=False, out=out),
        "torch.ops": lambda: op(base, hproj, node_state, zeros, zeros, gru_input, None, w_hh, w1s, w2, 0.0, 0, 1.0,
                                None, out[0], out[1], out[2], None, w2_packed.data, w_hh_packed.data),
    }
    rounds = {name: [] for name in calls}
    for _ in range(6):
        for name, call in calls.items():
            for _ in range(3):
                call()
            times = []
            for _ in range(10):
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            rounds[name].append(statistics.median(times))
    for name, medians in rounds.items():
        print(f"{shape} n={n} {name:9s} {statistics.median(medians) * 1e3:.3f} ms  rounds "
              + " ".join(f"{x * 1e3:.2f}" for x in medians))


if __name__ == "__main__":
    main()
