"""The engine's speed as one process measures it, for comparing two versions of the
``domino`` package in separate processes (the C++ extension is the installed one for both):
the target forward as the engine's rounds call it, and the engine end to end.

- ``forward``: ``DominoGenerator._target_forward`` over k = 1, 8, 16 (``--tokens``) new tokens after 110
  cached ones (a GrowingCache, cropped back after each), median of 30, with the share of
  its ``decoder_layers`` call (the cache's reserve and hold included) and LM head removed:
  "rest" is the Python around them. ``--fixed`` runs it inside
  ``domino.fast_forward.model_fixed`` (where the package has it), as the engine's loops do.
- ``e2e``: ``generate_plain`` (the engine's plain loop) then ``generate`` (the default) on
  --prompts HumanEval prompts x 96 tokens: tokens per second (long contexts:
  ``bench_e2e.py --module-context``).
- ``drafter``: the shipped drafter's calls at contexts of 100, 1,000 and 4,000 slots (random
  features): a 6-token draft (``draft``) and ``extend_context`` by 3 slots (set back after
  each), median of 30 each.

Another version of the package runs from a directory put first on PYTHONPATH; alternate the
two in ABBA order, since this VM's speed drifts between processes::

    git archive a595257 python/domino | tar -x -C /tmp/old
    for v in old new new old; do
      if [ $v = old ]; then PYTHONPATH=/tmp/old/python python benchmarks/engine_speed.py e2e --prompts 16
      else python benchmarks/engine_speed.py e2e --prompts 16; fi
    done

Where the versions' extensions differ too (``drafter`` across the change that gave
``draft_layers`` its stores), copy each version's ``_C*.so`` into the installed
``domino_ops`` before its run.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_acceptance import humaneval_prompts  # noqa: E402
from model_fixed_ab import Timer  # noqa: E402


def forward_rows(gen, fixed: bool, ks: tuple[int, ...] = (1, 8, 16)) -> str:
    from domino import fast_forward
    from domino.kv_cache import GrowingCache

    held = getattr(fast_forward, "model_fixed", None)
    g = torch.Generator().manual_seed(0)
    cached = 110
    times = {(k, part): [] for k in ks for part in ("forward", "layers", "head")}
    block = held(gen.target) if fixed and held is not None else contextlib.nullcontext()
    with torch.inference_mode(), block:
        cache = GrowingCache()
        gen.target(input_ids=torch.randint(0, 49152, (1, cached), generator=g), cache=cache, use_cache=True)
        ids = {k: torch.randint(0, 49152, (1, k), generator=g) for k in ks}

        def forward(k):
            gen._target_forward(ids[k], torch.ones(1, cached + k, dtype=torch.bool),
                                torch.arange(cached, cached + k)[None], cache)
            cache.crop(-k)

        for _ in range(6):
            for k in ks:
                forward(k)
                layers, head = Timer(fast_forward, "_decoder_layers_in_one_call"), Timer(fast_forward, "_product")
                try:
                    for _ in range(5):
                        layers.seconds = head.seconds = 0.0
                        t = time.perf_counter()
                        forward(k)
                        times[(k, "forward")].append(time.perf_counter() - t)
                        times[(k, "layers")].append(layers.seconds)
                        times[(k, "head")].append(head.seconds)
                finally:
                    head.remove()
                    layers.remove()
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    return " | ".join(f"k={k}: {med[(k, 'forward')]:.2f} ms, rest "
                      f"{med[(k, 'forward')] - med[(k, 'layers')] - med[(k, 'head')]:.2f}" for k in ks)


def drafter_rows(gen) -> str:
    d = gen.drafter
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode(), d.weights_fixed():
        for T in (100, 1000, 4000):
            feats = torch.randn(1, T + 3, d.fc.in_features, generator=g).to(d.fc.weight.dtype)
            pos, valid = torch.arange(T + 3)[None], torch.ones(1, T + 3, dtype=torch.bool)
            cache = d.new_cache(1, "cpu", d.fc.weight.dtype)
            d.extend_context(cache, feats[:, :T], pos[:, :T], valid[:, :T])
            anchor, anchor_pos = torch.tensor([5]), torch.tensor([T])

            def extend(cache=cache, T=T, feats=feats, pos=pos, valid=valid):
                restore = _set_back(cache)
                t = time.perf_counter()
                d.extend_context(cache, feats[:, T:], pos[:, T:], valid[:, T:])
                elapsed = time.perf_counter() - t
                restore()
                return elapsed

            def draft(cache=cache, anchor=anchor, anchor_pos=anchor_pos):
                t = time.perf_counter()
                d.draft(cache, anchor, anchor_pos, num_drafts=6)
                return time.perf_counter() - t

            times = {"draft 6": [], "extend by 3": []}
            for _ in range(3):
                draft(), extend()
            for _ in range(30):
                times["draft 6"].append(draft())
                times["extend by 3"].append(extend())
            rows.append(f"{T} slots: " + ", ".join(f"{k} {statistics.median(v) * 1e3:.2f} ms" for k, v in times.items()))
    return " | ".join(rows)


def _set_back(cache):
    """A function that puts the drafter's context cache back as it is now (either version's
    cache: stores with a length, or tensors replaced by each extension)."""
    if hasattr(cache, "key_stores"):
        length = cache.length
        return lambda: setattr(cache, "length", length)
    saved = list(cache.keys), list(cache.values), cache.mask

    def restore():
        cache.keys, cache.values, cache.mask = saved
    return restore


def e2e_row(gen, prompts: int) -> str:
    ps = humaneval_prompts(prompts)
    gen.generate(ps[0], max_new_tokens=32)
    gen.generate_plain(ps[0], max_new_tokens=32)
    speed = {}
    for name, call in (("plain", gen.generate_plain), ("default", gen.generate)):
        tokens, t = 0, time.perf_counter()
        for p in ps:
            tokens += len(call(p, max_new_tokens=96).token_ids)
        speed[name] = tokens / (time.perf_counter() - t)
    chooser = getattr(gen, "_round_kinds", {}).get(1)  # the default's tree-or-chain choice, all calls
    kinds = "" if chooser is None else ", rounds " + " / ".join(f"{k} {n}" for k, n in chooser.rounds.items())
    return (f"plain {speed['plain']:.1f} tok/s, default {speed['default']:.1f} tok/s, "
            f"ratio {speed['default'] / speed['plain']:.3f}{kinds}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("forward", "e2e", "drafter"))
    ap.add_argument("--fixed", action="store_true", help="forward: inside model_fixed, as the engine runs it")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 16], help="forward: the k new tokens timed")
    args = ap.parse_args()

    import domino

    gen = domino.load_default()
    package = Path(domino.__file__).parent
    if args.what == "forward":
        row = forward_rows(gen, args.fixed, tuple(args.tokens))
    elif args.what == "e2e":
        row = e2e_row(gen, args.prompts)
    else:
        row = drafter_rows(gen)
    print(f"{package} {args.what}{' fixed' if args.fixed else ''}: {row}")


if __name__ == "__main__":
    main()
