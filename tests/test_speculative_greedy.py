"""Greedy speculative generation is the target's own greedy decoding, token for token."""

import pytest
import torch

from engine_cases import assert_mostly_multi_token, assert_stops_like_the_target, cheap_verification, prompts
from tiny_models import RiggedDrafts, RowsOfTheRound, tiny_generator


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("use_head", [True, False])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("budget", ["adaptive", "whole block"])
def test_random_drafter_matches_target_greedy(kind, use_head, batch, budget):
    """The adaptive budget's costs are rigged so that it drafts and verifies several tokens
    every round (with measured costs it may plan plain one-token steps throughout for a
    random drafter, and the test would compare plain decoding with itself)."""
    gen = tiny_generator(kind)
    ps = prompts(batch, seed=batch)
    num_drafts = None if budget == "adaptive" else gen.drafter.config.num_drafts
    if budget == "adaptive":
        cheap_verification(gen, batch)
    spec = gen.generate(ps, max_new_tokens=40, use_head=use_head, num_drafts=num_drafts)
    plain = gen.generate_target_only(ps, max_new_tokens=40)
    assert spec.token_ids == plain.token_ids
    assert all(len(t) == 40 for t in spec.token_ids)
    assert all(1 <= a <= gen.drafter.config.num_drafts + 1 for seq in spec.acceptance_lengths for a in seq)
    assert_mostly_multi_token(spec)


@pytest.mark.parametrize("batch", [1, 3])
def test_rigged_drafter_full_acceptance(batch):
    gen = tiny_generator("qwen3")
    ps = prompts(batch, seed=7)
    plain = gen.generate_target_only(ps, max_new_tokens=50)
    rig = RiggedDrafts(gen, [p + t for p, t in zip(ps, plain.token_ids)])
    spec = gen.generate(ps, max_new_tokens=50, num_drafts=gen.drafter.config.num_drafts)
    rig.restore()
    assert spec.token_ids == plain.token_ids
    full = gen.drafter.config.num_drafts + 1
    for seq in spec.acceptance_lengths:
        assert seq[:-1] == [full] * (len(seq) - 1)  # every round but the truncated last is full


def test_alternating_full_and_zero_acceptance_keeps_caches_consistent():
    """Long generation whose rounds alternate between accepting everything and nothing:
    the target and draft caches are rolled back every other round."""
    gen = tiny_generator("llama")
    ps = prompts(2, seed=11)
    plain = gen.generate_target_only(ps, max_new_tokens=200)
    rig = RiggedDrafts(gen, [p + t for p, t in zip(ps, plain.token_ids)], alternate=True)
    spec = gen.generate(ps, max_new_tokens=200, num_drafts=gen.drafter.config.num_drafts)
    rig.restore()
    assert spec.token_ids == plain.token_ids
    full = gen.drafter.config.num_drafts + 1
    assert set(spec.acceptance_lengths[0][:-1]) == {1, full}


def test_batch_sequences_advance_independently():
    """One rigged (always right) sequence next to one wrong one in the same batch."""
    gen = tiny_generator("qwen3")
    ps = prompts(2, seed=5)
    plain = gen.generate_target_only(ps, max_new_tokens=30)
    full = [p + t for p, t in zip(ps, plain.token_ids)]
    full[1] = [(t + 1) % 64 for t in full[1]]  # sequence 1's drafts are always wrong
    rig = RiggedDrafts(gen, full)
    spec = gen.generate(ps, max_new_tokens=30, num_drafts=gen.drafter.config.num_drafts)
    rig.restore()
    assert spec.token_ids == plain.token_ids
    assert max(spec.acceptance_lengths[0]) == gen.drafter.config.num_drafts + 1
    assert set(spec.acceptance_lengths[1]) == {1}


def test_shift_label_drafter_and_no_pure_prefix():
    for kw in (dict(shift_label=True), dict(pure_draft_prefix_len=0), dict(projector_type=None)):
        gen = tiny_generator("qwen3", **kw)
        ps = prompts(2, seed=3)
        spec = gen.generate(ps, max_new_tokens=20, num_drafts=gen.drafter.config.num_drafts)
        assert spec.token_ids == gen.generate_target_only(ps, max_new_tokens=20).token_ids


def test_stop_conditions_and_streaming():
    gen = tiny_generator("qwen3")
    assert_stops_like_the_target(gen, gen.generate)


def test_a_round_past_the_limit_eos_or_stop_string_is_cut_where_one_token_steps_stop():
    """A round can accept tokens past max_new_tokens, an EOS or the token that completes a
    stop string: the result (and the stream) ends exactly where decoding one token at a
    time would have stopped, whatever else the round accepted."""
    gen = tiny_generator("qwen3")
    p = prompts(1, seed=5)[0]  # its greedy tokens open distinct, as the cuts below need
    plain = gen.generate_target_only(p, max_new_tokens=40).token_ids
    n = gen.drafter.config.num_drafts

    def spec(first_round=n + 1, **kw):
        streamed = []
        rig = RiggedDrafts(gen, [p + plain])  # every draft right: whole-block rounds
        try:
            res = gen.generate(p, num_drafts=n, tree=None, stream=lambda i, ids: streamed.extend(ids), **kw)
        finally:
            rig.restore()
        assert streamed == res.token_ids
        assert res.acceptance_lengths[0] == first_round  # the first round ran past the cut
        return res

    # the limit falls inside the first round, with an EOS just after it: the round drafts
    # only what the limit can take (test_a_greedy_chain_round_verifies_no_more_than_...)
    limit = next(k for k in range(2, n - 1) if plain[k + 1] not in plain[: k + 1])
    gen.eos_ids = [plain[limit + 1]]
    assert spec(max_new_tokens=limit, first_round=limit - 1).token_ids == plain[:limit]
    # an EOS inside the first round, then tokens past it
    j = next(j for j in range(2, n) if plain[j] not in plain[:j])
    gen.eos_ids = [plain[j]]
    assert spec(max_new_tokens=40).token_ids == plain[: j + 1]
    gen.eos_ids = []
    # a stop string completed by a token inside the first round
    stop = " ".join(str(t) for t in plain[3:5])
    first = next(k for k in range(1, 41) if stop in " ".join(str(t) for t in plain[:k]))
    res = spec(max_new_tokens=40, stop=[stop])
    assert res.token_ids == plain[:first] and stop not in res.text


class CleanUpTokenizer:
    """Ids as pieces of text, joined and then with the spaces before punctuation removed,
    as HF's ``clean_up_tokenization`` does (``clean_up_tokenization_spaces=True``: WordPiece
    and Unigram tokenizers): a later token can take text away from an earlier prefix's
    ("a " then "a.")."""

    chat_template = None
    eos_token_id = None
    pad_token_id = 0
    PIECES = ["a", " ", ".", ",", "b", "!", " ", "?"]

    def decode(self, ids, skip_special_tokens=True):
        text = "".join(self.PIECES[i % len(self.PIECES)] for i in ids)
        for before, after in ((" .", "."), (" ,", ","), (" !", "!"), (" ?", "?")):
            text = text.replace(before, after)
        return text


def test_a_stop_string_that_a_later_token_of_the_round_cleans_away_stops_where_one_token_steps_stop():
    """With a decoder whose longer prefixes need not extend shorter ones' text, a stop
    string held only by a prefix inside a round (" " before a "." that removes it) stops
    the generation at that prefix, as one token at a time does; the round checked only its
    whole new text and went on."""
    gen = tiny_generator("qwen3")
    gen.tokenizer = tok = CleanUpTokenizer()
    n = gen.drafter.config.num_drafts
    checked = 0
    for seed in range(60):
        p = prompts(1, seed=seed)[0]
        plain = gen.generate_target_only(p, max_new_tokens=40).token_ids
        texts = [tok.decode(plain[:k]) for k in range(1, 41)]
        # the first prefix holding a space, which the next token's text cleans away
        first = next((k for k, t in enumerate(texts, start=1) if " " in t), None)
        if first is None or first < 2 or first >= 40 or " " in texts[first]:
            continue
        rig = RiggedDrafts(gen, [p + plain])  # every draft right: rounds of the whole block
        try:
            res = gen.generate(p, max_new_tokens=40, num_drafts=n, tree=None, stop=[" "])
        finally:
            rig.restore()
        assert res.token_ids == plain[:first] == gen.generate_plain(p, max_new_tokens=40, stop=[" "]).token_ids
        assert max(res.acceptance_lengths) > 1
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_the_baseline_ignores_the_checkpoints_generation_defaults():
    """A target whose generation_config carries a repetition penalty (Qwen2.5-Instruct
    does): the plain baseline decodes the model's own greedy tokens, as speculation does."""
    gen = tiny_generator("llama")
    ps = prompts(2, seed=9)
    before = gen.generate_target_only(ps, max_new_tokens=30).token_ids
    gen.target.generation_config.repetition_penalty = 1.5
    plain = gen.generate_target_only(ps, max_new_tokens=30).token_ids
    assert plain == before == gen.generate(ps, max_new_tokens=30).token_ids
    assert gen.target.generation_config.repetition_penalty == 1.5  # restored


def test_overlapping_bare_config_blocks_put_the_models_own_back():
    """Two blocks open at once on one model (two threads' generate_target_only calls),
    closed in the order they opened: inside both the config is bare, after both the
    model's own is back (each block had restored what it found: the empty one, for good)."""
    from domino.target import bare_generation_config

    model = tiny_generator("llama").target
    own = model.generation_config
    first, second = bare_generation_config(model), bare_generation_config(model)
    first.__enter__()
    second.__enter__()
    assert model.generation_config is not own and model.generation_config.eos_token_id is None
    first.__exit__(None, None, None)
    assert model.generation_config is not own  # the second block still runs bare
    second.__exit__(None, None, None)
    assert model.generation_config is own


def test_adaptive_budget_follows_acceptance_and_stays_exact():
    """With the default budget the drafts are chosen from the round costs: a drafter that is
    always right gets whole-block rounds, one that is always wrong gets none accepted (its
    rounds shrink to plain steps), and the output is the target's greedy decoding either way.
    The costs are rigged to a verification that grows slowly with its tokens, as on a GPU
    (measured ones follow the machine's load)."""
    gen = tiny_generator("qwen3")
    cheap_verification(gen, 1)
    ps = prompts(1, seed=7)
    plain = gen.generate_target_only(ps, max_new_tokens=120)
    rig = RiggedDrafts(gen, [p + t for p, t in zip(ps, plain.token_ids)])
    spec = gen.generate(ps, max_new_tokens=120, tree=None)  # chain rounds (the rigged drafts are a chain's)
    rig.restore()
    assert spec.token_ids == plain.token_ids
    assert max(spec.acceptance_lengths[0]) == gen.drafter.config.num_drafts + 1
    wrong = [[(t + 1) % 64 for t in p + t_] for p, t_ in zip(ps, plain.token_ids)]
    rig = RiggedDrafts(gen, wrong)
    spec = gen.generate(ps, max_new_tokens=120, tree=None)
    rig.restore()
    assert spec.token_ids == plain.token_ids
    assert set(spec.acceptance_lengths[0]) == {1}


def test_num_drafts_is_validated():
    gen = tiny_generator("qwen3")
    for bad in (-1, gen.drafter.config.num_drafts + 1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="num_drafts"):
            gen.generate([1, 2, 3], max_new_tokens=4, num_drafts=bad)
    zero = gen.generate([1, 2, 3], max_new_tokens=6, num_drafts=0)  # plain decoding through the engine
    assert zero.token_ids == gen.generate_target_only([1, 2, 3], max_new_tokens=6).token_ids
    assert set(zero.acceptance_lengths) == {1}


def test_plain_steps_queue_the_drafters_context_and_it_is_the_same_when_it_drafts():
    """Rounds that draft nothing queue their tokens for the drafter's context, which takes
    them in one call before the next draft: the same context bit for bit (keys, values,
    mask) as one call a round, so the same drafts."""
    import torch

    from domino.budget import DepthAcceptance
    from domino.sampling_params import RowSampling

    from domino.loading import use_cpu_kernels

    greedy = RowSampling(0.0, 0, 1.0, None, False)
    gen = tiny_generator("qwen3")
    # the engine's CPU configuration: the drafter's products and norms batch-invariant (on
    # PyTorch's own linears a 5-row product may round unlike five 1-row ones: the context
    # then differs in its last bits, and verification keeps the output exact regardless)
    use_cpu_kernels(gen.drafter, small_batch_linear=True, small_batch_attention=False)
    ps = prompts(3, seed=6)

    def rounds(eager: bool):
        st, _ = gen._prefill(ps, greedy)
        acceptance = DepthAcceptance(gen.drafter.config.num_drafts, 0.5)
        for n in (0, 0, 0, 2, 0, 0, 3, 0):
            gen._chain_round(st, greedy, True, None, n, acceptance)
            if eager:
                gen._drafter_context(st)
            assert eager or (len(st.pending_context) > 0)
        return st

    with torch.inference_mode():
        lazy, eager = rounds(False), rounds(True)
    assert len(lazy.pending_context) == 2 and not eager.pending_context  # the n = 3 round and the plain step after it
    with torch.inference_mode():
        ctx_lazy, ctx_eager = gen._drafter_context(lazy), gen._drafter_context(eager)
    assert torch.equal(ctx_lazy.mask, ctx_eager.mask) and ctx_lazy.mask.shape[1] > lazy.cache_mask.shape[1] - 8
    for a, b in zip(ctx_lazy.keys + ctx_lazy.values, ctx_eager.keys + ctx_eager.values):
        assert torch.equal(a, b)
    with torch.inference_mode():
        d_lazy = gen.drafter.draft(ctx_lazy, lazy.anchor, lazy.anchor_pos)
        d_eager = gen.drafter.draft(ctx_eager, eager.anchor, eager.anchor_pos)
    assert torch.equal(d_lazy.tokens, d_eager.tokens) and torch.equal(d_lazy.vocab_logits, d_eager.vocab_logits)


@pytest.mark.parametrize("dtype, logits_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
def test_verification_takes_the_targets_logits(dtype, logits_dtype):
    """A bf16 target's logits reach verification and greedy steps as they are (their argmax
    reads bf16; no float32 copy), a float16 target's as float32 (the verify and sampling ops
    take float32 or bf16): the engine's plain loop, greedy chains and trees decode the
    target's own greedy tokens, and sampling runs."""
    gen = tiny_generator("llama")
    gen.target.to(dtype)
    seen = []
    forward = gen._target_forward

    def spy(*args, **kwargs):
        logits, features = forward(*args, **kwargs)
        seen.append(logits.dtype)
        return logits, features

    gen._target_forward = spy
    p = prompts(1, seed=5)[0]
    plain = gen.generate_target_only(p, max_new_tokens=16).token_ids
    assert gen.generate_plain(p, max_new_tokens=16).token_ids == plain  # its steps' argmax reads them too
    for tree in (None, "auto"):
        assert gen.generate(p, max_new_tokens=16, tree=tree).token_ids == plain
    assert len(gen.generate(p, max_new_tokens=16, temperature=0.8).token_ids) == 16
    assert seen and set(seen) == {logits_dtype}


def test_past_the_drafter_contexts_first_capacity():
    """A generation long enough that the drafter's context stores regrow mid-call (the
    prompt plus 256 slots of headroom first, domino.draft_context) is still the target's
    greedy decoding, chains and trees, in a ragged batch; and it drafts what the same
    generation drafts with stores that never regrow (the same acceptance, round by round)."""
    from unittest import mock

    from domino import draft_context
    from domino.tree import TreeShape

    gen = tiny_generator("qwen3")
    ps = prompts(2, seed=5)
    plain = gen.generate_target_only(ps, max_new_tokens=330)
    real = draft_context.DraftContextCache._grown
    # drafting every round, and a fixed tree size (no budget: a measured cost must not change the drafts)
    for tree in (None, TreeShape(2, 3, 11)):
        def generate():
            return gen.generate(ps, max_new_tokens=330, tree=tree, num_drafts=None if tree else 4)

        grown = []

        def counting(self, store, capacity):
            grown.append(capacity)
            return real(self, store, capacity)

        with mock.patch.object(draft_context.DraftContextCache, "_grown", counting):
            spec = generate()
        assert spec.token_ids == plain.token_ids
        assert len(set(grown)) >= 2, grown  # the first stores, then at least one regrowth
        with mock.patch.object(draft_context, "grown_capacity", lambda held, need: need + 100_000):
            roomy = generate()  # one allocation, never regrown
        assert roomy.acceptance_lengths == spec.acceptance_lengths


@pytest.mark.parametrize("mode", [dict(tree=None, num_drafts=3), dict(tree=None), dict()])
@pytest.mark.parametrize("rigged", [False, True])
def test_no_round_runs_once_the_output_is_complete(mode, rigged):
    """A round runs only while the output is short of max_new_tokens: the prefill's first
    token and the rounds' tokens reach the limit, and without the last round they fall short
    of it, at every limit (one round more at the limit costs a target forward and adds
    nothing; the last round's count is what it accepted, before the cut to the limit)."""
    gen = tiny_generator("qwen3")
    ps = prompts(1, seed=3)
    full = gen.generate_target_only(ps, max_new_tokens=12).token_ids[0]
    rig = RiggedDrafts(gen, [ps[0] + full]) if rigged else None
    try:
        for limit in range(1, len(full) + 1):
            res = gen.generate(ps[0], max_new_tokens=limit, **mode)
            assert res.token_ids == full[:limit]
            acc = res.acceptance_lengths
            assert 1 + sum(acc[:-1]) < limit <= 1 + sum(acc) if acc else limit == 1, (limit, acc)
    finally:
        if rig:
            rig.restore()


@pytest.mark.parametrize("mode", [dict(tree=None, num_drafts=7), dict(tree=None)])
def test_a_greedy_chain_round_verifies_no_more_than_the_output_can_still_take(mode):
    """A round keeps at most its drafts + 1 tokens, so near the limit a greedy chain round
    verifies no more than the output can still take (the last round had verified a whole
    block, every draft past the limit a wasted row of the target's forward). Every draft
    right: the rounds would otherwise run whole blocks. A sampled round keeps its size
    (its draws follow it: a seeded request's tokens would depend on its batch)."""
    gen = tiny_generator("qwen3")
    cheap_verification(gen, 1)
    ps = prompts(1, seed=3)
    full = gen.generate_target_only(ps, max_new_tokens=16).token_ids[0]
    rig = RiggedDrafts(gen, [ps[0] + full])
    try:
        for limit in range(1, 10):
            res = gen.generate(ps[0], max_new_tokens=limit, **mode)
            assert res.token_ids == full[:limit]
            have = 1  # the prefill's token
            for verified, kept in zip(res.verified_lengths, res.acceptance_lengths):
                assert verified <= limit - have, (limit, res.verified_lengths, res.acceptance_lengths)
                have += kept
    finally:
        rig.restore()
    if "num_drafts" in mode:
        sampled = gen.generate(ps[0], max_new_tokens=3, temperature=1.0, **mode)
        assert sampled.verified_lengths[0] == 8


@pytest.mark.parametrize("mode", [dict(tree=None, num_drafts=3), dict()])
def test_the_drafters_context_holds_each_position_once_in_order(mode):
    """The positions the drafter's context receives for a sequence's real tokens run
    0, 1, 2, ... with no gap or repeat, prompt and every committed round alike (a position
    off by one leaves the output exact, verification sees to that, but the drafter then
    reads its context at the wrong rotary positions)."""
    gen = tiny_generator("qwen3")
    ps = [[3, 4, 5, 6, 7], [8, 9]]
    gen.generate(ps, max_new_tokens=2, **mode)  # the budget's cost measurement (its own contexts) out of the way
    seen = [[], []]
    extend = gen.drafter.extend_context
    rows = RowsOfTheRound(gen)  # a finished sequence leaves the batch

    def spy(cache, features, positions, valid):
        for i, s in enumerate(rows.sequences(range(len(ps)), positions.shape[0])):
            seen[s] += positions[i][valid[i]].tolist()
        return extend(cache, features, positions, valid)

    gen.drafter.extend_context = spy
    try:
        res = gen.generate(ps, max_new_tokens=10, **mode)
    finally:
        del gen.drafter.extend_context
        rows.restore()
    for s in range(len(ps)):
        assert seen[s] == list(range(len(seen[s])))
        assert len(ps[s]) <= len(seen[s]) <= len(ps[s]) + len(res.token_ids[s])
