"""Speculative sampling is distributed exactly as the target's own sampling."""

import pytest
import torch

import domino.generate
from domino import budget
from domino.budget import RoundCosts
from engine_cases import V, check
from tiny_models import tiny_generator

@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 4, 0.9)])
@pytest.mark.parametrize("use_head", [True, False])
def test_speculative_sampling_matches_target(temperature, top_k, top_p, use_head):
    gen = tiny_generator("qwen3", vocab=V, block_size=4, seed=3)
    gen.generate = _with_head(gen.generate, use_head)
    res = check(gen, temperature, top_k, top_p)
    # the drafter is random but V is small: some drafts must be accepted (rejection path and
    # acceptance path both exercised)
    lens = [a for seq in res.acceptance_lengths for a in seq]
    assert 1 in lens and max(lens) > 1


def _with_head(fn, use_head):
    return lambda *a, **k: fn(*a, use_head=use_head, **k)


def test_a_biased_verifier_is_caught(monkeypatch):
    """Negative control: accepting every draft (verify by 'always yes') fails the same test."""
    def accept_all(draft_tokens, draft_probs, target_probs, generator=None):
        b, k = draft_tokens.shape
        bonus = torch.multinomial(target_probs[:, -1], 1, generator=generator)
        return torch.cat([draft_tokens, bonus], 1), torch.full((b,), k, dtype=torch.int64)

    monkeypatch.setattr(domino.generate.domino_ops, "verify_sampling", accept_all)
    gen = tiny_generator("qwen3", vocab=V, block_size=4, seed=3)
    with pytest.raises(AssertionError, match="chi-square|zero probability"):
        check(gen, 1.0, 0, 1.0)


def test_a_wrong_token_after_a_fully_accepted_chain_is_caught(monkeypatch):
    """Negative control of the tokens after the first round: the target's token after a
    fully accepted chain drawn from the target's distribution at the round's first position
    instead of after the last draft. With 3 drafts that token is the 5th (the prefill gives
    the 1st), so a check of the first 3 tokens passes it."""
    verify = domino.generate.domino_ops.verify_sampling

    def wrong_bonus_row(draft_tokens, draft_probs, target_probs, generator=None):
        out, accepted = verify(draft_tokens, draft_probs, target_probs, generator=generator)
        k = draft_tokens.shape[1]
        full = accepted == k
        if k and bool(full.any()):
            out = out.clone()
            out[full, k] = torch.multinomial(target_probs[full, 0], 1, generator=generator)[:, 0]
        return out, accepted

    monkeypatch.setattr(domino.generate.domino_ops, "verify_sampling", wrong_bonus_row)
    gen = tiny_generator("qwen3", vocab=V, block_size=4, seed=3)
    with pytest.raises(AssertionError, match="tokens 4-5: (chi-square|drew tokens of zero probability)"):
        check(gen, 1.0, 0, 1.0)


def test_a_drafter_without_a_pure_draft_prefix_samples_as_the_target():
    """pure_draft_prefix_len = 0: every draft from the head, none from the base logits alone
    (sampled drafting used to ask for the confidence of an empty prefix and fail)."""
    gen = tiny_generator("qwen3", vocab=V, block_size=4, seed=3, pure_draft_prefix_len=0)
    check(gen, 0.9, 0, 1.0)


def test_adaptive_budget_sampling_matches_target(monkeypatch):
    """The default budget (drafts planned from costs, a verify length from the drafter's
    confidence by a stopping rule) keeps the output distributed as the target's. The costs
    are pinned so that rounds do draft (measured ones may make plain steps the best choice
    for a random drafter); that a stopping rule cannot tilt the verified drafts is
    tests/test_budget.py::test_verify_length_is_a_stopping_rule."""
    gen = tiny_generator("qwen3", vocab=V, block_size=4, seed=3)
    gen._costs[4000] = RoundCosts((0.0, 10.0, 10.5, 11.0, 11.5), (0.0, 0.5, 0.5, 0.5))
    chosen = []
    real = budget.best_verify_length
    monkeypatch.setattr(domino.generate.budget, "best_verify_length",
                        lambda a, c, n: chosen.append(real(a, c, n)) or chosen[-1])
    res = check(gen, 0.8, 0, 1.0, num_drafts=None)
    lens = [a for seq in res.acceptance_lengths for a in seq]
    assert max(lens) > 1 and max(chosen) > 0  # drafts were verified and accepted
