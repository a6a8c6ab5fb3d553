"""Interleaved A/B of holding the models fixed, as the engine's loops do
(``domino.fast_forward.model_fixed`` for the target, ``DominoDraftModel.weights_fixed`` for
the drafter: the target's plan and hooks, and the drafter's layer weights, checked once per
call), against checking them at every forward ("checked": what a caller of the switched
model gets outside such a block). SmolLM2-135M-Instruct and the shipped drafter
(``domino.load_default``), bf16.

Two measurements, timed in alternating rounds (medians, warm-up excluded):
- the target forward as the engine calls it (attention mask, positions, hidden states,
  every logit row) over k = 1, 8, 16 new tokens after a --cache-token GrowingCache, cropped
  back after each; beside it the same loop's ``domino_ops.decoder_layers`` call (with the
  cache's reserve and hold) and the LM head: what the rest of the forward costs in Python;
- ``generate_plain`` (the engine's plain loop) and ``generate`` (the default) on
  --prompts HumanEval prompts x --new-tokens tokens: tokens per second, outputs compared.

    python benchmarks/model_fixed_ab.py [--rounds 6] [--cache 110] [--prompts 8] [--new-tokens 96]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import torch

from timing import copy_bandwidth_gbs


class Timer:
    """Accumulates the wall time of a module's function while installed."""

    def __init__(self, owner, name: str):
        self.owner, self.name, self.fn, self.seconds = owner, name, getattr(owner, name), 0.0

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return self.fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t

        setattr(owner, name, timed)

    def remove(self) -> None:
        setattr(self.owner, self.name, self.fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cache", type=int, default=110)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=96)
    args = ap.parse_args()

    import domino
    from domino import fast_forward
    from domino import generate as generate_module
    from domino.kv_cache import GrowingCache
    from domino_ops import cpu
    from eval_acceptance import humaneval_prompts

    gen = domino.load_default()
    model = gen.target
    if not fast_forward.uses_fast_forward(model):
        raise SystemExit("the fast forward does not apply here: nothing is checked per forward")
    print(f"CPU: {cpu.model()}, {torch.get_num_threads()} threads; bf16; load average {os.getloadavg()[0]:.1f}; "
          f"copy bandwidth {copy_bandwidth_gbs():.1f} GB/s")
    blocks = {"checked": lambda: contextlib.nullcontext(), "fixed": lambda: fast_forward.model_fixed(model)}

    g = torch.Generator().manual_seed(0)
    ks = (1, 8, 16)
    vocab = model.config.vocab_size
    times = {(name, k, part): [] for name in blocks for k in ks for part in ("forward", "layers", "head")}
    with torch.inference_mode():
        cache = GrowingCache()
        model(input_ids=torch.randint(0, vocab, (1, args.cache), generator=g), cache=cache, use_cache=True)
        ids = {k: torch.randint(0, vocab, (1, k), generator=g) for k in ks}

        def forward(k):
            out = model(input_ids=ids[k], attention_mask=torch.ones(1, args.cache + k, dtype=torch.long),
                        position_ids=torch.arange(args.cache, args.cache + k)[None], cache=cache, use_cache=True,
                        output_hidden_states=True, logits_to_keep=0)
            cache.crop(-k)
            return out

        for _ in range(args.rounds):
            for name, block in blocks.items():
                with block():
                    for k in ks:
                        forward(k)
                        layers = Timer(fast_forward, "_decoder_layers_in_one_call")
                        head = Timer(fast_forward, "_product")
                        try:
                            for _ in range(5):
                                layers.seconds = head.seconds = 0.0
                                t = time.perf_counter()
                                forward(k)
                                times[(name, k, "forward")].append(time.perf_counter() - t)
                                times[(name, k, "layers")].append(layers.seconds)
                                times[(name, k, "head")].append(head.seconds)
                        finally:
                            head.remove()
                            layers.remove()
        if not times[("fixed", 1, "layers")][-1]:
            raise SystemExit("the forward did not run the fast path: nothing to compare")

    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print(f"\ntarget forward as the engine calls it after {args.cache} cached tokens, median of {5 * args.rounds}, "
          f"ms: the whole forward | its decoder_layers call (with the cache's reserve and hold) | its LM head | "
          f"the rest (Python)\n")
    print("| variant | " + " | ".join(f"{k} token{'s' if k > 1 else ''}" for k in ks) + " |")
    print("|---|" + "---|" * len(ks))
    for name in blocks:
        cells = []
        for k in ks:
            f, lay, hd = (med[(name, k, p)] for p in ("forward", "layers", "head"))
            cells.append(f"{f:.2f} = {lay:.2f} + {hd:.2f} + {f - lay - hd:.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("| checked / fixed | " + " | ".join(
        f"{med[('checked', k, 'forward')] / med[('fixed', k, 'forward')]:.3f}x" for k in ks) + " |")

    prompts = humaneval_prompts(args.prompts)
    held = (generate_module.model_fixed, type(gen.drafter).weights_fixed)
    engine_blocks = {"checked": (lambda m: contextlib.nullcontext(m), lambda self: contextlib.nullcontext(self)),
                     "fixed": held}
    speed = {(name, call): [] for name in engine_blocks for call in ("plain", "default")}
    outputs = {}
    try:
        for r in range(args.rounds // 2 + 1):
            for name, (target_block, drafter_block) in engine_blocks.items():
                generate_module.model_fixed, type(gen.drafter).weights_fixed = target_block, drafter_block
                for call, fn in (("plain", gen.generate_plain), ("default", gen.generate)):
                    t, tokens, outs = time.perf_counter(), 0, []
                    for p in prompts:
                        res = fn(p, max_new_tokens=args.new_tokens)
                        tokens += len(res.token_ids)
                        outs.append(res.token_ids)
                    if r:  # the first round warms up
                        speed[(name, call)].append(tokens / (time.perf_counter() - t))
                    outputs.setdefault(call, []).append(outs)
    finally:
        generate_module.model_fixed, type(gen.drafter).weights_fixed = held
    same = all(o == outs[0] for outs in outputs.values() for o in outs)
    tps = {key: statistics.median(v) for key, v in speed.items()}
    print(f"\nthe engine on {args.prompts} HumanEval prompts x {args.new_tokens} tokens, tok/s, median of "
          f"{len(speed[('fixed', 'plain')])} alternating passes (outputs identical in every pass: {same})\n")
    print("| variant | plain loop | default | default / plain |")
    print("|---|---|---|---|")
    for name in engine_blocks:
        print(f"| {name} | {tps[(name, 'plain')]:.1f} | {tps[(name, 'default')]:.1f} | "
              f"{tps[(name, 'default')] / tps[(name, 'plain')]:.3f}x |")
    print(f"| fixed / checked | {tps[('fixed', 'plain')] / tps[('checked', 'plain')]:.3f}x | "
          f"{tps[('fixed', 'default')] / tps[('checked', 'default')]:.3f}x | |")
    print(f"\nload average {os.getloadavg()[0]:.1f}; copy bandwidth {copy_bandwidth_gbs():.1f} GB/s after")


if __name__ == "__main__":
    main()
