"""Not a comparison of methods: what ``generate(tree="auto")`` does in a new process. For
each of ``--processes`` new Python processes it loads ``domino.load_default()`` and runs
``--calls`` greedy calls of ``make run``'s prompt (``--max-new-tokens``, default 128), and
prints per call its wall time and how many rounds the round-kind chooser
(:mod:`domino.round_kind`) played as trees and as chains, and for the first call the
first tree round's milliseconds against the median of the later ones (the cold round the
chooser leaves unmeasured).

    python benchmarks/round_kind_first_call.py [--processes 3] [--calls 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROMPT = "Write a Python function that checks whether a number is prime."  # the Makefile's default


def one_process(calls: int, max_new_tokens: int) -> list[dict]:
    """In this process: ``calls`` calls, each {seconds, tree, chain, tree_ms}."""
    import time

    import torch

    import domino
    import domino.round_kind as round_kind

    gen = domino.load_default()
    log = []
    record = round_kind.RoundKindChooser.record

    def logged(self, kind, tokens, ms):
        log.append((kind, ms))
        return record(self, kind, tokens, ms)

    round_kind.RoundKindChooser.record = logged
    out = []
    with torch.inference_mode():
        for _ in range(calls):
            start, t0 = len(log), time.perf_counter()
            gen.generate(PROMPT, max_new_tokens=max_new_tokens)
            rounds = log[start:]
            out.append(dict(seconds=time.perf_counter() - t0, tree=sum(k == "tree" for k, _ in rounds),
                            chain=sum(k == "chain" for k, _ in rounds),
                            tree_ms=[ms for k, ms in rounds if k == "tree"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_process(args.calls, args.max_new_tokens)))
        return
    from domino_ops import cpu

    print(f"CPU: {cpu.model()}; {args.processes} new processes x {args.calls} calls of {args.max_new_tokens} tokens")
    for p in range(args.processes):
        result = subprocess.run([sys.executable, __file__, "--child", "--calls", str(args.calls),
                                 "--max-new-tokens", str(args.max_new_tokens)],
                                capture_output=True, text=True, check=True)
        calls = json.loads(result.stdout.strip().splitlines()[-1])
        for i, c in enumerate(calls):
            extra = ""
            if i == 0 and len(c["tree_ms"]) > 1:
                extra = (f"; first tree round {c['tree_ms'][0]:.1f} ms, later ones median "
                         f"{statistics.median(c['tree_ms'][1:]):.1f} ms")
            print(f"process {p} call {i}: {c['seconds']:.2f} s, tree rounds {c['tree']}, chain rounds "
                  f"{c['chain']}{extra}")


if __name__ == "__main__":
    main()
