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


def flat_costs(verify_one: float, verify_more: float, draft: float):
    """Rigged round costs: a forward over one token, over 2..32 tokens, drafting 1..15."""
    from domino.budget import RoundCosts

    return RoundCosts((0.0, verify_one) + (verify_more,) * 31, (0.0,) + (draft,) * 15)


def rig_round_costs(gen, batch_size: int, costs) -> None:
    """Rigs ``gen``'s round costs (no measuring) for a call of ``batch_size`` requests: the
    call's own batch size and every smaller one its rounds are planned with once requests
    have finished (``domino.budget.cost_batch_sizes``) get ``costs``."""
    from domino.budget import cost_batch_sizes

    for size in cost_batch_sizes(batch_size):
        gen._costs[size] = costs


def cheap_verification(gen, batch_size: int) -> None:
    """Rigs ``gen``'s round costs for ``batch_size`` (:func:`rig_round_costs`): verifying
    more tokens and drafting cost almost nothing, and a plain step (one token verified)
    twice a verification of more, so the adaptive budget drafts and verifies several tokens
    every round even with a tiny random drafter, whose measured costs and low acceptance
    would make most rounds plain one-token steps (and a test of multi-token verification
    vacuous): a drafting round is expected to beat a plain step by far more than the plan's
    margin (``domino.budget.DRAFT_MARGIN``) whatever the acceptance."""
    from domino.budget import RoundCosts

    rig_round_costs(gen, batch_size, RoundCosts(tuple([0.0, 20.0] + [10.0 + 0.05 * t for t in range(2, 33)]),
                                                tuple([0.0] + [0.05 * n for n in range(1, 16)])))


def assert_mostly_multi_token(res, at_least: float = 0.8) -> None:
    """Most rounds of ``res`` (a GenerationResult, one sequence or a batch) verified more
    than one token: the speculative path, not plain decoding, made the output."""
    rows = res.verified_lengths
    rows = rows if rows and isinstance(rows[0], list) else [rows]
    lengths = [v for row in rows for v in row]
    assert lengths and sum(v > 1 for v in lengths) >= at_least * len(lengths), lengths


V = 8
PROMPT = [3, 5, 2, 6]


def assert_stops_like_the_target(gen, decode) -> None:
    """``decode(prompt, **kwargs)`` (``gen``'s generate or generate_plain, greedy) streams
    the target's own greedy tokens and ends where the target does: at an EOS id (the 10th
    plain token made one), and at the token that completes a stop string on the decoded
    text, which the text leaves out."""
    p = prompts(1, seed=2)[0]
    plain = gen.generate_target_only(p, max_new_tokens=30).token_ids
    streamed = []
    res = decode(p, max_new_tokens=30, stream=lambda i, ids: streamed.extend(ids))
    assert streamed == res.token_ids == plain
    gen.eos_ids = [plain[9]]
    assert decode(p, max_new_tokens=30).token_ids == plain[: plain.index(plain[9]) + 1]
    gen.eos_ids = []
    stop = " ".join(str(t) for t in plain[4:6])
    first = next(k for k in range(1, 31) if stop in " ".join(str(t) for t in plain[:k]))
    res = decode(p, max_new_tokens=30, stop=[stop])
    assert res.token_ids == plain[:first] and stop not in res.text


@torch.no_grad()
def exact_next(gen, prefixes, temperature, top_k, top_p):
    """The target's filtered next-token distribution after each prefix (full forward)."""
    ids = torch.tensor([PROMPT + list(p) for p in prefixes])
    logits = gen.target(ids).logits[:, -1].double().numpy()
    return np.stack([filtered_probs(row, temperature, top_k, top_p) for row in logits])


def check(gen, temperature, top_k, top_p, N=4000, num_drafts=3):
    """N sequences of 5 tokens after PROMPT follow the target's filtered distribution
    (:func:`assert_distributed_as_target`). The first token is the prefill's, so with 3
    tokens a second round would run only after a first round that accepted nothing: tokens
    4 and 5 are those of rounds after accepted drafts, and of the target's own token after
    a fully accepted chain or tree path."""
    res = gen.generate([PROMPT] * N, max_new_tokens=5, temperature=temperature, top_k=top_k, top_p=top_p,
                       generator=torch.Generator().manual_seed(0), num_drafts=num_drafts)
    toks = np.array(res.token_ids)
    assert toks.shape == (N, 5)
    assert_distributed_as_target(gen, toks, temperature, top_k, top_p)
    return res


def assert_distributed_as_target(gen, toks, temperature, top_k, top_p, label=""):
    """The first tokens after PROMPT, ``toks`` [N, 3 or 5], follow the target's filtered
    distribution: token 1, the joint of tokens 1-2, token 3's marginal and, given 5 tokens,
    token 4's marginal and the joint of tokens 4-5."""
    p1 = exact_next(gen, [()], temperature, top_k, top_p)[0]
    assert_matches_distribution(toks[:, 0], p1, what=f"{label}token 1")
    joint = p1  # the joint distribution of the tokens so far, [V] * t
    for t in range(1, toks.shape[1]):
        prefixes = list(itertools.product(range(V), repeat=t))
        following = exact_next(gen, prefixes, temperature, top_k, top_p).reshape((V,) * (t + 1))
        joint = joint[..., None] * following
        if t == 1:
            assert_matches_distribution(toks[:, 0] * V + toks[:, 1], joint.ravel(), what=f"{label}tokens 1-2")
        elif t == 2:
            assert_matches_distribution(toks[:, 2], joint.sum(axis=(0, 1)), what=f"{label}token 3")
        elif t == 3:
            assert_matches_distribution(toks[:, 3], joint.sum(axis=(0, 1, 2)), what=f"{label}token 4")
        elif t == 4:
            assert_matches_distribution(toks[:, 3] * V + toks[:, 4], joint.sum(axis=(0, 1, 2)).ravel(),
                                        what=f"{label}tokens 4-5")


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
