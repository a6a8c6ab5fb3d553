"""Prompt lookup grafted onto greedy tree rounds (domino.lookup, domino.tree.graft_chains):
the n-gram index against a brute-force scan, the graft against a parent-pointer oracle,
and the engine's output still exactly the target's greedy decoding."""

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino import TreeShape
from domino.lookup import NGRAM_SIZES, NgramIndex
from domino.tree import graft_chains, tree_links
from domino_ops.tree_draft import DraftTree
from engine_cases import cheap_verification, count_grafts, prompts
from tiny_models import tiny_generator
from tree_cases import random_eagle_draft


def brute_force_proposal(tokens, max_tokens, sizes=NGRAM_SIZES):
    """The tokens after the latest earlier occurrence of the longest suffix n-gram."""
    for n in sizes:
        if len(tokens) < n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # an occurrence with a token after it
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + max_tokens]
    return []


@pytest.mark.parametrize("sizes", [NGRAM_SIZES, (3, 2)])  # the default, and one lookup_replay.py compares
@given(tokens=st.lists(st.integers(0, 4), max_size=60), cuts=st.lists(st.integers(0, 60), max_size=4),
       max_tokens=st.integers(0, 12))
def test_ngram_index_matches_a_brute_force_scan(sizes, tokens, cuts, max_tokens):
    """Whatever pieces the tokens arrive in, every proposal is the brute-force scan's."""
    bounds = sorted({min(c, len(tokens)) for c in cuts} | {len(tokens)})
    index = NgramIndex(tokens[:bounds[0]], sizes)
    assert index.propose(max_tokens) == brute_force_proposal(tokens[:bounds[0]], max_tokens, sizes)
    for lo, hi in zip(bounds, bounds[1:]):
        index.extend(tokens[lo:hi])
        assert index.tokens == tokens[:hi]
        assert index.propose(max_tokens) == brute_force_proposal(tokens[:hi], max_tokens, sizes)


def test_ngram_index_proposal_has_teeth():
    index = NgramIndex([7, 1, 2, 3, 9, 9, 5, 1, 2, 3])
    assert index.propose(3) == [9, 9, 5]  # after the earlier "1 2 3"
    index.extend([8, 1, 2, 3])
    assert index.propose(2) == [8, 1]  # the latest earlier occurrence wins
    assert NgramIndex([1, 2, 3]).propose(4) == []
    # the longest suffix that occurred before wins over a later occurrence of a shorter one:
    # "4 5 1 2 3" occurred once (then 6), "2 3" most recently (then 7)
    longest = NgramIndex([4, 5, 1, 2, 3, 6, 0, 2, 3, 7, 4, 5, 1, 2, 3])
    assert max(NGRAM_SIZES) >= 5 and longest.propose(2) == [6, 0]
    # propose_match also says how long the matched suffix was: 5 here (the 6-token suffix
    # "7 4 5 1 2 3" never occurred before), 3 after "1 2 3" alone, 0 without a match
    assert longest.propose_match(2) == ([6, 0], 5)
    assert index.propose_match(2) == ([8, 1], 3)
    assert NgramIndex([1, 2, 3]).propose_match(4) == ([], 0)
    assert index.propose_match(0) == ([], 0)


def reachable(nxt, sib, parents_out, node=0, depth=0, depths=None):
    """Parent and depth of every node reachable from the root by the verify ops' links."""
    depths = {0: 0} if depths is None else depths
    child = nxt[node]
    while child != -1:
        parents_out[child] = node
        depths[child] = depth + 1
        reachable(nxt, sib, parents_out, child, depth + 1, depths)
        child = sib[child]
    return depths


def token_paths(cand, parents, nodes):
    """The root-to-node token sequence of each node (root excluded)."""
    out = {}
    for v in nodes:
        path, u = [], v
        while u != 0:
            path.append(cand[u])
            u = parents[u]
        out[v] = tuple(reversed(path))
    return out


@given(seed=st.integers(0, 2**31 - 1), topk=st.integers(1, 3), depth=st.integers(1, 4), bs=st.integers(1, 3),
       max_depth=st.integers(1, 9))
def test_graft_matches_a_parent_pointer_oracle(seed, topk, depth, bs, max_depth):
    rng = random.Random(seed)
    total = topk + (depth - 1) * topk * topk
    n = rng.randint(1, total + 1)
    parent_list, selected, parents = random_eagle_draft(rng, bs, topk, depth, n)
    cand = torch.tensor([[rng.randrange(3) for _ in range(n)] for _ in range(bs)], dtype=torch.int64)
    tree = DraftTree(parent_list, selected, cand, None)
    anchor_pos = torch.tensor([rng.randrange(5, 50) for _ in range(bs)])
    links = tree_links(tree, anchor_pos, topk, depth)
    old_paths = [token_paths(cand[s].tolist(), parents[s], range(1, n)) for s in range(bs)]
    chains = []
    for s in range(bs):  # follow an existing path a while, then new tokens (or nothing at all)
        start = list(old_paths[s][rng.randrange(1, n)]) if n > 1 and rng.random() < 0.7 else []
        chains.append(start[:rng.randint(0, len(start))] + [rng.randrange(3) for _ in range(rng.randint(0, 6))])
    new_cand, new_links, deepest = graft_chains(cand, links, chains, max_depth)
    N = new_cand.shape[1]
    assert torch.equal(new_cand[:, :n], cand)
    deepest_seen = 0
    for s in range(bs):
        nxt, sib = new_links.next_token[s].tolist(), new_links.next_sibling[s].tolist()
        par = {}
        depths = reachable(nxt, sib, par)
        assert all(par[v] == parents[s][v] for v in range(1, n))  # the drafted tree is unchanged
        c = new_cand[s].tolist()
        paths = token_paths(c, par, [v for v in depths if v != 0])
        # what it holds now: the drafted paths and the chain's prefixes down to max_depth
        want = set(old_paths[s].values()) | {tuple(chains[s][:i]) for i in range(1, min(len(chains[s]), max_depth) + 1)}
        assert set(paths.values()) == want
        for v, d in depths.items():  # ancestors: the node's own path; positions: its depth
            row = new_links.ancestors[s, v].nonzero().flatten().tolist()
            u, anc = v, {v}
            while u != 0:
                u = par[u]
                anc.add(u)
            assert sorted(row) == sorted(anc)
            assert new_links.positions[s, v] == anchor_pos[s] + d
            deepest_seen = max(deepest_seen, d)
        for v in range(N):  # padding nodes: reached by no link, see the root and themselves
            if v not in depths:
                assert v >= n and new_links.ancestors[s, v].nonzero().flatten().tolist() == [0, v]
        assert new_links.retrive_index[s].tolist() == [s * N + v for v in range(N)]
    assert deepest == deepest_seen  # what verification sizes its accepted paths by


def test_verification_walks_a_grafted_chain():
    """A target that continues along the chain accepts all of it through verify_tree_greedy."""
    rng = random.Random(3)
    parent_list, selected, _ = random_eagle_draft(rng, 1, 2, 3, 5)
    cand = torch.tensor([[9, 1, 2, 3, 4]])
    links = tree_links(DraftTree(parent_list, selected, cand, None), torch.tensor([10]), 2, 3)
    chain = [7, 8, 6]
    cand2, links2, deepest = graft_chains(cand, links, [chain], 8)
    assert deepest >= 3 and cand2.shape[1] == 8
    N = cand2.shape[1]
    node_of = {7: 5, 8: 6, 6: 7}
    target = torch.full((1, N), 5, dtype=torch.int64)  # after the chain's last node: 5, in no node
    target[0, 0] = 7
    target[0, 5], target[0, 6] = 8, 6
    predicts = torch.empty(N, dtype=torch.int32)
    accept_index = torch.empty(1, deepest + 1, dtype=torch.int32)
    accept_num = torch.empty(1, dtype=torch.int32)
    domino_ops.verify_tree_greedy(predicts, accept_index, accept_num, cand2, links2.retrive_index,
                                  links2.next_token, links2.next_sibling, target)
    assert accept_num.item() == 3
    assert accept_index[0, :4].tolist() == [0, node_of[7], node_of[8], node_of[6]]


@pytest.mark.parametrize("kind,batch,shape", [("qwen3", 1, TreeShape(2, 3)), ("llama", 3, TreeShape(3, 2, 5)),
                                              ("qwen3", 3, TreeShape(1, 4))])
def test_engine_with_lookup_is_plain_greedy_and_grafts(kind, batch, shape, monkeypatch):
    gen = tiny_generator(kind)
    cheap_verification(gen, batch)
    ps = prompts(batch, seed=11)
    grafted = count_grafts(monkeypatch)
    plain = gen.generate_target_only(ps, max_new_tokens=40).token_ids
    spec = gen.generate(ps, max_new_tokens=40, tree=shape, lookup_tokens=6)
    assert spec.token_ids == plain
    assert sum(grafted) > 0, "the tiny models' repetitive output should have given lookup something to graft"
    assert all(g <= 6 for g in grafted)
    grafted.clear()
    assert gen.generate(ps, max_new_tokens=40, tree=shape, lookup_tokens=0).token_ids == plain
    assert not grafted  # off: nothing grafted
    sampled = gen.generate(ps, max_new_tokens=8, tree=None, temperature=0.8, lookup_tokens=6)  # chains: never
    assert not grafted and len(sampled.token_ids) == batch


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_lookup_tokens(bad):
    gen = tiny_generator("qwen3")
    with pytest.raises(ValueError, match="lookup_tokens must be an int >= 0"):
        gen.generate(prompts(1), max_new_tokens=4, lookup_tokens=bad)


@pytest.mark.parametrize("prior,expect", [(0.99, "some"), (0.001, "none")])
def test_the_budget_cuts_grafts_that_do_not_pay(prior, expect, monkeypatch):
    """With the adaptive budget a graft is cut to the new tokens worth their verification:
    with verification nearly free, a lookup believed right (the prior of a call's graft
    acceptance) is grafted, one believed wrong is not; the output is the target's either way."""
    import domino.generate

    gen = tiny_generator("qwen3")
    cheap_verification(gen, 1)
    ps = prompts(1, seed=11)
    for kind in ("lookup-long", "lookup-short"):
        monkeypatch.setitem(domino.generate.GRAFT_PRIOR, kind, prior)
    proposed = []
    real_propose = NgramIndex.propose_match

    def recording(self, n):
        got = real_propose(self, n)
        proposed.append(got[0])
        return got

    monkeypatch.setattr(NgramIndex, "propose_match", recording)
    grafted = count_grafts(monkeypatch)
    plain = gen.generate_target_only(ps, max_new_tokens=40).token_ids
    assert gen.generate(ps, max_new_tokens=40, tree=TreeShape(2, 3), lookup_tokens=6,
                        datastore_tokens=0).token_ids == plain
    assert any(proposed), "the tiny model's repetitive output should have given lookup something to propose"
    assert (sum(grafted) > 0) == (expect == "some"), grafted


def _recording_graft_counters(monkeypatch):
    """Replaces the engine's per-kind graft counters by ones recording every update as
    (kind, verified, accepted); returns the list they append to."""
    import domino.generate
    from domino.budget import DepthAcceptance

    updates = []

    class Recording(DepthAcceptance):
        def update(self, verified, accepted):
            updates.append((self.kind, list(verified), list(accepted)))
            super().update(verified, accepted)

    def recording_counters(lookup_tokens, datastore_tokens):
        counters = {}
        for kind, prior in domino.generate.GRAFT_PRIOR.items():
            counters[kind] = Recording(max(lookup_tokens, datastore_tokens, 1), prior)
            counters[kind].kind = kind
        return counters

    monkeypatch.setattr(domino.generate, "new_graft_acceptance", recording_counters)
    return updates


@pytest.mark.parametrize("wrong_at", [None, 0, 2])
def test_graft_acceptance_counts_the_new_nodes_on_the_accepted_path(wrong_at, monkeypatch):
    """The engine's per-kind counts: a lookup chain that is the target's own continuation
    (rigged) is counted accepted up to its first wrong token (none, the first, the third),
    under the kind of its match (12 tokens: a long match)."""
    gen = tiny_generator("qwen3")
    cheap_verification(gen, 1)
    ps = prompts(1, seed=3)
    plain = gen.generate_target_only(ps, max_new_tokens=30).token_ids[0]
    prompt_len = len(ps[0])

    def rigged(self, n):  # the target's next tokens, one of them made wrong
        at = len(self.tokens) - prompt_len
        chain = list(plain[at:at + n])
        if wrong_at is not None and wrong_at < len(chain):
            chain[wrong_at] = (chain[wrong_at] + 1) % 64
        return chain, 12

    monkeypatch.setattr(NgramIndex, "propose_match", rigged)
    updates = _recording_graft_counters(monkeypatch)
    spec = gen.generate(ps, max_new_tokens=30, tree=TreeShape(2, 3), lookup_tokens=4, datastore_tokens=0).token_ids
    assert spec[0] == plain
    offered = [(kind, v, a) for kind, v, a in updates if v and v[0]]
    assert offered, "the lookup should have offered new tokens"
    assert {kind for kind, _, _ in offered} == {"lookup-long"}
    for _, (v,), (a,) in offered:
        # the new tokens start where the chain leaves the drafter's tree: at most the first
        # wrong token's place, and all of them when none is wrong
        assert a <= v and (a == v if wrong_at is None else a <= wrong_at), (v, a)
    if wrong_at is not None:
        assert any(a < v for _, (v,), (a,) in offered)


def test_a_kind_cut_to_nothing_gathers_no_evidence(monkeypatch):
    """A kind of graft the budget cuts away entirely is neither grafted nor counted: its
    counts stay as they were (re-grafting it as its evidence faded measured slower)."""
    import domino.generate

    gen = tiny_generator("qwen3")
    cheap_verification(gen, 1)
    ps = prompts(1, seed=11)
    for kind in ("lookup-long", "lookup-short"):
        monkeypatch.setitem(domino.generate.GRAFT_PRIOR, kind, 0.001)  # believed wrong: always cut
    updates = _recording_graft_counters(monkeypatch)
    grafted = count_grafts(monkeypatch)
    gen.generate(ps, max_new_tokens=40, tree=TreeShape(2, 3), lookup_tokens=6, datastore_tokens=0)
    assert grafted and not any(grafted)  # rounds that grafted, all cut to nothing
    assert not [u for u in updates if u[0].startswith("lookup")]


def test_lookup_graft_kind_splits_at_the_long_match():
    from domino.generate import lookup_graft_kind
    from domino.lookup import LONG_MATCH

    assert LONG_MATCH == 4
    assert [lookup_graft_kind(n) for n in (2, 3, 4, 12)] == ["lookup-short", "lookup-short", "lookup-long",
                                                            "lookup-long"]
