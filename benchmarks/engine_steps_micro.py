"""Per-call timings of three small steps of the engine's loop, each against what it replaced
(fifty-sixth session), medians:

- stop strings: ``domino.stop_strings.stop_length`` on a 2,000- and a 4,000-token output
  with 3 new tokens, decoding the whole output (what every step did before) against the
  tail (``clean=n - 3``: each new token checked on the text it can have changed); SmolLM2's
  tokenizer;
- a tree round's KV-cache compaction (``domino.tree.compact_tree_cache``): 30 layers of
  [1, 3, 300, 64] bf16, a 12-node round keeping 3, with the layers' storage as one tensor
  against the per-layer path (and one tensor for a batch of 4 sequences), a 128 MB pass between calls to leave the caches cold as a
  forward does;
- greedy verification of a bf16 target's logits [1, rows, 49,152]: the tree's argmax and
  ``verify_greedy`` on a float32 copy (before) and on the bf16 logits (now).

    python benchmarks/engine_steps_micro.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

import domino_ops


def median_us(fn, repeats: int = 200, between=None) -> float:
    for _ in range(10):
        fn()
    ts = []
    for _ in range(repeats):
        if between is not None:
            between()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def stop_strings() -> None:
    from transformers import AutoTokenizer

    from domino.loading import smollm2_dir
    from domino.stop_strings import stop_length

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    text = (Path(__file__).resolve().parents[1] / "python" / "domino" / "generate.py").read_text() * 2
    ids = tok.encode(text, add_special_tokens=False)
    stop = ["<|im_end|>x", "\n\n\n\n\n"]
    for n in (2000, 4000):
        whole = median_us(lambda: any(s in tok.decode(ids[:n], skip_special_tokens=True) for s in stop))
        tail = median_us(lambda: stop_length(tok, ids[:n], stop, n - 3))
        print(f"stop strings, {n} tokens: whole output {whole:.0f} us, tail {tail:.0f} us a step")


def compaction() -> None:
    from domino.kv_cache import GrowingCache
    from domino.tree import compact_tree_cache

    torch.manual_seed(0)
    big = torch.randn(32 << 20)
    for name in ("one tensor", "per layer", "one tensor, 4 sequences"):
        b = 4 if name.endswith("4 sequences") else 1
        path = torch.tensor([[0, 2, 5], [0, 1, 2], [0, 0, 0], [0, 3, 4]])[:b]
        cache = GrowingCache()
        states = torch.randn(b, 3, 300, 64).bfloat16()
        keys, values, _ = cache.reserve(30, states)
        for k, v in zip(keys, values):
            k[:, :, :300].copy_(states)
            v[:, :, :300].copy_(states)
        cache.hold(30, 300)
        if name == "per layer":
            cache.shared_storage = lambda: None  # the per-layer path
        us = median_us(lambda: compact_tree_cache(cache, path, 12), repeats=50, between=lambda: big.mul_(1.0))
        print(f"tree compaction, {name}: {us:.0f} us")


def greedy_verification() -> None:
    from domino.tree import target_argmax

    torch.manual_seed(0)
    for rows in (8, 12, 20):
        logits = torch.randn(1, rows, 49152).bfloat16()
        drafts = torch.randint(0, 49152, (1, rows - 1))
        cells = [median_us(lambda: target_argmax(logits.float())), median_us(lambda: target_argmax(logits)),
                 median_us(lambda: domino_ops.verify_greedy(drafts, logits.float())),
                 median_us(lambda: domino_ops.verify_greedy(drafts, logits))]
        print(f"greedy verification, {rows} rows: tree argmax {cells[0]:.0f} -> {cells[1]:.0f} us, "
              f"verify_greedy {cells[2]:.0f} -> {cells[3]:.0f} us (float32 copy -> bf16)")


if __name__ == "__main__":
    from domino_ops import cpu

    print(f"CPU: {cpu.model()}, {torch.get_num_threads()} threads")
    stop_strings()
    compaction()
    greedy_verification()
