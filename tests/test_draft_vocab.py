"""A drafter's draft vocabulary (``DominoDraftModel.set_draft_vocab``): drafting restricted
to K target tokens. The whole vocabulary drafts what no restriction drafts; a subset drafts
only its own tokens, the best of them by the same logits; generation stays exactly the
target's (greedy token for token, sampled in distribution); checkpoints keep it; bad ids
are refused; and ``training/draft_vocab.py`` picks the most frequent response tokens."""

import json

import pytest
import torch
from safetensors.torch import load_file

import domino_ops

from domino import TreeShape
from domino.model import DRAFT_VOCAB_KEY, DominoDraftModel
from domino.sampling_params import RowSampling
from engine_cases import V as SMALL_V, check, prompts
from tiny_models import tiny_drafter, tiny_generator, tiny_target
from torch_threads import torch_threads
from training import draft_vocab

GREEDY = RowSampling(0.0, 0, 1.0, None, False)
SUBSET = torch.tensor([2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 63])  # vocab 64


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with torch_threads(1):
        yield


def drafts(gen, ps, **kw):
    """Chain drafts [b, n] and the logits they came from, and a 3-wide tree, after prefill."""
    d = gen.drafter
    st, _ = gen._prefill(ps, GREEDY)
    chain = d.draft(st.dcache, st.anchor, st.anchor_pos, **kw)
    tree = d.draft_tree(st.dcache, st.anchor, st.anchor_pos, topk=3, depth=3, **kw)
    return st, chain, tree


@pytest.mark.parametrize("use_head", [True, False])
def test_whole_vocabulary_drafts_what_no_restriction_drafts(use_head):
    gen = tiny_generator("qwen3")
    ps = prompts(3, seed=5)
    _, chain, tree = drafts(gen, ps, use_head=use_head)
    gen.drafter.set_draft_vocab(torch.arange(64))
    _, chain_v, tree_v = drafts(gen, ps, use_head=use_head)
    assert torch.equal(chain_v.tokens, chain.tokens)
    torch.testing.assert_close(chain_v.confidence, chain.confidence, rtol=1e-5, atol=1e-6)
    assert torch.equal(tree_v.candidates, tree.candidates)
    torch.testing.assert_close(tree_v.candidate_scores, tree.candidate_scores, rtol=1e-5, atol=1e-5)


def test_subset_drafts_the_best_subset_token_by_the_same_logits():
    """Head off: each draft is the argmax of the full base logits over the subset only."""
    gen = tiny_generator("llama")
    d = gen.drafter.set_draft_vocab(SUBSET)
    st, chain, tree = drafts(gen, prompts(2, seed=1), use_head=False)
    block, pos = d.block_input(st.anchor, st.anchor_pos)
    full = d.lm_head(d.draft_hidden(d.backbone(st.dcache, block, pos))).float()  # [b, n, V]
    masked = torch.full_like(full, float("-inf"))
    masked[..., SUBSET] = full[..., SUBSET]
    assert torch.equal(chain.tokens, masked.argmax(-1))
    assert torch.isinf(chain.logits[..., [i for i in range(64) if i not in SUBSET.tolist()]]).all()
    torch.testing.assert_close(chain.logits[..., SUBSET], full[..., SUBSET], rtol=1e-5, atol=1e-5)
    assert torch.equal(tree.candidates[:, 1:4], masked[:, 0].topk(3, dim=-1).indices)
    # the whole-vocabulary rows are built on access, from the draft-vocabulary ones
    assert chain.vocab_logits.shape[-1] == len(SUBSET)
    first = chain.prefix(2)
    assert torch.equal(first.tokens, chain.tokens[:, :2])
    assert torch.equal(first.logits, chain.logits[:, :2])


@pytest.mark.parametrize("use_head", [True, False])
def test_subset_drafts_what_the_whole_vocabulary_drafts_from_logits_masked_to_it(use_head):
    """With the head too: the subset's rows of w2 and of the GRU input, indexed by subset
    position, act exactly as the whole vocabulary does when every other token's base logit
    is -inf (chain: choose_tokens; tree: the draft_tree op)."""
    import domino_ops

    gen = tiny_generator("qwen3")
    d = gen.drafter
    with torch.no_grad():  # a head whose correction outweighs the base logits, decided by the GRU state
        d.embed_proj[2].weight.mul_(200.0)
        d.embed_proj[0].weight[:, d.config.hidden_size:].mul_(50.0)
    ps = prompts(3, seed=8)
    d.set_draft_vocab(SUBSET)
    st, chain, tree = drafts(gen, ps, use_head=use_head)
    d.set_draft_vocab(None)
    block, pos = d.block_input(st.anchor, st.anchor_pos)
    h = d.draft_hidden(d.backbone(st.dcache, block, pos))
    full = d.base_logits(h)
    masked = torch.full_like(full, float("-inf"))
    masked[..., SUBSET] = full[..., SUBSET]
    want = d.choose_tokens(h, masked, st.anchor, use_head=use_head)
    assert torch.equal(chain.tokens, want.tokens)
    if use_head:  # the head's corrections mattered: the base argmax alone drafts otherwise
        assert not torch.equal(chain.tokens, masked.argmax(-1))
    if use_head:
        E, w_ih, w_hh, w1h, w1s, w2 = d.head_weights()
        head = ((h[:, :3] @ w1h.T).float(), d.gru_state(st.anchor[:, None]), E, w_ih, w_hh, w1s, w2)
        with torch.no_grad():  # an inference op: the drafter's weights require grad
            want_tree = domino_ops.draft_tree(masked[:, :3].contiguous(), *head, st.anchor, topk=3, depth=3,
                                              plain_depths=d.config.pure_draft_prefix_len)
        assert torch.equal(tree.candidates, want_tree.candidates)


@pytest.mark.parametrize("use_head", [True, False])
def test_subset_drafts_only_its_tokens(use_head):
    gen = tiny_generator("qwen3")
    gen.drafter.set_draft_vocab(SUBSET)
    st, chain, tree = drafts(gen, prompts(3, seed=7), use_head=use_head)
    assert torch.isin(chain.tokens, SUBSET).all()
    assert torch.equal(tree.candidates[:, 0], st.anchor)  # the root is the anchor, whatever it is
    assert torch.isin(tree.candidates[:, 1:], SUBSET).all()
    assert torch.isin(tree.candidate_tokens, SUBSET).all()
    sampled = RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(0), True)
    chain = gen.drafter.draft(st.dcache, st.anchor, st.anchor_pos, use_head=use_head, sampling=sampled)
    tree = gen.drafter.draft_tree(st.dcache, st.anchor, st.anchor_pos, topk=2, depth=2, use_head=use_head,
                                  sampling=sampled)
    outside = torch.ones(64, dtype=torch.bool)
    outside[SUBSET] = False
    assert torch.isin(chain.tokens, SUBSET).all() and torch.isin(tree.candidates[:, 1:], SUBSET).all()
    assert torch.isinf(chain.logits[..., outside]).all()
    assert tree.draft_probs.shape[-1] == 64 and (tree.draft_probs[..., outside] == 0).all()
    expanded = tree.draft_probs.sum(-1) > 0
    torch.testing.assert_close(tree.draft_probs.sum(-1)[expanded], torch.ones(int(expanded.sum())))


@pytest.mark.parametrize("kind,tree", [("qwen3", None), ("llama", None), ("qwen3", TreeShape(3, 3, 8)),
                                       ("llama", TreeShape(2, 4))])
def test_generation_with_a_subset_is_the_targets_greedy(kind, tree):
    gen = tiny_generator(kind)
    gen.drafter.set_draft_vocab(SUBSET)
    ps = prompts(3, seed=11)
    kw = {} if tree is not None else dict(num_drafts=gen.drafter.config.num_drafts)
    spec = gen.generate(ps, max_new_tokens=24, tree=tree, **kw)
    assert spec.token_ids == gen.generate_target_only(ps, max_new_tokens=24).token_ids


def test_sampled_generation_with_a_subset_is_the_targets_distribution():
    """Draft probabilities are zero outside the subset; rejection sampling still gives
    exactly the target's distribution (engine_cases.check: tokens 1, 1-2, 3, 4 and 4-5)."""
    gen = tiny_generator("qwen3", vocab=SMALL_V, block_size=4, seed=3)
    gen.drafter.set_draft_vocab(torch.tensor([0, 2, 3, 6]))
    res = check(gen, 1.0, 0, 1.0)
    assert max(a for seq in res.acceptance_lengths for a in seq) > 1  # some drafts were accepted


def test_checkpoint_keeps_the_draft_vocabulary(tmp_path):
    target = tiny_target("qwen3")
    d = tiny_drafter(target).set_draft_vocab(SUBSET.flip(0))  # any order: kept ascending
    d.save_pretrained(tmp_path, dtype=torch.float32)
    assert torch.equal(load_file(str(tmp_path / "model.safetensors"))[DRAFT_VOCAB_KEY], SUBSET)
    loaded = DominoDraftModel.from_pretrained(tmp_path)
    assert torch.equal(loaded.draft_vocab, SUBSET)
    assert loaded.draft_vocab.dtype == torch.int64
    for k, v in d.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    loaded.set_draft_vocab(None).save_pretrained(tmp_path, dtype=torch.float32)
    assert DominoDraftModel.from_pretrained(tmp_path).draft_vocab is None


def test_head_rows_follow_in_place_weight_updates():
    """Training updates w2 in place: the cached draft-vocabulary rows must not go stale."""
    gen = tiny_generator("qwen3")
    d = gen.drafter.set_draft_vocab(SUBSET)
    w2_rows = d.head_weights()[5].clone()
    with torch.no_grad():
        d.embed_proj[2].weight.add_(1.0)
    torch.testing.assert_close(d.head_weights()[5], w2_rows + 1.0)
    assert torch.equal(d.head_weights()[0], d.embed_tokens.weight[SUBSET])


@pytest.mark.skipif(not domino_ops.small_batch_linear_packed_supported(),
                    reason="no packed bf16 kernel runs on this CPU (it needs AVX2 and FMA, or AVX512-BF16)")
def test_packed_w2_follows_the_draft_vocabulary_and_in_place_updates():
    """The packed w2 the tree expand reads (bf16 drafter, AVX512-BF16 CPU) is always
    w2's packing: after another draft vocabulary of the same size and the same first and
    last ids (whose row copy may land at the old one's address), and after an in-place update."""
    target = tiny_target(vocab=256)
    d = tiny_drafter(target).to(torch.bfloat16)
    d.bind_target(target.to(torch.bfloat16))

    def packed_is_w2s():
        w2 = d.head_weights()[5]
        return torch.equal(d._packed_head_weight("w2", w2, d.embed_proj[2].weight).data, domino_ops.pack_small_batch_linear_weight(w2).data)

    d.set_draft_vocab(torch.cat([torch.arange(0, 100), torch.arange(156, 256)]))
    assert packed_is_w2s()
    d.set_draft_vocab(torch.cat([torch.arange(0, 50), torch.arange(106, 256)]))
    assert packed_is_w2s()
    with torch.no_grad():
        d.embed_proj[2].weight.add_(1.0)
    assert packed_is_w2s()
    d.set_draft_vocab(None)
    assert packed_is_w2s()


@pytest.mark.parametrize("ids,err,match", [
    ([1, 2, 3], TypeError, "token_ids must be a torch.Tensor"),
    (torch.tensor([1.0, 2.0]), ValueError, "token_ids must be a 1-D integer tensor"),
    (torch.tensor([[1, 2]]), ValueError, "token_ids must be a 1-D integer tensor"),
    (torch.tensor([], dtype=torch.int64), ValueError, "token_ids must hold 1 to 64"),
    (torch.arange(65), ValueError, "token_ids must hold 1 to 64"),
    (torch.tensor([0, 64]), ValueError, r"token_ids must lie in \[0, 64\)"),
    (torch.tensor([-1, 3]), ValueError, r"token_ids must lie in \[0, 64\)"),
    (torch.tensor([3, 5, 3]), ValueError, "token_ids must be distinct"),
])
def test_bad_draft_vocabulary(ids, err, match):
    d = tiny_drafter(tiny_target("qwen3"))
    with pytest.raises(err, match=match):
        d.set_draft_vocab(ids)
    assert d.draft_vocab is None


def test_most_frequent_response_tokens(tmp_path):
    """Counted over the training shards; shard 3 repeats held-out shard 0's prompt (a later
    pass over the prompt order) and is counted nowhere, as the trainer leaves it out."""
    shards = {0: [[5, 5, 9, 1]], 1: [[7, 7, 7, 3, 4], [4, 3, 8]], 2: [[3, 9, 9, 2]], 3: [[6, 6, 6, 6]]}
    prompts = {0: [[1]], 1: [[2], [3]], 2: [[4]], 3: [[1]]}
    for i, responses in shards.items():
        (tmp_path / f"shard_{i:05d}.jsonl").write_text(
            "".join(json.dumps({"prompt_ids": p, "response_ids": r}) + "\n" for p, r in zip(prompts[i], responses)))
    counts, held = draft_vocab.response_counts(tmp_path, exclude={0})
    assert held == [5, 5, 9, 1]
    assert counts == {7: 3, 3: 3, 4: 2, 9: 2, 8: 1, 2: 1}
    # ties in count go to the smaller id; the result is ascending
    assert draft_vocab.most_frequent(counts, 3).tolist() == [3, 4, 7]
    assert draft_vocab.most_frequent(counts, 4).tolist() == [3, 4, 7, 9]
    assert draft_vocab.most_frequent(counts, 100).tolist() == [2, 3, 4, 7, 8, 9]
    assert draft_vocab.coverage(torch.tensor([5, 9]), held) == 0.75


def test_draft_vocab_script_writes_into_a_checkpoint(tmp_path):
    target = tiny_target("qwen3")
    d = tiny_drafter(target)
    d.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "shard_00001.jsonl").write_text(json.dumps({"prompt_ids": [1], "response_ids": [9, 9, 4]}))
    draft_vocab.main(["--data", str(tmp_path / "data"), "--size", "8", "--checkpoint", str(tmp_path / "ckpt")])
    loaded = DominoDraftModel.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    assert loaded.draft_vocab.tolist() == [4, 9]
    for k, v in d.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.to(torch.bfloat16)), k


@pytest.mark.parametrize("use_head", [True, False])
@pytest.mark.parametrize("subset", [False, True])
def test_sampled_drafts_keep_the_distributions_they_were_drawn_from(use_head, subset):
    """At T > 0 a chain draft keeps each position's filtered distribution (verification's
    q, not computed again): the filtered_probs of the logits it was drawn from, over the
    whole vocabulary 0 outside a draft vocabulary, prefixes included; greedy keeps none."""
    gen = tiny_generator("qwen3")
    if subset:
        gen.drafter.set_draft_vocab(SUBSET)
    d = gen.drafter
    sampling = RowSampling(torch.tensor([0.7, 1.3, 0.0]), torch.tensor([0, 5, 0]), torch.tensor([0.9, 1.0, 1.0]),
                           torch.Generator().manual_seed(3), True)
    st, _ = gen._prefill(prompts(3, seed=4), GREEDY)
    chain = d.draft(st.dcache, st.anchor, st.anchor_pos, use_head=use_head, sampling=sampling)
    want = domino_ops.filtered_probs(chain.logits, **sampling.filter_kwargs())
    assert chain.probs.shape == want.shape
    torch.testing.assert_close(chain.probs, want, rtol=2e-5, atol=1e-30)
    torch.testing.assert_close(chain.confidence, want.amax(-1), rtol=2e-5, atol=1e-30)
    first = chain.prefix(2)
    assert torch.equal(first.probs, chain.probs[:, :2])
    # every drawn token has mass under the distribution kept for it; the greedy row's is
    # the one-hot of its token
    assert (chain.probs.gather(-1, chain.tokens[..., None]) > 0).all()
    assert torch.equal(chain.probs[2], torch.nn.functional.one_hot(chain.tokens[2], chain.probs.shape[-1]).float())
    greedy = d.draft(st.dcache, st.anchor, st.anchor_pos, use_head=use_head)
    assert greedy.vocab_probs is None and greedy.probs is None
