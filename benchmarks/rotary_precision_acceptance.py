"""Does rounding the rotary frequencies to bf16 change the shipped drafter's acceptance?
Two train/deploy mismatches the seventy-second session fixed, each undone on the loaded
default generator and measured side by side with the fixed one, in one run:

- ``target rounded``: the target's rotary frequencies rounded to bf16, as the training
  data's target had them (``generate_data`` loaded it in float32 and cast it to bf16,
  which rounds that float32 buffer too); greedy decoding then follows that target;
- ``drafter rounded``: the drafter's own rotary frequencies rounded to bf16, as every
  drafter loaded in bf16 had them while it trained with float32 ones.

Mean acceptance length (``eval_acceptance.mean_tau``: greedy whole-block chains, 128 new
tokens, head on) on the first ``--num-prompts`` held-out chat prompts (or HumanEval).

    python benchmarks/rotary_precision_acceptance.py [--prompts chat|humaneval] [--num-prompts 64]
"""

from __future__ import annotations

import argparse
import time

import torch

import domino
from eval_acceptance import chat_prompts, humaneval_prompts, mean_tau


def rounded(freqs: torch.Tensor) -> torch.Tensor:
    """``freqs`` (float32) rounded to bf16 and back: what a cast of the module made of them."""
    return freqs.to(torch.bfloat16).float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", choices=("chat", "humaneval"), default="chat")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args()
    gen = domino.load_default()
    prompts = chat_prompts(args.num_prompts) if args.prompts == "chat" else humaneval_prompts(args.num_prompts)
    target_rot, drafter_rot = gen.target.model.rotary_emb, gen.drafter.rotary
    target_freqs, drafter_bits = target_rot.inv_freq.clone(), drafter_rot.inv_freq_bits.clone()

    def set_freqs(target: torch.Tensor, drafter_bits_now: torch.Tensor) -> None:
        target_rot.inv_freq = target
        if hasattr(target_rot, "original_inv_freq"):
            target_rot.original_inv_freq = target
        drafter_rot.inv_freq_bits = drafter_bits_now

    variants = {"as deployed (float32 frequencies)": (target_freqs, drafter_bits),
                "target rounded (the training data's target)": (rounded(target_freqs), drafter_bits),
                "drafter rounded (drafters loaded in bf16 before)": (
                    target_freqs, rounded(drafter_rot.inv_freq).view(torch.int32))}
    print(f"{args.prompts} prompts 0..{len(prompts) - 1}, greedy chains, {args.max_new_tokens} new tokens, head on")
    for name, (target, drafter) in variants.items():
        set_freqs(target, drafter)
        t0 = time.perf_counter()
        tau = mean_tau(gen, prompts, use_head=True, temperature=0.0, max_new_tokens=args.max_new_tokens)
        print(f"{name:50} tau {tau:.3f}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    set_freqs(target_freqs, drafter_bits)


if __name__ == "__main__":
    main()
