"""Is the drafter's confidence an acceptance probability? A reliability table, and the
calibration the engine's verification budget uses (``domino.budget.Calibration``).

Runs greedy generation on HumanEval prompts as ``generate`` does by default (``--rounds
tree``: the default tree with the adaptive budget; ``chain``: whole-block chains) and
records, for every draft the target examined, the drafter's confidence in it and whether
the target accepted it. In a tree round the target examines the children of every node on
the accepted path (the last accepted node's included: all rejected); a child's confidence
is its own draft probability, its cumulative probability over its parent's (what
``domino.tree.path_acceptance`` maps). In a chain round it examines each draft up to and
including the first rejected one. Prints, per confidence bin, the mean confidence
against the measured acceptance rate, before and after fitting, on the fitting prompts
and on ``--heldout`` other prompts (the fit's honest error); ``--write`` stores the fit
beside the drafter's weights (``calibration.json``), where
``DominoDraftModel.from_pretrained`` finds it. Its per-depth rates (the prior of the
plan's acceptance per depth) are, for trees, how often the accepted path went on past
each depth, as the plan counts them. Every run writes its report to
``benchmarks/results/calibration.txt`` (the record of the shipped fit: restore it with git
after a trial run), as the other benchmarks write theirs.

    python benchmarks/calibration.py --num-prompts 32 --offset 100 --write
    python benchmarks/calibration.py --target /path/to/hf-model --drafter training/runs/mine/drafter --write

The prompts used to fit (default HumanEval 100..131) and the held-out ones (132..147) are
disjoint from those the end-to-end benchmark times (0..19).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

import domino
import domino.generate
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


def collect_tree(gen, prompts, max_new_tokens: int) -> tuple[list[float], list[bool], list[int], list[list[int]]]:
    """(confidence, accepted, depth) of every tree node the target examined in default
    (tree) generation, and per depth [rounds whose accepted path reached a node with
    children at that depth, rounds whose path went on past it]."""
    confidences, accepted, depths, extended = [], [], [], []
    real_verify = domino.generate.verify_tree

    def recording(tree, links, logits, sampling, depth):
        out = real_verify(tree, links, logits, sampling, depth)
        path = out.path
        b = tree.candidates.shape[0]
        node_scores = torch.cat([torch.zeros(b, 1), tree.candidate_scores.gather(1, tree.selected_index).float()], 1)
        nxt, sib = links.next_token.tolist(), links.next_sibling.tolist()
        for s, k in enumerate(out.num_accepted):
            for j in range(k + 1):
                u, c = path[s][j], nxt[s][path[s][j]]
                if c != -1:
                    while len(extended) <= j:
                        extended.append([0, 0])
                    extended[j][0] += 1
                    extended[j][1] += j < k
                while c != -1:
                    confidences.append(math.exp(float(node_scores[s, c] - node_scores[s, u])))
                    accepted.append(j < k and c == path[s][j + 1])
                    depths.append(j)
                    c = sib[s][c]
        return out

    domino.generate.verify_tree = recording
    try:
        for p in prompts:
            # the drafter's own nodes only
            gen.generate(p, max_new_tokens=max_new_tokens, lookup_tokens=0, datastore_tokens=0)
    finally:
        domino.generate.verify_tree = real_verify
    return confidences, accepted, depths, extended


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
    parser.add_argument("--target", type=Path, default=None,
                        help="HF target directory (default: SmolLM2-135M-Instruct); give its --drafter")
    parser.add_argument("--drafter", type=Path, default=None, help="default: the shipped drafter (default target)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--offset", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--rounds", choices=("tree", "chain"), default="tree",
                        help="fit on the default tree rounds (generate's default at T = 0) or whole-block chains")
    parser.add_argument("--heldout", type=int, default=16,
                        help="prompts after the fitting ones on which the fit is scored (0: none)")
    parser.add_argument("--write", action="store_true", help=f"store the fit as {CALIBRATION_FILE} beside the drafter")
    args = parser.parse_args()
    if args.target is not None and args.drafter is None:
        parser.error("--target: give the --drafter trained for it")

    drafter_dir = args.drafter or DEFAULT_DRAFTER_DIR
    gen = domino.load(args.target or smollm2_dir(), drafter_dir, quiet=False,
                      **DEFAULT_OPTIONS)  # as the engine runs by default
    torch.set_grad_enabled(False)

    def run(prompts):
        if args.rounds == "chain":
            return (*collect(gen, prompts, args.max_new_tokens), None)
        return collect_tree(gen, prompts, args.max_new_tokens)

    conf, acc, depth, extended = run(humaneval_prompts(args.num_prompts, args.offset))
    if len(conf) == 0:
        raise SystemExit("no draft was examined: the budget drafted nothing in these rounds (a drafter whose "
                         "confidence is low everywhere); fit on whole-block chains with --rounds chain")
    fit = Calibration.fit(conf, acc, bins=args.bins, depth=depth)
    if extended is not None:  # trees: the plan's prior is how often the path went on past each depth
        fit.depth_rates = [(went + 0.5) / (reached + 1.0) for reached, went in extended]
    what = "the default tree (adaptive budget)" if args.rounds == "tree" else "whole-block chains"
    report = [f"HumanEval prompts {args.offset}..{args.offset + args.num_prompts - 1}, greedy, {what}, "
              f"{len(conf)} drafts examined by the target",
              "", "before fitting (confidence taken as the acceptance probability):",
              reliability_table(conf, acc, Calibration(), args.bins),
              "", "after fitting (the engine's mapping), on the fitting prompts:",
              reliability_table(conf, acc, fit, args.bins)]
    if args.heldout:
        lo = args.offset + args.num_prompts
        h_conf, h_acc, _, _ = run(humaneval_prompts(args.heldout, lo))
        report += ["", f"held out (HumanEval prompts {lo}..{lo + args.heldout - 1}, {len(h_conf)} drafts), the same fit:",
                   reliability_table(h_conf, h_acc, fit, args.bins)]
    report += ["", "acceptance by depth (given the drafts before it were accepted"
               + ("; trees: of the examined children, and how often the path went on past the depth):"
                  if extended is not None else "):")]
    for d in sorted(set(depth)):
        sel = [a for a, dd in zip(acc, depth) if dd == d]
        line = f"  depth {d + 1:2d}: {sum(sel) / len(sel):.3f} of {len(sel)}"
        if extended is not None and d < len(extended):
            line += f"; path went on {extended[d][1]} of {extended[d][0]} ({fit.depth_rates[d]:.3f})"
        report.append(line)
    text = "\n".join(report)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "calibration.txt").write_text(text + "\n")
    if args.write:
        fit.save(drafter_dir / CALIBRATION_FILE)
        print(f"wrote {drafter_dir / CALIBRATION_FILE}")


if __name__ == "__main__":
    main()
