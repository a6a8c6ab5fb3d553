"""Where a model's packed weight copies lie in memory, and how fast they stream from there.

SmolLM2-135M-Instruct's 211 linear layers (the LM head included), switched by
``domino.fast_linear.use_small_batch_linear`` (which packs every layer's weight), the copies
then placed back to back in forward order (``place_packed_weights``, as the fast forward's
plan places the products it runs). Three ways to run the layers, interleaved within every
repeat (median of ``--repeats`` after 2 warm-ups), at one row (a decode step) and 16 (a
verification):

- "placed": ``small_batch_linear_packed`` on the placed copies;
- "one by one": on copies of the same panels allocated one by one, as packing leaves them
  (each where the allocator put it);
- "row-major": ``small_batch_linear`` on the model's own weights (another kernel, other
  bits: the stream of the loader's layout, for scale).

Each variant's output is the same bits in "placed" and "one by one" (checked).

    python benchmarks/packed_placement_ab.py [--dtypes fp32,bf16] [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import domino_ops
from domino.fast_linear import packed_weight, place_packed_weights, use_small_batch_linear
from domino.loading import smollm2_dir


def layer_runs(model, dtype: torch.dtype, rows: int) -> dict:
    """The three ways to run the layers, each a function of no arguments."""
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
    placed = [packed_weight(m).data for m in layers]
    one_by_one = [p.clone() for p in placed]  # allocated one at a time, in forward order
    xs = [torch.randn(rows, m.in_features).to(dtype) for m in layers]
    outs = [torch.empty(rows, m.out_features, dtype=dtype) for m in layers]
    packed_op, row_op = torch.ops.domino_ops.small_batch_linear_packed.default, torch.ops.domino_ops.small_batch_linear.default

    def on(panels):
        def run():
            for m, p, x, o in zip(layers, panels, xs, outs):
                packed_op(x, p, m.out_features, None, o)
        return run

    def row_major():
        for m, x, o in zip(layers, xs, outs):
            row_op(x, m.weight, None, o)

    on(placed)()
    expected = [o.clone() for o in outs[-3:]]  # checked outside the timed calls
    on(one_by_one)()
    assert all(torch.equal(a, b) for a, b in zip(expected, outs[-3:]))
    return {"placed": on(placed), "one by one": on(one_by_one), "row-major": row_major}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    print(f"{torch.get_num_threads()} threads; packed product for bf16: {domino_ops.small_batch_linear_packed_path()}")
    for name in args.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        model = use_small_batch_linear(AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=dtype).eval())
        place_packed_weights(model)
        with torch.inference_mode():
            for rows in (1, 16):
                runs = layer_runs(model, dtype, rows)
                times = {k: [] for k in runs}
                for rep in range(args.repeats + 2):
                    for k, run in runs.items():
                        t0 = time.perf_counter()
                        run()
                        if rep >= 2:
                            times[k].append((time.perf_counter() - t0) * 1e3)
                med = {k: statistics.median(v) for k, v in times.items()}
                print(f"{name}, {rows:2d} row(s), SmolLM2's 211 layers: "
                      + "  ".join(f"{k} {v:.2f} ms" for k, v in med.items())
                      + f"  (one by one / placed {med['one by one'] / med['placed']:.2f}x)")
        del model


if __name__ == "__main__":
    main()
