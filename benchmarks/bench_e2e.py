"""End-to-end decoding, every method in one run, side by side: greedy, every output checked
identical to plain greedy decoding, or sampled (``--temperature``, ``--top-k``, ``--top-p``:
outputs not comparable token by token; that speculative sampling draws from the target's
distribution is the test suite's to show, tests/test_speculative_sampling.py).

For each model configuration (``--configs``: fp32 with PyTorch's linears, fp32 and bf16
with the batch-invariant ``small_batch_linear`` under both models (and, with it, a HF
model's RMSNorms and gated MLPs on ``rms_norm`` / ``silu_mul``, ``domino.fast_layers``),
and bf16 with those and the target's attention on ``small_batch_attention``
(``domino.fast_attention``); the same kernels serve both sides of each comparison) it
times, on the same prompts:

- plain HF ``generate`` (greedy, or sampling at the same parameters) and HF prompt lookup
  (``prompt_lookup_num_tokens``);
- plain decoding by the engine's own loop (``--methods plain-loop``:
  ``DominoGenerator.generate_plain``, one forward and one ``domino_ops.sample`` per token),
  as fast as HF's greedy ``generate`` but faster sampled, where HF's logits warpers cost
  (its top-p sorts the vocabulary every token);
- Domino, a chain of the whole block every round (``num_drafts`` = block - 1);
- Domino, a chain with the adaptive budget (``tree=None``);
- Domino as ``generate`` runs by default (``tree="auto"``: at T = 0 each round a tree round
  of :data:`domino.tree.DEFAULT_TREE` with the grafts below or an adaptive chain round,
  whichever has measured faster, :mod:`domino.round_kind`);
- Domino, a tree (``--tree``, default 3,4; its size chosen each round by the adaptive
  budget unless given) every round, with prompt-lookup chains and chains retrieved from
  the datastore of the target's outputs grafted on (:mod:`domino.lookup`,
  :mod:`domino.datastore`; ``--datastore``, default the shipped one), the same with prompt
  lookup only, the tree alone (head on), and the tree alone with the head off (children
  from the base marginals only: a block drafter's tree, without causal state).

Speedups are against the fastest plain decoding of all configurations and plain methods,
PyTorch's own bf16 included (``--plain-configs``: configurations timed for plain decoding
only).
Per method it reports tokens/s (total new tokens / total time of a pass over the prompts,
the median of ``--repeats`` passes; the methods alternate within each pass, so the
machine's drift hits them alike; one warm-up generation per method excluded), the
speedup, the median over passes of the pass's own ratio to plain greedy decoding in the
same configuration (less moved by the machine's drift between passes), acceptance
(tokens advanced per round), tokens verified per round and the
round's cost breakdown (drafting / target forward / the rest, ms per round; the prompts'
prefills are in none of them). The costs of
the adaptive budget are measured (or read from the disk cache) before any timing.

    python benchmarks/bench_e2e.py --num-prompts 8 --max-new-tokens 96 [--repeats 3] [--out FILE]
    python benchmarks/bench_e2e.py --chat        # held-out chat prompts instead of HumanEval
    python benchmarks/bench_e2e.py --batch-size 4 --methods plain-loop adaptive-chain default   # batches
    python benchmarks/bench_e2e.py --temperature 0.7 --methods adaptive-chain   # sampled (at T > 0
                                                 # the default's rounds are adaptive chains too)
    python benchmarks/bench_e2e.py --module-context 6000   # each function at the end of a long
                                                 # module (~1,900 tokens of context)
    python benchmarks/bench_e2e.py --sweep       # acceptance vs tokens verified: chain vs tree,
                                                 # head on vs off (PNG in results/)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

import domino
import domino_ops
from domino.budget import cost_batch_sizes
from domino.fast_forward import uses_fast_forward
from domino.loading import DEFAULT_DATASTORE, DEFAULT_DRAFTER_DIR, smollm2_dir
from domino_ops import cpu
from eval_acceptance import chat_prompts, humaneval_prompts, humaneval_prompts_in_a_module
from timing import copy_bandwidth_gbs

RESULTS = Path(__file__).parent / "results"
# (dtype, small-batch linear, small-batch attention: with both, bit-identical to plain decoding)
CONFIGS = {"fp32": (torch.float32, False, False), "bf16": (torch.bfloat16, False, False),
           "fp32-sbl": (torch.float32, True, False), "bf16-sbl": (torch.bfloat16, True, False),
           "fp32-sb": (torch.float32, True, True), "bf16-sb": (torch.bfloat16, True, True)}


class RoundTimer:
    """Accumulates the wall time of the drafter's drafting and of the target's forwards
    while installed (wrapping the generator's own methods); the prompt's prefill (the
    forward that needs only the last logits) is kept apart from the rounds' forwards."""

    def __init__(self, gen):
        self.gen, self.ms = gen, defaultdict(float)
        self.originals = {}
        for owner, name, key in ((gen.drafter, "draft", "draft"), (gen.drafter, "draft_tree", "draft"),
                                 (gen, "_target_forward", "target")):
            fn = getattr(owner, name)
            self.originals[(owner, name)] = fn
            setattr(owner, name, self._timed(fn, key))

    def _timed(self, fn, key):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            prefill = key == "target" and (kw.get("last_logits_only") or (len(a) > 4 and a[4]))
            self.ms["prefill" if prefill else key] += (time.perf_counter() - t0) * 1e3
            return out
        return wrapper

    def remove(self):
        for (owner, name) in self.originals:
            delattr(owner, name)  # the instance attribute shadowed the class's method


def one_pass(fn, requests, gen) -> dict:
    """Generates every request once with ``fn`` (a request: one prompt, or a list of prompts
    decoded as one batch): tokens/s (total tokens / total time), each sequence's output, the
    acceptance and verified lengths of each sequence's rounds, the number of rounds (a
    batch's rounds once) and the round-cost breakdown."""
    timer = RoundTimer(gen)
    try:
        tokens, outs, acc, ver, rounds, t0 = 0, [], [], [], 0, time.perf_counter()
        for request in requests:
            res = fn(request, None)
            batch = isinstance(request, list) and isinstance(request[0], (str, list))
            ids, accepts = (res.token_ids, res.acceptance_lengths) if batch else ([res.token_ids], [res.acceptance_lengths])
            verified = (res.verified_lengths if batch else [res.verified_lengths]) if res.verified_lengths else [
                [1] * len(a) for a in accepts]
            outs.extend(ids)
            tokens += sum(len(t) for t in ids)
            for a, v in zip(accepts, verified):
                acc.extend(a)
                ver.extend(v)
            rounds += max(len(a) for a in accepts)
        elapsed = time.perf_counter() - t0
    finally:
        timer.remove()
    return dict(tps=tokens / elapsed, outputs=outs, accepts=acc, verified=ver, rounds=rounds, ms=dict(timer.ms),
                elapsed=elapsed)


def summarize(name: str, passes: list[dict]) -> dict:
    """One method's row: the median tokens/s over its passes; acceptance, verified tokens
    and the per-round breakdown over all passes; the outputs of the last."""
    accepts = [a for p in passes for a in p["accepts"]]
    rounds = max(sum(p["rounds"] for p in passes), 1)  # a batch's rounds counted once
    ms = {k: sum(p["ms"].get(k, 0.0) for p in passes) for k in ("draft", "target", "prefill")}
    total_ms = sum(p["elapsed"] for p in passes) * 1e3
    return dict(name=name, tps=statistics.median(p["tps"] for p in passes), outputs=passes[-1]["outputs"],
                # per sequence and round (a batch's round counts once per sequence)
                tau=sum(accepts) / max(len(accepts), 1),
                verified=sum(v for p in passes for v in p["verified"]) / max(len(accepts), 1),
                rounds=rounds, draft_ms=ms["draft"] / rounds, target_ms=ms["target"] / rounds,
                other_ms=(total_ms - ms["draft"] - ms["target"] - ms["prefill"]) / rounds)


# bench_e2e --methods: the rows of the comparison table, in its order
METHODS = ("plain", "plain-loop", "lookup", "chain", "adaptive-chain", "default", "tree-all", "tree-lookup", "tree", "head-off")


PLAIN_LOOP = "plain engine loop (domino_ops.sample)"


def plain_name(args) -> str:
    """The baseline row's name: plain HF decoding, greedy or sampled."""
    return "plain HF greedy" if args.temperature == 0 else "plain HF sampling"


def sampling_kwargs(args) -> dict:
    """The sampling parameters every method decodes with (greedy at temperature 0)."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)


def methods(gen, args, tree):
    M = args.max_new_tokens
    n_block = gen.drafter.config.num_drafts
    shape = f"{tree.topk},{tree.depth}," + (str(tree.num_draft_tokens) if tree.num_draft_tokens else "adaptive")
    sampling = sampling_kwargs(args)

    def plain(p, m):
        torch.manual_seed(0)  # HF generate's sampling draws from torch's default generator
        return gen.generate_target_only(p, max_new_tokens=m or M, **sampling)

    def plain_loop(p, m):
        return gen.generate_plain(p, max_new_tokens=m or M, generator=torch.Generator().manual_seed(0), **sampling)

    def lookup(p, m):
        torch.manual_seed(0)
        return gen.generate_target_only(p, max_new_tokens=m or M, prompt_lookup_num_tokens=args.prompt_lookup_tokens,
                                        **sampling)

    def spec(**kw):
        return lambda p, m: gen.generate(p, max_new_tokens=m or M, generator=torch.Generator().manual_seed(0),
                                         **sampling, **kw)

    every = {"plain": (plain_name(args), plain),
             "plain-loop": (PLAIN_LOOP, plain_loop),
             "lookup": (f"HF prompt lookup ({args.prompt_lookup_tokens})", lookup),
             "chain": (f"Domino chain {n_block}", spec(num_drafts=n_block)),
             "adaptive-chain": ("Domino chain, adaptive", spec(tree=None)),
             "default": ("Domino default (auto: tree or chain)", spec()),
             "tree-all": (f"Domino tree {shape} + lookup + datastore", spec(tree=tree)),
             "tree-lookup": (f"Domino tree {shape} + lookup", spec(tree=tree, datastore_tokens=0)),
             "tree": (f"Domino tree {shape}", spec(tree=tree, lookup_tokens=0, datastore_tokens=0)),
             "head-off": (f"tree {shape}, head off", spec(tree=tree, use_head=False, lookup_tokens=0,
                                                         datastore_tokens=0))}
    return [every["plain"]] + [every[k] for k in METHODS if k != "plain" and k in args.methods]


def load(config: str, drafter, datastore=DEFAULT_DATASTORE):
    """The SmolLM2 target and ``drafter`` in configuration ``config`` (CONFIGS), with the
    ``datastore`` (the path of a saved one)."""
    dtype, sbl, sba = CONFIGS[config]
    return domino.load(smollm2_dir(), drafter, dtype=dtype, small_batch_linear=sbl, small_batch_attention=sba,
                       datastore=datastore)


def cmd_compare(args) -> None:
    if args.chat:
        prompts = chat_prompts(args.num_prompts)
    elif args.module_context:
        prompts = humaneval_prompts_in_a_module(args.num_prompts, args.offset, args.module_context)
    else:
        prompts = humaneval_prompts(args.num_prompts, args.offset)
    num_prompts = len(prompts)
    if args.batch_size > 1:  # each request a batch of that many prompts (the last may be smaller)
        prompts = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    topk, depth, nodes = args.tree
    tree = domino.TreeShape(topk, depth, nodes or None)
    torch.set_grad_enabled(False)
    # Plain decoding streams the weights once per token, so it follows the machine's memory
    # bandwidth, which on a shared VM moves between runs; rounds over ~9 tokens follow it
    # less. Printed with the table so that runs can be read side by side.
    copy_before = copy_bandwidth_gbs()
    rows = []
    plain_only = [c for c in args.plain_configs if c not in args.configs]
    fast = []  # the configurations whose target forward is domino.fast_forward's (both sides of a row)
    for config in plain_only + args.configs:
        gen = load(config, args.drafter, args.datastore)
        if uses_fast_forward(gen.target):
            fast.append(config)
        # the adaptive budget's costs, at every batch size a request's rounds may carry:
        # measured (or read) before any timing
        for size in {s for p in prompts for s in cost_batch_sizes(len(p) if args.batch_size > 1 else 1)}:
            gen.round_costs(size)
        ms = [(name, fn) for name, fn in methods(gen, args, tree)
              if config not in plain_only or name in (plain_name(args), PLAIN_LOOP)]
        for _, fn in ms:
            fn(prompts[0], 8)  # warm-up, untimed
        # the methods alternate within every repeat, so the machine's drift hits them alike
        passes = {name: [] for name, _ in ms}
        for rep in range(args.repeats):
            for name, fn in ms:
                passes[name].append(one_pass(fn, prompts, gen))
                print(f"  {config:11} pass {rep + 1}/{args.repeats} {name:46} {passes[name][-1]['tps']:6.1f} tok/s",
                      flush=True)
        # each pass's ratio to the faster plain method of this configuration
        base = max((n for n in passes if n in (plain_name(args), PLAIN_LOOP)),
                   key=lambda n: statistics.median(p["tps"] for p in passes[n]))
        for name, _ in ms:
            ratios = [a["tps"] / b["tps"] for a, b in zip(passes[name], passes[base])]
            rows.append({**summarize(name, passes[name]), "config": config, "pass_ratio": statistics.median(ratios)})
    copy_after = copy_bandwidth_gbs()
    datastore_tokens = int((gen.datastore.tokens >= 0).sum()) if gen.datastore is not None else 0
    plains = {r["config"]: r for r in rows if r["name"] == plain_name(args)}
    fastest = max((r for r in rows if r["name"] in (plain_name(args), PLAIN_LOOP)), key=lambda r: r["tps"])
    what = ('held-out chat prompts (%d)' % num_prompts if args.chat else
            'HumanEval prompts %d..%d' % (args.offset, args.offset + num_prompts - 1)
            + (' after a module of %d characters' % args.module_context if args.module_context else ''))
    what += f" in batches of {args.batch_size}" if args.batch_size > 1 else ""
    head = (f"\n{what}, "
            + ("greedy" if args.temperature == 0 else
               f"sampled at temperature {args.temperature}, top_k {args.top_k}, top_p {args.top_p} (outputs not "
               "comparable token by token: 'identical' is n/a)")
            + f", max_new_tokens={args.max_new_tokens}, median of {args.repeats}; {cpu.model()} "
            f"(head kernels {cpu.isa()}, small_batch_linear {domino_ops.small_batch_linear_isa()}, packed product "
            f"{domino_ops.small_batch_linear_packed_path() if domino_ops.small_batch_linear_packed_supported() else 'none'}), "
            f"{torch.get_num_threads()} threads, torch {torch.__version__}; speedup vs the fastest plain "
            f"decoding ({fastest['config']} {fastest['name']}, {fastest['tps']:.1f} tok/s); per pass: the median of "
            f"each pass's "
            f"ratio to the faster plain method in the same configuration; copy bandwidth {copy_before:.1f} GB/s before the "
            f"runs, {copy_after:.1f} after; datastore {args.datastore.name} ({datastore_tokens} tokens); "
            f"target forward domino.fast_forward in: {', '.join(fast) or 'none'}")
    lines = [head, f"{'config':11} | {'method':46} | {'tok/s':>6} | {'speedup':>7} | {'per pass':>8} | {'tau':>5} | "
             f"{'verified':>8} | {'draft ms':>8} | {'target ms':>9} | {'other ms':>8} | identical",
             "-" * 149]
    for r in rows:
        same = r["outputs"] == plains[r["config"]]["outputs"]  # vs plain greedy in the same configuration
        identical = "n/a" if args.temperature else "yes" if same else "NO"
        spec = not r["name"].startswith(("HF prompt lookup", "plain"))
        lines.append(f"{r['config']:11} | {r['name']:46} | {r['tps']:6.1f} | {r['tps'] / fastest['tps']:6.2f}x | "
                     f"{r['pass_ratio']:7.2f}x | "
                     + (f"{r['tau']:5.2f} | {r['verified']:8.2f} | {r['draft_ms']:8.1f} | {r['target_ms']:9.1f} | "
                        f"{r['other_ms']:8.1f}" if spec else f"{'':5} | {'':8} | {'':8} | {'':9} | {'':8}")
                     + f" | {identical}")
    text = "\n".join(lines)
    print(text)
    if args.out != "-":
        out = Path(args.out) if args.out else RESULTS / ("e2e_chat.txt" if args.chat else "e2e.txt")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
        print(f"wrote {out}")


def cmd_sweep(args) -> None:
    """Acceptance against tokens verified per round: chains of n drafts and trees of N
    nodes, head on and off, one configuration, greedy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prompts = humaneval_prompts(args.num_prompts, args.offset)
    gen = load(args.configs[0], args.drafter, args.datastore)
    torch.set_grad_enabled(False)
    n_block = gen.drafter.config.num_drafts
    curves = {}
    for use_head in (True, False):
        on = "head on" if use_head else "head off"
        curves[f"chain, {on}"] = [(n, {"num_drafts": n}) for n in (1, 2, 3, 4, 6, 8, n_block)]
        curves[f"tree, {on}"] = [(N, {"tree": domino.TreeShape(4, 6, N), "lookup_tokens": 0,
                                      "datastore_tokens": 0})
                                 for N in (3, 4, 6, 8, 12, 16, 24)]
        for key in (f"chain, {on}", f"tree, {on}"):
            pts = []
            for size, kw in curves[key]:
                acc = rounds = 0
                for p in prompts:
                    res = gen.generate(p, max_new_tokens=args.max_new_tokens, use_head=use_head, **kw)
                    acc += sum(res.acceptance_lengths)
                    rounds += len(res.acceptance_lengths)
                pts.append((size + (1 if "chain" in key else 0), acc / rounds))
                print(f"  {key:16} verified {pts[-1][0]:3d}: tau {pts[-1][1]:.3f}", flush=True)
            curves[key] = pts
    lines = [f"HumanEval prompts {args.offset}..{args.offset + len(prompts) - 1}, greedy, "
             f"max_new_tokens={args.max_new_tokens}, {args.configs[0]}; tau = tokens advanced per round",
             f"{'curve':16} | " + " | ".join(f"{'verified':>8} {'tau':>5}" for _ in range(7))]
    for key, pts in curves.items():
        lines.append(f"{key:16} | " + " | ".join(f"{v:8d} {t:5.2f}" for v, t in pts))
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "acceptance_vs_verified.txt").write_text(text + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, pts in curves.items():
        ax.plot(*zip(*pts), marker="o" if "chain" in key else "s", linestyle="-" if "head on" in key else "--",
                label=key)
    ax.set_xlabel("tokens verified per round (anchor + drafts / tree nodes)")
    ax.set_ylabel("acceptance (tokens advanced per round)")
    ax.set_title("SmolLM2-135M + Domino drafter, HumanEval, greedy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "acceptance_vs_verified.png", dpi=120)
    print(f"wrote {RESULTS / 'acceptance_vs_verified.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed passes over the prompts (median); the methods alternate within each pass")
    parser.add_argument("--out", default=None,
                        help="the table's file (default results/e2e.txt, or e2e_chat.txt with --chat; - for none)")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--plain-configs", nargs="*", choices=list(CONFIGS), default=["bf16"],
                        help="configurations timed for plain greedy decoding only (so the fastest plain decoding "
                             "is in every table; default: PyTorch's own bf16)")
    parser.add_argument("--drafter", type=Path, default=DEFAULT_DRAFTER_DIR)
    parser.add_argument("--datastore", type=Path, default=DEFAULT_DATASTORE,
                        help="the target's outputs to retrieve chains from (domino.datastore)")
    parser.add_argument("--tree", type=int, nargs=3, default=(3, 4, 0), metavar=("TOPK", "DEPTH", "NODES"),
                        help="the tree's shape; NODES 0: chosen each round by the adaptive budget")
    parser.add_argument("--prompt-lookup-tokens", type=int, default=10, help="HF prompt lookup's tokens per step")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="the rows timed (plain HF decoding always; the speedups are against the fastest plain row)")
    parser.add_argument("--chat", action="store_true", help="held-out chat prompts instead of HumanEval")
    parser.add_argument("--module-context", type=int, default=0, metavar="CHARS",
                        help="each HumanEval function asked for at the end of a module of CHARS characters of "
                             "other problems' solved functions (6000: ~1,900 tokens of context)")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="prompts decoded together as one batch request (tok/s counts every sequence's tokens)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample every method at this temperature (0: greedy, outputs checked identical)")
    parser.add_argument("--top-k", type=int, default=0, help="with --temperature: top-k (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="with --temperature: top-p (1: off)")
    parser.add_argument("--sweep", action="store_true", help="acceptance vs tokens verified (plot)")
    args = parser.parse_args()
    print(f"[bench_e2e] {platform.node()} {cpu.model()}", flush=True)
    (cmd_sweep if args.sweep else cmd_compare)(args)


if __name__ == "__main__":
    main()
