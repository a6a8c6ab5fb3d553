"""Verification cost on the CPU: a forward over k new tokens against a one-token step.

Prints, in one run, for SmolLM2-135M-Instruct with a KV cache of --cache tokens, the median
time of a forward over k = 1, 2, 4, 8, 16, 32 new tokens (logits at every position, as a
verification needs) with PyTorch's own linear layers, with
``domino_ops.small_batch_linear`` under them (``domino.fast_linear``; attention stays HF's
SDPA), with both the linear and ``domino_ops.small_batch_attention``, and with those plus
``domino_ops.rms_norm`` and ``silu_mul`` (``domino.fast_layers``), and with all of them
run as ``domino.fast_forward``'s one loop (what the engine runs on the CPU, where it
applies), in fp32 and bf16, side by side, each with its ratio to its own one-token
forward. Every repeat runs every variant, each at every k back to back, so machine noise
hits the variants alike and each ratio compares forwards made seconds apart. Then a
microbenchmark of the op alone against ``torch.nn.functional.linear`` on SmolLM2's shapes
at M = 1 and 16.

    python benchmarks/bench_linear.py [--repeats 9] [--cache 110] [--threads N]
    python benchmarks/bench_linear.py --prompt-rows   # a prompt's products (500 and 2,000 rows) against F.linear

Goal (issue 15): a 16-token forward <= 1.3x a one-token forward with the kernel, in both
dtypes, and the kernel's one-token forward no slower than PyTorch's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import types

import torch
import torch.nn.functional as F

import domino_ops
from domino.target import cache_kwarg
from domino_ops import cpu
from timing import copy_bandwidth_gbs, median_seconds
from domino.fast_attention import undo_small_batch_attention, use_small_batch_attention
from domino.fast_forward import model_fixed, undo_fast_forward, use_fast_forward, uses_fast_forward
from domino.fast_layers import undo_fused_layers, use_fused_layers
from domino import fast_linear
from domino.fast_linear import undo_small_batch_linear, use_small_batch_linear, uses_small_batch_linear

KS = (1, 2, 4, 8, 16, 32)
SHAPES = ((576, 576), (1536, 576), (576, 1536), (49152, 576))  # (N, K): q/o, gate/up, down, LM head
# variant: (small_batch_linear, packed weights, small_batch_attention, fused layers, fast
# forward). "kernel"
# is what domino.fast_linear runs: the packed kernel for bf16 on an AVX512-BF16 or AVX2-only CPU and for
# fp32 on an AVX-512F one (float32 panels), else the row-major one; "row-major" forces the row-major kernel (shown where packing
# applies); "fused" adds domino.fast_layers' rms_norm and silu_mul (and the fused projections);
# "engine" runs the forward as domino.fast_forward's one loop over those kernels: what the
# engine runs (where it applies; else "engine" is "fused").
# On an AMX CPU the packed kernel runs AMX tiles, and "engine-vector" is the engine with
# the packed kernel's AVX512-BF16 vector path instead (DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH).
VARIANTS = {"torch": (False, False, False, False, False), "row-major": (True, False, False, False, False),
            "kernel": (True, True, False, False, False), "kernel+attention": (True, True, True, False, False),
            "fused": (True, True, True, True, False), "engine": (True, True, True, True, True),
            "engine-vector": (True, True, True, True, True)}
LABELS = {"torch": "PyTorch", "row-major": "small_batch_linear row-major", "kernel": "small_batch_linear",
          "kernel+attention": "+ small_batch_attention", "fused": "+ rms_norm, silu_mul",
          "engine": "+ fast_forward (the engine)",
          "engine-vector": "the engine, packed product on AVX512-BF16 vectors, not AMX"}
PACKED_PATH_ENV = "DOMINO_SMALL_BATCH_LINEAR_PACKED_PATH"


def packed_path() -> str:
    """The packed kernel's product on this CPU ("amx", "avx512_bf16"; "" without one)."""
    return domino_ops.small_batch_linear_packed_path() if domino_ops.small_batch_linear_packed_supported() else ""


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    except OSError:
        pass
    return "?"


CLOCK = time.perf_counter  # --cpu-time: time.thread_time (one thread; ignores time spent descheduled)
FAST_FORWARD_APPLIES = {}  # dtype -> whether the "engine" variant ran domino.fast_forward (else HF's forward)


def forward_times(model, cache_len: int, repeats: int, ks=KS) -> dict:
    """{(variant, k): [seconds]} for each variant of VARIANTS, alternating per repeat."""
    from domino.kv_cache import GrowingCache

    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, cache_len), generator=g)
    cache = GrowingCache()  # the engine's cache (the engine's forward runs its layers as one decoder_layers call)
    times = {}
    kv = cache_kwarg(model.forward)  # "cache" or "past_key_values" (the transformers version's)
    use_small_batch_linear(model)  # once: switching packs the weights (where the CPU packs their dtype)
    packed_dtypes = getattr(model.lm_head, fast_linear._PACKS, ())
    packs = model.lm_head.weight.dtype in packed_dtypes
    amx = packs and packed_path() == "amx" and model.lm_head.weight.dtype == torch.bfloat16
    variants = {v: f for v, f in VARIANTS.items() if (v != "row-major" or packs) and (v != "engine-vector" or amx)}
    ids = {k: torch.randint(0, vocab, (1, k), generator=g) for k in ks}
    with torch.inference_mode():
        model(input_ids=prompt, **{kv: cache}, use_cache=True)
        # Every repeat runs every variant at every k, a variant's k back to back: a ratio to
        # k = 1 compares forwards made seconds apart, never minutes (this VM's memory
        # bandwidth drifts by a third over minutes), and the variants alternate. After a
        # switch one untimed forward, and the k in another order each repeat, so no k is
        # always the first (or last) forward of a variant.
        for rep in range(repeats + 2):  # the first two rounds are warm-up
            for variant, (linear, packed, attention, fused, fast) in variants.items():
                undo_fast_forward(model)  # its plan reads the switches below
                run_linear_as(model, linear, packed_dtypes if packed else ())
                (use_small_batch_attention if attention else undo_small_batch_attention)(model)
                (use_fused_layers if fused else undo_fused_layers)(model)
                if fast:
                    FAST_FORWARD_APPLIES[model.lm_head.weight.dtype] = uses_fast_forward(use_fast_forward(model))
                path = "avx512_bf16" if variant == "engine-vector" else None
                # held fixed, as the engine's loops hold their target (no-op off the fast forward)
                with model_fixed(model), cpu.kernel_switch(PACKED_PATH_ENV, path):
                    model(input_ids=ids[ks[0]], **{kv: cache}, use_cache=True)
                    cache.crop(-ks[0])
                    for k in ks[rep % len(ks):] + ks[:rep % len(ks)]:
                        t0 = CLOCK()
                        out = model(input_ids=ids[k], **{kv: cache}, use_cache=True)
                        dt = CLOCK() - t0
                        assert out.logits.shape[1] == k
                        cache.crop(-k)
                        if rep >= 2:
                            times.setdefault((variant, k), []).append(dt)
    undo_fast_forward(model)
    undo_small_batch_linear(model)
    undo_small_batch_attention(model)
    undo_fused_layers(model)
    return times


def run_linear_as(model, linear: bool, packed: tuple) -> None:
    """The switched model's nn.Linear layers run PyTorch's F.linear (linear False), the
    row-major kernel or the packed one (for the dtypes in ``packed``). Sets the switch's own
    per-layer flag, so the packed copies are made once, not at every switch."""
    for mod in model.modules():
        if uses_small_batch_linear(mod) and type(mod) is torch.nn.Linear:
            if linear:
                mod.forward = types.MethodType(fast_linear._small_batch_forward, mod)
            else:
                mod.__dict__.pop("forward", None)
            setattr(mod, fast_linear._PACKS, packed)


def model_table(repeats: int, cache_len: int, dtypes) -> None:
    from transformers import AutoModelForCausalLM

    from domino.loading import smollm2_dir

    path = smollm2_dir()
    med = {}
    for dt in dtypes:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt).eval()
        for (variant, k), ts in forward_times(model, cache_len, repeats).items():
            med[(dt, variant, k)] = (statistics.median(ts), min(ts), max(ts))
        del model
    names = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    cols = [(dt, v) for dt in dtypes for v in VARIANTS if (dt, v, 1) in med]
    for stat, label in ((0, f"median of {repeats}"), (1, f"minimum of {repeats} (robust to other load)")):
        print(f"\nSmolLM2-135M-Instruct, forward over k new tokens, KV cache {cache_len} tokens, {label}; "
              "ratio = time / its own k = 1 time\n")
        print("| tokens | " + " | ".join(f"{names[dt]} {LABELS[v]}" for dt, v in cols) + " |")
        print("|" + "---|" * (len(cols) + 1))
        for k in KS:
            cells = []
            for dt, v in cols:
                t, base = med[(dt, v, k)][stat], med[(dt, v, 1)][stat]
                cells.append(f"{t * 1e3:.1f} ms" + ("" if k == 1 else f" ({t / base:.2f}x)"))
            print(f"| {k} | " + " | ".join(cells) + " |")
    print("\nmax of the repeats: " + "; ".join(
        f"{names[dt]} {v} k={k}: {a[2] * 1e3:.1f} ms"
        for (dt, v, k), a in sorted(med.items(), key=lambda i: (str(i[0][0]), i[0][1], i[0][2]))))
    print("\ngoals (medians):")
    for dt in dtypes:
        r16 = med[(dt, "kernel", 16)][0] / med[(dt, "kernel", 1)][0]
        one = med[(dt, "kernel", 1)][0] / med[(dt, "torch", 1)][0]
        r16a = med[(dt, "kernel+attention", 16)][0] / med[(dt, "kernel+attention", 1)][0]
        r16e = med[(dt, "engine", 16)][0] / med[(dt, "engine", 1)][0]
        print(f"  {names[dt]}: 16-token / 1-token forward with the kernel = {r16:.2f}x (goal <= 1.3: "
              f"{'met' if r16 <= 1.3 else 'MISSED'}); kernel 1-token / PyTorch 1-token = {one:.2f} "
              f"(goal <= 1: {'met' if one <= 1.0 else 'MISSED'}); with small_batch_attention too: "
              f"{r16a:.2f}x; the engine's configuration (+ rms_norm, silu_mul, fast_forward): 16-token / "
              f"1-token = {r16e:.2f}x, its 1-token forward {med[(dt, 'engine', 1)][0] * 1e3:.1f} ms "
              f"({med[(dt, 'engine', 1)][0] / med[(dt, 'torch', 1)][0]:.2f}x PyTorch's)"
              + ("" if FAST_FORWARD_APPLIES.get(dt) else "; fast_forward does not apply to this dtype on this "
                 "CPU (its linears are not packed): the engine column is HF's forward over the same kernels"))
        if (dt, "engine-vector", 16) in med:
            r16v = med[(dt, "engine-vector", 16)][0] / med[(dt, "engine-vector", 1)][0]
            print(f"    the engine with the packed product on AVX512-BF16 vectors instead of AMX tiles: "
                  f"16-token / 1-token = {r16v:.2f}x, its 1-token forward "
                  f"{med[(dt, 'engine-vector', 1)][0] * 1e3:.1f} ms")


def median_time(f, repeats: int) -> float:
    return median_seconds(f, repeats, warmup=3, clock=CLOCK)


def micro_table(repeats: int, dtypes) -> None:
    print("\nThe op alone against F.linear (median of "
          f"{repeats}; the smaller weights stay in cache between calls, the LM head does not):\n")
    print("| dtype | N x K | M | F.linear | small_batch_linear | GB/s (weights) | GFLOP/s | packed | GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    op = torch.ops.domino_ops.small_batch_linear.default
    packed_op = torch.ops.domino_ops.small_batch_linear_packed.default
    g = torch.Generator().manual_seed(0)
    for dt in dtypes:
        for N, K in SHAPES:
            w = torch.randn(N, K, generator=g).to(dt)
            for M in (1, 6, 16):
                x = torch.randn(M, K, generator=g).to(dt)
                out = torch.empty(M, N, dtype=dt)
                t_ref = median_time(lambda: F.linear(x, w), repeats)
                t_op = median_time(lambda: op(x, w, None, out), repeats)
                gbs = N * K * w.element_size() / t_op / 1e9
                gf = 2 * M * N * K / t_op / 1e9
                packed = ""
                if domino_ops.small_batch_linear_packed_supported(dt):
                    wp = domino_ops.pack_small_batch_linear_weight(w, dtype=dt).data
                    t_p = median_time(lambda: packed_op(x, wp, N, None, out), repeats)
                    packed = f" {t_p * 1e6:.0f} us ({t_ref / t_p:.1f}x) | {2 * M * N * K / t_p / 1e9:.1f} |"
                print(f"| {str(dt)[6:]} | {N} x {K} | {M} | {t_ref * 1e6:.0f} us | {t_op * 1e6:.0f} us "
                      f"({t_ref / t_op:.1f}x) | {gbs:.1f} | {gf:.1f} |" + (packed or " | |"))


# The engine's fused products (N x K): q/k/v, o, gate/up, down
PROMPT_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


def prompt_table(repeats: int) -> None:
    """A prompt's products (500 and 2,000 rows, bf16, the engine's fused layer shapes):
    PyTorch's F.linear (oneDNN) against the packed kernel the engine runs."""
    print("\nA prompt's products, bf16, F.linear against small_batch_linear_packed (median of "
          f"{repeats}):\n")
    print("| N x K | rows | F.linear | packed |")
    print("|---|---|---|---|")
    packed_op = torch.ops.domino_ops.small_batch_linear_packed.default
    g = torch.Generator().manual_seed(0)
    for M in (500, 2000):
        for N, K in PROMPT_SHAPES:
            w = torch.randn(N, K, generator=g).bfloat16()
            x = torch.randn(M, K, generator=g).bfloat16()
            wp = domino_ops.pack_small_batch_linear_weight(w).data
            out = torch.empty(M, N, dtype=torch.bfloat16)
            t_ref = median_time(lambda: F.linear(x, w), repeats)
            t_p = median_time(lambda: packed_op(x, wp, N, None, out), repeats)
            print(f"| {N} x {K} | {M} | {t_ref * 1e3:.2f} ms | {t_p * 1e3:.2f} ms ({t_ref / t_p:.2f}x) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--cache", type=int, default=110, help="KV-cache length before the k new tokens")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--prompt-rows", action="store_true",
                    help="only a prompt's products (500 and 2,000 rows, bf16) against F.linear")
    ap.add_argument("--cpu-time", action="store_true",
                    help="one thread, timed by its CPU time: for a machine busy with other work")
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        args.threads = 1
        CLOCK = time.thread_time
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = [{"fp32": torch.float32, "bf16": torch.bfloat16}[d] for d in args.dtypes.split(",")]
    print(f"CPU: {cpu.model()} ({cpu_flags()}), {torch.get_num_threads()} threads"
          f"{', timed by thread CPU time' if args.cpu_time else ''}; "
          f"small_batch_linear path: {domino_ops.small_batch_linear_isa()}; packed product: {packed_path() or 'none'}; torch {torch.__version__}")
    load0 = os.getloadavg()
    # The one-token forward streams the weights (memory-bound), the 16-token one is
    # compute-bound at 16 rows: their ratio follows the memory bandwidth of the moment,
    # which on a shared VM moves between runs; printed before and after.
    bw0 = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw0:.1f} GB/s before the tables")
    if args.prompt_rows:
        prompt_table(args.repeats)
    else:
        if not args.skip_model:
            model_table(args.repeats, args.cache, dtypes)
        if not args.skip_micro:
            micro_table(max(args.repeats, 15), dtypes)
    print(f"\ncopy bandwidth {copy_bandwidth_gbs():.1f} GB/s after the tables ({bw0:.1f} before)")
    print(f"load average (1/5/15 min) at start {load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f}, at end "
          "{:.1f}/{:.1f}/{:.1f} on {} CPUs: other work on the machine inflates times".format(
              *os.getloadavg(), os.cpu_count()))


if __name__ == "__main__":
    main()
