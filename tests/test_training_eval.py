"""The trainer's acceptance metric steps through responses as generation does, and the
distillation data and losses line up with the target."""

import pytest
import torch

from domino.target import target_features
from tiny_models import tiny_generator, tiny_target
from training.data import Conversation, load_shards, make_batch
from training.evaluate import generation_acceptance, stepped_rounds
from training.generate_data import features_from_ids, regenerate, shard_path, target_as_deployed, write_shard
from training.losses import per_token_loss


@pytest.mark.parametrize("use_head", [True, False])
def test_stepped_rounds_draft_what_the_generator_drafts(use_head):
    gen = tiny_generator("llama", block_size=8)
    drafted = []
    draft = gen.drafter.draft

    def spy(*args, **kw):
        d = draft(*args, **kw)
        drafted.append(d.tokens[0].tolist())
        return d

    gen.drafter.draft = spy
    prompt = [5, 9, 3, 17, 22, 41]
    res = gen.generate(prompt, max_new_tokens=40, use_head=use_head, num_drafts=gen.drafter.config.num_drafts)
    tokens = torch.tensor(prompt + res.token_ids)
    with torch.no_grad():  # the cached-feature conversation the trainer would hold
        hs = gen.target(tokens[None, :-1], output_hidden_states=True).hidden_states
    conv = Conversation(tokens, len(prompt), target_features(hs, gen.drafter.config.target_layer_ids)[0])
    rounds = list(stepped_rounds(gen.drafter, [conv], use_head=use_head, max_new_tokens=40))
    # same anchors visited, same tokens drafted (a last round with room for no draft is a
    # plain step: the generator calls no drafter there)
    assert [r.drafts for r in rounds if r.drafts] == drafted
    assert all(r.drafts for r in rounds[:-1])
    assert [r.advanced for r in rounds][:-1] == res.acceptance_lengths[:-1]
    assert sum(r.advanced for r in rounds) == len(res.token_ids) - 1  # every token after the prefill's
    tau = generation_acceptance(gen.drafter, [conv], use_head=use_head, max_new_tokens=40)
    assert tau == pytest.approx((len(res.token_ids) - 1) / len(rounds))


def test_pooled_over_rounds_not_conversations():
    """A long response counts as many rounds as it takes: rigged drafters that accept
    everything on one conversation and nothing on another average by rounds."""
    gen = tiny_generator("llama", block_size=4)
    convs = []
    for prompt, n in (([3, 4, 5], 30), ([6, 7], 6)):
        res = gen.generate(prompt, max_new_tokens=n)
        tokens = torch.tensor(prompt + res.token_ids)
        with torch.no_grad():
            hs = gen.target(tokens[None, :-1], output_hidden_states=True).hidden_states
        convs.append(Conversation(tokens, len(prompt), target_features(hs, gen.drafter.config.target_layer_ids)[0]))
    rounds = list(stepped_rounds(gen.drafter, convs, use_head=True))
    tau = generation_acceptance(gen.drafter, convs, use_head=True)
    total = sum(len(c.tokens) - c.prompt_len - 1 for c in convs)
    assert tau == pytest.approx(total / len(rounds))


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    target = tiny_target("llama", vocab=64)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 64, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(5)]
    data = regenerate(target, prompts, [0, 2, 3], eos={1}, pad=0, max_new_tokens=20, top_k=8)
    out = tmp_path_factory.mktemp("shard")
    write_shard(shard_path(out, 0), data)
    return target, data, out


def test_top_logprobs_are_the_targets_distribution(shard):
    target, data, _ = shard
    assert data.top_ids.shape == data.top_logprobs.shape == (data.response_offsets[-1], 8)
    for i, rec in enumerate(data.records):
        lo, hi = data.response_offsets[i], data.response_offsets[i + 1]
        assert hi - lo == len(rec["response_ids"])
        assert data.top_ids[lo:hi, 0].tolist() == rec["response_ids"]  # greedy = top-1
        tokens = torch.tensor(rec["prompt_ids"] + rec["response_ids"])
        with torch.no_grad():
            logits = target(tokens[None, :-1]).logits[0, len(rec["prompt_ids"]) - 1:]
        ref = torch.log_softmax(logits.float(), -1).topk(8, -1)
        assert torch.equal(data.top_ids[lo:hi].long(), ref.indices)
        torch.testing.assert_close(data.top_logprobs[lo:hi].float(), ref.values, atol=2e-2, rtol=2e-3)


def test_features_recomputed_from_token_ids_match_generation(shard):
    """A committed token shard gets its tensors back from teacher-forced forwards, in one
    batch or several."""
    target, data, _ = shard
    assert len(data.records) > 2
    for batch_size in (2, len(data.records)):
        again = features_from_ids(target, data.records, data.layer_ids, pad=0, top_k=8, batch_size=batch_size)
        assert again.offsets == data.offsets and again.response_offsets == data.response_offsets
        torch.testing.assert_close(again.features.float(), data.features.float(), atol=2e-2, rtol=2e-2)
        assert (again.top_ids == data.top_ids).float().mean() > 0.98  # ties may swap under rounding
        torch.testing.assert_close(again.top_logprobs.float(), data.top_logprobs.float(), atol=2e-2, rtol=2e-3)


def test_features_are_returned_in_the_records_order(shard):
    """features_from_ids batches the conversations in length order: whatever order the
    records come in, each gets its own tensors back (reversed records, reversed rows)."""
    target, data, _ = shard
    lengths = [len(r["prompt_ids"]) + len(r["response_ids"]) for r in data.records]
    assert lengths != sorted(lengths) and lengths[::-1] != sorted(lengths)  # the batching reorders
    fwd = features_from_ids(target, data.records, data.layer_ids, pad=0, top_k=8, batch_size=2)
    rev = features_from_ids(target, data.records[::-1], data.layer_ids, pad=0, top_k=8, batch_size=2)
    n = len(data.records)
    for i in range(n):
        j = n - 1 - i
        torch.testing.assert_close(rev.features[rev.offsets[j]:rev.offsets[j + 1]].float(),
                                   fwd.features[fwd.offsets[i]:fwd.offsets[i + 1]].float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(rev.top_logprobs[rev.response_offsets[j]:rev.response_offsets[j + 1]].float(),
                                   fwd.top_logprobs[fwd.response_offsets[i]:fwd.response_offsets[i + 1]].float(),
                                   atol=2e-2, rtol=2e-3)


def _random_prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 64, (n,), generator=g).tolist() for n in lengths]


def _greedy_alone(target, prompt: list[int], n: int, eos: int | set[int]) -> list[int]:
    """The target's greedy continuation of one prompt, a full forward per token (the oracle)."""
    eos = {eos} if isinstance(eos, int) else eos
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(target(torch.tensor([ids])).logits[0, -1].argmax()))
            if ids[-1] in eos:
                break
    return ids[len(prompt):]


def _assert_each_prompts_own_greedy_decoding(target, prompts, data, n: int, eos: set[int], deployed: bool):
    """Each response of ``data`` is its prompt's greedy continuation decoded alone, and its
    features are those of the prompt and response[:-1] (as deployed: bit for bit)."""
    for i, (p, rec) in enumerate(zip(prompts, data.records)):
        ids = p + _greedy_alone(target, p, n, eos=eos)
        assert rec["prompt_ids"] == p and rec["response_ids"] == ids[len(p):], i
        with torch.no_grad():
            hs = target(torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
        feats = data.features[data.offsets[i]:data.offsets[i + 1]]
        alone = target_features(hs, [0, 2, 3])[0]
        if deployed:
            assert torch.equal(feats, alone.to(torch.bfloat16)), i
        else:
            torch.testing.assert_close(feats.float(), alone.float(), atol=2e-2, rtol=2e-2)


def _deployed(target, tmp_path):
    """``target`` saved, then loaded as generate_data loads a target (``target_as_deployed``)."""
    target.save_pretrained(tmp_path / "target")
    return target_as_deployed(tmp_path / "target")


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_data_target_is_the_target_the_engine_deploys(kind, tmp_path):
    """generate_data's target computes the deployed target's logits and features bit for bit
    (domino.load with DEFAULT_OPTIONS): its responses are the deployed target's own greedy
    decoding. Loaded in float32 and cast to bf16 it was not (the rotary frequencies rounded
    too: SmolLM2's logits up to ~1.3 apart)."""
    import domino
    from domino.loading import DEFAULT_OPTIONS
    from tiny_models import IdTokenizer

    tiny_target(kind, vocab=64).save_pretrained(tmp_path / "target")
    data_target = target_as_deployed(tmp_path / "target")
    deployed = domino.load(tmp_path / "target", None, IdTokenizer(), **DEFAULT_OPTIONS).target
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a = data_target(ids, output_hidden_states=True)
        b = deployed(ids, output_hidden_states=True)
    assert torch.equal(a.logits, b.logits)
    assert all(torch.equal(x, y) for x, y in zip(a.hidden_states, b.hidden_states))


@pytest.mark.parametrize("deployed", [False, True], ids=["fp32", "deployed"])
@pytest.mark.parametrize("prompts", [_random_prompts([1, 12, 2, 5], 11),  # very different lengths
                                     _random_prompts([6, 6, 6], 12),  # equal lengths: no padding at all
                                     _random_prompts([1, 1], 13),  # nothing to prefill
                                     _random_prompts([37, 3, 21, 9, 30, 14], 14)],  # long, ragged
                         ids=["ragged", "equal", "one-token", "long"])
def test_regenerated_responses_are_each_prompts_own_greedy_decoding(prompts, deployed, tmp_path):
    """Prompts prefilled in length-sorted groups and decoded together: each response is that prompt's
    greedy continuation decoded alone, and its features are those of the prompt and
    response[:-1]. As deployed (bf16 with the batch-invariant kernels, what
    ``generate_data`` runs on the CPU) the features are the solo forward's bits exactly."""
    target = tiny_target("llama", vocab=64)
    if deployed:
        target = _deployed(target, tmp_path)
        assert next(target.parameters()).dtype == torch.bfloat16
        assert target.model.rotary_emb.inv_freq.dtype == torch.float32  # loaded in bf16, not cast (as domino.load)
    data = regenerate(target, prompts, [0, 2, 3], eos={1}, pad=0, max_new_tokens=10, top_k=4)
    _assert_each_prompts_own_greedy_decoding(target, prompts, data, 10, {1}, deployed)


@pytest.mark.parametrize("deployed", [False, True], ids=["fp32", "deployed"])
def test_rows_that_finish_leave_the_batch_and_the_others_decode_on(deployed, monkeypatch, tmp_path):
    """Rows that emit an EOS early leave the batch (the cache is compacted around the rows
    still decoding), at several steps: every response is still its prompt's own greedy
    decoding, with its features and top-k log-probabilities those of a batch that kept
    every row (as deployed: bit for bit)."""
    target = tiny_target("llama", vocab=64)
    if deployed:
        target = _deployed(target, tmp_path)
    prompts = _random_prompts([5, 12, 3, 8, 7, 2, 10, 4, 6], 15)
    n = 14
    free = [r["response_ids"] for r in regenerate(target, prompts, [0, 2, 3], eos=set(), pad=0,
                                                  max_new_tokens=n, top_k=4).records]
    # EOS ids that end the rows at several different steps, some rows never
    candidates = sorted({t for row in free for t in row})
    eos = next({a, b} for a in candidates for b in candidates if a < b and len(
        {next((j for j, t in enumerate(row) if t in (a, b)), n) for row in free}) >= 4 and
        sum(any(t in (a, b) for t in row[:n // 2]) for row in free) >= 2 and
        any(a not in row and b not in row for row in free))
    from transformers import StaticCache

    compactions = []
    reorder = StaticCache.reorder_cache
    monkeypatch.setattr(StaticCache, "reorder_cache", lambda self, keep: (compactions.append(len(keep)),
                                                                         reorder(self, keep)))
    data = regenerate(target, prompts, [0, 2, 3], eos=eos, pad=0, max_new_tokens=n, top_k=4)
    assert len(compactions) >= 2, compactions  # the batch did shrink, more than once
    monkeypatch.undo()
    _assert_each_prompts_own_greedy_decoding(target, prompts, data, n, eos, deployed)
    kept = regenerate(target, prompts, [0, 2, 3], eos=set(), pad=0, max_new_tokens=n, top_k=4)
    for i, rec in enumerate(data.records):  # the rows that stayed: the same top-k at each step
        m = len(rec["response_ids"])
        r0, k0 = data.response_offsets[i], kept.response_offsets[i]
        assert torch.equal(data.top_ids[r0:r0 + m], kept.top_ids[k0:k0 + m]), i
        if deployed:
            assert torch.equal(data.top_logprobs[r0:r0 + m], kept.top_logprobs[k0:k0 + m]), i


def _mistral_with_a_window(window: int):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                            max_position_embeddings=1024, sliding_window=window, pad_token_id=0,
                                            bos_token_id=None, eos_token_id=None)).eval()


@pytest.mark.parametrize("kind", ["repetition_penalty", "sliding_window"])
def test_regeneration_is_greedy_decoding_for_other_targets(kind):
    """A checkpoint's own generation defaults (here a repetition penalty) do not leak into
    the responses, and a sliding-window target (Mistral, Gemma) decodes from the prefilled
    cache; a window too short for prompt plus response is refused by name."""
    if kind == "repetition_penalty":
        target = tiny_target("llama", vocab=64)
        target.generation_config.repetition_penalty = 1.3
    else:
        target = _mistral_with_a_window(4096)
    prompts = _random_prompts([9, 3, 14], 21)
    data = regenerate(target, prompts, [0, 2, 3], eos={1}, pad=0, max_new_tokens=12, top_k=4)
    for i, (p, rec) in enumerate(zip(prompts, data.records)):
        assert rec["response_ids"] == _greedy_alone(target, p, 12, eos=1), i
    if kind == "sliding_window":
        with pytest.raises(ValueError, match="sliding window .8 tokens. is shorter"):
            regenerate(_mistral_with_a_window(8), prompts, [0, 2, 3], eos={1}, pad=0, max_new_tokens=12, top_k=4)


def test_batch_carries_the_label_distributions(shard):
    _, _, out = shard
    convs = load_shards(out)
    batch = make_batch(convs, 3, 4, 3, 63, torch.Generator().manual_seed(0))
    valid = batch.label_valid
    assert torch.equal(batch.label_top_ids[..., 0][valid], batch.labels[valid])
    assert torch.isinf(batch.label_top_logprobs[~valid]).all()
    assert torch.isfinite(batch.label_top_logprobs[valid]).all()


def test_distillation_losses_vanish_when_the_draft_is_the_target():
    g = torch.Generator().manual_seed(0)
    V, K = 50, 6
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(8)]).view(2, 4, K)
    logp = torch.log_softmax(torch.randn(2, 4, K, generator=g), -1)
    exact = torch.full((2, 4, V), -1e9).scatter(-1, ids, logp)  # q equal to p on its support
    labels = ids[..., 0]
    assert per_token_loss("kl", exact, labels, ids, logp).abs().max() < 1e-5
    tv_part = per_token_loss("ce_tv", exact, labels, ids, logp) - per_token_loss("ce", exact, labels, None, None)
    assert tv_part.abs().max() < 1e-5
    off = torch.randn(2, 4, V, generator=g)  # a different q: both losses positive
    assert (per_token_loss("kl", off, labels, ids, logp) > 1e-3).all()
    assert (per_token_loss("ce_tv", off, labels, ids, logp) > per_token_loss("ce", off, labels, None, None)).all()
    with pytest.raises(ValueError, match="top-K"):
        per_token_loss("kl", off, labels, None, None)


@pytest.mark.parametrize("kind", ["ce", "kl", "ce_tv"])
@pytest.mark.parametrize("chunk_rows", [1, 7, 64])
def test_chunked_loss_matches_whole_logits_and_their_gradients(kind, chunk_rows):
    """The chunked loss (training/chunked_loss.py) against the same loss on whole logits
    through autograd: value, its two parts and the gradients of h, a and W2."""
    from training.chunked_loss import chunked_draft_loss

    g = torch.Generator().manual_seed(chunk_rows)
    R, H, r, V, K, lam = 23, 12, 5, 40, 4, 0.3
    h = torch.randn(R, H, generator=g, requires_grad=True)
    a = torch.randn(R, r, generator=g)
    a[::4] = 0  # positions the head leaves alone
    a.requires_grad_()
    w2 = torch.randn(V, r, generator=g, requires_grad=True)
    lm = torch.randn(V, H, generator=g)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(R)])
    logp = torch.log_softmax(torch.randn(R, K, generator=g), -1)
    labels, weights = ids[:, 0], torch.rand(R, generator=g)

    loss, lb, lf = chunked_draft_loss(kind, h, a, w2, lm, labels, ids, logp, weights, lam, chunk_rows=chunk_rows)
    got = torch.autograd.grad(2 * loss, (h, a, w2))  # a scale on the way back reaches every gradient

    base = h @ lm.T
    final = base + a @ w2.T
    part = (lambda x: (per_token_loss(kind, x[:, None], labels[:, None], ids[:, None], logp[:, None])[:, 0]
                       * weights).sum())
    ref_b, ref_f = part(base), part(final)
    ref = (1 - lam) * ref_f + lam * ref_b
    want = torch.autograd.grad(2 * ref, (h, a, w2))
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lb, ref_b.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lf, ref_f.detach(), rtol=1e-5, atol=1e-5)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert not lb.requires_grad and not lf.requires_grad


def test_training_time_test_feeds_the_gru_draft_vocabulary_tokens(shard):
    """Under training-time test the GRU consumes the drafter's own choices; with a draft
    vocabulary those are the best of its tokens, as drafting chooses (it once fed the
    argmax over the whole vocabulary, tokens drafting never writes)."""
    from tiny_models import tiny_drafter

    target, _, out = shard
    model = tiny_drafter(target).bind_target(target)
    vocab = torch.arange(2, 64, 2)
    model.set_draft_vocab(vocab)
    c = model.config
    batch = make_batch(load_shards(out), 3, c.block_size, c.num_drafts, c.mask_token_id,
                       torch.Generator().manual_seed(1))
    fed = []
    with torch.no_grad():
        h = model.packed_draft_hidden(*batch.backbone_inputs())
        base = model.lm_head(h)
        hook = model.embed_tokens.register_forward_hook(lambda mod, inputs, output: fed.append(inputs[0]))
        final = model.self_fed_logits(h, base, batch.anchors.reshape(-1))
    hook.remove()
    steps = torch.stack(fed[1:], dim=1)  # after the anchor: the choices at positions 0..n-2
    assert steps.numel() and torch.isin(steps, vocab).all()
    assert torch.equal(steps, vocab[final[:, :-1, vocab].argmax(-1)])
    assert not torch.isin(final.argmax(-1), vocab).all()  # the whole-vocabulary argmax would differ (control)


@pytest.mark.parametrize("kind,ttt", [("ce", False), ("kl", False), ("ce_tv", False), ("ce", True)])
def test_draft_vocab_batch_loss_is_over_its_tokens(shard, kind, ttt):
    """A drafter with a draft vocabulary trains on a batch restricted to it: labels and
    top-K ids become its indices, labels outside it drop out, and the loss (chunked, or
    whole under training-time test) equals the full logits' loss sliced to its K columns."""
    from tiny_models import tiny_drafter
    from training.data import restrict_to_draft_vocab
    from training.train import forward_batch

    target, _, out = shard
    model = tiny_drafter(target).bind_target(target).train()
    c = model.config
    convs = load_shards(out)
    batch = make_batch(convs, 3, c.block_size, c.num_drafts, c.mask_token_id, torch.Generator().manual_seed(1))
    vocab = torch.arange(2, 64, 2)  # every other token: some labels fall outside
    rb = restrict_to_draft_vocab(batch, vocab, c.vocab_size)
    inside = torch.isin(batch.labels, vocab)
    assert (batch.label_valid & ~inside).any() and (batch.label_valid & inside).any()
    assert torch.equal(rb.label_valid, batch.label_valid & inside)
    assert torch.equal(vocab[rb.labels][rb.label_valid], batch.labels[rb.label_valid])
    kept = torch.isfinite(rb.label_top_logprobs)
    assert torch.equal(kept, torch.isfinite(batch.label_top_logprobs) & torch.isin(batch.label_top_ids, vocab))
    assert torch.equal(vocab[rb.label_top_ids][kept], batch.label_top_ids[kept])

    weights = rb.label_valid.float().view(-1, c.num_drafts)
    weights = weights / weights.sum()
    loss, lb, lf = forward_batch(model, rb, kind=kind, weights=weights, lam=0.3, ttt=ttt, autocast=False)
    with torch.no_grad():
        N, A = batch.anchors.shape
        h = model.packed_draft_hidden(*batch.backbone_inputs())
        base = model.lm_head(h)
        if ttt:
            final = model.self_fed_logits(h, base, batch.anchors.reshape(-1))
        else:
            final = base + model.embed_proj[2](model.teacher_forced_head_input(h, batch.teacher.reshape(N * A, -1)))
        n = c.num_drafts
        part = (lambda x: (per_token_loss(kind, x[..., vocab], rb.labels.view(-1, n),
                                          rb.label_top_ids.view(-1, n, 8), rb.label_top_logprobs.view(-1, n, 8))
                           * weights).sum())
        ref_b, ref_f = part(base), part(final)
    torch.testing.assert_close(lb, ref_b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lf, ref_f, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.detach(), 0.7 * ref_f + 0.3 * ref_b, rtol=1e-4, atol=1e-5)
    loss.backward()  # w2's gradient lands on the draft vocabulary's rows only
    g = model.embed_proj[2].weight.grad
    outside = torch.ones(c.vocab_size, dtype=torch.bool)
    outside[vocab] = False
    assert g[outside].abs().max() == 0 and g[vocab].abs().max() > 0


def test_acceptance_weights_follow_the_expected_accepted_length():
    """acceptance_weights gives each position dE[tau]/dq_k (autograd on E[tau] = sum_m
    prod_{j<=m} q_j), zero at and after an invalid label; a position the drafter already
    misses early leaves the later ones little."""
    from training.train import acceptance_weights

    g = torch.Generator().manual_seed(3)
    q = torch.rand(5, 7, generator=g, dtype=torch.float64).requires_grad_()
    valid = torch.ones(5, 7, dtype=torch.bool)
    valid[2, 4] = False  # this block's chain ends before position 4
    valid[3] = False     # a block without valid labels weighs nothing
    got = acceptance_weights(q.float().detach(), valid)
    qv = torch.where(valid, q, torch.zeros_like(q))
    expected_tau = torch.cumprod(qv, dim=1).sum()
    (grad,) = torch.autograd.grad(expected_tau, q)
    want = torch.where(valid, grad, torch.zeros_like(grad)).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got[2, 4:].eq(0).all() and got[3].eq(0).all() and got[2, :4].gt(0).all()
    # a block the drafter misses at its first position: the later positions barely count
    low = acceptance_weights(torch.tensor([[0.01, 0.9, 0.9], [0.9, 0.9, 0.9]]), torch.ones(2, 3, dtype=torch.bool))
    assert low[0, 1] < 0.05 * low[1, 1] and low[0, 0] > 0.5 * low[1, 0]


def test_acceptance_weighted_batch_loss_uses_the_final_logits_label_probabilities(shard):
    """forward_batch with acceptance=True weighs the per-position CE by acceptance_weights
    of the teacher-forced final logits' label probabilities, scaled to the given weights'
    total: the same loss as computing those by hand."""
    from tiny_models import tiny_drafter
    from training.train import acceptance_weights, forward_batch

    target, _, out = shard
    model = tiny_drafter(target).bind_target(target).train()
    c = model.config
    batch = make_batch(load_shards(out), 3, c.block_size, c.num_drafts, c.mask_token_id,
                       torch.Generator().manual_seed(2))
    n = c.num_drafts
    weights = batch.label_valid.float().view(-1, n) * torch.exp(-torch.arange(n) / 7.0)
    weights = weights * (0.5 / weights.sum())  # a total of 0.5: e.g. one rank's share
    loss, lb, lf = forward_batch(model, batch, kind="ce", weights=weights, lam=0.25, ttt=False, autocast=False,
                                 acceptance=True)
    with torch.no_grad():
        N, A = batch.anchors.shape
        h = model.packed_draft_hidden(*batch.backbone_inputs())
        base = model.lm_head(h)
        final = base + model.embed_proj[2](model.teacher_forced_head_input(h, batch.teacher.reshape(N * A, -1)))
        labels = batch.labels.view(-1, n)
        q = torch.log_softmax(final.float(), -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0].exp()
        w = acceptance_weights(q, batch.label_valid.view(-1, n))
        w = w * (0.5 / w.sum())
        assert not torch.allclose(w, weights)  # another weighting than the decay (control)
        part = (lambda x: (per_token_loss("ce", x, labels, None, None) * w).sum())
        ref_b, ref_f = part(base), part(final)
    torch.testing.assert_close(lf, ref_f, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lb, ref_b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss.detach(), 0.75 * ref_f + 0.25 * ref_b, rtol=1e-4, atol=1e-5)
