"""Domino tree drafting end to end: draft_tree (expand + frontier selection) -> 
build_tree_kernel_efficient -> verify_tree_greedy / verify_tree_sampling, against a slow
reference written from the description (one node at a time, Python lists, explicit
parent pointers); topk = 1 is the rollout's chain; sampled trees verify losslessly."""

import dataclasses
import warnings

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from domino_ops.tree_draft import candidate_parents, draft_tree, tree_size
from kernel_cases import head_rollout_inputs
from stats import assert_matches_distribution

MARGIN = 1e-3  # near ties may be ordered differently by the kernel's rounding: skip them


def build(tree, seq_lens, topk, depth):
    """build_tree_kernel_efficient on a DraftTree: (retrive_index, next_token, next_sibling)."""
    b, n = tree.candidates.shape
    ridx, nxt, sib = (torch.full((b, n), -9, dtype=torch.long) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an orphan node ("invalid eagle tree") fails the test
        domino_ops.build_tree_kernel_efficient(tree.parent_list, tree.selected_index, seq_lens,
                                               torch.zeros(b * n * n, dtype=torch.bool),
                                               torch.zeros(b * n, dtype=torch.long), ridx, nxt, sib, topk, depth, n, 1)
    return ridx, nxt, sib


def paths(nxt, sib, candidates):
    """Per sequence, each node's token path from the root (root token excluded)."""
    out = []
    for b in range(candidates.shape[0]):
        path = {0: ()}
        stack = [0]
        while stack:
            u = stack.pop()
            c = int(nxt[b, u])
            while c != -1:
                path[c] = path[u] + (int(candidates[b, c]),)
                stack.append(c)
                c = int(sib[b, c])
        out.append([path[u] for u in range(candidates.shape[1])])
    return out


def target_oracle(V, seed):
    """A deterministic 'target': its greedy token after a path (a hash of the path), equal
    to a fixed favourite token half the time so drafts get accepted."""
    def target(path):
        h = hash((seed,) + path) & 0xFFFF
        return h % V if h & 1 else (7 * len(path) + (path[-1] if path else 0)) % V
    return target


# --- the slow reference ------------------------------------------------------------------

def slow_tree(inputs, b_index, topk, depth, n_nodes):
    """One sequence's tree, candidate by candidate: (tokens of the selected candidates in
    ascending flat order, parent node of each node, parent flat index of every candidate
    (-1: the root)). Calls assume(False) on near ties."""
    base, hproj, state, gru_input, w_ih, w_hh, w1s, w2 = inputs
    cand = []  # flat index -> dict(token, score, parent flat (-1 root), state)

    def children(node_state, d):
        t, lp, st_, L = reference.domino_head_expand(
            base, hproj, node_state.view(1, -1), torch.tensor([b_index]), torch.tensor([d]), gru_input, w_ih, w_hh,
            w1s, w2, num_children=topk)
        top = L[0].sort(descending=True).values[:topk + 1]
        assume(len(top) <= topk or float(top[topk - 1] - top[topk]) > MARGIN)
        return t[0].tolist(), lp[0].tolist(), st_[0]

    t, lp, st_ = children(state[b_index], 0)
    for c in range(topk):
        cand.append(dict(token=t[c], score=lp[c], parent=-1, state=st_[c]))
    frontier = list(range(topk))
    for s in range(1, depth):
        step = []
        for f in frontier:
            t, lp, st_ = children(cand[f]["state"], s)
            for c in range(topk):
                step.append(len(cand))
                cand.append(dict(token=t[c], score=cand[f]["score"] + lp[c], parent=f, state=st_[c]))
        ranked = sorted(step, key=lambda i: -cand[i]["score"])
        if len(ranked) > topk:
            assume(cand[ranked[topk - 1]]["score"] - cand[ranked[topk]]["score"] > MARGIN)
        frontier = ranked[:topk]
    ranked = sorted(range(len(cand)), key=lambda i: -cand[i]["score"])
    if n_nodes - 1 < len(ranked):
        assume(cand[ranked[n_nodes - 2]]["score"] - cand[ranked[n_nodes - 1]]["score"] > MARGIN)
    chosen = sorted(ranked[:n_nodes - 1])
    node_of = {f: i + 1 for i, f in enumerate(chosen)}
    parents = [-1] + [0 if cand[f]["parent"] == -1 else node_of[cand[f]["parent"]] for f in chosen]
    return [cand[f]["token"] for f in chosen], parents, [c["parent"] for c in cand]


def slow_verify_greedy(tokens, parents, target, steps):
    """Emitted tokens: from the root, the first child (ascending node order) whose token
    is the target's, at most steps - 1 times, then the target's token."""
    path, node, out = (), 0, []
    while len(out) < steps - 1:
        want = target(path)
        child = next((c for c in range(1, len(parents)) if parents[c] == node and tokens[c - 1] == want), None)
        if child is None:
            break
        out.append(want)
        path += (want,)
        node = child
    return out + [target(path)]


@given(b=st.integers(1, 2), V=st.sampled_from([8, 40]), topk=st.integers(1, 3), depth=st.integers(1, 4),
       extra=st.integers(0, 30), seed=st.integers(0, 2**31 - 1))
def test_greedy_expand_select_build_verify_matches_the_slow_reference(b, V, topk, depth, extra, seed):
    k = 4
    inputs = head_rollout_inputs(b, k, V, 8, 12, 4, torch.float32, torch.float32, seed % 2 == 0, seed)
    n_nodes = min(tree_size(topk, depth) + 1, 2 + extra)
    roots = torch.randint(0, V, (b,), generator=torch.Generator().manual_seed(seed))
    slow = [slow_tree(inputs, i, topk, depth, n_nodes) for i in range(b)]
    tree = draft_tree(*inputs, roots, topk=topk, depth=depth, num_draft_tokens=n_nodes)
    flat_parents = candidate_parents(tree.parent_list, topk, depth)
    for i, (tokens, _, cand_parents) in enumerate(slow):
        assert tree.candidates[i, 1:].tolist() == tokens
        assert tree.candidates[i, 0] == roots[i]
        assert flat_parents[i].tolist() == cand_parents  # every candidate's parent, selected or not
    assert tree.draft_probs is None
    ridx, nxt, sib = build(tree, torch.full((b,), 5), topk, depth)
    target = target_oracle(V, seed)
    node_paths = paths(nxt, sib, tree.candidates)
    target_predict = torch.tensor([[target(p) for p in node_paths[i]] for i in range(b)])
    steps = depth + 1
    predicts = torch.full((b * n_nodes,), -5, dtype=torch.int32)
    accept_index = torch.full((b, steps), -5, dtype=torch.int32)
    accept_num = torch.full((b,), -5, dtype=torch.int32)
    domino_ops.verify_tree_greedy(predicts, accept_index, accept_num, tree.candidates, ridx, nxt, sib,
                                  target_predict)
    for i, (tokens, parents, _) in enumerate(slow):
        want = slow_verify_greedy(tokens, parents, target, steps)
        got = [int(predicts[int(a)]) for a in accept_index[i, :int(accept_num[i]) + 1]]
        assert got == want


@pytest.mark.parametrize("table", [True, False])
def test_topk_one_is_the_rollout_chain(table):
    inputs = head_rollout_inputs(3, 5, 300, 16, 24, 8, torch.bfloat16, torch.float32, table, seed=4)
    tokens, _, _ = domino_ops.domino_head_rollout(inputs[0].clone(), *inputs[1:])
    tree = draft_tree(*inputs, torch.zeros(3, dtype=torch.long), topk=1, depth=5)
    assert torch.equal(tree.candidates[:, 1:], tokens)
    assert tree.parent_list.tolist() == [[-1, 0, 1, 2, 3]] * 3  # each frontier: the one candidate of its step


def test_sampled_tree_keeps_every_draw_and_carries_the_draft_distributions():
    inputs = head_rollout_inputs(2, 3, 50, 8, 12, 4, torch.float32, torch.float32, True, seed=3)
    tree = draft_tree(*inputs, torch.zeros(2, dtype=torch.long), topk=2, depth=3, temperature=0.8, top_k=20,
                      generator=torch.Generator().manual_seed(0))
    n = tree_size(2, 3) + 1
    assert tree.candidates.shape == (2, n) and tree.draft_probs.shape == (2, n, 50)
    assert torch.equal(tree.selected_index, torch.arange(n - 1).expand(2, n - 1))
    ridx, nxt, sib = build(tree, torch.zeros(2, dtype=torch.long), 2, 3)
    # every expanded node's children are distinct draws from its distribution
    for b in range(2):
        for u in range(n):
            kids = []
            c = int(nxt[b, u])
            while c != -1:
                kids.append(int(tree.candidates[b, c]))
                c = int(sib[b, c])
            if kids:
                assert len(set(kids)) == len(kids) == 2
                assert bool((tree.draft_probs[b, u, kids] > 0).all())
                torch.testing.assert_close(tree.draft_probs[b, u].sum(), torch.tensor(1.0))
            else:
                assert bool((tree.draft_probs[b, u] == 0).all())  # never expanded
    # and row u is node u's own distribution: its GRU state walked along its path from the
    # root's, its logits L = base[d] + w2 silu(hproj[d] + w1s S), filtered as sampled
    # (depth 3: the row of a node at depth 2 comes from the frontier-dependent mapping)
    base, hproj, state, table, _, w_hh, w1s, w2 = inputs
    for b, node_paths in enumerate(paths(nxt, sib, tree.candidates)):
        for u, path in enumerate(node_paths):
            if not bool(tree.draft_probs[b, u].any()):
                continue
            S = state[b]
            for tok in path:
                S = reference.gru_cell(table[tok], w_hh @ S, S)
            d = len(path)
            L = base[b, d] + w2 @ torch.nn.functional.silu(hproj[b, d] + w1s @ S)
            want = domino_ops.filtered_probs(L[None], temperature=0.8, top_k=20)[0]
            torch.testing.assert_close(tree.draft_probs[b, u], want, rtol=1e-4, atol=1e-6)


def test_sampled_tree_of_depth_one_carries_the_roots_distribution():
    """Depth 1: only the root is expanded; its row is its filtered distribution and every
    child's row is zeros (the row lookup once failed on the empty frontier list)."""
    inputs = head_rollout_inputs(2, 2, 12, 4, 6, 4, torch.float32, torch.float32, True, seed=2)
    tree = draft_tree(*inputs, torch.tensor([1, 2]), topk=3, depth=1, temperature=0.9,
                      generator=torch.Generator().manual_seed(1))
    assert tree.candidates.shape == (2, 4) and tree.draft_probs.shape == (2, 4, 12)
    base, hproj, state, table, _, w_hh, w1s, w2 = inputs
    for b in range(2):
        L = base[b, 0] + w2 @ torch.nn.functional.silu(hproj[b, 0] + w1s @ state[b])
        want = domino_ops.filtered_probs(L[None], temperature=0.9)[0]
        torch.testing.assert_close(tree.draft_probs[b, 0], want, rtol=1e-4, atol=1e-6)
        assert bool((tree.draft_probs[b, 1:] == 0).all())
        assert len(set(tree.candidates[b, 1:].tolist())) == 3  # drawn without replacement


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_per_sequence_parameters_and_generators_draft_each_sequence_as_alone(backend):
    """Temperature / top-k / top-p as one value per sequence and one generator per sequence:
    each sequence's tree (candidates, scores, draft distributions) is the tree drafted for it
    alone with its scalar parameters and its generator; the greedy one's draft distributions
    are one-hot at each expanded node's best token."""
    inputs = head_rollout_inputs(3, 3, 50, 8, 12, 4, torch.float32, torch.float32, True, seed=5)
    rows = [(0.9, 10, 1.0), (0.0, 0, 1.0), (1.2, 0, 0.8)]
    T, k, p = (torch.tensor(c) for c in zip(*rows))
    roots = torch.tensor([3, 4, 5])
    tree = draft_tree(*inputs, roots, topk=2, depth=3, temperature=T, top_k=k, top_p=p, backend=backend,
                      generator=[torch.Generator().manual_seed(40 + s) for s in range(3)])
    for s, (t, kk, pp) in enumerate(rows):
        one = draft_tree(*(x[s:s + 1] for x in inputs[:3]), *inputs[3:], roots[s:s + 1], topk=2, depth=3,
                         temperature=t, top_k=kk, top_p=pp, backend=backend,
                         num_draft_tokens=tree.candidates.shape[1] if t == 0 else None,
                         generator=torch.Generator().manual_seed(40 + s))
        assert torch.equal(tree.candidates[s:s + 1], one.candidates), s
        assert torch.equal(tree.parent_list[s:s + 1], one.parent_list), s
        torch.testing.assert_close(tree.candidate_scores[s:s + 1], one.candidate_scores, rtol=1e-5, atol=1e-5)
        if t > 0:
            torch.testing.assert_close(tree.draft_probs[s:s + 1], one.draft_probs, rtol=1e-5, atol=1e-7)
    greedy = tree.draft_probs[1]
    expanded = greedy.sum(-1) > 0
    assert bool(expanded.any()) and bool(((greedy[expanded] == 0) | (greedy[expanded] == 1)).all())
    assert bool((greedy[expanded].sum(-1) == 1).all())
    _, nxt, _ = build(tree, torch.zeros(3, dtype=torch.long), 2, 3)
    for u in torch.nonzero(expanded)[:, 0].tolist():  # the one is at the node's first (best) child
        assert int(greedy[u].argmax()) == int(tree.candidates[1, nxt[1, u]])


def test_sampled_expand_select_build_verify_is_lossless():
    """Population of independent sequences: draft a sampled tree (topk 2, depth 3) with a
    head whose distributions differ from the target's, verify it with verify_tree_sampling:
    the first two emitted tokens follow the target jointly (a sequence that emitted only
    one continues with a draw from the target, as its next round would be); verified with
    draft distributions other than those the children were drawn from, they do not."""
    N, V, depth = 20_000, 6, 3
    g = torch.Generator().manual_seed(11)
    base = (torch.randn(1, depth, V, generator=g) * 1.5).expand(N, depth, V).contiguous()
    r, G = 4, 5
    inputs = (base, torch.randn(1, depth, r, generator=g).expand(N, depth, r).contiguous(), torch.zeros(N, G),
              torch.randn(V, 3 * G, generator=g), None, torch.randn(3 * G, G, generator=g) / 2,
              torch.randn(r, G, generator=g) * 2, torch.randn(V, r, generator=g) * 2)  # paths matter
    tree = draft_tree(*inputs, torch.zeros(N, dtype=torch.long), topk=2, depth=depth, temperature=1.0,
                      generator=torch.Generator().manual_seed(12))
    n = tree.candidates.shape[1]
    ridx, nxt, sib = build(tree, torch.zeros(N, dtype=torch.long), 2, depth)
    # the target: its next-token distribution after each path of up to 3 tokens
    p_root = torch.softmax(torch.randn(V, generator=g), -1)
    after = [p_root, torch.softmax(torch.randn(V, V, generator=g), -1),
             torch.softmax(torch.randn(V, V, V, generator=g), -1), torch.softmax(torch.randn(V, V, V, V, generator=g), -1)]
    parent = candidate_parents(tree.parent_list, 2, depth) + 1  # node u >= 1's parent node (0: the root)
    tok = tree.candidates
    target_probs = torch.empty(N, n, V)
    target_probs[:, 0] = p_root
    for u in range(1, n):  # node u's path (its ancestors' tokens, then its own), per sequence
        level = next(s for s in range(1, depth + 1) if u <= tree_size(2, s))
        node, path = torch.full((N,), u), []
        for _ in range(level):
            path.insert(0, tok.gather(1, node[:, None])[:, 0])
            node = parent.gather(1, (node - 1).clamp(min=0)[:, None])[:, 0]
        target_probs[:, u] = after[level][tuple(path)]
    coins, final = torch.rand(N, n, dtype=torch.float64, generator=g), torch.rand(N, dtype=torch.float64, generator=g)

    def first_two(draft_probs):
        """The first two emitted tokens, verified against ``draft_probs``: [N] ids first * V + second."""
        predicts = torch.full((N * n,), -5, dtype=torch.int32)
        accept_index = torch.full((N, depth + 1), -5, dtype=torch.int32)
        accept_num = torch.full((N,), -5, dtype=torch.int32)
        domino_ops.verify_tree_sampling(predicts, accept_index, accept_num, tree.candidates, ridx, nxt, sib, coins,
                                        final, target_probs, draft_probs)
        first = predicts[accept_index[:, 0].long()].long()  # the root's slot holds the first emitted token
        emitted_two = accept_num > 0
        second = torch.where(emitted_two, predicts[accept_index[:, 1].clamp(min=0).long()].long(),
                             torch.multinomial(after[1][first], 1, generator=g)[:, 0])
        assert 0.2 < float(emitted_two.float().mean()) < 0.95
        assert float((accept_num > 1).float().mean()) > 0.05  # depth-2 nodes' rows take part
        return (first * V + second).numpy()

    joint = (p_root[:, None] * after[1]).double().flatten().numpy()
    assert_matches_distribution(first_two(tree.draft_probs), joint, what="first two tokens")
    # Negative control, at the same N: a sampler that drew the children at temperature 1
    # but reports their distributions at temperature 0.9 (q ** (1 / 0.9), renormalised)
    q = tree.draft_probs
    wrong = torch.where(q > 0, q.clamp(min=1e-30) ** (1 / 0.9), 0.0)
    wrong = (wrong / wrong.sum(-1, keepdim=True).clamp(min=1e-30)).contiguous()
    with pytest.raises(AssertionError, match="chi-square"):
        assert_matches_distribution(first_two(wrong), joint, what="first two tokens")


@pytest.mark.parametrize("kw,msg", [
    (dict(topk=0, depth=2), "topk must be"),
    (dict(topk=2, depth=5), r"depth must be an int in \[1, 4\]"),
    (dict(topk=2, depth=2, num_draft_tokens=8), r"num_draft_tokens must be in \[2, 7\]"),
    (dict(topk=2, depth=2, num_draft_tokens=4, temperature=1.0), "every candidate"),
])
def test_bad_input(kw, msg):
    inputs = head_rollout_inputs(1, 4, 20, 4, 5, 3, torch.float32, torch.float32, True, seed=0)
    with pytest.raises(ValueError, match=msg):
        draft_tree(*inputs, torch.zeros(1, dtype=torch.long), **kw)


@pytest.mark.parametrize("roots,over,exc,msg", [
    (torch.tensor([-7]), {}, ValueError, r"root_tokens must hold token ids, values in \[0, "),
    (torch.tensor([3.9]), {}, TypeError, "root_tokens must be int64"),
    (torch.tensor([1, 2]), {}, ValueError, r"root_tokens must have shape \[1\]"),
    ([1], {}, TypeError, "root_tokens must be a torch.Tensor"),
    (torch.tensor([1]), dict(topk=21), ValueError, r"topk must be an int in \[1, 20\] \(the vocabulary\)"),
    (torch.tensor([1]), dict(num_draft_tokens=3.0), TypeError, "num_draft_tokens must be an int or None"),
    (torch.tensor([1]), dict(num_draft_tokens=torch.tensor([1, 2])), TypeError, "num_draft_tokens must be an int"),
    (torch.tensor([1]), dict(num_draft_tokens=torch.tensor([1, 2]), temperature=1.0), TypeError,
     "num_draft_tokens must be an int"),
    (torch.tensor([1]), dict(temperature=None), TypeError, "temperature"),
    (torch.tensor([1]), dict(temperature="x"), TypeError, "temperature"),
    (torch.tensor([1]), dict(base_logits=None), TypeError, "base_logits must be a torch.Tensor"),
    (torch.tensor([1]), dict(base_logits=torch.randn(4, 20)), ValueError, "base_logits must have 3 dimensions"),
])
def test_bad_roots_and_sizes_name_the_argument(roots, over, exc, msg):
    """root_tokens is copied into the candidates as it is, so it is checked (dtype, shape,
    no negative id; ids past V stay allowed: a draft vocabulary's tree roots at a target
    id); topk beyond the vocabulary and a non-int num_draft_tokens are named as draft_tree's
    own arguments."""
    inputs = list(head_rollout_inputs(1, 4, 20, 4, 5, 3, torch.float32, torch.float32, True, seed=0))
    if "base_logits" in over:
        inputs[0] = over.pop("base_logits")
    kw = dict(topk=2, depth=2)
    kw.update(over)
    with pytest.raises(exc, match=msg):
        draft_tree(*inputs, roots, **kw)
    # a root id beyond the (draft) vocabulary is fine: it is the target's
    assert draft_tree(*head_rollout_inputs(1, 4, 20, 4, 5, 3, torch.float32, torch.float32, True, seed=0),
                      torch.tensor([49151]), topk=2, depth=2).candidates[0, 0] == 49151


@pytest.mark.parametrize("name", ["w2", "base_logits", "state"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_inputs_that_require_grad_are_refused_in_grad_mode(name, temperature):
    """draft_tree is an inference kernel like the expand steps it runs: an input that
    autograd tracks would silently lose its gradient, so with grad mode on it is refused by
    name (greedy and sampled alike; the trees used to come back untracked); under no_grad
    the same call runs."""
    names = ("base_logits", "hproj", "state", "gru_input", "w_ih", "w_hh", "w1s", "w2")
    inputs = dict(zip(names, head_rollout_inputs(1, 4, 20, 4, 5, 3, torch.float32, torch.float32, True, seed=0)))
    inputs[name] = inputs[name].clone().requires_grad_()
    kw = dict(topk=2, depth=2, temperature=temperature, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match=f"draft_tree: {name} requires grad and grad mode is on"):
        draft_tree(*inputs.values(), torch.zeros(1, dtype=torch.long), **kw)
    with torch.no_grad():
        draft_tree(*inputs.values(), torch.zeros(1, dtype=torch.long), **kw)


@pytest.mark.parametrize("topk,depth", [(1, 3), (2, 1), (2, 4), (3, 3)])
def test_candidate_parents_and_reselection(topk, depth):
    """candidate_parents follows parent_list (each child's cumulative score is its parent's
    plus its own log-probability <= 0, and a child's parent was expanded at the step
    before); select_draft_nodes(tree, N) is what draft_tree keeps with num_draft_tokens=N."""
    from domino_ops.tree_draft import candidate_parents, select_draft_nodes

    b = 3
    inputs = head_rollout_inputs(b, 4, 50, 8, 12, 4, torch.float32, torch.float32, True, seed=topk * 10 + depth)
    roots = torch.tensor([1, 2, 3])
    full = draft_tree(*inputs, roots, topk=topk, depth=depth)
    total = tree_size(topk, depth)
    parents = candidate_parents(full.parent_list, topk, depth)
    assert parents.shape == (b, total)
    assert (parents[:, :topk] == -1).all()
    for c in range(topk, total):
        s = 1 + (c - topk) // (topk * topk)
        p = parents[:, c]
        assert ((p >= tree_size(topk, s - 1) if s > 1 else p >= 0) & (p < tree_size(topk, s))).all()
        assert (full.candidate_scores[:, c] <= full.candidate_scores.gather(1, p[:, None])[:, 0] + 1e-6).all()
    for N in range(2, total + 2):
        pruned = draft_tree(*inputs, roots, topk=topk, depth=depth, num_draft_tokens=N)
        again = select_draft_nodes(full, N)
        assert torch.equal(again.selected_index, pruned.selected_index)
        assert torch.equal(again.candidates, pruned.candidates)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        select_draft_nodes(full, total + 2)
    # a tree built by hand without the candidates' scores cannot be re-selected
    bare = dataclasses.replace(full, candidate_scores=None)
    with pytest.raises(ValueError, match="candidate_scores"):
        select_draft_nodes(bare, 2)
