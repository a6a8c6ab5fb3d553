"""The Python wrappers' cost on the ops a decoder layer calls on the CPU: each op through
its ``domino_ops`` wrapper against the same kernel called straight through
``torch.ops.domino_ops.<op>.default`` (with its output allocated per call, as the wrappers
do), interleaved, medians.

- The linears (``small_batch_linear``, ``small_batch_linear_packed``): one small layer in
  cache at one row (48 x 64: the call overhead alone), and SmolLM2-135M-Instruct's 211
  linears at one row (a decode step's linears, weights streamed). The packed op runs on
  panels of the layer's dtype (float32 by default, ``--dtype bf16``); needs a CPU that runs
  the packed kernel.
- ``rms_norm``, ``silu_mul``, ``apply_rotary_pos_emb`` and ``small_batch_attention`` at
  SmolLM2's one-token decode shapes (hidden 576, MLP 1536, 9 query and 3 key/value heads
  of 64, 110 cached positions).
- An ``nn.Linear`` switched by ``domino.fast_linear`` against PyTorch's own ``nn.Linear``
  (one 48 x 64 layer in cache, a [1, 1, 64] input as HF's forward passes it): the module
  call, and what each spends around its product (``switched_linear`` or ``F.linear``).

    python benchmarks/layer_ops_wrapper_cost.py [--dtype fp32|bf16]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import domino_ops


def interleaved_us(calls: dict, rounds: int, per_round: int, warmup: int = 3) -> dict:
    """Median over rounds of each call's mean time per call, us; the calls alternate."""
    times = {k: [] for k in calls}
    for r in range(rounds + warmup):
        for k, f in calls.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                f()
            if r >= warmup:
                times[k].append((time.perf_counter() - t0) / per_round * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def calls_for(xs, ws, ps) -> dict:
    """The four ways to run the layers (lists of x, weight, packed weight)."""
    lin, packed = torch.ops.domino_ops.small_batch_linear.default, torch.ops.domino_ops.small_batch_linear_packed.default
    return {
        "small_batch_linear wrapper": lambda: [domino_ops.small_batch_linear(x, w) for x, w in zip(xs, ws)],
        "small_batch_linear torch.ops": lambda: [lin(x, w, None, torch.empty(x.shape[0], w.shape[0], dtype=x.dtype))
                                                 for x, w in zip(xs, ws)],
        "small_batch_linear_packed wrapper": lambda: [domino_ops.small_batch_linear_packed(x, p)
                                                      for x, p in zip(xs, ps)],
        "small_batch_linear_packed torch.ops": lambda: [
            packed(x, p.data, p.out_features, None, torch.empty(x.shape[0], p.out_features, dtype=x.dtype))
            for x, p in zip(xs, ps)],
    }


def report(title: str, us: dict, n_calls: int) -> None:
    print(f"\n{title}")
    print("| op | wrapper | torch.ops | wrapper's own cost a call |")
    print("|---|---|---|---|")
    for op in ("small_batch_linear", "small_batch_linear_packed"):
        w, d = us[f"{op} wrapper"], us[f"{op} torch.ops"]
        print(f"| {op} | {w:.1f} us | {d:.1f} us | {(w - d) / n_calls:.2f} us |")


def layer_ops_table(dtype: torch.dtype) -> None:
    """rms_norm, silu_mul, apply_rotary_pos_emb, small_batch_attention: wrapper against torch.ops."""
    ops = torch.ops.domino_ops
    H, I, Hq, Hkv, D, N = 576, 1536, 9, 3, 64, 110
    x, w = torch.randn(1, H).to(dtype), torch.randn(H).to(dtype)
    gate, up = torch.randn(1, I).to(dtype), torch.randn(1, I).to(dtype)
    q, k = torch.randn(1, Hq, 1, D).to(dtype), torch.randn(1, Hkv, 1, D).to(dtype)
    cos, sin = torch.randn(1, 1, D).to(dtype), torch.randn(1, 1, D).to(dtype)
    kc, vc = torch.randn(1, Hkv, N, D).to(dtype), torch.randn(1, Hkv, N, D).to(dtype)
    calls = {
        "rms_norm wrapper": lambda: domino_ops.rms_norm(x, w, 1e-5),
        "rms_norm torch.ops": lambda: ops.rms_norm.default(x, w, 1e-5, torch.empty_like(x)),
        "silu_mul wrapper": lambda: domino_ops.silu_mul(gate, up),
        "silu_mul torch.ops": lambda: ops.silu_mul.default(gate, up, torch.empty_like(gate)),
        "apply_rotary_pos_emb wrapper": lambda: domino_ops.apply_rotary_pos_emb(q, k, cos, sin),
        "apply_rotary_pos_emb torch.ops": lambda: ops.apply_rotary_pos_emb.default(
            q, k, cos, sin, torch.empty_like(q), torch.empty_like(k)),
        "small_batch_attention wrapper": lambda: domino_ops.small_batch_attention(q, kc, vc),
        "small_batch_attention torch.ops": lambda: ops.small_batch_attention.default(
            q, kc, vc, None, D ** -0.5, torch.empty_like(q)),
    }
    us = interleaved_us(calls, 15, 2000)
    print("\nthe other layer ops at SmolLM2's one-token decode shapes: us a call (median of 15 rounds of 2,000 calls)")
    print("| op | wrapper | torch.ops | wrapper's own cost |")
    print("|---|---|---|---|")
    for op in ("rms_norm", "silu_mul", "apply_rotary_pos_emb", "small_batch_attention"):
        a, b = us[f"{op} wrapper"], us[f"{op} torch.ops"]
        print(f"| {op} | {a:.1f} us | {b:.1f} us | {a - b:.2f} us |")


def switched_layer_table(dtype: torch.dtype) -> None:
    """A switched nn.Linear's call against PyTorch's nn.Linear's, and each one's product alone."""
    from domino.fast_linear import packed_weight, runs_packed, use_small_batch_linear

    torch_layer = torch.nn.Linear(64, 48, bias=False).to(dtype)
    switched = use_small_batch_linear(torch.nn.Linear(64, 48, bias=False).to(dtype))
    with torch.no_grad():
        switched.weight.copy_(torch_layer.weight)
    x = torch.randn(1, 1, 64).to(dtype)
    w = switched.weight
    rows, out = x.view(1, 64), torch.empty(1, 48, dtype=dtype)
    if runs_packed(switched, dtype):
        p = packed_weight(switched)
        product = ("small_batch_linear_packed torch.ops",
                   lambda: torch.ops.domino_ops.small_batch_linear_packed.default(rows, p.data, 48, None, out))
    else:
        product = ("small_batch_linear torch.ops", lambda: torch.ops.domino_ops.small_batch_linear.default(rows, w, None, out))
    calls = {"switched nn.Linear": lambda: switched(x), product[0]: product[1],
             "PyTorch's nn.Linear": lambda: torch_layer(x), "F.linear": lambda: F.linear(x, torch_layer.weight)}
    with torch.inference_mode():
        us = interleaved_us(calls, 15, 2000)
    print("\na switched nn.Linear against PyTorch's, one 48 x 64 layer in cache, x [1, 1, 64], inference mode: "
          "us a call (median of 15 rounds of 2,000 calls)")
    print("| layer | module call | its product alone | the module's own cost |")
    print("|---|---|---|---|")
    print(f"| switched (domino.fast_linear) | {us['switched nn.Linear']:.2f} us | {us[product[0]]:.2f} us "
          f"({product[0]}) | {us['switched nn.Linear'] - us[product[0]]:.2f} us |")
    theirs = us["PyTorch's nn.Linear"]
    print(f"| PyTorch's | {theirs:.2f} us | {us['F.linear']:.2f} us (F.linear) | {theirs - us['F.linear']:.2f} us |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    print(f"{torch.get_num_threads()} threads, {args.dtype}; packed product "
          f"{domino_ops.small_batch_linear_packed_path() if dtype == torch.bfloat16 else 'float32 panels'}")

    w = torch.randn(48, 64).to(dtype)
    small = calls_for([torch.randn(1, 64).to(dtype)], [w], [domino_ops.pack_small_batch_linear_weight(w, dtype=dtype)])
    report("one 48 x 64 layer in cache, one row: us a call (median of 15 rounds of 2,000 calls)",
           interleaved_us(small, 15, 2000), 1)

    from transformers import AutoModelForCausalLM

    from domino.loading import smollm2_dir
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=dtype)
    ws = [m.weight.detach().contiguous() for m in model.modules() if type(m) is torch.nn.Linear]
    ps = [domino_ops.pack_small_batch_linear_weight(w, dtype=dtype) for w in ws]
    xs = [torch.randn(1, w.shape[1]).to(dtype) for w in ws]
    model_us = interleaved_us(calls_for(xs, ws, ps), 11, 1)
    report(f"SmolLM2's {len(ws)} linears, one row, weights streamed: us for all of them (median of 11 rounds)",
           model_us, len(ws))
    layer_ops_table(dtype)
    switched_layer_table(dtype)


if __name__ == "__main__":
    main()
