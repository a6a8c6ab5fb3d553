"""How much prompt lookup (and the datastore of the target's outputs) could add to the
drafter's tree rounds: a replay.

Generates each prompt with the default tree alone (``lookup_tokens=0``,
``datastore_tokens=0``), then
replays its rounds: at each round's start, the chain ``domino.lookup.NgramIndex`` would
propose (from the prompt and the output so far) is compared with the tokens the round
went on to produce. Prints the tree's tokens per round and the better of tree and lookup
per round, the most a graft of that chain could give at those round boundaries (an upper
bound: it ignores that a longer round moves the next round's start). The engine's real
speed with the graft is ``bench_e2e.py``'s "+ lookup" row. With the shipped datastore
(``--datastore-tokens``, default 6) it also replays the chain ``domino.datastore`` would
retrieve at each round's start, alone and beside the lookup chain.

    python benchmarks/lookup_replay.py [--num-prompts 8] [--max-new-tokens 128] [--lookup-tokens 10]
        [--ngram-sizes 3,2 12,8,6,5,4,3,2]   # several index settings replayed on the same rounds
"""

from __future__ import annotations

import argparse

import torch

from bench_e2e import load
from domino import lookup
from domino.loading import DEFAULT_DRAFTER_DIR
from domino.datastore import DEFAULT_DATASTORE_TOKENS
from domino.lookup import DEFAULT_LOOKUP_TOKENS, NgramIndex
from eval_acceptance import chat_prompts, humaneval_prompts


def tree_rounds(gen, prompts, max_new_tokens: int) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, output ids, tokens per round) of each prompt generated with the default
    tree alone (no lookup, no datastore)."""
    runs = []
    for p in prompts:
        res = gen.generate(p, max_new_tokens=max_new_tokens, lookup_tokens=0, datastore_tokens=0)
        runs.append((gen.encode(p), res.token_ids, res.acceptance_lengths))
    return runs


def matched(chain: list[int], out: list[int], pos: int) -> int:
    """How many leading tokens of ``chain`` the output holds from ``pos`` on."""
    m = 0
    while m < len(chain) and pos + m < len(out) and chain[m] == out[pos + m]:
        m += 1
    return m


def replay(runs, lookup_tokens: int, ngram_sizes: tuple[int, ...]) -> tuple[float, float, float, int]:
    """(tree tokens per round, best-of tokens per round, share of rounds lookup wins, rounds)
    with the index matching suffixes of ``ngram_sizes``."""
    tree = best = wins = rounds = 0
    for prompt, out, accepts in runs:
        index = NgramIndex(prompt + out[:1], ngram_sizes)
        pos = 1  # the first token comes from the prefill
        for a in accepts:
            m = matched(index.propose(lookup_tokens), out, pos)
            tree, best, wins, rounds = tree + a, best + max(a, m + 1), wins + (m + 1 > a), rounds + 1
            index.extend(out[pos:pos + a])
            pos += a
    return tree / rounds, best / rounds, wins / rounds, rounds


def replay_datastore(runs, store, lookup_tokens: int, datastore_tokens: int) -> tuple[float, float]:
    """(better of the tree and the datastore chain, better of the tree, the lookup chain and
    the datastore chain) in tokens per round, at the same round boundaries."""
    with_store = with_all = rounds = 0
    for prompt, out, accepts in runs:
        index = NgramIndex(prompt + out[:1])
        pos = 1
        for a in accepts:
            d = matched(store.propose(index.tokens, datastore_tokens), out, pos)
            m = matched(index.propose(lookup_tokens), out, pos)
            with_store, with_all, rounds = with_store + max(a, d + 1), with_all + max(a, d + 1, m + 1), rounds + 1
            index.extend(out[pos:pos + a])
            pos += a
    return with_store / rounds, with_all / rounds


def parse_sizes(text: str) -> tuple[int, ...]:
    """"12,8,3" -> (12, 8, 3): n-gram lengths, longest first, each >= 1."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"n-gram sizes must look like 4,3,2, got {text!r}") from None
    if not sizes or min(sizes) < 1 or list(sizes) != sorted(set(sizes), reverse=True):
        raise argparse.ArgumentTypeError(f"n-gram sizes must be distinct, >= 1, longest first, got {text!r}")
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--lookup-tokens", type=int, default=DEFAULT_LOOKUP_TOKENS)
    ap.add_argument("--datastore-tokens", type=int, default=DEFAULT_DATASTORE_TOKENS,
                    help="also replay the chain retrieved from the shipped datastore (domino.datastore; 0: not)")
    ap.add_argument("--ngram-sizes", type=parse_sizes, nargs="+", default=[lookup.NGRAM_SIZES],
                    help="suffix lengths the index tries, e.g. 3,2 12,8,6,5,4,3,2 (each replayed on the same "
                         "rounds; default: domino.lookup.NGRAM_SIZES)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    gen = load("bf16-sb", DEFAULT_DRAFTER_DIR)
    for name, prompts in (("HumanEval", humaneval_prompts(args.num_prompts, 0)),
                          ("held-out chat", chat_prompts(args.num_prompts))):
        runs = tree_rounds(gen, prompts, args.max_new_tokens)
        for sizes in args.ngram_sizes:
            tree, best, wins, rounds = replay(runs, args.lookup_tokens, sizes)
            print(f"{name}: {rounds} rounds; tree alone {tree:.3f} tokens a round, better of tree and lookup "
                  f"({args.lookup_tokens} tokens, n-grams {','.join(map(str, sizes))}) {best:.3f}; "
                  f"lookup longer in {wins:.0%} of rounds")
        if gen.datastore is not None and args.datastore_tokens:
            store, all3 = replay_datastore(runs, gen.datastore, args.lookup_tokens, args.datastore_tokens)
            print(f"{name}: better of tree and the datastore chain ({args.datastore_tokens} tokens) {store:.3f}; "
                  f"better of tree, lookup and datastore {all3:.3f}")


if __name__ == "__main__":
    main()
