"""Is the drafter's confidence an acceptance probability? A reliability table, and the
calibration the engine's verification budget uses (``domino.budget.Calibration``).

Runs greedy generation with whole-block chains on HumanEval prompts and records, for every
draft the target examined (each draft up to and including the first rejected one of a
round), the drafter's confidence in it (its probability under the distribution it was
chosen from) and whether the target accepted it. Prints, per confidence bin, the mean
confidence against the measured acceptance rate, before and after fitting; ``--write``
stores the fit beside the drafter's weights (``calibration.json``), where
``DominoDraftModel.from_pretrained`` finds it.

    python benchmarks/calibration.py --num-prompts 32 --offset 100 --write

The prompts used to fit (default HumanEval 100..131) are disjoint from those the
end-to-end benchmark times (0..19).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import domino
from domino.budget import Calibration
from domino.loading import DEFAULT_DRAFTER_DIR, DEFAULT_OPTIONS, smollm2_dir
from domino.model import CALIBRATION_FILE
from eval_acceptance import humaneval_prompts

RESULTS = Path(__file__).parent / "results"


def collect(gen, prompts, max_new_tokens: int, use_head: bool = True) -> tuple[list[float], list[bool], list[int]]:
    """(confidence, accepted, depth) of every draft the target examined, one prompt at a time."""
    confidences, accepted, depths = [], [], []
    drafts = []
    real_draft = gen.drafter.draft

    def recording(*a, **kw):
        d = real_draft(*a, **kw)
        drafts.append(d.confidence[0].tolist())
        return d

    gen.drafter.draft = recording
    try:
        for p in prompts:
            drafts.clear()
            res = gen.generate(p, max_new_tokens=max_new_tokens, use_head=use_head,
                               num_drafts=gen.drafter.config.num_drafts)
            for conf, kept in zip(drafts, res.acceptance_lengths):
                for i in range(min(kept, len(conf))):  # drafts 0..kept-2 accepted, kept-1 rejected
                    confidences.append(conf[i])
                    accepted.append(i < kept - 1)
                    depths.append(i)
    finally:
        gen.drafter.draft = real_draft
    return confidences, accepted, depths


def reliability_table(confidence, accepted, calibration: Calibration, bins: int = 10) -> str:
    edges = [i / bins for i in range(bins + 1)]
    c = torch.tensor(confidence)
    a = torch.tensor(accepted, dtype=torch.float32)
    mapped = calibration(c)
    lines = [f"{'confidence':>11} | {'drafts':>6} | {'mean conf':>9} | {'accepted':>8} | {'calibrated':>10}",
             "-" * 57]
    for lo, hi in zip(edges, edges[1:]):
        m = (c >= lo) & ((c < hi) if hi < 1 else (c <= hi))
        if m.any():
            lines.append(f"{lo:4.1f}-{hi:4.1f}  | {int(m.sum()):6d} | {c[m].mean():9.3f} | {a[m].mean():8.3f} | "
                         f"{mapped[m].mean():10.3f}")
    ece_raw = sum(abs(c[m].mean() - a[m].mean()) * m.sum() for m in _bin_masks(c, edges)) / len(c)
    ece_cal = sum(abs(mapped[m].mean() - a[m].mean()) * m.sum() for m in _bin_masks(c, edges)) / len(c)
    lines.append(f"expected calibration error: raw {float(ece_raw):.3f}, calibrated {float(ece_cal):.3f}")
    return "\n".join(lines)


def _bin_masks(c, edges):
    for lo, hi in zip(edges, edges[1:]):
        m = (c >= lo) & ((c < hi) if hi < 1 else (c <= hi))
        if m.any():
            yield m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", type=Path, default=DEFAULT_DRAFTER_DIR)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--offset", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--write", action="store_true", help=f"store the fit as {CALIBRATION_FILE} beside the drafter")
    args = parser.parse_args()

    gen = domino.load(smollm2_dir(), args.drafter, quiet=False, **DEFAULT_OPTIONS)  # as the engine runs by default
    torch.set_grad_enabled(False)
    conf, acc, depth = collect(gen, humaneval_prompts(args.num_prompts, args.offset), args.max_new_tokens)
    fit = Calibration.fit(conf, acc, bins=args.bins, depth=depth)
    report = [f"HumanEval prompts {args.offset}..{args.offset + args.num_prompts - 1}, greedy, whole-block chains, "
              f"{len(conf)} drafts examined by the target",
              "", "before fitting (confidence taken as the acceptance probability):",
              reliability_table(conf, acc, Calibration(), args.bins),
              "", "after fitting (the engine's mapping):", reliability_table(conf, acc, fit, args.bins),
              "", "acceptance by depth (given the drafts before it were accepted):"]
    for d in sorted(set(depth)):
        sel = [a for a, dd in zip(acc, depth) if dd == d]
        report.append(f"  depth {d + 1:2d}: {sum(sel) / len(sel):.3f} of {len(sel)}")
    text = "\n".join(report)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "calibration.txt").write_text(text + "\n")
    if args.write:
        fit.save(args.drafter / CALIBRATION_FILE)
        print(f"wrote {args.drafter / CALIBRATION_FILE}")


if __name__ == "__main__":
    main()
