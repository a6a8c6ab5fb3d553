"""Random draft trees for the tree-op tests, sgl-kernel's hand-built verify case, and plain
parent-pointer oracles.

The oracles work from parent pointers and child lists directly, never through
parent_list / selected_index look-ups or the left-child / right-sibling links, so they
check the ops' index chasing independently of the references.
"""

from __future__ import annotations

import random

import torch

POISON = -7


# --- EAGLE drafts in SGLang's layout (inputs of build_tree_kernel_efficient) ---------------

def random_eagle_draft(rng: random.Random, bs: int, topk: int, depth: int, n: int, *, sort: bool = True):
    """``bs`` random EAGLE drafts of ``n`` nodes (root included).

    Step 0 has ``topk`` candidates (flat indices 0..topk-1), children of the root; step s >= 1
    has topk**2 candidates, topk children for each of the topk frontier nodes listed in
    ``parent_list`` (a random choice among step s-1's candidates). Every candidate's score is
    its parent's times a random probability, and the n-1 best are selected (SGLang's
    ``organize_draft_results``), so every selected node's parent is selected. Returns
    (parent_list [bs, topk*(depth-1)+1], selected_index [bs, n-1], parents: per request the
    parent node of each node, -1 for the root). ``sort=False`` leaves the selection in score
    order instead of ascending, so a parent can come after its child.
    """
    total = topk + (depth - 1) * topk * topk
    assert 1 <= n <= total + 1
    plists, sels, parents = [], [], []
    for _ in range(bs):
        parent_flat = {c: -1 for c in range(topk)}  # flat candidate -> flat parent (-1 root)
        score = {c: rng.random() for c in range(topk)}
        plist = [-1]
        prev = list(range(topk))  # candidates of the previous step
        for s in range(1, depth):
            frontier = rng.sample(prev, topk) if s > 1 else rng.sample(range(topk), topk)
            plist += frontier
            base = topk + (s - 1) * topk * topk
            prev = []
            for j, f in enumerate(frontier):
                for m in range(topk):
                    c = base + j * topk + m
                    parent_flat[c] = f
                    score[c] = score[f] * rng.uniform(0.01, 0.99)
                    prev.append(c)
        chosen = sorted(score, key=lambda c: -score[c])[: n - 1]
        if sort:
            chosen.sort()
        node_of = {c: i + 1 for i, c in enumerate(chosen)}
        parents.append([-1] + [0 if parent_flat[c] == -1 else node_of[parent_flat[c]] for c in chosen])
        plists.append(plist)
        sels.append(chosen)
    parent_list = torch.tensor(plists, dtype=torch.int64).view(bs, topk * (depth - 1) + 1)
    selected_index = torch.tensor(sels, dtype=torch.int64).view(bs, n - 1)
    return parent_list, selected_index, parents


def ancestry(parent: list[int], t: int) -> list[int]:
    """t and its ancestors, root excluded."""
    out = []
    while t > 0:
        out.append(t)
        t = parent[t]
    return out


def oracle_tree(parents: list[list[int]], seq_lens: list[int]):
    """Expected (ancestor masks [bs, n, n] bool, positions [bs*n], retrive_index,
    retrive_next_token, retrive_next_sibling [bs, n]) from parent pointers."""
    bs, n = len(parents), len(parents[0])
    masks = torch.zeros(bs, n, n, dtype=torch.bool)
    positions = []
    for b, par in enumerate(parents):
        for t in range(n):
            masks[b, t, 0] = True
            masks[b, t, ancestry(par, t)] = True
            positions.append(seq_lens[b] + len(ancestry(par, t)))
    # each node's children in ascending node order, as child lists for links()
    rnext, rsib = links([[[c for c in range(1, n) if par[c] == u] for u in range(n)] for par in parents])
    ridx = torch.arange(bs * n, dtype=torch.int64).view(bs, n)
    return masks, torch.tensor(positions, dtype=torch.int64), ridx, rnext, rsib


def pack_rows(masks: torch.Tensor) -> torch.Tensor:
    """[rows, n] bool -> [rows, nbytes] uint8, bit j of the little-endian word = column j."""
    rows, n = masks.shape
    nbytes = 1 if n <= 8 else (2 if n <= 16 else 4)
    out = torch.zeros(rows, nbytes, dtype=torch.uint8)
    for j in range(n):
        out[:, j // 8] |= (masks[:, j].to(torch.uint8) << (j % 8))
    return out


# --- trees in left-child / right-sibling form (inputs of the verify ops) --------------------

def random_tree(rng: random.Random, n: int, *, max_children: int | None = None, shuffle: bool = True):
    """A random tree of n nodes, node 0 the root, every parent before its children; returns
    (parent, children): children[u] in sibling order (shuffled unless ``shuffle=False``)."""
    parent = [-1] * n
    children = [[] for _ in range(n)]
    for i in range(1, n):
        options = [u for u in range(i) if max_children is None or len(children[u]) < max_children]
        u = rng.choice(options)
        parent[i] = u
        children[u].append(i)
    if shuffle:
        for kids in children:
            rng.shuffle(kids)
    return parent, children


def chain_tree(n: int):
    return [-1] + list(range(n - 1)), [[i + 1] for i in range(n - 1)] + [[]]


def links(children_per_request: list[list[list[int]]]):
    """retrive_next_token, retrive_next_sibling [bs, n] int64 from child lists."""
    nt, ns = [], []
    for children in children_per_request:
        n = len(children)
        a, s = [-1] * n, [-1] * n
        for u, kids in enumerate(children):
            if kids:
                a[u] = kids[0]
                for x, y in zip(kids, kids[1:]):
                    s[x] = y
        nt.append(a)
        ns.append(s)
    return torch.tensor(nt, dtype=torch.int64), torch.tensor(ns, dtype=torch.int64)


def verify_outputs(num_predicts: int, bs: int, steps: int):
    """Poisoned predicts, accept_index, accept_token_num."""
    return (torch.full((num_predicts,), POISON, dtype=torch.int32),
            torch.full((bs, steps), POISON, dtype=torch.int32),
            torch.full((bs,), POISON, dtype=torch.int32))


# --- sgl-kernel's hand-built tree (the verify ops' sgl-case tests and bad-input tables) ------

def sgl_eagle_case():
    """sgl-kernel/tests/speculative/test_eagle_utils.py (sgl-project/sglang): two requests of
    6 nodes; request 0: 0 -> {1, 3}, 1 -> 2, 3 -> 4 -> 5; request 1: 0 -> {4, 1}, 4 -> 5,
    1 -> 2 -> 3. The target's argmax is planted at a few nodes, token 18 elsewhere. Returns
    (candidates, retrive_index, next_token, next_sibling [2, 6], logits [2, 6, 20])."""
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    retrive_index = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    next_token = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    next_sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    logits = torch.full((2, 6, 20), 1.0)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = logits[1, 0, 11] = logits[1, 4, 12] = 10
    logits[logits.amax(-1) < 10] = torch.where(torch.arange(20) == 18, 10.0, 1.0)
    return candidates, retrive_index, next_token, next_sibling, logits


def sgl_verify_args():
    """The arguments the tree-verify ops share, on ``sgl_eagle_case``, by schema name in
    schema order: poisoned outputs (predicts [12], accept_index [2, 4], accept_token_num
    [2]), then candidates, retrive_index, retrive_next_token, retrive_next_sibling. Returns
    (that dict, the case's logits), for the caller to append its target arguments."""
    candidates, retrive_index, next_token, next_sibling, logits = sgl_eagle_case()
    predicts, accept_index, accept_num = verify_outputs(12, 2, 4)
    return dict(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
                retrive_index=retrive_index, retrive_next_token=next_token,
                retrive_next_sibling=next_sibling), logits


def oracle_greedy(children_per_request, candidates, ridx, target_predict, steps: int, num_predicts: int,
                  predicts_before: torch.Tensor):
    """Expected (predicts, accept_index, accept_token_num) of verify_tree_greedy: at each node
    take the first child in sibling order whose token is the target's token there."""
    bs, n = candidates.shape
    cand, r = candidates.tolist(), ridx.tolist()
    target = target_predict.reshape(-1).tolist()
    pred = predicts_before.tolist()
    for b in range(bs):
        for u in range(n):
            pred[r[b][u]] = -1
    acc_index, acc_num = [], []
    for b, children in enumerate(children_per_request):
        path, u = [0], 0
        while len(path) < steps:
            want = target[r[b][u]]
            nxt = next((c for c in children[u] if cand[b][c] == want), None)
            if nxt is None:
                break
            pred[r[b][u]] = want
            path.append(nxt)
            u = nxt
        pred[r[b][u]] = target[r[b][u]]
        acc_index.append([r[b][p] for p in path] + [-1] * (steps - len(path)))
        acc_num.append(len(path) - 1)
    return (torch.tensor(pred, dtype=torch.int32), torch.tensor(acc_index, dtype=torch.int32).view(bs, steps),
            torch.tensor(acc_num, dtype=torch.int32))


# Links of sgl_eagle_case that do not form a tree (each a dict of replaced link tensors): the
# verify ops must refuse them before walking, on every backend that reads CPU values, since
# a walk could then repeat nodes and "accept" more tokens than the tree has.
GOOD_NEXT_TOKEN = [[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]]
GOOD_NEXT_SIBLING = [[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]]
NOT_A_TREE = {
    "sibling cycle 1 <-> 3": dict(retrive_next_sibling=torch.tensor([[-1, 3, -1, 1, -1, -1], GOOD_NEXT_SIBLING[1]])),
    "first-child cycle 1 -> 2 -> 1": dict(retrive_next_token=torch.tensor([[1, 2, 1, 4, 5, -1], GOOD_NEXT_TOKEN[1]])),
    "the root as a child": dict(retrive_next_token=torch.tensor([[1, 2, 0, 4, 5, -1], GOOD_NEXT_TOKEN[1]])),
    "the root as a sibling": dict(retrive_next_sibling=torch.tensor([GOOD_NEXT_SIBLING[0], [-1, -1, -1, -1, 1, 0]])),
    "a node both a first child and a sibling": dict(
        retrive_next_sibling=torch.tensor([[-1, 3, -1, -1, -1, 2], GOOD_NEXT_SIBLING[1]])),
}
NOT_A_TREE_MESSAGE = r"of request [01] .*the links do not form a tree"
