"""Tree speculation in the engine (``generate(..., tree=TreeShape(...))``): greedy output is
the target's own greedy decoding, a topk = 1 tree is the chain, acceptance through a
sibling keeps the caches right, sampled trees are distributed as the target (per request,
in a batch mixing parameters and seeds), and the
one-forward tree verification sees exactly what each path's own forward sees."""

import dataclasses

import numpy as np
import pytest
import torch

import domino.tree
import domino_ops
from domino import TreeShape
from domino.budget import RoundCosts
from domino.fast_attention import use_small_batch_attention
from domino.sampling_params import RowSampling
from domino_ops.tree_draft import DraftTree, tree_size
from engine_cases import PROMPT, V as SMALL_V, assert_distributed_as_target, assert_mostly_multi_token, check, \
    cheap_verification, flat_costs, prompts, rig_round_costs
from tiny_models import RiggedDrafts, RowsOfTheRound, tiny_generator
from torch_threads import torch_threads

GREEDY = RowSampling(0.0, 0, 1.0, None, False)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny models' matrices are too small for a second thread to help, and on a busy
    machine intra-op threads contending for the cores made these tests 5x slower."""
    with torch_threads(1):
        yield



def every_node(topk: int, depth: int) -> TreeShape:
    """A tree verified with every candidate each round (the default chooses the size from
    measured costs, which the rigged trees below do not carry the scores for)."""
    return TreeShape(topk, depth, TreeShape(topk, depth).max_nodes)

class RiggedTree:
    """Replaces ``drafter.draft_tree`` with a full tree (every candidate a node) whose
    target path is always the *last* sibling: at depth 1 the last root child, deeper the
    last child of the last frontier slot. Every other node is a wrong token. With
    ``alternate`` the path's first token is wrong on every other round (no acceptance)."""

    def __init__(self, gen, full_sequences, alternate=False):
        self.gen, self.full, self.alternate, self.round = gen, full_sequences, alternate, 0
        self.original = gen.drafter.draft_tree
        self.rows = RowsOfTheRound(gen)
        gen.drafter.draft_tree = self

    def __call__(self, cache, anchor, anchor_pos, *, topk, depth, **kw):
        vocab = self.gen.drafter.config.vocab_size
        wrong_round = self.alternate and self.round % 2 == 1
        self.round += 1
        parents = [-1, *range(topk)]
        for s in range(1, depth - 1):  # frontier of step s: its first topk - 1 candidates, then the path's node
            base = tree_size(topk, s)
            parents += [base + j for j in range(topk - 1)] + [base + topk * topk - 1]
        rows = []
        for seq, p in zip(self.rows.sequences(self.full, anchor.shape[0]), anchor_pos.tolist()):
            right = [seq[q] if q < len(seq) else 1 for q in range(p + 1, p + 1 + depth)]
            if wrong_round:
                right[0] = (right[0] + topk) % vocab  # differs from every sibling: (t + 1 + c) % V, c < topk - 1
            row = [(right[0] + 1 + c) % vocab for c in range(topk - 1)] + [right[0]]
            for s in range(1, depth):
                step = [(right[s] + 1 + c) % vocab for _ in range(topk) for c in range(topk)]
                step[-1] = right[s]  # the last child of the last frontier slot
                row += step
            rows.append(row)
        b, total = len(rows), tree_size(topk, depth)
        tokens = torch.tensor(rows, dtype=torch.int64)
        parent_list = torch.tensor([parents], dtype=torch.int64).expand(b, -1).contiguous()
        if depth == 1:
            parent_list = torch.empty(b, 0, dtype=torch.int64)
        return DraftTree(parent_list, torch.arange(total).expand(b, total).contiguous(),
                         torch.cat([anchor[:, None], tokens], dim=1), None)

    def restore(self):
        self.gen.drafter.draft_tree = self.original
        self.rows.restore()


def greedy_plain(gen, ps, n):
    return gen.generate_target_only(ps, max_new_tokens=n).token_ids


# ---- greedy: exactly the target -------------------------------------------------------

@pytest.mark.parametrize("kind,use_head,batch,shape", [
    ("qwen3", True, 1, TreeShape(1, 1)),
    ("qwen3", True, 3, TreeShape(2, 3)),
    ("qwen3", False, 3, TreeShape(4, 5, 12)),
    ("qwen3", True, 1, TreeShape(3, 2)),
    ("qwen3", False, 1, TreeShape(2, 5, 4)),
    ("llama", True, 3, TreeShape(4, 4, 9)),
    ("llama", False, 3, TreeShape(3, 1)),
    ("llama", True, 1, TreeShape(1, 5)),
    ("llama", False, 1, TreeShape(2, 2, 2)),
    ("llama", True, 3, TreeShape(3, 5, 20)),
])
def test_tree_matches_target_greedy(kind, use_head, batch, shape):
    """Fixed node counts and the adaptive budget (no count; its costs rigged so that it
    drafts every round, as measured costs on these tiny models would not)."""
    gen = tiny_generator(kind)
    cheap_verification(gen, batch)
    ps = prompts(batch, seed=batch + shape.topk)
    plain = greedy_plain(gen, ps, 30)
    spec = gen.generate(ps, max_new_tokens=30, use_head=use_head, tree=shape, lookup_tokens=0)
    assert spec.token_ids == plain
    assert all(1 <= a <= shape.depth + 1 for seq in spec.acceptance_lengths for a in seq)
    assert_mostly_multi_token(spec)
    # with prompt-lookup chains grafted on (the default): still the target's greedy tokens
    assert gen.generate(ps, max_new_tokens=30, use_head=use_head, tree=shape).token_ids == plain


@pytest.mark.parametrize("drafter_kw", [dict(shift_label=True), dict(pure_draft_prefix_len=0),
                                        dict(pure_draft_prefix_len=3), dict(projector_type=None)])
def test_tree_with_other_drafter_configs(drafter_kw):
    gen = tiny_generator("qwen3", **drafter_kw)
    ps = prompts(2, seed=3)
    assert gen.generate(ps, max_new_tokens=20, tree=TreeShape(2, 4, 7)).token_ids == greedy_plain(gen, ps, 20)


def test_tree_matches_target_greedy_with_small_batch_attention():
    gen = tiny_generator("llama")
    use_small_batch_attention(gen.target)
    ps = prompts(3, seed=5)
    spec = gen.generate(ps, max_new_tokens=24, tree=every_node(3, 3))
    assert spec.token_ids == greedy_plain(gen, ps, 24)
    assert_mostly_multi_token(spec)


def test_tree_matches_target_greedy_with_eager_attention():
    """The eager path adds the 4D mask to the scores as sdpa does (a bool mask would be
    added as 0/1 there and mask nothing)."""
    gen = tiny_generator("qwen3")
    gen.target.set_attn_implementation("eager")
    ps = prompts(3, seed=4)
    spec = gen.generate(ps, max_new_tokens=24, tree=every_node(3, 3))
    assert spec.token_ids == greedy_plain(gen, ps, 24)
    assert_mostly_multi_token(spec)


@pytest.mark.parametrize("kind,use_head", [("qwen3", True), ("llama", False)])
def test_topk_one_tree_is_the_chain(kind, use_head):
    gen = tiny_generator(kind)
    ps = prompts(3, seed=9)
    chain = gen.generate(ps, max_new_tokens=30, use_head=use_head, num_drafts=gen.drafter.config.num_drafts)
    tree = gen.generate(ps, max_new_tokens=30, use_head=use_head, tree=every_node(1, gen.drafter.config.num_drafts),
                        lookup_tokens=0)
    assert tree.token_ids == chain.token_ids
    assert tree.acceptance_lengths == chain.acceptance_lengths


@pytest.mark.parametrize("drafter_kw", [{}, dict(pure_draft_prefix_len=0), dict(pure_draft_prefix_len=3),
                                        dict(shift_label=True), dict(projector_type=None)])
def test_topk_one_tree_drafts_the_chain_tokens(drafter_kw):
    gen = tiny_generator("qwen3", **drafter_kw)
    d = gen.drafter
    st, _ = gen._prefill(prompts(3, seed=2), GREEDY)
    n = d.config.num_drafts
    for use_head in (True, False):
        chain = d.draft(st.dcache, st.anchor, st.anchor_pos, use_head=use_head).tokens
        for depth in (1, 2, n):
            tree = d.draft_tree(st.dcache, st.anchor, st.anchor_pos, topk=1, depth=depth, use_head=use_head)
            assert torch.equal(tree.candidates[:, 0], st.anchor)
            assert torch.equal(tree.candidates[:, 1:], chain[:, :depth]), (use_head, depth)


def test_head_free_tree_children_are_the_base_top_k():
    """Without the head every node at depth d has the same children: the base logits' best."""
    gen = tiny_generator("llama")
    d = gen.drafter
    st, _ = gen._prefill(prompts(2, seed=1), GREEDY)
    block, pos = d.block_input(st.anchor, st.anchor_pos)
    base = d.lm_head(d.draft_hidden(d.backbone(st.dcache, block, pos))).float()
    tree = d.draft_tree(st.dcache, st.anchor, st.anchor_pos, topk=3, depth=3, use_head=False)
    best = base.topk(3, dim=-1).indices  # [b, n, 3]
    cands = tree.candidates[:, 1:]  # every candidate selected: the layout's own order
    assert torch.equal(cands[:, :3], best[:, 0])
    for s in (1, 2):
        step = cands[:, tree_size(3, s):tree_size(3, s + 1)].view(2, 3, 3)
        assert torch.equal(step, best[:, s, None].expand(2, 3, 3))


# ---- the target's side: mask, positions, compaction ------------------------------------

@pytest.mark.parametrize("attn", ["sdpa", "eager", "small_batch"])
def test_tree_forward_equals_each_paths_own_forward(attn):
    """One forward over a tree (ragged batch: the cache has left-padding holes) gives at
    every node the logits of a plain forward over the prompt and that node's path."""
    gen = tiny_generator("qwen3")
    if attn == "small_batch":
        use_small_batch_attention(gen.target)
    else:
        gen.target.set_attn_implementation(attn)
    ps = prompts(3, seed=6)
    st, _ = gen._prefill(ps, GREEDY)
    tree = gen.drafter.draft_tree(st.dcache, st.anchor, st.anchor_pos, topk=3, depth=3, num_draft_tokens=8)
    links = domino.tree.tree_links(tree, st.anchor_pos, 3, 3)
    mask = domino.tree.tree_attention_mask(st.cache_mask, links.ancestors, gen.target.dtype)
    logits, _ = gen._target_forward(tree.candidates, mask, links.positions, st.cache)
    for s, prompt in enumerate(ps):
        for u in range(tree.candidates.shape[1]):
            path = [int(tree.candidates[s, a]) for a in range(u + 1) if links.ancestors[s, u, a]]
            assert links.positions[s, u] == len(prompt) + len(path) - 1
            want = gen.target(torch.tensor([prompt + path])).logits[0, -1].float()
            torch.testing.assert_close(logits[s, u], want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("topk,depth", [(2, 3), (3, 4), (2, 1)])
def test_acceptance_through_siblings(topk, depth):
    """The target's path is always the last sibling: every round accepts depth drafts
    through non-first children, and the compacted caches keep the next rounds right
    (ragged batch; one sequence's drafts always wrong)."""
    gen = tiny_generator("llama")
    ps = prompts(3, seed=5)
    plain = greedy_plain(gen, ps, 40)
    full = [p + t for p, t in zip(ps, plain)]
    full[2] = [(t + 1) % 64 for t in full[2]]  # sequence 2's trees never hold its path
    rig = RiggedTree(gen, full)
    try:
        spec = gen.generate(ps, max_new_tokens=40, tree=every_node(topk, depth), lookup_tokens=0)
    finally:
        rig.restore()
    assert spec.token_ids == plain
    for seq in spec.acceptance_lengths[:2]:
        assert seq[:-1] == [depth + 1] * (len(seq) - 1)
    assert set(spec.acceptance_lengths[2]) == {1}


def test_sibling_paths_feed_the_drafter_what_a_chain_feeds(monkeypatch):
    """A tree whose path runs through last siblings and a rigged chain accept the same
    tokens; the drafter's context gets the same features, positions and validity."""
    # the chain's rounds whole to the end, as the tree's (a greedy chain's last rounds draft
    # only what the output can still take: test_speculative_greedy.py)
    monkeypatch.setattr(domino.generate.DominoGenerator, "_chain_room",
                        staticmethod(lambda out_ids, live, max_new_tokens, sampling, position_room: position_room))
    gen = tiny_generator("qwen3")
    ps = prompts(2, seed=12)
    plain = greedy_plain(gen, ps, 30)
    full = [p + t for p, t in zip(ps, plain)]
    k = len(ps[1]) + 11  # sequence 1's drafts go wrong after 10 tokens (in the tree: every sibling): ragged
    full[1] = full[1][:k] + [(t + 1) % 64 for t in full[1][k:]]
    n = gen.drafter.config.num_drafts

    def run(rig_class, **kw):
        calls = []
        extend = gen.drafter.extend_context
        gen.drafter.extend_context = lambda cache, f, pos, valid: (calls.append((f, pos, valid)),
                                                                   extend(cache, f, pos, valid))
        rig = rig_class(gen, full)
        try:
            res = gen.generate(ps, max_new_tokens=30, **kw)
        finally:
            rig.restore()
            del gen.drafter.extend_context
        return res, calls

    chain, chain_calls = run(RiggedDrafts, num_drafts=n)
    tree, tree_calls = run(RiggedTree, tree=every_node(2, n), lookup_tokens=0)
    assert chain.token_ids == tree.token_ids == plain
    assert chain.acceptance_lengths == tree.acceptance_lengths
    assert len(chain_calls) == len(tree_calls)
    for (cf, cp, cv), (tf, tp, tv) in zip(chain_calls, tree_calls):
        assert torch.equal(cp, tp) and torch.equal(cv, tv)
        torch.testing.assert_close(tf[tv], cf[cv], atol=1e-5, rtol=1e-5)


def test_alternating_sibling_and_zero_acceptance():
    gen = tiny_generator("qwen3")
    ps = prompts(2, seed=11)
    plain = greedy_plain(gen, ps, 80)
    rig = RiggedTree(gen, [p + t for p, t in zip(ps, plain)], alternate=True)
    try:
        spec = gen.generate(ps, max_new_tokens=80, tree=every_node(3, 4), lookup_tokens=0)
    finally:
        rig.restore()
    assert spec.token_ids == plain
    assert set(spec.acceptance_lengths[0][:-1]) == {1, 5}


def test_without_compaction_sibling_acceptance_goes_wrong(monkeypatch):
    """Negative control: skipping the KV compaction (keeping the round's first slots, the
    root and its first children, instead of the accepted path) breaks the output."""
    gen = tiny_generator("llama")
    ps = prompts(2, seed=5)
    plain = greedy_plain(gen, ps, 30)
    monkeypatch.setattr(domino.generate, "compact_tree_cache", lambda cache, path, n: None)
    rig = RiggedTree(gen, [p + t for p, t in zip(ps, plain)])
    try:
        spec = gen.generate(ps, max_new_tokens=30, tree=every_node(2, 3), lookup_tokens=0)
    finally:
        rig.restore()
    assert spec.token_ids != plain


def _verified(path, next_token, tokens=None, selected=(), parent_list=(-1,), candidate_tokens=None):
    """A one-sequence VerifiedTree from its rows."""
    return domino.tree.VerifiedTree([list(path)], [list(tokens if tokens is not None else path)], [list(next_token)],
                                    [list(selected)], [list(parent_list)],
                                    None if candidate_tokens is None else [list(candidate_tokens)])


def test_depths_tried_stop_at_the_cut_trees_leaves():
    """A round counts a depth as tried only where the verified tree had a node there: a path
    accepted to a leaf tried no further depth, one that stops above children tried one more."""
    cases = [([0, 1], [1, -1, -1], 1),   # root -> 1: the one draft accepted, a leaf
             ([0], [1, -1, -1], 1),      # the same tree, its draft rejected
             ([0, 1], [1, 2, -1], 2),    # root -> 1 -> 2: stopped at 1, above node 2
             ([0, 1, 2], [1, 2, -1], 2)]  # accepted to the leaf 2
    for path, next_token, tried in cases:
        assert domino.tree.depths_tried(_verified(path, next_token)) == [tried], path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_target_argmax_is_torch_argmax(dtype):
    """The greedy verification's target tokens: torch.argmax's choice at every node, ties by
    index and the first NaN, over vocabularies on and off the kernels' vector widths."""
    g = torch.Generator().manual_seed(3)
    for b, n, V in [(1, 1, 1), (1, 11, 49152), (3, 5, 37), (2, 16, 1000)]:
        logits = torch.randint(-3, 4, (b, n, V), generator=g).to(dtype)  # few values: many ties
        logits[0, -1, V // 2] = float("nan")
        logits[-1, 0, :] = float("-inf")
        got = domino.tree.target_argmax(logits)
        assert got.shape == (b, n) and got.dtype == torch.int64
        assert torch.equal(got, logits.argmax(-1)), (b, n, V)


def test_top_chain_counts_by_hand():
    """topk 2: flat candidates 0, 1 (the root's children c = 0, 1), then 2 + 4(s-1) + 2j + c
    under step s's frontier slot j. The top chain is the c = 0 child at every depth. The
    depth after the last accepted top node counts where the tree verified its top child
    (rejected), or drafted it and cut it (accepted iff its token is the target's there), and
    not where that node was never expanded; grafted nodes are on no drafter chain."""
    flat_tokens = [10, 11, 20, 21, 30, 31, 40, 41, 50, 51]  # by flat index (depth 3 needs all ten)

    def counts(selected, next_token, path, tokens, num_acc, parent_list=(-1, 0, 1), depth=2, with_tokens=True):
        rows = lambda x: x if isinstance(x[0], (list, tuple)) else [x]  # noqa: E731
        selected, next_token, path, tokens = rows(selected), rows(next_token), rows(path), rows(tokens)
        num_acc = num_acc if isinstance(num_acc, list) else [num_acc]
        b = len(selected)
        verified = domino.tree.VerifiedTree(
            [list(p[:k + 1]) for p, k in zip(path, num_acc)], [list(t[:k + 1]) for t, k in zip(tokens, num_acc)],
            [list(r) for r in next_token], [list(r) for r in selected], [list(parent_list)] * b,
            [flat_tokens[:2 + 4 * (depth - 1)]] * b if with_tokens else None)
        out = list(zip(*domino.tree.top_chain_counts(verified, 2)))
        return out if b > 1 else out[0]

    # nodes 1..4 = flat 0, 1, 2, 3: root -> {1 (c0), 2 (c1)}, 1 -> {3 (c0), 4 (c1)}; 5: a graft under 3
    sel, full = [0, 1, 2, 3], [1, 3, -1, -1, -1]
    assert counts(sel, full, [0, 1, 3], [10, 20, 99], 2) == (2, 2)  # the top chain accepted to the last depth
    assert counts(sel, full, [0, 1, 4], [10, 21, 99], 2) == (2, 1)  # on through a sibling: the top child rejected
    assert counts(sel, full, [0, 1, 0], [10, 55, -1], 1) == (2, 1)  # node 1 kept, its top child 3 rejected
    assert counts(sel, full, [0, 2, 0], [11, 99, -1], 1) == (1, 0)  # a sibling at depth 1: the chain failed there
    assert counts(sel, full, [0, 0, 0], [55, -1, -1], 0) == (1, 0)  # nothing accepted
    assert counts([sel, sel], [full, full], [[0, 1, 3], [0, 1, 4]], [[10, 20, 99], [10, 21, 99]],
                  [2, 2]) == [(2, 2), (2, 1)]  # a batch: each row its own
    assert counts(sel, [1, 3, -1, 5, -1, -1], [0, 1, 3, 5], [10, 20, 77, 88], 3) == (2, 2)  # the graft says nothing
    # node 1's top child (flat 2, token 20) cut, its sibling flat 3 kept as node 3
    cut = [0, 1, 3], [1, 3, -1, -1]
    assert counts(*cut, [0, 1, 3], [10, 21, 99], 2) == (2, 1)  # the target's 21 is not the cut 20: rejected
    assert counts(*cut, [0, 1, 0], [10, 20, -1], 1) == (2, 2)  # the target's 20 is the cut top child's: accepted
    assert counts(*cut, [0, 1, 0], [10, 20, -1], 1, with_tokens=False) == (1, 1)  # no candidate tokens: no word
    # the root's top child (flat 0, token 10) cut; nodes 1..3 = flat 1, 4, 5
    assert counts([1, 4, 5], [1, 2, -1, -1], [0, 1, 2], [11, 30, 99], 2) == (1, 0)
    assert counts([1, 4, 5], [1, 2, -1, -1], [0, 0, 0], [10, -1, -1], 0) == (1, 1)
    # depth 3, step 2's frontier = flat 4, 5 (under flat 1): node 2 = flat 2 (under flat 0) was never expanded
    assert counts([0, 2], [1, 2, -1], [0, 1, 2], [10, 20, 99], 2, parent_list=(-1, 0, 1, 4, 5), depth=3) == (2, 2)
    # step 2's frontier holds flat 2 in slot j: its children are flat 6 + 2j + c (tokens 40 + 10j + c); the
    # top one cut, its sibling kept as node 3
    for j, frontier in ((0, (2, 5)), (1, (5, 2))):
        kw = dict(parent_list=(-1, 0, 1, *frontier), depth=3)
        sel, links = [0, 2, 7 + 2 * j], [1, 2, 3, -1]
        assert counts(sel, links, [0, 1, 2, 3], [10, 20, 41 + 10 * j, 99], 3, **kw) == (3, 2), j
        assert counts(sel, links, [0, 1, 2, 0], [10, 20, 40 + 10 * j, -1], 2, **kw) == (3, 3), j


def _auto_rounds_all_trees(gen, batch: int) -> None:
    """Under "auto", every round of ``gen`` in a call of ``batch`` requests a tree round
    (the choosers of the smaller batch sizes its rounds have once requests finish too)."""
    for size in domino.budget.cost_batch_sizes(batch):
        gen._round_kinds.setdefault(size, domino.round_kind.RoundKindChooser()).choose = lambda: "tree"


@pytest.mark.parametrize("use_head,batch", [(True, 1), (False, 3), (True, 3)])
def test_top_chain_counts_are_what_the_chain_would_have_done(use_head, batch, monkeypatch):
    """In real tree rounds under "auto" (DEFAULT_TREE, cut by the budget, prompt-lookup
    grafts on), the top chain's counts agree with the chain the drafter drafts from the same
    state, checked against the target's own greedy continuation: the accepted count is the
    chain's where one more depth was tried, and at most the chain's where it was not."""
    # a small vocabulary, and a drafter seed whose top chain is right now and then (25-70 accepted drafts
    # over the three cases, against 1-3 with the default seed)
    gen = tiny_generator("qwen3", vocab=SMALL_V, seed=4)
    # verifying costs 1 ms a token more, a plain step twice a small verification: trees are drafted and cut
    rig_round_costs(gen, batch, RoundCosts(tuple([0.0, 20.0] + [8.0 + t for t in range(2, 33)]),
                                           tuple([0.0] + [0.05 * n for n in range(1, 16)])))
    _auto_rounds_all_trees(gen, batch)
    tree_round, top_chain_counts = gen._tree_round, domino.generate.top_chain_counts
    pending, seen = [], []

    def spying_tree_round(st, sampling, use_head_, shape, *a, **kw):
        chain = gen.drafter.draft(gen._drafter_context(st), st.anchor, st.anchor_pos, use_head=use_head_).tokens
        pending.append((chain.tolist(), st.anchor_pos.tolist(), list(st.rows)))
        try:
            return tree_round(st, sampling, use_head_, shape, *a, **kw)
        finally:
            pending.clear()

    def spying_counts(verified, *a):
        tried, acc = top_chain_counts(verified, *a)
        seen.append((*pending[0], tried, acc, len(verified.next_token[0])))
        return tried, acc

    gen._tree_round = spying_tree_round
    monkeypatch.setattr(domino.generate, "top_chain_counts", spying_counts)
    rows, cut_trees, evidence = 0, 0, {"accepted": 0, "rejected": 0}
    n = 64
    for seed in (21, 22, 23):
        ps = prompts(batch, seed=seed, vocab=SMALL_V)
        full = [p + t for p, t in zip(ps, greedy_plain(gen, ps, n + 8))]  # the target's own continuation
        seen.clear()
        res = gen.generate(ps, max_new_tokens=n, use_head=use_head)
        assert res.token_ids == [t[len(p):len(p) + n] for p, t in zip(ps, full)]
        for chain, anchor_pos, requests, tried, acc, nodes in seen:
            cut_trees += nodes < 1 + tree_size(3, 4)
            for s, request in enumerate(requests):  # row s decodes request ``request``
                truth = 0
                while truth < 4 and chain[s][truth] == full[request][anchor_pos[s] + 1 + truth]:
                    truth += 1
                assert acc[s] <= tried[s] <= 4 and acc[s] <= truth
                if tried[s] > acc[s]:
                    assert acc[s] == truth, (chain[s][:4], full[request][anchor_pos[s] + 1:anchor_pos[s] + 5], tried[s])
                evidence["accepted"] += acc[s]
                evidence["rejected"] += tried[s] > acc[s]
                rows += 1
    # not vacuous: both kinds of evidence, in trees the budget cut
    assert rows >= 30 and cut_trees >= 10 and evidence["accepted"] >= 10 and evidence["rejected"] >= 30, (
        rows, cut_trees, evidence)


def test_tree_rounds_count_their_top_chain_in_the_chains_acceptance(monkeypatch):
    """Under "auto", a tree round's top-chain counts go into the chain rounds' acceptance
    (else, where the prior plans no chain drafts, chain rounds would stay plain steps and
    the chooser would weigh trees against plain steps), and only there; a tree round the
    budget makes a plain step lets the chain's evidence fade as the tree's."""
    gen = tiny_generator("qwen3")
    cheap_verification(gen, 2)
    made = []

    class Recorded(domino.budget.DepthAcceptance):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.calls = []
            made.append(self)

        def update(self, verified, accepted):
            self.calls.append((list(verified), list(accepted)))
            super().update(verified, accepted)

    monkeypatch.setattr(domino.generate, "DepthAcceptance", Recorded)
    top_chain_counts, counted = domino.generate.top_chain_counts, []

    def spying_counts(*a):
        tried, acc = top_chain_counts(*a)
        counted.append((tried, acc))
        return tried, acc

    monkeypatch.setattr(domino.generate, "top_chain_counts", spying_counts)
    _auto_rounds_all_trees(gen, 2)
    ps = prompts(2, seed=4)
    res = gen.generate(ps, max_new_tokens=24)
    assert res.token_ids == greedy_plain(gen, ps, 24)
    tree_kind, chain_kind = made[:2]  # _speculative makes one per round kind, in ROUND_KINDS order
    assert domino.round_kind.ROUND_KINDS == ("tree", "chain")
    assert len(counted) == len(tree_kind.calls) > 3  # every round a drafted tree
    # a finished sequence leaves the batch: each round's counts are its rows'
    assert [len(tried) for tried, _ in counted] == [sum(r < len(v) for v in res.verified_lengths)
                                                    for r in range(len(counted))]
    assert chain_kind.calls == counted
    # nothing pays: every tree round a plain step, and the chain's counts fade with the tree's
    made.clear()
    rig_round_costs(gen, 2, flat_costs(10.0, 100.0, 50.0))
    res = gen.generate(ps, max_new_tokens=8)
    assert max(v for row in res.verified_lengths for v in row) == 1 and made[0].calls
    assert made[1].calls == [([0] * len(v), [0] * len(v)) for v, _ in made[0].calls]
    # an explicit tree has no chain rounds to inform
    made.clear()
    cheap_verification(gen, 2)
    gen.generate(ps, max_new_tokens=8, tree=domino.tree.DEFAULT_TREE)
    assert made[1].calls == []


@pytest.mark.parametrize("costs,expect", [
    (flat_costs(10.0, 10.0, 0.0), "trees"),  # verifying more is free: a tree every round
    (flat_costs(10.0, 100.0, 50.0), "plain"),  # no draft ever pays: plain steps, nothing drafted
    (flat_costs(10.0, 12.0, 1.0), "trees, then plain"),  # pays at the prior's 0.5, not at what it sees
])
def test_adaptive_tree_is_planned_before_drafting(costs, expect):
    """The adaptive tree plans each round from the acceptance seen so far before drafting, as
    the chain does: where no draft is worth its cost the round is a plain step (and nothing
    is drafted); the output is the target's greedy decoding whatever the plan."""
    gen = tiny_generator("qwen3")
    ps = prompts(1, seed=5)
    gen._costs[1] = costs
    trees = []
    real = gen.drafter.draft_tree
    gen.drafter.draft_tree = lambda *a, **kw: trees.append(1) or real(*a, **kw)
    spec = gen.generate(ps, max_new_tokens=40, tree=TreeShape(2, 3), lookup_tokens=0)
    assert spec.token_ids == greedy_plain(gen, ps, 40)
    drafted = [x > 1 for x in spec.verified_lengths[0]]
    assert len(trees) == sum(drafted)  # a tree was drafted exactly in the rounds that verified one
    # (after plain rounds the seen acceptance fades back to the prior, and the plan may
    # draft again: tests/test_budget.py)
    assert {"trees": all(drafted), "plain": not any(drafted), "trees, then plain": drafted[0] and not all(drafted)}[expect]


def test_stop_conditions_and_streaming():
    """Rigged trees whose path is always right: every round accepts 3 drafts and adds the
    target's token (4 tokens), so the EOS, the stop string and the token limit each fall
    inside a round, where the tokens accepted past them must be dropped."""
    gen = tiny_generator("qwen3")
    p = prompts(1, seed=5)[0]  # its plain[4:6] occurs first there, as the cuts below need
    shape = every_node(2, 3)
    plain = greedy_plain(gen, p, 30)
    rig = RiggedTree(gen, [p + plain])
    try:
        streamed = []
        res = gen.generate(p, max_new_tokens=30, tree=shape, stream=lambda i, ids: streamed.extend(ids))
        assert streamed == res.token_ids == plain
        assert res.acceptance_lengths[:-1] == [4] * (len(res.acceptance_lengths) - 1)
        eos_at = plain.index(plain[9])
        assert eos_at % 4 != 3  # mid-round: the round that reaches it accepts tokens past it
        gen.eos_ids = [plain[9]]
        assert gen.generate(p, max_new_tokens=30, tree=shape).token_ids == plain[: eos_at + 1]
        gen.eos_ids = []
        stop = " ".join(str(t) for t in plain[4:6])  # completed by token 5, mid-round (tokens 4-7)
        res = gen.generate(p, max_new_tokens=30, stop=[stop], tree=shape)
        assert res.token_ids == plain[:6] and stop not in res.text
        assert gen.generate(p, max_new_tokens=7, tree=shape).token_ids == plain[:7]  # mid-round limit
    finally:
        rig.restore()


# ---- sampling: distributed as the target ----------------------------------------------

def _with_tree(gen, shape, use_head):
    original = gen.generate
    # check() passes a chain's num_drafts: a tree has its own size
    gen.generate = lambda *a, num_drafts=None, **k: original(*a, tree=shape, use_head=use_head, **k)
    return gen


def _sampled_tree_generator(use_head, shape=TreeShape(2, 2)):
    """The tiny target (V = 8) with a drafter whose distributions are peaked (its final
    norm's weight doubled), as a trained drafter's are: then drawing a node's children
    without replacement matters (the second child's draft probability is renormalised by
    the first's), and the tests below catch a verifier that forgets it (with the random
    drafter's flat distributions no check saw it, p > 1e-3, even at N = 15000)."""
    gen = tiny_generator("qwen3", vocab=SMALL_V, block_size=4, seed=3)
    with torch.no_grad():
        gen.drafter.norm.weight.mul_(2.0)
    return _with_tree(gen, shape, use_head)


@pytest.mark.parametrize("temperature,top_k,top_p,use_head", [(1.0, 0, 1.0, True), (0.7, 4, 0.9, False)])
def test_sampled_tree_matches_target(temperature, top_k, top_p, use_head):
    res = check(_sampled_tree_generator(use_head), temperature, top_k, top_p, N=3000)
    lens = [a for seq in res.acceptance_lengths for a in seq]
    assert 1 in lens and 2 in lens and max(lens) > 2  # rejected, partly and fully accepted paths


def test_sampled_tree_of_depth_one_matches_target():
    """A sampled tree one depth deep (the root's three children, drawn without replacement:
    the tree's draft rows then hold the root's alone, a lookup that once failed) follows
    the target too."""
    res = check(_sampled_tree_generator(True, TreeShape(3, 1)), 1.0, 0, 1.0, N=3000)
    lens = [a for seq in res.acceptance_lengths for a in seq]
    assert set(lens) == {1, 2}  # a child accepted or none, then the target's token


def test_biased_draft_probabilities_are_caught(monkeypatch):
    """Negative control: verifying with draft probabilities that are not the ones the
    children were drawn from (uniform ones) fails the same test."""
    verify = domino_ops.verify_tree_sampling

    def uniform_q(*args):
        q = torch.where(args[-1] > 0, 1.0 / args[-1].shape[-1], 0.0)
        return verify(*args[:-1], q)

    monkeypatch.setattr(domino.tree.domino_ops, "verify_tree_sampling", uniform_q)
    with pytest.raises(AssertionError, match="chi-square|zero probability"):
        check(_sampled_tree_generator(True), 1.0, 0, 1.0, N=3000)


def test_forgetting_that_siblings_are_drawn_without_replacement_is_caught(monkeypatch):
    """Negative control: a verifier that tests a node's second child against the draft
    distribution with the rejected first child still in it (the reference verifier without
    its draft update, reference_tree.next_draft) over-accepts second children and fails the
    same test at the same N."""
    from domino_ops import reference_tree

    monkeypatch.setattr(reference_tree, "next_draft", lambda q, x: (q, reference_tree._total(q)))
    monkeypatch.setattr(domino.tree.domino_ops, "verify_tree_sampling", reference_tree.verify_tree_sampling)
    with pytest.raises(AssertionError, match="chi-square|zero probability"):
        check(_sampled_tree_generator(True), 1.0, 0, 1.0, N=3000)


# Three requests' parameters, a batch cycling through them: two sampled ones, one greedy.
MIXED = [(1.0, 0, 1.0), (0.7, 4, 0.9), (0.0, 0, 1.0)]


def _mixed_tree_batch(N):
    gen = _with_tree(tiny_generator("qwen3", vocab=SMALL_V, block_size=4, seed=3), TreeShape(2, 2), True)
    sampling = [domino.SamplingParams(*MIXED[i % len(MIXED)]) for i in range(N)]
    res = gen.generate([PROMPT] * N, max_new_tokens=3, sampling=sampling, generator=torch.Generator().manual_seed(0))
    return gen, np.array(res.token_ids), res


def test_sampled_tree_with_per_request_parameters_matches_target():
    """One sampled tree per round for a batch whose requests each keep their own temperature,
    top-k and top-p: every request's tokens follow its own filtered target distribution,
    and the greedy requests' are the target's greedy tokens."""
    N = 4500
    gen, toks, res = _mixed_tree_batch(N)
    assert toks.shape == (N, 3)
    for j, (temperature, top_k, top_p) in enumerate(MIXED[:2]):
        assert_distributed_as_target(gen, toks[j::len(MIXED)], temperature, top_k, top_p, label=f"request kind {j}: ")
    greedy = gen.generate_target_only(PROMPT, max_new_tokens=3).token_ids
    assert all(row.tolist() == greedy for row in toks[2::len(MIXED)])
    lens = [a for seq in res.acceptance_lengths for a in seq]
    assert 1 in lens and max(lens) > 1


def test_per_request_parameters_are_needed_for_the_target_distribution(monkeypatch):
    """Negative control: the target's distribution filtered with the first request's
    parameters for every row (what ignoring per-request parameters would do) fails the
    test above for the requests that have other parameters."""
    def first_rows_parameters(self):
        def first(x):
            return float(x[0]) if x.dtype.is_floating_point else int(x[0])
        return {k: first(v) if isinstance(v, torch.Tensor) else v
                for k, v in dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p).items()}

    monkeypatch.setattr(RowSampling, "filter_kwargs", first_rows_parameters)
    gen, toks, _ = _mixed_tree_batch(3000)
    with pytest.raises(AssertionError, match="chi-square|zero probability"):
        assert_distributed_as_target(gen, toks[1::len(MIXED)], *MIXED[1])


def test_greedy_rows_of_a_sampled_tree_accept_a_sibling():
    """verify_tree on a sampled tree whose second sequence is greedy: where the target's
    argmax at the root is the root's second child, that row accepts it (rejection sampling
    against the row's one-hot draft distributions would accept the top child or nothing),
    while the sampled row is verified by rejection sampling."""
    from kernel_cases import head_rollout_inputs

    inputs = head_rollout_inputs(2, 2, 12, 4, 6, 4, torch.float32, torch.float32, True, seed=2)
    sampling = RowSampling(torch.tensor([0.9, 0.0]), 0, 1.0, torch.Generator().manual_seed(1), True)
    tree = domino_ops.draft_tree(*inputs, torch.tensor([1, 2]), topk=2, depth=2, **sampling.op_kwargs())
    links = domino.tree.tree_links(tree, torch.tensor([5, 7]), 2, 2)
    n = tree.candidates.shape[1]
    logits = torch.randn(2, n, 12, generator=torch.Generator().manual_seed(3))
    logits[1, 0, tree.candidates[1, 2]] = 30.0  # the greedy row's target picks the root's second child
    verified = domino.tree.verify_tree(tree, links, logits, sampling, 2)
    path, tokens = verified.path[1], verified.tokens[1]
    assert len(path) >= 2 and path[1] == 2 and tokens[0] == int(tree.candidates[1, 2])
    assert len(tokens) == len(path) and tokens[-1] == int(logits[1, path[-1]].argmax())


def test_a_seeded_request_in_a_sampled_tree_gives_the_same_tokens_alone_and_in_a_batch():
    """Sampled trees draw each request's randomness from its own seed (the drafting's
    uniforms per sequence, the verification's per row): a seeded request's tokens do not
    depend on the requests beside it."""
    gen = tiny_generator("llama")
    kw = dict(max_new_tokens=12, tree=TreeShape(2, 3))
    seeded = domino.SamplingParams(temperature=0.9, top_k=20, seed=11)
    alone = gen.generate(PROMPT, sampling=seeded, **kw).token_ids
    batch = gen.generate([[7, 8, 9, 10, 11], PROMPT, [4, 4]],
                         sampling=[domino.SamplingParams(temperature=1.2, seed=3), seeded, domino.SamplingParams()],
                         generator=torch.Generator().manual_seed(1), **kw).token_ids
    assert batch[1] == alone and len(alone) == 12
    assert batch[2] == gen.generate([4, 4], max_new_tokens=12, tree=TreeShape(2, 3)).token_ids  # greedy, exact
    other_seed = gen.generate(PROMPT, sampling=dataclasses.replace(seeded, seed=12), **kw).token_ids
    assert other_seed != alone


def test_sampled_tree_runs_with_one_generator_and_is_reproducible():
    gen = tiny_generator("llama")
    ps = prompts(2, seed=3)
    kw = dict(max_new_tokens=12, temperature=0.8, top_k=20, tree=TreeShape(2, 3))
    a = gen.generate(ps, generator=torch.Generator().manual_seed(5), **kw)
    b = gen.generate(ps, generator=torch.Generator().manual_seed(5), **kw)
    assert a.token_ids == b.token_ids and all(len(t) == 12 for t in a.token_ids)


# ---- arguments ------------------------------------------------------------------------

@pytest.mark.parametrize("make,msg", [
    (lambda: TreeShape(0, 2), "topk must be"),
    (lambda: TreeShape(2, 0), "depth must be"),
    (lambda: TreeShape(True, 2), "topk must be"),
    (lambda: TreeShape(2, 2, num_draft_tokens=8), r"num_draft_tokens must be in \[2, 7\]"),
    (lambda: TreeShape(2, 2, num_draft_tokens=1), r"num_draft_tokens must be in \[2, 7\]"),
])
def test_bad_tree_shapes(make, msg):
    with pytest.raises(ValueError, match=msg):
        make()


@pytest.mark.parametrize("kw,msg", [
    (dict(tree=TreeShape(2, 8)), r"depth must be at most the drafter's num_drafts \(7\)"),
    (dict(tree=(2, 3)), "tree must be a domino.TreeShape"),
    (dict(tree=TreeShape(2, 3, 5), temperature=0.8), "num_draft_tokens must be None"),
])
def test_bad_tree_arguments(kw, msg):
    gen = tiny_generator("qwen3")
    with pytest.raises(ValueError, match=msg):
        gen.generate(prompts(2), max_new_tokens=4, **kw)


def test_attention_without_4d_masks_is_refused():
    gen = tiny_generator("qwen3")
    gen.target.config._attn_implementation = "flash_attention_2"  # not installed here: only the check runs
    with pytest.raises(ValueError, match="attention implementation"):
        gen.generate(prompts(1), max_new_tokens=4, tree=TreeShape(2, 2))


def test_greedy_batch_with_per_request_seeds_is_fine():
    gen = tiny_generator("qwen3")
    ps = prompts(2, seed=8)
    params = [domino.SamplingParams(seed=1), domino.SamplingParams(seed=2)]
    assert gen.generate(ps, max_new_tokens=10, sampling=params, tree=TreeShape(2, 2)).token_ids == \
        greedy_plain(gen, ps, 10)


@pytest.mark.parametrize("kw,tree_rounds", [(dict(), True), (dict(temperature=0.8), False),
                                             (dict(num_drafts=3), False), (dict(tree=None), False)])
def test_auto_drafts_the_default_tree_when_greedy_and_a_chain_otherwise(kw, tree_rounds):
    """generate's default (tree="auto"): DEFAULT_TREE's rounds (the first round is one; later
    ones may be chains, by measured speed) when every request is greedy, chain rounds only
    when one samples, when num_drafts is given, or with tree=None; greedy output is the
    target's own either way."""
    gen = tiny_generator("qwen3")
    cheap_verification(gen, 1)
    shapes = []
    tree_round = gen._tree_round
    gen._tree_round = lambda st, sampling, use_head, shape, *a, **kw: shapes.append(shape) or tree_round(
        st, sampling, use_head, shape, *a, **kw)
    ps = prompts(1, seed=5)
    res = gen.generate(ps, max_new_tokens=24, generator=torch.Generator().manual_seed(0), **kw)
    assert bool(shapes) == tree_rounds and all(s == domino.tree.DEFAULT_TREE for s in shapes)
    if "temperature" not in kw:
        assert res.token_ids == greedy_plain(gen, ps, 24)


@pytest.mark.parametrize("fast", ["tree", "chain"])
def test_auto_plays_the_round_kind_that_measures_faster(fast):
    """Greedy "auto": each round a DEFAULT_TREE round or an adaptive chain round, by the
    tokens per millisecond each kind has kept (rigged here: the other kind 'costs' 10x);
    after the warm-up the faster kind takes most rounds, the output is the target's own
    either way, and the chooser is kept for the next call at this batch size."""
    gen = tiny_generator("qwen3")
    cheap_verification(gen, 1)
    kinds, inside_tree = [], []  # the rounds played; a tree round that plans no drafts runs a chain round inside
    tree_round, chain_round = gen._tree_round, gen._chain_round

    def counted_tree_round(*a, **kw):
        kinds.append("tree")
        inside_tree.append(True)
        try:
            return tree_round(*a, **kw)
        finally:
            inside_tree.pop()

    def counted_chain_round(*a):
        if not inside_tree:
            kinds.append("chain")
        return chain_round(*a)

    gen._tree_round, gen._chain_round = counted_tree_round, counted_chain_round
    chooser = gen._round_kinds.setdefault(1, domino.round_kind.RoundKindChooser(warmup=1, explore_every=4))
    record = chooser.record
    chooser.record = lambda kind, tokens, ms: record(kind, tokens, 1.0 if kind == fast else 10.0)
    ps = prompts(1, seed=5)
    res = gen.generate(ps, max_new_tokens=40)
    assert res.token_ids == greedy_plain(gen, ps, 40)
    assert kinds[:2] == ["tree", "chain"] and kinds[2:].count(fast) > 2 * kinds[2:].count(
        next(k for k in ("tree", "chain") if k != fast))
    first_call = len(kinds)
    assert sum(chooser.rounds.values()) == first_call  # every round timed and recorded
    assert gen.generate(ps, max_new_tokens=8).token_ids == greedy_plain(gen, ps, 8)
    assert gen._round_kinds[1] is chooser and sum(chooser.rounds.values()) == len(kinds) > first_call


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_auto_switching_kinds_every_round_keeps_a_batch_exact(kind):
    """A batch under "auto" with the kind switching every round (a look at the other kind
    after every round of the leader): the caches a tree round leaves (compacted paths,
    masked holes) serve the next chain round and back; the output is the target's own."""
    gen = tiny_generator(kind)
    cheap_verification(gen, 3)
    chooser = gen._round_kinds.setdefault(3, domino.round_kind.RoundKindChooser(warmup=1, explore_every=1,
                                                                                max_explore_every=1))
    ps = prompts(3, seed=11)
    assert gen.generate(ps, max_new_tokens=30).token_ids == greedy_plain(gen, ps, 30)
    assert min(chooser.rounds.values()) >= 3


def test_auto_falls_back_to_the_chain_where_a_tree_cannot_run():
    """No tree mask in the target's attention, or a drafter block shorter than the default
    tree's depth: "auto" drafts chains (explicit trees raise there)."""
    gen = tiny_generator("qwen3", block_size=3)
    assert gen._default_tree([domino.SamplingParams()], None) is None
    gen = tiny_generator("qwen3")
    assert gen._default_tree([domino.SamplingParams()], None) == domino.tree.DEFAULT_TREE
    gen.target.config._attn_implementation = "flash_attention_2"
    assert gen._default_tree([domino.SamplingParams()], None) is None
