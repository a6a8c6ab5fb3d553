"""Where a verification forward's extra time goes on the CPU: the target's forward over k
new tokens against a one-token forward, per op.

SmolLM2-135M-Instruct in the engine's CPU configuration (``domino.loading.use_cpu_kernels``:
``domino.fast_linear``, ``domino.fast_attention``, ``domino.fast_layers`` and, where it
applies, ``domino.fast_forward``; what ``bench_linear.py``'s "engine" column runs), a KV cache of --cache tokens. For k = 1 and each --tokens k it prints the
median wall time of a forward (warm-up excluded), then ``torch.profiler``'s self CPU time
per forward of each op at k = 1 and at the largest k, side by side with their difference,
and the rate of the linear layers' multiply-adds (all nn.Linear layers, the LM head
included, at every position) against the per-core peaks in ``benchmarks/README.md``
(``benchmarks/peak_multiply_adds.cpp``). The profiled forwards run after the timed ones;
the profiler's own overhead makes their sum differ from the wall time. The cache is a
``DynamicCache``, so the forward runs its layers one kernel call at a time and each op is
seen; the engine's ``GrowingCache`` runs them as one ``domino_ops.decoder_layers`` call
(the same kernels, without ~4-5 ms of Python around them on the Zen 3 VM: compare
``bench_linear.py``'s engine column, on that cache).

Issue 15's goal is a 16-token forward <= 1.3x a one-token one. On a CPU where the 16-token
linears are compute-bound, their multiply-adds at the peak set a floor under that ratio:
(one-token time + the linears' minimum 16-token time - their one-token time) / one-token
time; this prints it from the measured one-token linears and the peak given by --peak-gmacs.

    python benchmarks/verify_forward_profile.py [--dtype bf16] [--tokens 16] [--cache 110]
        [--peak-gmacs 232]   # 2 cores x 116 G/s VDPBF16PS on the Zen 4 VM
"""

from __future__ import annotations

import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from domino.loading import use_cpu_kernels
from domino.target import cache_kwarg
from timing import median_seconds

LINEAR_OPS = ("domino_ops::small_batch_linear_packed", "domino_ops::small_batch_linear", "aten::linear",
              "aten::addmm", "aten::mm")


def linear_macs(model, k: int) -> int:
    """Multiply-adds of every nn.Linear layer of ``model`` over k positions."""
    return k * sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))


def forward_fn(model, cache, kv: str, ids: torch.Tensor):
    """One forward over ``ids`` [1, k] after the cached prompt, the cache cropped back after."""
    k = ids.shape[1]

    def run():
        model(input_ids=ids, **{kv: cache}, use_cache=True)
        cache.crop(-k)

    return run


def self_us_per_forward(fn, forwards: int) -> dict:
    """{op name: self CPU microseconds per forward} over ``forwards`` profiled forwards."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(forwards):
            fn()
    return {e.key: e.self_cpu_time_total / forwards for e in prof.key_averages()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--tokens", type=int, nargs="+", default=[16], help="the k compared with k = 1")
    ap.add_argument("--cache", type=int, default=110)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--peak-gmacs", type=float, default=None,
                    help="the machine's multiply-add peak, G/s, all threads (benchmarks/README.md)")
    ap.add_argument("--rows", type=int, default=25, help="ops shown")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, DynamicCache

    from domino.loading import smollm2_dir
    from domino_ops import cpu

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=dtype).eval()
    use_cpu_kernels(model, small_batch_linear=True, small_batch_attention=True)  # as the engine: + fast_forward
    kv = cache_kwarg(model.forward)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = DynamicCache()
    ks = [1] + [k for k in args.tokens if k != 1]
    print(f"CPU: {cpu.model()}, {torch.get_num_threads()} threads; {args.dtype}, KV cache {args.cache} tokens, "
          f"the engine's configuration; load average {os.getloadavg()[0]:.1f}")
    with torch.inference_mode():
        model(input_ids=torch.randint(0, vocab, (1, args.cache), generator=g), **{kv: cache}, use_cache=True)
        fns = {k: forward_fn(model, cache, kv, torch.randint(0, vocab, (1, k), generator=g)) for k in ks}
        wall = {k: median_seconds(fns[k], args.repeats, warmup=5) * 1e3 for k in ks}
        ops = {k: self_us_per_forward(fns[k], 10) for k in (1, ks[-1])}
    for k in ks:
        print(f"k = {k:2d}: {wall[k]:6.2f} ms median of {args.repeats} ({wall[k] / wall[1]:.2f}x the one-token forward)")
    kmax = ks[-1]
    print(f"\nself CPU time per forward (torch.profiler, 10 forwards each), us\n")
    print(f"| op | k = 1 | k = {kmax} | difference |")
    print("|---|---|---|---|")
    names = sorted(set(ops[1]) | set(ops[kmax]), key=lambda n: -ops[kmax].get(n, 0.0))
    for name in names[:args.rows]:
        a, b = ops[1].get(name, 0.0), ops[kmax].get(name, 0.0)
        print(f"| {name} | {a:.0f} | {b:.0f} | {b - a:+.0f} |")
    total1, totalk = sum(ops[1].values()), sum(ops[kmax].values())
    print(f"| (all ops) | {total1:.0f} | {totalk:.0f} | {totalk - total1:+.0f} |")

    lin = {k: sum(ops[k].get(n, 0.0) for n in LINEAR_OPS) for k in (1, kmax)}
    macs = linear_macs(model, kmax)
    print(f"\nlinear layers at k = {kmax}: {macs / 1e9:.2f} G multiply-adds in {lin[kmax] / 1e3:.2f} ms, "
          f"{macs / lin[kmax] / 1e3:.0f} G/s; at k = 1 {lin[1] / 1e3:.2f} ms")
    if args.peak_gmacs:
        floor_ms = macs / args.peak_gmacs / 1e6
        ratio = (wall[1] + max(floor_ms - lin[1] / 1e3, 0.0)) / wall[1]
        print(f"at the peak ({args.peak_gmacs:.0f} G/s) they need >= {floor_ms:.2f} ms: the {kmax}-token forward "
              f"cannot come under {ratio:.2f}x this one-token forward unless the rest of it shrinks "
              f"(the linears at {macs / lin[kmax] / 1e3 / args.peak_gmacs:.0%} of the peak now)")


if __name__ == "__main__":
    main()
