"""Data regeneration speed (issue 14): ``training.generate_data.regenerate`` against HF
``generate`` on one shard's prompts, greedy (the first pass) and sampled at T = 0.7 (the
later passes), side by side in one run, the target as deployed
(``generate_data.target_as_deployed``: bf16 with the batch-invariant kernels, what
``generate_data`` runs on the CPU).

    python benchmarks/bench_regenerate.py [--shard 1] [--num-prompts 64] [--max-new-tokens 256]

``regenerate`` prefills the prompts in small length-sorted groups, then decodes the batch
with its own loop: finished rows leave the batch, and sampling inverts the cumulative
distribution at one uniform number per row. The baseline is one left-padded HF
``generate`` (a batch prefill at the longest prompt's length, finished rows padded to the
end, sampling by ``torch.multinomial``). Both record the target's hidden states and top-32
log-probabilities, as data generation does. The target is SmolLM2-135M-Instruct at one
thread (one data-generation worker per core). Each runs once after a warm-up (a shard
takes a minute or more), so run it on a quiet machine. Greedy responses must agree (the
kernels are batch-invariant: a row's bits do not depend on the padding or the batch);
sampled ones are other draws from the same distribution. The greedy pass also times
``regenerate`` with the target on HF's forward instead of ``domino.fast_forward``'s (the
same kernels; the responses must be identical).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.generate_data import read_shard_records, regenerate, shard_path, target_as_deployed  # noqa: E402

from domino.config import default_drafter_config  # noqa: E402
from domino.fast_forward import undo_fast_forward, use_fast_forward, uses_fast_forward  # noqa: E402
from domino.loading import smollm2_dir  # noqa: E402
from domino.target import bare_generation_config, special_token_ids  # noqa: E402
from domino_ops import cpu  # noqa: E402

TEMPERATURE = 0.7


class TopLogprobs:
    """A HF logits processor that records the top-k log-probabilities of every decode step,
    as ``regenerate`` records them (the processors run before any warper: the scores it
    sees are the target's raw logits)."""

    def __init__(self, k: int):
        self.k, self.ids, self.logprobs = k, [], []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = torch.log_softmax(scores.float(), dim=-1).topk(self.k, dim=-1)
        self.ids.append(top.indices.to(torch.int32))
        self.logprobs.append(top.values.to(torch.float16))
        return scores


def padded_generate(model, batch, eos, pad, max_new_tokens, temperature: float = 0.0) -> list[list[int]]:
    """The baseline: one left-padded batch through HF generate, static cache, hidden states
    and top-32 log-probabilities recorded; greedy, or sampled at ``temperature``. Returns
    the responses, cut after EOS."""
    from transformers import LogitsProcessorList

    T = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in batch])
    sampling = dict(do_sample=True, temperature=temperature) if temperature > 0 else dict(do_sample=False,
                                                                                          temperature=None)
    with torch.inference_mode(), bare_generation_config(model):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad,
                             eos_token_id=sorted(eos), top_k=None, top_p=None, disable_compile=True,
                             output_hidden_states=True, return_dict_in_generate=True,
                             logits_processor=LogitsProcessorList([TopLogprobs(32)]), cache_implementation="static",
                             **sampling)
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

    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    target_dir = smollm2_dir()
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = target_as_deployed(target_dir)
    eos, pad = special_token_ids(model, tok)
    eos = set(eos)
    layer_ids = default_drafter_config(model.config).target_layer_ids
    prompts = [r["prompt_ids"] for r in read_shard_records(shard_path(args.data, args.shard))][:args.num_prompts]
    lengths = sorted(len(q) for q in prompts)
    print(f"{cpu.model()} ({cpu.isa()}), {args.threads} thread(s), torch {torch.__version__}; shard "
          f"{args.shard}: {len(prompts)} prompts of {lengths[0]}-{lengths[-1]} tokens (median "
          f"{lengths[len(lengths) // 2]}), up to {args.max_new_tokens} new tokens; the target as deployed (bf16 "
          f"kernels)")
    g = torch.Generator().manual_seed(0)
    regenerate(model, prompts[:2], layer_ids, eos, pad, 4)  # warm-ups
    regenerate(model, prompts[:2], layer_ids, eos, pad, 4, temperature=TEMPERATURE, generator=g)
    padded_generate(model, prompts[:2], eos, pad, 4)

    rows = []
    for label, temperature in (("greedy", 0.0), (f"sampled, T = {TEMPERATURE}", TEMPERATURE)):
        t0 = time.perf_counter()
        base = padded_generate(model, prompts, eos, pad, args.max_new_tokens, temperature)
        t_base = time.perf_counter() - t0
        t0 = time.perf_counter()
        ours = [r["response_ids"] for r in regenerate(model, prompts, layer_ids, eos, pad, args.max_new_tokens,
                                                      temperature=temperature, generator=g).records]
        t_ours = time.perf_counter() - t0
        n_base, n_ours = sum(map(len, base)), sum(map(len, ours))
        rows.append((f"HF generate, one padded batch, {label}", t_base, n_base))
        rows.append((f"regenerate, {label}", t_ours, n_ours))
        if temperature == 0.0 and uses_fast_forward(model):
            undo_fast_forward(model)
            t0 = time.perf_counter()
            hf = [r["response_ids"] for r in regenerate(model, prompts, layer_ids, eos, pad, args.max_new_tokens).records]
            t_hf = time.perf_counter() - t0
            use_fast_forward(model)
            rows.append((f"regenerate, {label}, HF's forward", t_hf, sum(map(len, hf))))
            rows.append((f"  fast forward / HF's forward: {(n_ours / t_ours) / (sum(map(len, hf)) / t_hf):.2f}x "
                         f"tokens/s; responses identical: {hf == ours}", None, None))
        differ = sum(a != b for a, b in zip(base, ours))
        rows.append((f"  regenerate / HF generate: {(n_ours / t_ours) / (n_base / t_base):.2f}x tokens/s; "
                     f"responses differing {differ} of {len(prompts)}", None, None))
    print(f"{'method':<50} | {'seconds':>7} | {'tokens':>6} | {'tok/s':>6}")
    for label, seconds, tokens in rows:
        print(label if seconds is None else f"{label:<50} | {seconds:7.1f} | {tokens:6d} | {tokens / seconds:6.1f}")


if __name__ == "__main__":
    main()
