"""A prompt's prefill, side by side: SmolLM2-135M in bf16 through the engine's forward
(``DominoGenerator._target_forward`` on the batch-invariant CPU kernels, what ``generate``
and ``generate_plain`` run before their first token) and through HF's own forward of the
unswitched model (PyTorch's products and SDPA), one sequence of random tokens per length,
last logits only, median of ``--repeats`` after one untimed call. Both prefill into a fresh
cache each call.

    python benchmarks/prefill_speed.py [--lengths 150 500 2000] [--repeats 3]

``--profile-calls N`` instead runs the engine's prefill of the first length N times and
nothing else, for a profiler (the fifty-seventh session's split of the prefill: ``perf
record -D 10000 -F 1000 -- python benchmarks/prefill_speed.py --lengths 2000
--profile-calls 12`` on an unstripped build of the extension, ``perf report --sort
dso,symbol``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_seconds  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[150, 500, 2000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-calls", type=int, default=0, help="only the engine's prefill, this many times")
    args = ap.parse_args()

    import domino
    from domino.kv_cache import GrowingCache
    from domino.loading import smollm2_dir

    engine = domino.load_default()
    g = torch.Generator().manual_seed(0)

    def engine_prefill(ids):  # one prompt [1, T], all real tokens, into a fresh cache
        T = ids.shape[1]
        return engine._target_forward(ids, torch.ones(1, T, dtype=torch.bool), torch.arange(T)[None], GrowingCache(),
                                      last_logits_only=True)

    if args.profile_calls:
        ids = torch.randint(0, engine.target.config.vocab_size, (1, args.lengths[0]), generator=g)
        with torch.inference_mode():
            for _ in range(args.profile_calls):
                engine_prefill(ids)
        return
    hf = domino.load(smollm2_dir(True), None, dtype=torch.bfloat16).target  # no CPU kernels switched on
    print(f"prefill of one prompt, bf16 SmolLM2-135M, {torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'tokens':>6} | {'engine ms':>9} | {'HF ms':>8} | engine / HF")
    with torch.inference_mode():
        for T in args.lengths:
            ids = torch.randint(0, engine.target.config.vocab_size, (1, T), generator=g)
            ours = median_seconds(lambda: engine_prefill(ids), args.repeats) * 1e3
            theirs = median_seconds(lambda: hf(input_ids=ids, use_cache=True, logits_to_keep=1), args.repeats) * 1e3
            print(f"{T:>6} | {ours:9.1f} | {theirs:8.1f} | {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
