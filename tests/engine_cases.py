"""Shared cases of the engine tests (chains and trees): random prompts for the tiny
models, and the statistical check that speculative sampling is the target's sampling."""

import itertools

import numpy as np
import torch

from oracles import filtered_probs
from stats import assert_matches_distribution


def prompts(n, seed=0, vocab=64):
    """n random prompts of 3..11 token ids in [2, vocab)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def cheap_verification(gen, batch_size: int) -> None:
    """Rigs ``gen``'s round costs for ``batch_size`` (no measuring): verifying more tokens
    and drafting cost almost nothing, so the adaptive budget drafts and verifies several
    tokens every round even with a tiny random drafter, whose measured costs would make
    most rounds plain one-token steps (and a test of multi-token verification vacuous)."""
    from domino.budget import RoundCosts

    gen._costs[batch_size] = RoundCosts(tuple([0.0] + [10.0 + 0.05 * t for t in range(1, 33)]),
                                        tuple([0.0] + [0.05 * n for n in range(1, 16)]))


def assert_mostly_multi_token(res, at_least: float = 0.8) -> None:
    """Most rounds of ``res`` (a GenerationResult, one sequence or a batch) verified more
    than one token: the speculative path, not plain decoding, made the output."""
    rows = res.verified_lengths
    rows = rows if rows and isinstance(rows[0], list) else [rows]
    lengths = [v for row in rows for v in row]
    assert lengths and sum(v > 1 for v in lengths) >= at_least * len(lengths), lengths


V = 8
PROMPT = [3, 5, 2, 6]


@torch.no_grad()
def exact_next(gen, prefixes, temperature, top_k, top_p):
    """The target's filtered next-token distribution after each prefix (full forward)."""
    ids = torch.tensor([PROMPT + list(p) for p in prefixes])
    logits = gen.target(ids).logits[:, -1].double().numpy()
    return np.stack([filtered_probs(row, temperature, top_k, top_p) for row in logits])


def check(gen, temperature, top_k, top_p, N=4000, num_drafts=3):
    res = gen.generate([PROMPT] * N, max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p,
                       generator=torch.Generator().manual_seed(0), num_drafts=num_drafts)
    toks = np.array(res.token_ids)
    assert toks.shape == (N, 3)
    assert_distributed_as_target(gen, toks, temperature, top_k, top_p)
    return res


def assert_distributed_as_target(gen, toks, temperature, top_k, top_p, label=""):
    """The first three tokens after PROMPT, ``toks`` [N, 3], follow the target's filtered
    distribution: token 1, the joint of tokens 1-2, and token 3's marginal."""
    p1 = exact_next(gen, [()], temperature, top_k, top_p)[0]
    assert_matches_distribution(toks[:, 0], p1, what=f"{label}token 1")
    pairs = list(itertools.product(range(V), repeat=1))
    p2 = exact_next(gen, pairs, temperature, top_k, top_p)  # [V, V]
    joint12 = p1[:, None] * p2
    assert_matches_distribution(toks[:, 0] * V + toks[:, 1], joint12.ravel(), what=f"{label}tokens 1-2")
    triples = list(itertools.product(range(V), repeat=2))
    p3 = exact_next(gen, triples, temperature, top_k, top_p).reshape(V, V, V)
    marginal3 = (joint12[:, :, None] * p3).sum(axis=(0, 1))
    assert_matches_distribution(toks[:, 2], marginal3, what=f"{label}token 3")


def count_grafts(monkeypatch) -> list[int]:
    """Wraps ``domino.generate.graft_chains`` for the test: the returned list gets the
    number of nodes each call grafted onto the round's tree (prompt lookup, datastore)."""
    import domino.generate

    grafted = []
    real = domino.generate.graft_chains

    def counting(candidates, links, chains, max_depth):
        out = real(candidates, links, chains, max_depth)
        grafted.append(out[0].shape[1] - candidates.shape[1])
        return out

    monkeypatch.setattr(domino.generate, "graft_chains", counting)
    return grafted
