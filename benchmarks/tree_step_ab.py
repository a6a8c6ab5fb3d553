"""Interleaved A/B of the tree head step on the CPU: ``domino_head_expand`` with w2 packed,
with w2 and w_hh packed, a batch-1 chain step (``domino_head_rollout``, k = 1), and the
step's floor, the packed w2 product alone for the frontier's rows
(``small_batch_linear_packed``: [n, r] by w2 [V, r], what every node's logits need before
anything else is done with them), in blocks of 3 warm-up and 6 timed calls each, four rounds, medians
(``timing.interleaved_median_seconds``, which ``bench_head.py``'s tree table uses too). Interleaving
keeps a drifting machine from favouring whichever call is timed first. The expand calls write into outputs allocated once and passed
as ``out=``, without node logits (``write_node_logits=False``), as a greedy ``draft_tree`` does. Needs a CPU that
runs the packed kernel (AVX2 + FMA, or AVX512-BF16; ``small_batch_linear_packed_path()`` names the product).

    python benchmarks/tree_step_ab.py 16            # paper shape, 16 nodes, 4 children
    python benchmarks/tree_step_ab.py 16 small
    python benchmarks/tree_step_ab.py 4 engine      # the shipped drafter's head over its 16K draft vocabulary
"""

import sys
from pathlib import Path

import torch

import domino_ops
from domino_ops.ops import expand_outputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_head import SHAPES, make_inputs  # noqa: E402
from timing import interleaved_median_seconds  # noqa: E402


# bench_head's shapes, and the one the engine's tree rounds run: the shipped SmolLM2 drafter's
# head (H 576, G 256, r 64) over its draft vocabulary of 16,384 tokens
TREE_SHAPES = {**SHAPES, "engine": (576, 256, 64, 16384)}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    shape = sys.argv[2] if len(sys.argv) > 2 else "paper"
    H, G, r, V = TREE_SHAPES[shape]
    gen = torch.Generator().manual_seed(0)
    base, hproj, state, gru_input, _, w_hh, w1s, w2 = make_inputs(1, 1, H, G, r, V, torch.bfloat16, True, gen)
    m = 4
    w2_packed = domino_ops.pack_small_batch_linear_weight(w2)
    w_hh_packed = domino_ops.pack_small_batch_linear_weight(w_hh)
    node_state = torch.randn(n, G, generator=gen) * 0.5
    zeros = torch.zeros(n, dtype=torch.long)
    a = torch.randn(n, w2.shape[1], generator=gen).bfloat16()  # the correction's activations
    out = expand_outputs(n, m, G, V, "cpu", write_node_logits=False)

    def expand(**packs):
        return lambda: domino_ops.domino_head_expand(base, hproj, node_state, zeros, zeros, gru_input, None, w_hh,
                                                     w1s, w2, num_children=m, write_node_logits=False, out=out,
                                                     **packs)

    calls = {"w2 packed": expand(w2_packed=w2_packed),
             "w2+w_hh packed": expand(w2_packed=w2_packed, w_hh_packed=w_hh_packed),
             "w2 product alone": lambda: domino_ops.small_batch_linear_packed(a, w2_packed),
             "chain": lambda: domino_ops.domino_head_rollout(base, hproj, state, gru_input, None, w_hh, w1s, w2)}
    seconds = interleaved_median_seconds(list(calls.values()), 24, warmup=3, block=6)
    med = {k: s * 1e3 for k, s in zip(calls, seconds)}
    print(shape, f"n={n}", "  ".join(f"{k} {v:.3f} ms ({v / med['chain']:.2f}x)" for k, v in med.items()))


if __name__ == "__main__":
    main()
