"""``domino generate "PROMPT"``: speculative generation on the embedded default model."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from domino.datastore import DEFAULT_DATASTORE_TOKENS
from domino.lookup import DEFAULT_LOOKUP_TOKENS


def main(argv=None) -> int:
    """The ``domino`` command line (``domino generate --help``); returns the exit status."""
    parser = argparse.ArgumentParser(prog="domino", description="Domino speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="answer a prompt with speculative decoding")
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--no-head", action="store_true", help="backbone-only drafting (the DFlash baseline)")
    g.add_argument("--seed", type=int, default=0, help="seed for sampling (temperature > 0)")
    g.add_argument("--lookup-tokens", type=int, default=DEFAULT_LOOKUP_TOKENS,
                   help="prompt-lookup tokens grafted onto each greedy tree round at most (the adaptive budget "
                        "grafts the part that pays; 0: none)")
    g.add_argument("--datastore-tokens", type=int, default=DEFAULT_DATASTORE_TOKENS,
                   help="tokens retrieved from the default target's datastore of its own outputs and grafted "
                        "onto each greedy tree round at most (0: none; a --target has none)")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--tree", metavar="TOPK,DEPTH[,NODES]",
                       help="draft and verify this tree per round: TOPK children per node, DEPTH levels, NODES "
                            "verified nodes including the root (default: chosen each round from measured costs at "
                            "T = 0, every candidate at T > 0), e.g. --tree 3,4 or --tree 3,5,16. Default: the "
                            "tree 3,4 or an adaptive chain each round at T = 0, whichever measures faster on this "
                            "machine, a chain at T > 0")
    shape.add_argument("--chain", action="store_true", help="draft a chain per round, also at T = 0")
    g.add_argument("--num-drafts", type=int, default=None,
                   help="chain: drafts verified per round (default: chosen each round from measured costs); "
                        "implies a chain")
    g.add_argument("--target", help="HF target directory (default: SmolLM2-135M-Instruct)")
    g.add_argument("--drafter", help="drafter checkpoint directory (default: the shipped one, for the default "
                                     "target)")
    g.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="the models' dtype (default bf16: on the CPU, with the batch-invariant kernels, the "
                        "fastest configuration that stays token-identical)")
    g.add_argument("--compare", action="store_true",
                   help="also time the target's own decoding against Domino, side by side (both warmed up, "
                        "alternating, streaming off, median of --repeats runs each) and check the outputs match")
    g.add_argument("--repeats", type=int, default=3, help="timed runs of each side with --compare")
    args = parser.parse_args(argv)
    # errors as the generate subcommand's ("domino generate: error: ..."), with its usage
    tree = _tree_shape(g, args.tree) if args.tree is not None else None if args.chain else "auto"
    _check_request(g, args, tree)
    for flag, path in (("--target", args.target), ("--drafter", args.drafter)):
        if path is not None and not Path(path).is_dir():
            g.error(f"{flag}: no directory {path}")

    import torch

    import domino
    from domino.loading import DEFAULT_DATASTORE, DEFAULT_DRAFTER_DIR, DEFAULT_OPTIONS, smollm2_dir

    print("[domino] loading models (first run converts the GGUF once)...", file=sys.stderr, flush=True)
    if args.target or args.drafter or args.dtype != "bfloat16":
        # the shipped drafter and datastore are the default target's: with it, and only with it
        drafter = args.drafter or (None if args.target else DEFAULT_DRAFTER_DIR)
        datastore = DEFAULT_DATASTORE if not args.target and DEFAULT_DATASTORE.exists() else None
        try:
            gen = domino.load(args.target or smollm2_dir(quiet=False), drafter, quiet=False, datastore=datastore,
                              **{**DEFAULT_OPTIONS, "dtype": getattr(torch, args.dtype)})
        except (ValueError, TypeError) as e:
            g.error(str(e))
    else:
        gen = domino.load_default(quiet=False)
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    drafts = f"tree {args.tree}" if args.tree else "chain" if args.chain or args.num_drafts is not None else "auto"
    print(f"[domino] generating (head {'off' if args.no_head else 'on'}, T={args.temperature}, {drafts})",
          file=sys.stderr)
    printer = TextPrinter(gen.tokenizer)
    try:  # what only the loaded models can check (the drafter's depth, the context window)
        gen.generate("warm-up", max_new_tokens=4)  # first-call overheads out of the timing
        res = gen.generate(args.prompt, use_head=not args.no_head, tree=tree, num_drafts=args.num_drafts,
                           generator=torch.Generator().manual_seed(args.seed), lookup_tokens=args.lookup_tokens,
                           datastore_tokens=args.datastore_tokens, stream=printer, **kw)
    except (ValueError, TypeError) as e:
        g.error(str(e))
    printer.finish()
    print()
    rounds = len(res.acceptance_lengths)
    accepted = (f"mean acceptance length {res.mean_acceptance_length:.2f} over {rounds} rounds" if rounds
                else "no rounds (the prompt's forward gave the only token)")
    print(f"[domino] {len(res.token_ids)} tokens, {res.tokens_per_second:.1f} tok/s, {accepted}", file=sys.stderr)
    if args.compare:
        return _compare(gen, args, tree, kw, res.token_ids)
    return 0


def _compare(gen, args, tree, kw, streamed_ids: list[int]) -> int:
    """The target's own decoding against Domino on the same request, timed alike: both
    warmed up, ``args.repeats`` runs each, alternating, no streaming; the medians' speeds.
    The target alone runs two ways, HF ``generate`` and the engine's own loop
    (``generate_plain``: faster when sampling), and the speedup is against the faster.
    At temperature 0 every output must equal HF's (exit status 1 otherwise)."""
    import statistics

    import torch

    gen.generate_target_only("warm-up", max_new_tokens=4)
    gen.generate_plain("warm-up", max_new_tokens=4)
    spec, hf, loop = [], [], []
    for _ in range(args.repeats):
        hf.append(gen.generate_target_only(args.prompt, **kw))
        loop.append(gen.generate_plain(args.prompt, generator=torch.Generator().manual_seed(args.seed), **kw))
        spec.append(gen.generate(args.prompt, use_head=not args.no_head, tree=tree, num_drafts=args.num_drafts,
                                 generator=torch.Generator().manual_seed(args.seed), lookup_tokens=args.lookup_tokens,
                                 datastore_tokens=args.datastore_tokens, **kw))
    spec_tps = statistics.median(r.tokens_per_second for r in spec)
    hf_tps = statistics.median(r.tokens_per_second for r in hf)
    loop_tps = statistics.median(r.tokens_per_second for r in loop)
    base_tps = max(hf_tps, loop_tps)
    same = all(r.token_ids == hf[0].token_ids for r in [*spec, *hf, *loop]) and streamed_ids == hf[0].token_ids
    print(f"[domino] side by side, median of {args.repeats} alternating runs each: Domino {spec_tps:.1f} tok/s, "
          f"target alone {base_tps:.1f} tok/s (HF generate {hf_tps:.1f}, engine loop {loop_tps:.1f}); speedup "
          f"{spec_tps / base_tps:.2f}x; outputs "
          f"{'identical' if same else 'DIFFER'}" + ("" if args.temperature == 0 else " (sampling: not expected to match)"),
          file=sys.stderr)
    return 1 if args.temperature == 0 and not same else 0


class TextPrinter:
    """A ``stream`` callback that prints one sequence's text as it grows: the text of all
    tokens so far, special tokens (EOS) skipped, less what is already printed, holding back
    a trailing incomplete character (a multi-byte character split across rounds) until a
    later round completes it or :meth:`finish` prints what is left."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.ids: list[int] = []
        self.printed = 0

    def __call__(self, i: int, new_ids: list[int]) -> None:
        self.ids += new_ids
        self._print(self.tokenizer.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd"))

    def finish(self) -> None:
        """Prints the rest, an incomplete last character included (the output ended there)."""
        self._print(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _print(self, text: str) -> None:
        if len(text) > self.printed:
            print(text[self.printed:], end="", flush=True, file=self.out)
            self.printed = len(text)


def _check_request(parser, args, tree) -> None:
    """The request's arguments (``tree``: the parsed ``--tree``, None or "auto"), checked
    before any model loads (argparse's error)."""
    from domino.prompts import check_max_new_tokens
    from domino.sampling_params import SamplingParams
    from domino.tree import TreeShape

    if args.num_drafts is not None and args.tree:
        parser.error("--num-drafts is a chain's size: give it without --tree")
    try:
        check_max_new_tokens(args.max_new_tokens)
        params = SamplingParams(args.temperature, args.top_k, args.top_p)
        SamplingParams(seed=args.seed)  # its range (the CLI seeds the call's generator with it)
        if isinstance(tree, TreeShape):  # what does not depend on the drafter (its depth is checked once loaded)
            tree.check(tree.depth, [params])
        if args.num_drafts is not None and args.num_drafts < 0:
            raise ValueError(f"--num-drafts must be >= 0, got {args.num_drafts}")
        if args.repeats < 1:
            raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
        for flag, value in (("--lookup-tokens", args.lookup_tokens), ("--datastore-tokens", args.datastore_tokens)):
            if value < 0:
                raise ValueError(f"{flag} must be >= 0, got {value}")
    except (TypeError, ValueError) as e:
        parser.error(_flag_names(str(e)))


def _flag_names(message: str) -> str:
    """``message`` with the request's Python argument names written as the flags that set them."""
    for name in ("max_new_tokens", "temperature", "top_k", "top_p", "seed"):
        message = re.sub(rf"(?<![-\w]){name}\b", "--" + name.replace("_", "-"), message)
    return message


def _tree_shape(parser, text: str):
    """``TOPK,DEPTH[,NODES]`` as a :class:`domino.TreeShape` (argparse's error on bad input)."""
    from domino.tree import TreeShape

    try:
        if not text.strip():  # an empty --tree is no request for the default
            raise ValueError("give TOPK,DEPTH or TOPK,DEPTH,NODES")
        parts = [int(x) for x in text.split(",")]
        if len(parts) not in (2, 3):
            raise ValueError("give TOPK,DEPTH or TOPK,DEPTH,NODES")
        return TreeShape(*parts)
    except ValueError as e:
        parser.error(f"--tree {text}: {e}")


if __name__ == "__main__":
    sys.exit(main())
