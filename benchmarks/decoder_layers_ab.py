"""The target's decoder layers as one ``domino_ops.decoder_layers`` call (C++) against
``domino.fast_forward``'s Python loop over the same kernels, side by side in one run.

SmolLM2-135M-Instruct in bf16 on the CPU kernels (``domino.load``'s configuration, the
engine's and the plain baseline's forward) on a ``domino.kv_cache.GrowingCache``, the cache
both take; and a model of SmolLM2's 30 layers but 64 wide, whose kernels take
microseconds, so that its forward is nearly all the cost around the kernels. After a
prompt of each length, forwards over 1 token (a decode step) and 6 tokens (a
verification), with hidden states (as the engine asks), each cropped back after; the two
paths alternate within every repeat; median of ``--repeats`` after 2 warm-ups, and
whether logits and hidden states agree bit for bit.

    python benchmarks/decoder_layers_ab.py [--prompts 150 1000] [--tokens 1 6] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from unittest import mock

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import domino
from domino import fast_forward as ff
from domino.kv_cache import GrowingCache
from domino.loading import DEFAULT_DRAFTER_DIR, smollm2_dir, use_cpu_kernels
from domino_ops import cpu
from timing import copy_bandwidth_gbs

PATHS = {"python loop": ff._decoder_layers_in_python, "one call": ff._decoder_layers_in_one_call}


def narrow_model() -> torch.nn.Module:
    """SmolLM2-135M's 30 layers and head layout at width 64: the cost around the kernels."""
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=30,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return use_cpu_kernels(model, small_batch_linear=True, small_batch_attention=True)


def compare(name: str, model, prompts: list[int], tokens: list[int], repeats: int, vocab: int) -> None:
    g = torch.Generator().manual_seed(0)
    for T in prompts:
        ids = torch.randint(0, vocab, (1, T), generator=g)
        caches = {path: GrowingCache() for path in PATHS}
        for path, c in caches.items():
            with mock.patch.object(ff, "_decoder_layers_in_one_call", PATHS[path]):
                model(input_ids=ids, use_cache=True, logits_to_keep=1, past_key_values=c)
        for k in tokens:
            block = torch.randint(0, vocab, (1, k), generator=g)
            pos = torch.arange(T, T + k)[None]
            times, outs = {p: [] for p in PATHS}, {}
            for _ in range(repeats + 2):
                for path, c in caches.items():
                    with mock.patch.object(ff, "_decoder_layers_in_one_call", PATHS[path]):
                        t0 = time.perf_counter()
                        outs[path] = model(input_ids=block, position_ids=pos, use_cache=True, past_key_values=c,
                                           output_hidden_states=True)
                        times[path].append(time.perf_counter() - t0)
                    c.crop(-k)
            a, b = (outs[p] for p in PATHS)
            same = torch.equal(a.logits, b.logits) and all(map(torch.equal, a.hidden_states, b.hidden_states))
            loop, call = (statistics.median(times[p][2:]) * 1e3 for p in PATHS)
            print(f"{name:>14} | {T:6} | {k:6} | {loop:11.2f} | {call:8.2f} | {loop / call:5.2f}x | "
                  f"{'yes' if same else 'NO'}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, nargs="+", default=[150, 1000])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 6])
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    gen = domino.load(smollm2_dir(), DEFAULT_DRAFTER_DIR, dtype=torch.bfloat16, small_batch_linear=True,
                      small_batch_attention=True)
    print(f"{cpu.model()}, CPU build {cpu.isa()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"copy bandwidth {copy_bandwidth_gbs():.1f} GB/s, load average {os.getloadavg()[0]:.1f}; "
          f"median of {args.repeats}, ms per forward (hidden states on)")
    print(f"{'model':>14} | {'prompt':>6} | {'tokens':>6} | python loop | one call | ratio | same bits")
    compare("SmolLM2-135M", gen.target, args.prompts, args.tokens, args.repeats, gen.target.config.vocab_size)
    compare("30 x 64 wide", narrow_model(), args.prompts, args.tokens, args.repeats, 512)


if __name__ == "__main__":
    main()
