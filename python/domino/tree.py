"""Tree speculation on a HF transformers target: the tree's shape, its verification in one
target forward, and the KV cache compaction that keeps only the accepted path.

A round with a tree (see :mod:`domino.generate`):
  1. the drafter drafts a tree of N nodes per sequence (node 0, the root, is the anchor)
     in SGLang's EAGLE-2 layout (:meth:`domino.DominoDraftModel.draft_tree`);
  2. :func:`tree_links` turns it into each node's ancestors, position and the
     left-child / right-sibling links (:func:`domino_ops.build_tree_kernel_efficient`);
  3. the target runs once over the N nodes with :func:`tree_attention_mask`: a node sees
     the real cached tokens and its own ancestors (itself included), at position
     ``anchor_pos + depth``;
  4. :func:`verify_tree` walks the tree (:func:`domino_ops.verify_tree_greedy`, or the
     lossless :func:`domino_ops.verify_tree_sampling` at T > 0) and returns the accepted
     path and the emitted tokens (the accepted drafts plus one target token);
  5. :func:`compact_tree_cache` moves the accepted path's KV entries to the first slots of
     the round, so that the cache looks exactly as after a chain round that accepted the
     same tokens, and the engine then crops it as it does for chains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

import domino_ops
from domino.kv_cache import GrowingCache, GrowingLayer
from domino.prompts import check_int
from domino.sampling_params import RowSampling, SamplingParams
from domino.target import sliding_window
from domino_ops.tree_draft import DraftTree, candidate_parents, tree_size


@dataclass(frozen=True)
class TreeShape:
    """The shape of the draft tree of every round (SGLang's EAGLE-2 parameters).

    topk: children per expanded node, and nodes kept per depth for expansion (>= 1).
    depth: expansion steps, the longest path's drafts (>= 1, at most the drafter's
        ``num_drafts``); a round advances at most ``depth + 1`` tokens.
    num_draft_tokens: tree nodes verified per round, the root included, in
        ``[2, 1 + topk + (depth - 1) * topk**2]``; the best by cumulative draft
        log-probability are kept. None (the default): at temperature 0 chosen every round
        to maximise expected tokens per millisecond (:func:`domino.budget.best_tree_size`,
        from measured costs and the drafter's calibrated confidence along each path); at
        temperature > 0 every candidate, the only choice there (a sampled tree is verified
        losslessly only with all of its draws).

    ``TreeShape(1, num_drafts, num_drafts + 1)`` is the engine's chain: at temperature 0 it drafts,
    accepts and outputs what a chain round does (tokens and acceptance lengths; see
    :meth:`domino.DominoDraftModel.draft_tree` on rounding with a pure-draft prefix). At
    T > 0 both are lossless but draw from different random streams.
    """

    topk: int
    depth: int
    num_draft_tokens: int | None = None

    def __post_init__(self):
        for name in ("topk", "depth") + (() if self.num_draft_tokens is None else ("num_draft_tokens",)):
            check_int(name, getattr(self, name), lo=1)
            object.__setattr__(self, name, int(getattr(self, name)))  # a NumPy integer as Python's
        if self.num_draft_tokens is not None:
            if not 2 <= self.num_draft_tokens <= self.max_nodes:
                raise ValueError(f"num_draft_tokens must be in [2, {self.max_nodes}] for topk={self.topk}, "
                                 f"depth={self.depth}, got {self.num_draft_tokens}")

    @property
    def max_nodes(self) -> int:
        """Nodes of the full tree, root included: ``1 + topk + (depth - 1) * topk**2``."""
        return 1 + tree_size(self.topk, self.depth)

    def check(self, num_drafts: int, params: list[SamplingParams]) -> None:
        """Raises ValueError when this shape cannot serve a request: too deep for the
        drafter's ``num_drafts``, or pruned at T > 0 (a batch with a sampled request drafts
        a sampled tree, every candidate a node; each request keeps its own temperature,
        top_k, top_p and seed)."""
        if self.depth > num_drafts:
            raise ValueError(f"tree depth must be at most the drafter's num_drafts ({num_drafts}), got {self.depth}")
        sampled = any(domino_ops.sampling.may_sample(p.temperature) for p in params)
        if sampled and self.num_draft_tokens not in (None, self.max_nodes):
            raise ValueError(f"tree num_draft_tokens must be None (every candidate, {self.max_nodes}) at "
                             f"temperature > 0, got {self.num_draft_tokens}")


# The engine's default at temperature 0 (``generate(tree="auto")``): three children per
# node over four levels, the verified size chosen each round by the adaptive budget. In
# benchmarks/bench_e2e.py it beat the adaptive chain on HumanEval and on held-out chat
# prompts (e.g. 1.26x against 1.17x the fastest plain decoding, stage-6 drafter;
# benchmarks/results/e2e_zen5_stage6.txt), and every tree shape tried landed within noise
# of it.
DEFAULT_TREE = TreeShape(3, 4)


# The attention implementations that take a 4D additive mask as it is (transformers 5.x;
# "domino_small_batch": domino.fast_attention, which applies each row's mask).
MASKABLE_ATTENTION = ("eager", "sdpa", "domino_small_batch")


def tree_attention_supported(target) -> bool:
    """Whether the target's attention takes the tree's 4D float mask as its whole mask: an
    implementation that applies it, and no sliding-window layers (HF would apply the
    tree's mask there unwindowed)."""
    return (getattr(target.config, "_attn_implementation", None) in MASKABLE_ATTENTION
            and sliding_window(target.config) is None)


def check_tree_attention(target) -> None:
    """Raises ValueError unless the target's attention takes the tree's 4D float mask."""
    window = sliding_window(target.config)
    if window is not None:
        raise ValueError(f"tree: tree speculation needs full attention in every layer; this target attends to a "
                         f"sliding window ({window} positions) in some: use tree=None (chains)")
    impl = getattr(target.config, "_attn_implementation", None)
    if impl not in MASKABLE_ATTENTION:
        raise ValueError(f"tree: tree speculation needs the target's attention implementation to be one of "
                         f"{MASKABLE_ATTENTION} (a 4D tree mask), got {impl!r}; set it with "
                         f"target.set_attn_implementation('sdpa')")


@dataclass
class TreeLinks:
    """A drafted tree laid out for verification (b sequences, N nodes each).

    ancestors: [b, N, N] bool, row t true at t and its ancestors (the root included);
    positions: [b, N] int64, ``anchor_pos + depth``; retrive_index, next_token,
    next_sibling: [b, N] int64, the verify ops' tree (:mod:`domino_ops.tree_ops`).
    """

    ancestors: torch.Tensor
    positions: torch.Tensor
    retrive_index: torch.Tensor
    next_token: torch.Tensor
    next_sibling: torch.Tensor


def tree_links(tree: DraftTree, anchor_pos: torch.Tensor, topk: int, depth: int) -> TreeLinks:
    """:func:`domino_ops.build_tree_kernel_efficient` on a drafted tree whose roots sit at
    ``anchor_pos`` [b] int64 (QLEN_ONLY mask: the tree part of the attention mask)."""
    b, n = tree.candidates.shape
    dev = tree.candidates.device
    ancestors = torch.empty(b, n, n, dtype=torch.bool, device=dev)
    positions = torch.empty(b, n, dtype=torch.int64, device=dev)
    ridx, nxt, sib = (torch.empty(b, n, dtype=torch.int64, device=dev) for _ in range(3))
    domino_ops.build_tree_kernel_efficient(tree.parent_list, tree.selected_index, anchor_pos.contiguous(), ancestors,
                                           positions, ridx, nxt, sib, topk, depth, n, domino_ops.tree_ops.QLEN_ONLY)
    return TreeLinks(ancestors, positions, ridx, nxt, sib)


def tree_attention_mask(cache_mask: torch.Tensor, ancestors: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The target's 4D additive attention mask [b, 1, N, past + N] of ``dtype``: 0 where a
    node may attend (a real cached token, ``cache_mask`` [b, past] bool, or one of its
    ``ancestors`` [b, N, N] bool), the dtype's lowest value elsewhere.

    transformers (5.x ``masking_utils``) returns a 4D mask as given for the eager and sdpa
    attention paths; both *add* it to the scores, so it must be a float mask (eager would
    add a bool one as 0/1 and mask nothing). flash_attention_2 does not take 4D masks."""
    b, n, _ = ancestors.shape
    allowed = torch.cat([cache_mask[:, None, :].expand(b, n, -1), ancestors], dim=2)
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]


def target_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[b, N] int64: the target's greedy token at every node, from ``logits`` [b, N, V]
    float32 or bfloat16. :func:`domino_ops.sample` at temperature 0 picks what
    ``torch.argmax`` does (the first NaN, ties by index), ~9x faster on a CPU: 43 against
    396 us for 11 float32 rows of SmolLM2's 49,152 logits on the AMX Xeon VM
    (``benchmarks/bench_tree.py``, fifty-third session), ~1.5 % of a tree round."""
    b, n, V = logits.shape
    return domino_ops.sample(logits.reshape(b * n, V), temperature=0.0).view(b, n)


@dataclass
class VerifiedTree:
    """A verified tree on the host, one row per sequence, as lists of ints (the round's one
    device sync: a tree round's bookkeeping is a few dozen tiny steps, each a torch op
    costing 10-20 us right after the target's forward has flushed the caches, against a
    few Python steps on lists).

    path: the accepted nodes, root first (``num_accepted + 1`` node indices); tokens: the
    accepted drafts then the target's token (as many); next_token: the verified tree's
    first-child links (:class:`TreeLinks`' ``next_token`` rows, -1: a leaf); selected,
    parent_list, candidate_tokens: the drafted tree's ``selected_index``, ``parent_list`` and
    ``candidate_tokens`` rows (:class:`domino_ops.tree_draft.DraftTree`; candidate_tokens
    None where the tree has none), which :func:`top_chain_counts` reads."""

    path: list[list[int]]
    tokens: list[list[int]]
    next_token: list[list[int]]
    selected: list[list[int]]
    parent_list: list[list[int]]
    candidate_tokens: list[list[int]] | None

    @property
    def num_accepted(self) -> list[int]:
        """Accepted drafts per sequence (the root not counted)."""
        return [len(p) - 1 for p in self.path]


def verify_tree(tree: DraftTree, links: TreeLinks, logits: torch.Tensor, sampling: RowSampling,
                depth: int) -> VerifiedTree:
    """Verifies the tree against the target's ``logits`` [b, N, V] (float32 or bf16) at its nodes:
    greedily when the tree was drafted greedily (``tree.draft_probs`` is None), else by
    lossless recursive rejection sampling with ``sampling``'s filter and generator; the
    accepted paths of at most ``depth`` drafts and the tree's rows on the host, in one
    transfer (:class:`VerifiedTree`)."""
    b, n = tree.candidates.shape
    dev = logits.device
    predicts = torch.empty(b * n, dtype=torch.int32, device=dev)
    accept_index = torch.empty(b, depth + 1, dtype=torch.int32, device=dev)
    accept_num = torch.empty(b, dtype=torch.int32, device=dev)
    common = (predicts, accept_index, accept_num, tree.candidates, links.retrive_index, links.next_token,
              links.next_sibling)
    if tree.draft_probs is None:
        domino_ops.verify_tree_greedy(*common, target_argmax(logits))
    else:
        target_probs = domino_ops.filtered_probs(logits.float(), **sampling.filter_kwargs()).contiguous()
        domino_ops.verify_tree_sampling(*common, domino_ops.draw_uniforms((b, n), dev, sampling.generator),
                                        domino_ops.draw_uniforms((b,), dev, sampling.generator), target_probs,
                                        tree.draft_probs)
        if isinstance(sampling.temperature, torch.Tensor):
            # Greedy requests among sampled ones: rejection sampling against their one-hot
            # draft distributions would accept a top child or nothing; matching the target's
            # argmax (what it gives them too) also accepts a sibling. Their randomness is drawn
            # above all the same, so a seeded request's stream does not depend on its batch.
            greedy = domino_ops.sampling.effective_temperature(sampling.temperature) == 0
            g_predicts, g_index, g_num = (torch.empty_like(predicts), torch.empty_like(accept_index),
                                          torch.empty_like(accept_num))
            domino_ops.verify_tree_greedy(g_predicts, g_index, g_num, *common[3:], target_argmax(logits))
            rows = greedy.repeat_interleave(n)
            predicts = torch.where(rows, g_predicts, predicts)
            accept_index = torch.where(greedy[:, None], g_index, accept_index)
            accept_num = torch.where(greedy, g_num, accept_num)
    # everything the round reads, in one transfer (type promotion: int64): accept_index holds
    # slots of predicts (retrive_index's, root first), retrive_index's first column each
    # sequence's first slot
    parts = [predicts, accept_index, accept_num, links.retrive_index[:, 0], links.next_token, tree.selected_index,
             tree.parent_list]
    if tree.candidate_tokens is not None:
        parts.append(tree.candidate_tokens)
    flat = torch.cat([p.reshape(-1) for p in parts]).tolist()  # the one sync
    rows, at = [], 0
    for p in parts:  # each part as its b rows
        width = p.numel() // b if b else 0
        rows.append([flat[at + s * width:at + (s + 1) * width] for s in range(b)])
        at += p.numel()
    slots = [row[:num + 1] for row, (num,) in zip(rows[1], rows[2])]
    return VerifiedTree(path=[[i - first for i in taken] for taken, (first,) in zip(slots, rows[3])],
                        tokens=[[flat[i] for i in taken] for taken in slots],  # predicts lead flat
                        next_token=rows[4], selected=rows[5], parent_list=rows[6],
                        candidate_tokens=rows[7] if tree.candidate_tokens is not None else None)


def depths_tried(verified: VerifiedTree) -> list[int]:
    """How many depths of the tree the target tried along each sequence's accepted path:
    the accepted drafts, plus one where the path's last node has children in the verified
    (possibly cut) tree, all of them rejected. Per-depth acceptance counts a tree round by
    it, as a chain round by its verified length."""
    return [len(path) - 1 + (links[path[-1]] >= 0) for path, links in zip(verified.path, verified.next_token)]


def top_chain_counts(verified: VerifiedTree, topk: int) -> tuple[list[int], list[int]]:
    """How the chain a chain round would have drafted from the same state fared in this
    greedy tree round, as :class:`domino.budget.DepthAcceptance` counts it: (tried,
    accepted), an int per sequence.

    That chain is the tree's top chain: from the root, each node's best child, child 0 of
    its expansion (a flat candidate index ``= 0 mod topk``; :mod:`domino_ops.tree_draft`),
    which is the token a chain round drafts after the same tokens. ``accepted``: the
    leading nodes of the accepted path on the top chain, plus one where the top chain's
    next node was drafted but cut from the verified tree and its token is the target's
    there. ``tried``: ``accepted``, plus one where that next node was verified (the target
    rejected it) or cut with another token than the target's. Where the last top node was
    not expanded (the frontier kept other nodes, or it is at the tree's depth) the round
    says nothing of the next depth: counting only the nodes the budget kept would measure
    the confident ones. Nodes 1..n0-1 are the drafted tree's (``selected``); nodes from n0
    on are grafted, on no drafter chain. Without ``candidate_tokens`` a cut node says
    nothing either."""
    tried, accepted = [], []
    for s, (path, tokens, links, selected) in enumerate(zip(verified.path, verified.tokens, verified.next_token,
                                                            verified.selected)):
        def on_top_chain(u: int) -> bool:
            return u == 0 or (u <= len(selected) and selected[u - 1] % topk == 0)

        acc = 0
        while acc < len(path) - 1 and on_top_chain(path[acc + 1]):
            acc += 1
        last = path[acc]  # the last top node, at depth acc
        child = links[last]  # its first child: the lowest c
        verified_child = child >= 0 and on_top_chain(child)
        if verified.candidate_tokens is None:
            tried.append(acc + verified_child)
            accepted.append(acc)
            continue
        # the last top node's child 0: the candidate q * topk under parent_list[q] (q >= 1;
        # domino_ops.tree_draft.candidate_parents' layout), or candidate 0 under the root;
        # none where it was never expanded
        if last == 0:
            child0 = 0
        else:
            flat = selected[last - 1]
            child0 = next((q * topk for q, p in enumerate(verified.parent_list[s]) if q and p == flat), None)
        cut = child0 is not None and not verified_child
        right = cut and verified.candidate_tokens[s][child0] == tokens[acc]
        tried.append(acc + (verified_child or cut))
        accepted.append(acc + right)
    return tried, accepted


def compact_tree_cache(cache: DynamicCache, path: torch.Tensor, num_nodes: int) -> None:
    """Moves each sequence's accepted nodes' keys/values (``path`` [b, m] int64, node
    indices in path order, m <= num_nodes) to the first m slots of the round, the last
    ``num_nodes`` slots of every layer; the caller then crops the ``num_nodes - m`` left.
    A sequence that kept fewer than m tokens gets copies of its root in its extra slots;
    the caller's cache mask makes them holes."""
    m = path.shape[1]
    shared = cache.shared_storage() if isinstance(cache, GrowingCache) else None
    if shared is not None:  # every layer's keys and values in one tensor: two ops a sequence for all of them
        store, length = shared  # [2 * layers, b, h, capacity, d]
        if path.shape[0] != store.shape[1]:
            raise ValueError(f"path must have a row per sequence ({store.shape[1]}), got shape {tuple(path.shape)}")
        start = length - num_nodes
        rows = start + path
        # index_select copies first (no overlap hazard); one per sequence: a gather with an
        # index expanded over every layer, head and lane cost more (benchmarks/engine_steps_micro.py,
        # 30 layers, caches cold, old and new alternating on the Zen 4 VM: medians 299 -> 222 us
        # at one sequence, 466 -> 269 us at four; results/compaction_index_select_zen4_session62.txt)
        for s in range(store.shape[1]):
            store[:, s, :, start:start + m] = store[:, s].index_select(2, rows[s])
        return
    index = {}  # one gather index per (start, kv heads, head dim): built once, not 60 times (~0.2 ms)
    for layer in cache.layers:
        if type(layer) not in (DynamicLayer, GrowingLayer):  # a sliding-window or static layer cannot be compacted so
            raise NotImplementedError(f"tree speculation needs a DynamicCache of full-attention layers, "
                                      f"got {type(layer).__name__}")
        start = layer.keys.shape[2] - num_nodes
        for name in ("keys", "values"):
            t = getattr(layer, name)  # [b, kvh, T, hd]
            key = (start, t.shape[1], t.shape[3])
            if key not in index:
                index[key] = (start + path)[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
            t[:, :, start:start + m] = t.gather(2, index[key])  # gather copies first: no overlap hazard


def path_acceptance(tree: DraftTree, topk: int, depth: int, calibration) -> torch.Tensor:
    """[b, tree_size] float32: for every candidate of a greedy tree, the probability that
    the target accepts it and all of its ancestors, estimated as the product along its path
    of ``calibration`` (``domino.budget.Calibration``) applied to each node's own draft
    probability (its cumulative probability over its parent's)."""
    scores = tree.candidate_scores
    parents = candidate_parents(tree.parent_list, topk, depth)
    parent_scores = torch.where(parents >= 0, scores.gather(1, parents.clamp(min=0)), torch.zeros((), device=scores.device))
    own = calibration((scores - parent_scores).exp())
    path = own.clone()
    for s in range(1, depth):  # step s's parents are step s-1 candidates: done by then
        lo, hi = tree_size(topk, s), tree_size(topk, s + 1)
        path[:, lo:hi] = own[:, lo:hi] * path.gather(1, parents[:, lo:hi])
    return path


def _graft_points(cand, nxt, sib, depth_of, chains, max_depth) -> list[tuple[int, int, int]]:
    """Per sequence (host lists of one tree's candidates, links and node depths): where its
    chain leaves the tree, as (the last node it follows, how many of its tokens follow
    existing nodes, how many new nodes it adds under the depth limit)."""
    points = []
    for s, chain in enumerate(chains):
        node, i = 0, 0
        while i < len(chain):
            child = nxt[s][node]
            while child != -1 and cand[s][child] != chain[i]:
                child = sib[s][child]
            if child == -1:
                break
            node, i = child, i + 1
        points.append((node, i, min(len(chain) - i, max(0, max_depth - depth_of[s][node]))))
    return points


def graft_sizes(candidates: torch.Tensor, links: TreeLinks, chains: list[list[int]],
                max_depth: int) -> list[tuple[int, int]]:
    """Per sequence, what :func:`graft_chains` would do with its chain: (how many of its
    tokens follow existing nodes, how many new nodes it adds). Cutting a chain to its first
    ``followed + L`` tokens makes it add ``min(new, L)`` nodes."""
    pos = links.positions.tolist()
    depth_of = [[p - row[0] for p in row] for row in pos]
    points = _graft_points(candidates.tolist(), links.next_token.tolist(), links.next_sibling.tolist(), depth_of,
                           chains, max_depth)
    return [(i, new) for _, i, new in points]


def graft_chains(candidates: torch.Tensor, links: TreeLinks, chains: list[list[int]],
                 max_depth: int) -> tuple[torch.Tensor, TreeLinks, int]:
    """Grafts a chain of tokens onto each sequence's tree (b trees of N nodes): from the
    root, the chain follows the existing child with its next token as long as there is
    one, and its remaining tokens become new nodes, each the only child of the one
    before, under the last node followed (a chain is cut so that no node lies deeper than
    ``max_depth``). Sequences that add fewer nodes than the most get unreachable padding
    nodes (linked to no parent, seeing the root and themselves) that verification never
    walks into.

    ``candidates`` [b, N] int64 and ``links`` as :func:`tree_links` made them; ``chains``:
    b lists of token ids. Returns the candidates [b, N + E], their links and the deepest
    node's depth (E = the most nodes any sequence adds; with E = 0 the inputs as given)."""
    b, n = candidates.shape
    cand, nxt, sib = candidates.tolist(), links.next_token.tolist(), links.next_sibling.tolist()
    pos = links.positions.tolist()
    depth_of = [[p - row[0] for p in row] for row in pos]
    grafts = [(node, list(chain[i:i + new])) for chain, (node, i, new) in
              zip(chains, _graft_points(cand, nxt, sib, depth_of, chains, max_depth))]
    E = max(len(new) for _, new in grafts)
    deepest = max(max(row) for row in depth_of)
    if E == 0:
        return candidates, links, deepest
    N = n + E
    dev = candidates.device
    anc = torch.zeros(b, N, N, dtype=torch.bool, device=dev)
    anc[:, :n, :n] = links.ancestors
    for s, (node, new) in enumerate(grafts):
        cand[s] += new + [cand[s][0]] * (E - len(new))
        nxt[s] += [-1] * E
        sib[s] += [-1] * E
        parent = node
        for t in range(E):
            j = n + t
            if t < len(new):
                if nxt[s][parent] == -1:
                    nxt[s][parent] = j
                else:  # the last of the parent's children gets j as its next sibling
                    c = nxt[s][parent]
                    while sib[s][c] != -1:
                        c = sib[s][c]
                    sib[s][c] = j
                anc[s, j] = anc[s, parent]
                pos[s].append(pos[s][parent] + 1)
                deepest = max(deepest, pos[s][-1] - pos[s][0])
                parent = j
            else:  # padding: sees the root and itself, reached by no link
                anc[s, j, 0] = True
                pos[s].append(pos[s][0] + 1)
            anc[s, j, j] = True
    as_long = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    ridx = torch.arange(b, device=dev)[:, None] * N + torch.arange(N, device=dev)
    return as_long(cand), TreeLinks(anc, as_long(pos), ridx, as_long(nxt), as_long(sib)), deepest
