"""The verification budget's policy choices, each undone on its own, side by side in one run
against plain decoding (greedy, every output token-identical to plain decoding):

- ``default``: what the library does;
- ``no margin``: drafting planned wherever it is expected to beat a plain step at all,
  instead of by ``domino.budget.DRAFT_MARGIN`` (the library before 2026-12-05);
- ``drafting alone``: the cost model's drafting timed without the drafter's context
  extension and the calibration a drafting round also runs
  (``domino.budget.measure_round_costs`` before 2026-12-05), with no margin: the library
  before 2026-12-05 as a whole;
- ``warm``: drafting timed back to back instead of right after a target forward, as a round
  runs it (the library before 2026-11-24);
- ``keep``: the per-depth acceptance evidence kept for the whole request instead of fading
  (``DepthAcceptance(memory=32)``: a stretch where drafting stopped paying is forgotten
  after ~32 rounds);
- ``one context``: the costs measured at a 128-position cache only, for every round,
  instead of at 128 and 1,024 positions and read at each round's own cache length (the
  library before 2026-12-05);
- ``chain counts alone``: under ``tree="auto"``, the chain rounds' acceptance counted from
  chain rounds only, not also from each tree round's top chain
  (:func:`domino.tree.top_chain_counts`; the library before the fifty-third session);
- ``call-size costs``: every round of a batch planned (and, under "auto", its kind chosen)
  with the call's batch size's costs, also after requests have finished and left the batch,
  instead of those of the rows left (:func:`domino.budget.cost_batch_size`; the library
  before the seventy-third session). With ``--batch-size 1`` it is the default.

Each variant has its own round-kind chooser (:mod:`domino.round_kind`), so that one
variant's rounds do not move another's choice between trees and chains.

Every variant's cost tables are measured in this run, one after another, so a slow moment
of the machine cannot favour one variant's table (a 2-core VM's tables swing by ~10 % from
minute to minute); the verification times are the default's for all, so the variants differ
only in what they change. With ``--batch-size`` above 1 every table is measured at each
batch size the call's rounds may be planned with (``domino.budget.cost_batch_sizes``), and
each variant's cell also gives the rows the target's forwards carried, against all of the
call's rows in every round ("rows"). Plain decoding is the engine's own loop
(``DominoGenerator.generate_plain``).

Prompts: HumanEval, held-out ShareGPT chat, `make run`'s prompt (three times), and
(``--prompts module``) HumanEval functions at the end of a long module (~1,900 tokens), each
a request of ``--batch-size`` prompts. Default configuration (``domino.load_default``: bf16,
small-batch linear and attention), rounds as ``generate`` runs them by default (``--chain``:
chain rounds only). Tokens/s is decoding's: the tokens after each request's first
over the time after it (the prompt's prefill, which every method shares, excluded), total
per method and pass, the median of ``--repeats`` passes; methods alternate per request, in an
order that turns by one each request; one warm-up generation excluded.

    python benchmarks/bench_budget.py [--num-prompts 12] [--max-new-tokens 96] [--repeats 2] [--batch-size 4]
        [--variants default "no margin"] [--prompts humaneval chat make-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

VARIANTS = ("default", "no margin", "drafting alone", "warm", "keep", "one context", "chain counts alone",
            "call-size costs")
PROMPT_SETS = ("humaneval", "chat", "make-run", "module")


def variant_costs(gen, batch_size: int) -> dict:
    """Each variant's round costs, all with the default's verification times."""
    from domino import budget

    default = budget.measure_round_costs(gen, batch_size)
    timed = budget._min_ms
    budget._min_ms = lambda fns, repeats, before=None: timed(fns, repeats)  # back to back
    try:
        warm = budget.measure_round_costs(gen, batch_size)
    finally:
        budget._min_ms = timed
    drafter = gen.drafter
    extend, calibration = drafter.extend_context, drafter.calibration
    prompt_context = []

    def prompt_only(*args):  # the measurement's first call fills the prompt's context; no later one
        if not prompt_context:
            prompt_context.append(True)
            extend(*args)

    drafter.extend_context, drafter.calibration = prompt_only, lambda confidence: confidence
    try:
        alone = budget.measure_round_costs(gen, batch_size)
    finally:
        del drafter.extend_context, drafter.calibration  # the instance attributes shadowed the class's
        drafter.calibration = calibration
    return {"default": default, "no margin": default, "keep": default, "chain counts alone": default,
            "call-size costs": default,
            "one context": budget.RoundCosts(default.verify_ms, default.draft_ms, batch_size, default.key,
                                             default.context),
            "drafting alone": dataclasses.replace(default, draft_ms=alone.draft_ms, draft_ms_long=alone.draft_ms_long),
            "warm": dataclasses.replace(default, draft_ms=warm.draft_ms, draft_ms_long=warm.draft_ms_long)}


def main() -> None:
    from eval_acceptance import chat_prompts, humaneval_prompts, humaneval_prompts_in_a_module

    from domino import budget, load_default
    from domino.budget import DepthAcceptance
    from domino.round_kind import RoundKindChooser
    from domino_ops import cpu

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=2, help="passes over the prompts (median)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together as one request")
    p.add_argument("--chain", action="store_true", help="chain rounds only (tree=None)")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--prompts", nargs="+", choices=PROMPT_SETS, default=list(PROMPT_SETS))
    args = p.parse_args()

    gen = load_default()
    b = args.batch_size
    sizes = budget.cost_batch_sizes(b)
    by_size = {size: variant_costs(gen, size) for size in sizes}  # [batch size][variant]
    defaults = DepthAcceptance.__init__.__defaults__  # (prior, prior_weight, memory)
    plan = budget.best_draft_length
    settings = {name: (float("inf") if name == "keep" else defaults[2],  # (memory, margin)
                       0.0 if name in ("no margin", "drafting alone") else budget.DRAFT_MARGIN)
                for name in args.variants}
    print(f"{cpu.model()} ({cpu.isa()}); SmolLM2-135M-Instruct + the shipped drafter, bf16, small-batch linear + "
          f"attention; {args.max_new_tokens} new tokens per prompt, requests of {b}, "
          f"{'chain rounds' if args.chain else 'rounds as generate runs them'}")
    tables = [(size, name) for name in dict.fromkeys(("default", *args.variants)) for size in sizes
              if size == b or name == "default"]  # at the smaller batch sizes, the default's printed alone
    for size, name in tables:
        c = by_size[size][name]
        for context, draft, verify in ((c.context, c.draft_ms, c.verify_ms),
                                       (c.long_context, c.draft_ms_long, c.verify_ms_long)):
            if draft:
                print(f"  {name} costs at batch {size}, {context} cached: draft ms n=1..5 "
                      f"{[round(x, 1) for x in draft[1:6]]}, verify ms t=1..5 {[round(x, 1) for x in verify[1:6]]}")
    make_run = [[{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]]
    sets = {"humaneval": ("HumanEval", lambda: humaneval_prompts(args.num_prompts)),
            "chat": ("chat", lambda: chat_prompts(args.num_prompts)), "make-run": ("make run", lambda: make_run * 3),
            "module": ("module", lambda: humaneval_prompts_in_a_module(args.num_prompts))}
    rounds = {"tree": None} if args.chain else {}
    choosers = {m: {size: RoundKindChooser() for size in sizes} for m in settings}
    rows_left = budget.cost_batch_size
    tree_round = gen._tree_round

    def tree_round_blind_chains(*a, **kw):  # the round's top chain not counted in the chain rounds' acceptance
        return tree_round(*a, **{**kw, "chain_acceptance": None})

    print("prompts    | " + " | ".join(["plain loop", *settings]))
    for key in args.prompts:
        label, load = sets[key]
        prompts = load()
        requests = [prompts[i:i + b] if b > 1 else prompts[i] for i in range(0, len(prompts), b)]
        passes = {m: [] for m in ["plain", *settings]}
        accepted = {m: [] for m in settings}
        carried = {m: [0, 0] for m in settings}  # rows the target's forwards carried, against all of them
        for size in sizes:  # the warm-up gets choosers of its own, not the last variant's
            gen._round_kinds.pop(size, None)
        gen.generate(requests[0], max_new_tokens=8, **rounds)  # warm-up
        gen.generate_plain(requests[0], max_new_tokens=8)
        try:
            for _ in range(args.repeats):
                totals = {m: [0, 0.0] for m in passes}
                outputs = {m: [] for m in passes}  # this pass's, every sequence: the last one's are compared
                for r, request in enumerate(requests):
                    # the order turns by one each request (and pass): in a fixed order the later
                    # of two variants read 3-5 % ahead on `make run`'s repeated prompt in four
                    # runs, and within 1.4 % of the earlier with the order alternating (ad hoc)
                    methods = list(totals)
                    turn = (r + len(requests) * len(passes["plain"])) % len(methods)
                    for m in methods[turn:] + methods[:turn]:
                        first = []  # when the first token (the prefill's) reached the caller

                        def stream(i, new_ids, first=first):
                            if not first:
                                first.append(time.perf_counter())

                        if m == "plain":
                            out = gen.generate_plain(request, max_new_tokens=args.max_new_tokens, stream=stream)
                        else:
                            memory, margin = settings[m]
                            for size in sizes:
                                gen._costs[size] = by_size[size][m]
                                gen._round_kinds[size] = choosers[m][size]
                            budget.cost_batch_size = ((lambda rows, batch_size: batch_size)
                                                      if m == "call-size costs" else rows_left)
                            gen._tree_round = tree_round_blind_chains if m == "chain counts alone" else tree_round
                            DepthAcceptance.__init__.__defaults__ = (*defaults[:2], memory)
                            budget.best_draft_length = (lambda rates, c, live=1, margin=margin:
                                                        plan(rates, c, live, margin))
                            out = gen.generate(request, max_new_tokens=args.max_new_tokens, stream=stream, **rounds)
                        seconds = time.perf_counter() - first[0]
                        ids = out.token_ids if b > 1 else [out.token_ids]
                        if m != "plain":
                            lengths = out.acceptance_lengths if b > 1 else [out.acceptance_lengths]
                            accepted[m] += [a for seq in lengths for a in seq]
                            carried[m][0] += sum(map(len, lengths))
                            carried[m][1] += max(map(len, lengths)) * len(lengths)
                        outputs[m] += ids
                        totals[m][0] += sum(map(len, ids)) - len(ids)  # each sequence's first: the prefill's
                        totals[m][1] += seconds
                for m, (n, sec) in totals.items():
                    passes[m].append(n / sec)
        finally:
            DepthAcceptance.__init__.__defaults__ = defaults
            budget.best_draft_length = plan
            budget.cost_batch_size = rows_left
            for size in sizes:
                gen._costs.pop(size, None)
            gen._tree_round = tree_round
        tps = {m: statistics.median(v) for m, v in passes.items()}
        cells = [f"{tps['plain']:.1f} tok/s"] + [
            f"{tps[m]:.1f} ({tps[m] / tps['plain']:.3f}x, tau {sum(accepted[m]) / len(accepted[m]):.2f}"
            + (f", rows {carried[m][0] / carried[m][1]:.2f}" if b > 1 else "") + ")"
            for m in settings]
        differ = [m for m in settings if outputs[m] != outputs["plain"]]
        print(f"{label:10} | " + " | ".join(cells) + f" | identical: {'no: ' + ', '.join(differ) if differ else 'yes'}",
              flush=True)


if __name__ == "__main__":
    main()
