"""Data regeneration speed (issue 14): ``training.generate_data.regenerate`` (the prompts
prefilled in small length-sorted groups, then one batch decode) against one left-padded
HF ``generate`` over the same prompts (a batch prefill at the longest prompt's length, as
``regenerate`` ran before), both in fp32 with PyTorch's matrix products, and
``regenerate`` with the target as deployed (``generate_data.target_as_deployed``: bf16
with the batch-invariant kernels, what ``generate_data`` runs on the CPU), side by side in
one run, on one shard's prompts.

    python benchmarks/bench_regenerate.py [--shard 1] [--num-prompts 64] [--max-new-tokens 256]

Both record the target's hidden states and top-32 log-probabilities, as data generation
does. The target is SmolLM2-135M-Instruct at one thread (one data-generation worker per
core). Each runs once after a warm-up (a shard takes minutes), so run it on a
quiet machine; the script also says how many responses differ (rounding can flip a
near-tie between the two ways of computing the prompt).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.generate_data import (TopLogprobs, read_shard_records, regenerate, shard_path,  # noqa: E402
                                    target_as_deployed)

from domino.config import default_drafter_config  # noqa: E402
from domino.loading import smollm2_dir  # noqa: E402
from domino.target import special_token_ids  # noqa: E402
from domino_ops import cpu  # noqa: E402


def padded_generate(model, batch, eos, pad, max_new_tokens) -> list[list[int]]:
    """The baseline: one left-padded batch through HF generate, static cache, hidden states
    and top-32 log-probabilities recorded. Returns the responses, cut after EOS."""
    from transformers import LogitsProcessorList

    T = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in batch])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=pad, eos_token_id=sorted(eos), temperature=None, top_k=None, top_p=None,
                             output_hidden_states=True, return_dict_in_generate=True,
                             logits_processor=LogitsProcessorList([TopLogprobs(32)]), cache_implementation="static")
    rows = out.sequences[:, T:].tolist()
    return [row[:next((j + 1 for j, t in enumerate(row) if t in eos), len(row))] for row in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "training" / "regenerated" / "smollm2_mix")
    p.add_argument("--shard", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    target_dir = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    eos, pad = special_token_ids(model, tok)
    eos = set(eos)
    layer_ids = default_drafter_config(model.config).target_layer_ids
    prompts = [r["prompt_ids"] for r in read_shard_records(shard_path(args.data, args.shard))][:args.num_prompts]
    lengths = sorted(len(q) for q in prompts)
    print(f"{cpu.model()}, {args.threads} thread(s), torch {torch.__version__}; shard {args.shard}: "
          f"{len(prompts)} prompts of {lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}, "
          f"padded batch: {len(prompts) * lengths[-1]} token slots for {sum(lengths)} tokens), "
          f"up to {args.max_new_tokens} new tokens")
    deployed = target_as_deployed(AutoModelForCausalLM.from_pretrained(target_dir))
    regenerate(model, prompts[:2], layer_ids, eos, pad, 4)  # warm-ups
    padded_generate(model, prompts[:2], eos, pad, 4)
    regenerate(deployed, prompts[:2], layer_ids, eos, pad, 4)

    t0 = time.perf_counter()
    base = padded_generate(model, prompts, eos, pad, args.max_new_tokens)
    t_base = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = regenerate(model, prompts, layer_ids, eos, pad, args.max_new_tokens)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    data_dep = regenerate(deployed, prompts, layer_ids, eos, pad, args.max_new_tokens)
    t_dep = time.perf_counter() - t0
    tokens, tokens_dep = data.response_offsets[-1], data_dep.response_offsets[-1]
    differ = sum(r["response_ids"] != b for r, b in zip(data.records, base))
    differ_dep = sum(r["response_ids"] != d["response_ids"] for r, d in zip(data.records, data_dep.records))
    print(f"{'method':<46} | {'seconds':>7} | {'tokens':>6} | {'tok/s':>6}")
    print(f"{'HF generate, one padded batch (fp32)':<46} | {t_base:7.1f} | {sum(map(len, base)):6d} | "
          f"{sum(map(len, base)) / t_base:6.1f}")
    print(f"{'regenerate (length-sorted prefill, fp32)':<46} | {t_ours:7.1f} | {tokens:6d} | {tokens / t_ours:6.1f}")
    print(f"{'regenerate, target as deployed (bf16 kernels)':<46} | {t_dep:7.1f} | {tokens_dep:6d} | "
          f"{tokens_dep / t_dep:6.1f}")
    print(f"regenerate vs padded generate (fp32): {t_base / t_ours:.2f}x tokens/s, responses differing "
          f"{differ} of {len(prompts)}")
    print(f"as deployed vs fp32 regenerate: {(tokens_dep / t_dep) / (tokens / t_ours):.2f}x tokens/s; responses "
          f"differing from fp32: {differ_dep} of {len(prompts)} (the deployed bf16 target's own greedy decoding)")


if __name__ == "__main__":
    main()
