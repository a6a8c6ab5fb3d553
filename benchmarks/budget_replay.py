"""Replays greedy chain decoding under drafting policies, offline, from measured acceptance:
how fast would each policy for the number of drafts per round be, at batch sizes 1, 2, 4?

Greedy decoding's output does not depend on how rounds are cut, so neither does what the
drafter proposes at each position: with the target's own continuation known, the drafts
from every anchor position t (the context: the target's features of the tokens before t,
as generation builds it) and how many of them the target accepts, ``L(t)``, are facts of
the prompt. A policy then only decides where rounds start and how many drafts they verify,
and its rounds can be replayed without running the models: a round at position t that
verifies k drafts advances ``min(L(t), k) + 1`` tokens and costs what the measured cost
tables (``domino.budget.round_costs``; the table the engine plans that round with, of the
batch size ``domino.budget.cost_batch_size`` picks for the sequences still decoding) say
drafting n and verifying k + 1 tokens cost, plus ``--overhead-ms`` of host work per
drafting round.

The traces come from the engine as it runs by default (bf16, small-batch kernels): the
target's continuation by plain greedy decoding, its features from one forward over prompt
and continuation, and at every position the drafter's whole block with its confidences.
(Prefill features equal the decode-time ones where the kernels are batch-invariant, as the
default's are; the attention's rounding may differ in the last bits.)

Policies replayed side by side: plain decoding; the library's plan (``live``: the
functions and classes of :mod:`domino.budget` it calls); fixed draft counts; and a
per-round oracle that knows every sequence's ``L(t)`` (an upper bound for any plan that
reads only the past). Speed is tokens over replayed milliseconds, against plain
decoding's at the same batch size. The batches are consecutive prompts, as ``bench_e2e.py
--batch-size`` forms them.

    python benchmarks/budget_replay.py [--num-prompts 16] [--offset 0] [--max-new-tokens 96] [--batch-sizes 1 2 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

import torch

import domino
from domino import budget
from domino.kv_cache import GrowingCache
from eval_acceptance import chat_prompts, humaneval_prompts

RESULTS = Path(__file__).parent / "results"


@dataclasses.dataclass
class Trace:
    """One prompt's greedy continuation as the drafter sees it, position by position:
    ``accepted[j]`` drafts the target accepts from the anchor at output position j (of the
    drafter's whole block) and ``confidence[j]`` [n_max] the drafter's confidence in each."""

    accepted: list[int]
    confidence: torch.Tensor  # [M, n_max] float32
    prompt_len: int = 0

    def __len__(self) -> int:
        return len(self.accepted)


@torch.inference_mode()
def trace(gen, prompt_ids: list[int], max_new_tokens: int) -> Trace:
    """The drafter's block and its acceptance at every output position of one prompt."""
    n_max = gen.drafter.config.num_drafts
    out = gen.generate_plain([prompt_ids], max_new_tokens=max_new_tokens + n_max).token_ids[0]
    P, dev = len(prompt_ids), gen.device
    ids = torch.tensor([prompt_ids + out], device=dev)
    T = ids.shape[1]
    positions = torch.arange(T, device=dev)[None]
    mask = torch.ones(1, T, dtype=torch.bool, device=dev)
    _, features = gen._target_forward(ids, mask, positions, GrowingCache(), last_logits_only=True)
    dcache = gen.drafter.new_cache(1, dev, gen.drafter.fc.weight.dtype)
    gen.drafter.extend_context(dcache, features[:, :P], positions[:, :P], mask[:, :P])
    accepted, confidence = [], []
    for t in range(P, min(T - 1, P + max_new_tokens)):  # the anchor at t: its token is out[t - P]
        draft = gen.drafter.draft(dcache, ids[:, t], positions[:, t], num_drafts=n_max)
        truth = ids[0, t + 1:t + 1 + n_max]
        match = (draft.tokens[0, :truth.numel()] == truth).long()
        accepted.append(int(match.cumprod(0).sum()))
        confidence.append(draft.confidence[0].float())
        gen.drafter.extend_context(dcache, features[:, t:t + 1], positions[:, t:t + 1], mask[:, t:t + 1])
    return Trace(accepted, torch.stack(confidence), P)


# ---- policies: each plans a round's draft count n, then may cut it to k after drafting ----


class Plain:
    """Plain decoding: nothing drafted, one token a round."""

    def plan(self, live: int, costs: budget.RoundCosts) -> int:
        return 0

    def verify_length(self, confidence: torch.Tensor, n: int, costs: budget.RoundCosts) -> int:
        return n

    def update(self, verified: list[int], accepted: list[int]) -> None:
        pass


class Fixed(Plain):
    """n drafts every round, all verified."""

    def __init__(self, n: int):
        self.n = n

    def plan(self, live: int, costs: budget.RoundCosts) -> int:
        return self.n


class Library(Plain):
    """The library's chain-round plan, as ``DominoGenerator._draft_and_choose`` calls it."""

    def __init__(self, gen, margin: float = budget.DRAFT_MARGIN):
        self.gen, self.margin = gen, margin
        self.acceptance = budget.DepthAcceptance(gen.drafter.config.num_drafts,
                                                 gen.drafter.calibration.depth_rates or 0.5)

    def plan(self, live: int, costs: budget.RoundCosts) -> int:
        return budget.best_draft_length(self.acceptance.rates(), costs, live, self.margin)

    def verify_length(self, confidence: torch.Tensor, n: int, costs: budget.RoundCosts) -> int:
        return budget.best_verify_length(self.gen.drafter.calibration(confidence), costs, n)

    def update(self, verified: list[int], accepted: list[int]) -> None:
        self.acceptance.update(verified, accepted)


def replay(traces: list[Trace], policy, costs: dict[int, budget.RoundCosts], overhead_ms: float,
           oracle: bool = False) -> tuple[int, float, int]:
    """(tokens, milliseconds, rounds) of one batch decoded under ``policy`` (``oracle``:
    each round the k maximising this round's tokens per millisecond, from the true
    acceptance). ``costs``: the tables by batch size, each of
    ``domino.budget.cost_batch_sizes(len(traces))`` among them."""
    b = len(traces)
    pos = [0] * b
    tokens = rounds = 0
    ms = 0.0
    n_max = min(costs[b].max_drafts, traces[0].confidence.shape[1])
    while True:
        live = [s for s, tr in enumerate(traces) if pos[s] < len(tr)]
        if not live:
            return tokens, ms, rounds
        rounds += 1
        # planned and priced as the engine plans it: at the batch size of the rows left
        costs_now = costs[budget.cost_batch_size(len(live), b)].at(max(tr.prompt_len for tr in traces) + max(pos))
        if oracle:
            def gain(k):
                return sum(min(traces[s].accepted[pos[s]], k) + 1 for s in live) / costs_now.round_ms(k, k)
            n = k = max(range(n_max + 1), key=gain)
        else:
            n = policy.plan(len(live), costs_now)
            k = policy.verify_length(torch.stack([traces[s].confidence[pos[s]] for s in live]), n,
                                     costs_now) if n else 0
        acc = [min(traces[s].accepted[pos[s]], k) for s in live]
        if not oracle:
            policy.update([k] * len(live), acc)
        ms += costs_now.round_ms(n, k) + (overhead_ms if n else 0.0)
        for s, a in zip(live, acc):
            step = min(a + 1, len(traces[s]) - pos[s])
            pos[s] += step
            tokens += step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--offset", type=int, default=0, help="the first HumanEval problem")
    p.add_argument("--chat", action="store_true", help="held-out chat prompts instead of HumanEval")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--overhead-ms", type=float, default=1.0,
                   help="host work of a drafting round beyond the cost tables (verification, commit, the loop: "
                        "about bench_e2e's 'other' column)")
    p.add_argument("--margins", type=float, nargs="*", default=[0.0, 0.05, 0.2],
                   help="the plan's margin (domino.budget.DRAFT_MARGIN) replayed at these values too")
    p.add_argument("--traces", type=Path, default=None,
                   help="a file to keep the traces in: read when it holds these prompts' traces, else written")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    gen = domino.load_default()
    prompts = chat_prompts(args.num_prompts) if args.chat else humaneval_prompts(args.num_prompts, args.offset)
    seqs = [gen._encode_request(pr, args.max_new_tokens)[0][0] for pr in prompts]
    kept = torch.load(args.traces) if args.traces is not None and args.traces.exists() else None
    if kept is not None and kept["prompts"] == seqs and kept["max_new_tokens"] == args.max_new_tokens:
        traces = [Trace(a, c, len(p)) for (a, c), p in zip(kept["traces"], seqs)]
    else:
        traces = [trace(gen, s, args.max_new_tokens) for s in seqs]
        if args.traces is not None:
            torch.save({"prompts": seqs, "max_new_tokens": args.max_new_tokens,
                        "traces": [(t.accepted, t.confidence) for t in traces]}, args.traces)
    mean_L = statistics.fmean(a for tr in traces for a in tr.accepted)
    lines = [f"{len(traces)} {'chat' if args.chat else f'HumanEval (from {args.offset})'} prompts, "
             f"{sum(map(len, traces))} positions, mean drafts accepted of a whole block {mean_L:.2f}; "
             f"overhead {args.overhead_ms} ms a drafting round"]
    for b in args.batch_sizes:
        batches = [traces[i:i + b] for i in range(0, len(traces), b)]
        costs = {size: gen.round_costs(size) for bt in batches for size in budget.cost_batch_sizes(len(bt))}
        # a fresh policy per request: each generate call starts its own plan
        makers = ({f"library, margin {m:g}" + (" (its own)" if m == budget.DRAFT_MARGIN else ""):
                   lambda m=m: Library(gen, m) for m in sorted({budget.DRAFT_MARGIN, *args.margins})}
                  | {f"fixed n={n}": lambda n=n: Fixed(n) for n in (1, 2, 3, 5)})
        plain_tokens, plain_ms, _ = (sum(x) for x in zip(*(replay(bt, Plain(), costs, 0.0) for bt in batches)))
        plain_speed = plain_tokens / plain_ms * 1e3
        lines.append(f"\nbatch {b}: plain {plain_speed:.1f} tok/s (replayed)")
        lines.append(f"  {'policy':<30} {'tok/s':>7} {'vs plain':>9} {'tokens/round/seq':>17}")
        for name, make in list(makers.items()) + [("oracle (knows L)", None)]:
            runs = [replay(bt, make() if make else Plain(), costs, args.overhead_ms, oracle=make is None)
                    for bt in batches]
            tok, ms, rounds = (sum(x) for x in zip(*runs))
            speed = tok / ms * 1e3
            lines.append(f"  {name:<30} {speed:7.1f} {speed / plain_speed:8.2f}x {tok / rounds / b:17.2f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
