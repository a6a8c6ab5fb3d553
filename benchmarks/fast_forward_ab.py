"""Interleaved A/B of ``domino.fast_forward``: SmolLM2-135M-Instruct in the engine's CPU
configuration (``domino.loading.use_cpu_kernels``: small-batch linear, attention, fused
layers), its forward as one loop over the kernels ("fast", what the engine and its
plain-decoding baseline run) against HF's forward over the same switched modules ("hf",
``type(model).forward``).

Two measurements, each checked bit for bit first, then timed in alternating rounds
(medians, warm-up excluded):
- the target forward as the engine calls it in a round (attention mask, positions, the
  hidden states the drafter reads, every logit row) over k = 1, 4, 8, 16 new tokens after
  a --cache-token KV cache;
- plain greedy decoding, HF ``generate`` (the baseline ``generate_target_only`` runs) of
  --new-tokens tokens after a chat prompt: tokens per second, and whether both decode
  the same tokens.

    python benchmarks/fast_forward_ab.py [--dtype bf16] [--rounds 8] [--cache 110] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from timing import copy_bandwidth_gbs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--cache", type=int, default=110)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

    from domino import fast_forward
    from domino.fast_forward import uses_fast_forward
    from domino.loading import smollm2_dir, use_cpu_kernels
    from domino.target import bare_generation_config
    from domino_ops import cpu

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir(), dtype=dtype).eval()
    use_cpu_kernels(model, small_batch_linear=True, small_batch_attention=True)
    if not uses_fast_forward(model):
        raise SystemExit(f"the fast forward does not apply here ({args.dtype} linears not on the packed kernel)")
    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    fast, hf = model.forward, (lambda **kw: type(model).forward(model, **kw))
    variants = {"fast": fast, "hf": hf}
    print(f"CPU: {cpu.model()}, {torch.get_num_threads()} threads; {args.dtype}; load average "
          f"{os.getloadavg()[0]:.1f}; copy bandwidth {copy_bandwidth_gbs():.1f} GB/s")

    g = torch.Generator().manual_seed(0)
    ks = (1, 4, 8, 16)
    vocab = model.config.vocab_size
    with torch.inference_mode():
        cache = DynamicCache()
        model(input_ids=torch.randint(0, vocab, (1, args.cache), generator=g), cache=cache, use_cache=True)
        ids = {k: torch.randint(0, vocab, (1, k), generator=g) for k in ks}

        def forward(fn, k):
            out = fn(input_ids=ids[k], attention_mask=torch.ones(1, args.cache + k, dtype=torch.long),
                     position_ids=torch.arange(args.cache, args.cache + k)[None], cache=cache, use_cache=True,
                     output_hidden_states=True, logits_to_keep=0)
            cache.crop(-k)
            return out

        def outputs_of(fn, k):
            out = forward(fn, k)
            return out.hidden_states + (out.logits,)

        same = all(torch.equal(a, b) for k in ks for a, b in zip(outputs_of(fast, k), outputs_of(hf, k)))
        print(f"forward: logits and hidden states bit-identical: {same}")
        # the fast variant must run the fast path (not fall back to HF's forward): count its products
        products, product = [], fast_forward._product
        fast_forward._product = lambda *a: products.append(1) or product(*a)
        forward(fast, 1)
        fast_forward._product = product
        if not products:
            raise SystemExit("the fast variant fell back to HF's forward: nothing to compare")
        times = {(name, k): [] for name in variants for k in ks}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                for k in ks:
                    forward(fn, k)
                    for _ in range(3):
                        t = time.perf_counter()
                        forward(fn, k)
                        times[(name, k)].append(time.perf_counter() - t)

        prompt = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that checks "
                                           "whether a number is prime."}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)

        def decode():
            with bare_generation_config(model):
                return model.generate(**prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                      do_sample=False, pad_token_id=tok.pad_token_id or 0)

        outputs, speed = {}, {name: [] for name in variants}
        for r in range(args.rounds // 2 + 1):
            for name, fn in variants.items():
                model.forward = fn  # what HF generate calls
                t = time.perf_counter()
                outputs[name] = decode()
                if r:  # the first round warms up
                    speed[name].append(args.new_tokens / (time.perf_counter() - t))
        model.forward = fast

    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print(f"\ntarget forward as the engine calls it, median of {3 * args.rounds}, ms\n")
    print("| variant | " + " | ".join(f"{k} token{'s' if k > 1 else ''}" for k in ks) + " | 16 / 1 |")
    print("|---|" + "---|" * len(ks) + "---|")
    for name in variants:
        print(f"| {name} | " + " | ".join(f"{med[(name, k)]:.2f}" for k in ks)
              + f" | {med[(name, 16)] / med[(name, 1)]:.2f}x |")
    print("| hf / fast | " + " | ".join(f"{med[('hf', k)] / med[('fast', k)]:.3f}x" for k in ks) + " | |")
    tps = {name: statistics.median(v) for name, v in speed.items()}
    print(f"\nplain greedy decoding (HF generate), {args.new_tokens} tokens, median of {len(speed['fast'])}: "
          f"fast {tps['fast']:.1f} tok/s, hf {tps['hf']:.1f} tok/s, {tps['fast'] / tps['hf']:.3f}x; "
          f"same tokens: {torch.equal(outputs['fast'], outputs['hf'])}")


if __name__ == "__main__":
    main()
