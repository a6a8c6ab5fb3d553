"""Speculative sampling is distributed exactly as the target's own sampling."""

import pytest
import torch

import domino.generate
import domino_ops
from domino import budget
from domino.budget import RoundCosts
from engine_cases import V, check, rig_round_costs
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
    """Negative control of the tokens after the first round: the token after a fully
    accepted chain drawn from the drafter's distribution at the last draft instead of the
    target's after it (q for p). With 3 drafts that token is the 5th (the prefill gives
    the 1st), so a check of the first 3 tokens passes it. (The control before drew it
    from the target's distribution at the round's first position, which this check caught
    with the drafter that read target layer 1 four times; since the tiny drafter reads four
    distinct layers it passes 4,000 draws with every one of 22 drafter seeds tried, and
    fails 8,000 with one of four: on this 8-token target the two distributions differ too
    little for the check's power.)"""
    verify = domino.generate.domino_ops.verify_sampling

    def wrong_bonus_row(draft_tokens, draft_probs, target_probs, generator=None):
        out, accepted = verify(draft_tokens, draft_probs, target_probs, generator=generator)
        k = draft_tokens.shape[1]
        full = accepted == k
        if k and bool(full.any()):
            out = out.clone()
            out[full, k] = torch.multinomial(draft_probs[full, k - 1].float(), 1, generator=generator)[:, 0]
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
    rig_round_costs(gen, 4000, RoundCosts((0.0, 10.0, 10.5, 11.0, 11.5), (0.0, 0.5, 0.5, 0.5)))
    chosen = []
    real = budget.best_verify_length
    monkeypatch.setattr(domino.generate.budget, "best_verify_length",
                        lambda a, c, n: chosen.append(real(a, c, n)) or chosen[-1])
    res = check(gen, 0.8, 0, 1.0, num_drafts=None)
    lens = [a for seq in res.acceptance_lengths for a in seq]
    assert max(lens) > 1 and max(chosen) > 0  # drafts were verified and accepted


def test_the_draft_distribution_is_the_head_corrected_one_the_tokens_came_from():
    """At T > 0 the drafter's q (Draft.vocab_logits / vocab_probs) at the head's positions is
    the rollout's corrected distribution, the one its tokens were drawn from, not the
    backbone's base logits: the reference rollout with the same inputs and generator writes
    the same logits and draws the same tokens. (A q from the base logits keeps the chi-square
    tests green on a tiny drafter, whose correction is small, but is not lossless.)"""
    from domino.sampling_params import RowSampling

    gen = tiny_generator("qwen3")
    d = gen.drafter
    g = torch.Generator().manual_seed(5)
    b, n = 2, d.config.num_drafts
    h = torch.randn(b, n, d.config.hidden_size, generator=g)
    with torch.no_grad():
        base = d.base_logits(h).float()
        anchor = torch.tensor([3, 7])
        P = d.config.pure_draft_prefix_len
        draft = d.choose_tokens(h, base.clone(), anchor,
                                sampling=RowSampling(0.9, 0, 1.0, torch.Generator().manual_seed(11), True))
        # the same draws by hand: the prefix from the base logits, then the reference rollout
        g2 = torch.Generator().manual_seed(11)
        prefix = domino_ops.sample(base[:, :P].reshape(-1, base.shape[-1]), temperature=0.9, generator=g2).view(b, P)
        E, w_ih, w_hh, w1h, w1s, w2 = d.head_weights()
        state = d.gru_state(torch.cat([anchor[:, None], prefix], dim=1))
        hproj = torch.nn.functional.linear(h[:, P:].to(w1h.dtype), w1h).float()
        rest = base[:, P:].contiguous()
        tokens, _, _ = domino_ops.domino_head_rollout(rest, hproj, state, E, w_ih, w_hh, w1s, w2, temperature=0.9,
                                                      generator=g2, write_logits=True, backend="reference")
    assert torch.equal(draft.tokens, torch.cat([prefix, tokens], dim=1))
    assert (rest - base[:, P:]).abs().max() > 1e-3  # the head moved the logits: the check below has teeth
    torch.testing.assert_close(draft.vocab_logits[:, P:], rest, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(draft.vocab_probs, domino_ops.filtered_probs(draft.vocab_logits, 0.9))
