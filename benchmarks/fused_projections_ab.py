"""Interleaved A/B of the fused projections (``domino.fast_layers``): SmolLM2-135M-Instruct
in the engine's CPU configuration (small-batch linear, attention, fused layers), its q/k/v
and gate/up products run as one packed product each and its rotary embedding as one
``apply_rotary_pos_emb`` call ("fused", what the engine runs) against one product per
layer and HF's attention forward with its rotary ops ("separate", the same model with
``fast_layers.fused_packed_linear`` declining), forwards over 1 and 16 new tokens after a
110-token KV cache. Checks first that both give the same logits bit for bit; then rounds
of each variant in turn (one untimed forward after each switch, then 3 timed), medians.
Both run HF's forward over the switched modules; since the fortieth session the engine
runs ``domino.fast_forward``'s loop instead, which always fuses the products
(``benchmarks/fast_forward_ab.py`` compares it with HF's forward).

    python benchmarks/fused_projections_ab.py [--dtype bf16] [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--cache", type=int, default=110)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, DynamicCache

    import domino.fast_layers as fast_layers
    from domino.fast_attention import use_small_batch_attention
    from domino.fast_linear import use_small_batch_linear
    from domino.loading import smollm2_dir
    from domino.target import cache_kwarg
    from domino_ops import cpu

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=dtype).eval()
    use_small_batch_linear(model)
    use_small_batch_attention(model)
    fast_layers.use_fused_layers(model)
    kv = cache_kwarg(model.forward)
    fused_attention = sum(fast_layers.uses_fused_layers(m) for m in model.modules()
                          if type(m).__name__ in fast_layers.ATTENTION_CLASSES)
    variants = {"fused": fast_layers.fused_packed_linear, "separate": lambda *a: None}
    print(f"CPU: {cpu.model()}, {torch.get_num_threads()} threads; {args.dtype}; {fused_attention} attention "
          f"layers on the fused forward; load average {os.getloadavg()[0]:.1f}")
    g = torch.Generator().manual_seed(0)
    ks = (1, 16)
    try:
        with torch.inference_mode():
            cache = DynamicCache()
            model(input_ids=torch.randint(0, model.config.vocab_size, (1, args.cache), generator=g), **{kv: cache},
                  use_cache=True)
            ids = {k: torch.randint(0, model.config.vocab_size, (1, k), generator=g) for k in ks}

            def forward(k):
                logits = model(input_ids=ids[k], **{kv: cache}, use_cache=True).logits
                cache.crop(-k)
                return logits

            logits = {}
            for name, fn in variants.items():
                fast_layers.fused_packed_linear = fn
                logits[name] = {k: forward(k) for k in ks}
            same = all(torch.equal(logits["fused"][k], logits["separate"][k]) for k in ks)
            print(f"logits bit-identical: {same}")
            times = {(name, k): [] for name in variants for k in ks}
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    fast_layers.fused_packed_linear = fn
                    for k in ks:
                        forward(k)
                        for _ in range(3):
                            t = time.perf_counter()
                            forward(k)
                            times[(name, k)].append(time.perf_counter() - t)
    finally:
        fast_layers.fused_packed_linear = variants["fused"]
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print(f"\nmedian of {3 * args.rounds} forwards, ms\n")
    print("| variant | 1 token | 16 tokens | 16 / 1 |")
    print("|---|---|---|---|")
    for name in variants:
        print(f"| {name} | {med[(name, 1)]:.2f} | {med[(name, 16)]:.2f} | {med[(name, 16)] / med[(name, 1)]:.2f}x |")
    print(f"\nfused / separate: 1 token {med[('fused', 1)] / med[('separate', 1)]:.3f}, "
          f"16 tokens {med[('fused', 16)] / med[('separate', 16)]:.3f}")


if __name__ == "__main__":
    main()
