"""Domino tree drafting in SGLang's EAGLE-2 layout: expand a frontier depth by depth with
:func:`domino_ops.domino_head_expand`, keep the best ``topk`` children per sequence as the
next frontier, and emit ``parent_list``, ``selected_index`` and the draft tokens exactly as
:func:`domino_ops.build_tree_kernel_efficient` consumes them. Everything is tensor
operations on the inputs' device (no host round trip), so expand -> select -> build ->
verify runs on a GPU without a sync.

The layout (sgl-project/sglang ``select_top_k_tokens`` / ``organize_draft_results``): step 0
expands each sequence's root into ``topk`` candidates (flat indices ``0..topk-1``), all of
which form the first frontier; step ``s >= 1`` expands the ``topk`` frontier nodes into
``topk`` children each (flat indices ``topk + (s-1)*topk**2 + j*topk + c`` for frontier slot
j, child c), and the ``topk`` best of them by cumulative log-probability become the next
frontier. ``parent_list`` is ``[-1, 0..topk-1]`` followed by the flat indices of every
later frontier but the last, ``[b, topk*(depth-1)+1]``.

Which candidates become tree nodes:

- temperature 0 (EAGLE-2): the ``num_draft_tokens - 1`` best of all candidates by
  cumulative log-probability (``selected_index``, ascending), verified with
  :func:`domino_ops.verify_tree_greedy`;
- temperature > 0: every candidate. Children are drawn without replacement from the
  draft, and :func:`domino_ops.verify_tree_sampling` is lossless only if a node's verified
  children are all of its draws (pruning a child by its own score would tilt the proposal).
  Choosing which nodes to expand next does not (a node's children are drawn after that
  choice), so the frontier selection is the same at every temperature. A temperature given
  as a [b] tensor (one per sequence, any values, zeros included) makes a sampled tree too:
  its greedy sequences' children are their best tokens, their draft distributions one-hot.

Sampling parameters given as tensors are validated once per call by reading them on the
host (a device sync on a GPU); everything after that stays on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from domino_ops import _checks
from domino_ops.linear_packed import PackedLinearWeight
from domino_ops.ops import check_expand_args, expand_outputs, filtered_probs, run_expand
from domino_ops.sampling import drawn_uniforms, may_sample

__all__ = ["DraftTree", "candidate_parents", "draft_tree", "select_draft_nodes", "tree_size"]


def tree_size(topk: int, depth: int) -> int:
    """Candidates of a tree of ``depth`` expansion steps: ``topk + (depth-1)*topk**2``."""
    return topk + (depth - 1) * topk * topk


@dataclass
class DraftTree:
    """A drafted tree, per sequence of the batch (N = number of tree nodes, root included).

    parent_list: [b, topk*(depth-1)+1] int64; selected_index: [b, N-1] int64 (ascending);
    candidates: [b, N] int64, the root token then the selected candidates' tokens (the
    ``candidates`` of the verify ops once ``build_tree_kernel_efficient`` has linked them);
    draft_probs: [b, N, V] float32 at temperature > 0, the distribution each node's
    children were drawn from (zeros for nodes never expanded), else None.
    candidate_scores, candidate_tokens: [b, tree_size] float32 / int64, every candidate's
    cumulative draft log-probability and token by flat index, selected or not (what
    :func:`select_draft_nodes` re-selects from).
    """

    parent_list: torch.Tensor
    selected_index: torch.Tensor
    candidates: torch.Tensor
    draft_probs: Optional[torch.Tensor]
    candidate_scores: Optional[torch.Tensor] = None
    candidate_tokens: Optional[torch.Tensor] = None


def draft_tree(base_logits: torch.Tensor, hproj: torch.Tensor, state: torch.Tensor, gru_input: torch.Tensor,
               w_ih: torch.Tensor | None, w_hh: torch.Tensor, w1s: torch.Tensor, w2: torch.Tensor,
               root_tokens: torch.Tensor, *, topk: int, depth: int, num_draft_tokens: Optional[int] = None,
               plain_depths: int = 0, temperature: float | torch.Tensor = 0.0, top_k: int | torch.Tensor = 0,
               top_p: float | torch.Tensor = 1.0,
               generator: torch.Generator | list[torch.Generator] | tuple[torch.Generator, ...] | None = None,
               backend: str | None = None,
               w2_packed: PackedLinearWeight | None = None,
               w_hh_packed: PackedLinearWeight | None = None) -> DraftTree:
    """Drafts a tree per sequence with the Domino head, in SGLang's EAGLE-2 layout.

    Args:
        base_logits [b, k, V], hproj [b, k, r], state [b, G], gru_input, w_ih, w_hh, w1s,
            w2: as :func:`domino_ops.domino_head_rollout` (state: the GRU state at the root).
        root_tokens: [b] int64 >= 0, each sequence's last verified token (node 0; copied
            into ``candidates`` as it is, so it may be an id of a larger vocabulary than V,
            the target's when V is a draft vocabulary).
        topk: children per expanded node and frontier size, an int in [1, V].
        depth: expansion steps, in [1, k]; candidates at step s sit at block position s.
        num_draft_tokens: tree nodes N including the root, in [2, 1 + tree_size]; at
            temperature 0 only (default: every candidate). At temperature > 0 every
            candidate is a node (see the module docstring).
        plain_depths: an int >= 0 (default 0): the first ``plain_depths`` depths are
            drafted from ``base_logits`` alone (a zero head correction, L = base), while
            the GRU states still advance.
        temperature, top_k, top_p, generator, backend, w2_packed, w_hh_packed: as
            :func:`domino_head_expand` (per-sequence [b] tensors, and one generator per
            sequence, included: a batch can mix greedy and sampled requests, each with its
            own seed; a sequence's draws then do not depend on the others'). A temperature
            given as a tensor makes a sampled tree (every candidate a node, ``draft_probs``
            set; a greedy sequence's children are its best tokens and its draft
            distributions one-hot).
    Returns:
        a :class:`DraftTree`.
    """
    b, k, V = _checks.tensor("base_logits", base_logits, ndim=3, dtypes=_checks.FLOAT_OR_BF16).shape
    root_tokens = _checks.tensor("root_tokens", root_tokens, ndim=1, dtypes=(torch.int64,),
                                 device=base_logits.device)
    _checks.shape("root_tokens", root_tokens, (b,))
    _checks.in_range("root_tokens", root_tokens, 0, 2 ** 63 - 1, "hold token ids, values")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= V:
        raise ValueError(f"topk must be an int in [1, {V}] (the vocabulary), got {topk!r}")
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= k:
        raise ValueError(f"depth must be an int in [1, {k}] (the block's positions), got {depth!r}")
    if isinstance(plain_depths, bool) or not isinstance(plain_depths, int) or plain_depths < 0:
        raise ValueError(f"plain_depths must be an int >= 0, got {plain_depths!r}")
    total = tree_size(topk, depth)
    if num_draft_tokens is not None and (isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int)):
        raise TypeError(f"num_draft_tokens must be an int or None, got {type(num_draft_tokens).__name__}")
    dev = base_logits.device
    seq = torch.arange(b, device=dev)
    # The arguments are checked once, as the first step sees them; the steps after it run
    # on the states, sequence and depth indices this function builds (~25 us of checks a
    # step saved, a tenth of a small drafter's step).
    chosen, temperature, top_k, top_p = check_expand_args(
        base_logits, hproj, state, seq, torch.zeros_like(seq), gru_input, w_ih, w_hh, w1s, w2, topk, temperature,
        top_k, top_p, generator, backend, w2_packed, w_hh_packed)
    # an inference kernel: inputs that autograd tracks would silently lose their gradients
    _checks.no_autograd("draft_tree", [("base_logits", base_logits), ("hproj", hproj), ("state", state),
                                       ("gru_input", gru_input), ("w_ih", w_ih), ("w_hh", w_hh), ("w1s", w1s),
                                       ("w2", w2)])
    sampled = may_sample(temperature)
    if sampled and num_draft_tokens not in (None, total + 1):
        raise ValueError(f"num_draft_tokens must be {total + 1} (every candidate) at temperature > 0 or with "
                         f"temperature given per sequence, got {num_draft_tokens}")
    if num_draft_tokens is None:
        num_draft_tokens = total + 1
    if not 2 <= num_draft_tokens <= total + 1:
        raise ValueError(f"num_draft_tokens must be in [2, {total + 1}] for topk={topk}, depth={depth}, "
                         f"got {num_draft_tokens}")

    # A plain depth's correction is exactly zero: a rank-1 head of zeros (hproj, w1s, w2)
    # gives L = base + 0, the same bits as the full-rank zero w2 this used to allocate (and
    # stream) every round, while the GRU states advance with the real w_hh and gru_input.
    plain = None
    if plain_depths > 0:
        plain = (torch.zeros(b, k, 1, dtype=hproj.dtype, device=dev),  # hproj
                 torch.zeros(1, w1s.shape[1], dtype=w1s.dtype, device=dev),  # w1s
                 torch.zeros(w2.shape[0], 1, dtype=w2.dtype, device=dev))  # w2

    # A greedy tree never reads a step's node logits: its steps do not write them (the CPU
    # kernel then never stores the [n, V] float32 rows).
    def expand(node_state, node_seq, d):
        hp, ws, w, wp = (*plain, None) if d < plain_depths else (hproj, w1s, w2, w2_packed)
        n, G = node_state.shape
        out = expand_outputs(n, topk, G, V, dev, write_node_logits=sampled)
        # One generator per sequence: the frontier holds n / b nodes of each sequence, sequence
        # by sequence, so row s of a [b, n / b * topk] draw (from generator s) is its nodes'
        # uniforms in node order, what domino_head_expand would draw, without reading node_seq.
        u = None
        if sampled and isinstance(generator, (list, tuple)):
            u = drawn_uniforms((b, n // b * topk), dev, generator).view(n, topk)
        return run_expand(chosen, base_logits, hp, node_state, node_seq, torch.full_like(node_seq, d), gru_input,
                          w_ih, w_hh, ws, w, topk, temperature, top_k, top_p, generator, wp, w_hh_packed, out, u)

    tokens, logprobs, child_state, logits = expand(state, seq, 0)
    scores, token_list, score_list = logprobs, [tokens], [logprobs]
    parents = [torch.arange(-1, topk, device=dev).expand(b, topk + 1)]
    # row r: the node parent_list[:, r] (row 0: the root); kept only where the draft
    # probabilities are read (a sampled tree), so a greedy tree holds one step's rows at a time
    node_logits = [logits.view(b, 1, V)] if sampled else []
    frontier_state = child_state.reshape(b * topk, -1)
    frontier_seq = seq.repeat_interleave(topk)
    for s in range(1, depth):
        tokens, logprobs, child_state, logits = expand(frontier_state, frontier_seq, s)
        cand_scores = (scores.unsqueeze(2) + logprobs.view(b, topk, topk)).flatten(1)  # [b, topk*topk]
        score_list.append(cand_scores)
        token_list.append(tokens.view(b, topk * topk))
        if sampled:
            node_logits.append(logits.view(b, topk, V))
        if s == depth - 1:
            break  # the last frontier is never expanded (nor listed in parent_list)
        scores, best = torch.topk(cand_scores, topk, dim=-1)
        parents.append(best + tree_size(topk, s))
        frontier_state = child_state.view(b, topk * topk, -1).gather(
            1, best.unsqueeze(-1).expand(-1, -1, child_state.shape[-1])).reshape(b * topk, -1)

    all_scores, all_tokens = torch.cat(score_list, dim=1), torch.cat(token_list, dim=1)
    if num_draft_tokens == total + 1:
        selected = torch.arange(total, device=dev).expand(b, total)
    else:
        selected = _best_candidates(all_scores, num_draft_tokens - 1)
    parent_list = torch.cat(parents, dim=1) if depth > 1 else torch.empty(b, 0, dtype=torch.int64, device=dev)
    candidates = torch.cat([root_tokens.view(b, 1).to(torch.int64), all_tokens.gather(1, selected)], dim=1)
    draft_probs = None
    if sampled:
        draft_probs = _node_draft_probs(torch.cat(node_logits, dim=1), parent_list, selected,
                                        temperature, top_k, top_p)
    return DraftTree(parent_list, selected.contiguous(), candidates, draft_probs, all_scores, all_tokens)


def _best_candidates(scores: torch.Tensor, m: int) -> torch.Tensor:
    """Flat indices [b, m] (ascending) of the m best candidates by cumulative log-probability."""
    return torch.sort(torch.topk(scores, m, dim=-1).indices, dim=-1).values


def select_draft_nodes(tree: DraftTree, num_draft_tokens: int) -> DraftTree:
    """The same drafted tree verified with ``num_draft_tokens`` nodes (root included): the
    best candidates by cumulative log-probability, as :func:`draft_tree` selects them.
    Greedy trees only (a sampled tree is verified with every draw)."""
    if tree.draft_probs is not None:
        raise ValueError("select_draft_nodes: a sampled tree must keep every candidate")
    if tree.candidate_scores is None or tree.candidate_tokens is None:
        raise ValueError("select_draft_nodes: tree has no candidate_scores / candidate_tokens to select from "
                         "(a DraftTree made by draft_tree has them)")
    total = tree.candidate_scores.shape[1]
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or \
            not 2 <= num_draft_tokens <= total + 1:
        raise ValueError(f"num_draft_tokens must be an int in [2, {total + 1}], got {num_draft_tokens!r}")
    selected = _best_candidates(tree.candidate_scores, num_draft_tokens - 1).contiguous()
    candidates = torch.cat([tree.candidates[:, :1], tree.candidate_tokens.gather(1, selected)], dim=1)
    return DraftTree(tree.parent_list, selected, candidates, None, tree.candidate_scores, tree.candidate_tokens)


def candidate_parents(parent_list: torch.Tensor, topk: int, depth: int) -> torch.Tensor:
    """Each candidate's parent by flat index [b, tree_size] int64 (-1: the root), from
    ``parent_list``: a step-s candidate (s >= 1) at flat index ``topk + (s-1)*topk**2 +
    j*topk + c`` is a child of frontier slot j of step s, which is ``parent_list[:, 1 +
    (s-1)*topk + j]``."""
    b = parent_list.shape[0]
    dev = parent_list.device
    first = torch.full((b, topk), -1, dtype=torch.int64, device=dev)
    if depth == 1:
        return first
    slot = torch.arange((depth - 1) * topk * topk, device=dev) // topk  # (s-1)*topk + j
    return torch.cat([first, parent_list[:, 1 + slot]], dim=1)


def _node_draft_probs(node_logits, parent_list, selected, temperature, top_k, top_p) -> torch.Tensor:
    """[b, N, V]: node i's children's draft distribution, filtered_probs of its expansion
    logits (row r of node_logits is the node parent_list[:, r]; node 0 is row 0), zeros for
    a node never expanded."""
    rows, V = node_logits.shape[1:]
    probs = filtered_probs(node_logits, temperature, top_k, top_p)  # [b, rows, V]
    # node i >= 1 (flat index selected[:, i-1]) was expanded iff some parent_list[:, r >= 1] equals
    # it; node 0, the root, is row 0
    match = parent_list[:, None, 1:rows] == selected[:, :, None]  # [b, N-1, rows-1]
    expanded = F.pad(match.any(-1), (1, 0), value=True)  # [b, N]
    # a flat index is listed once at most, so the sum is its row (0 where unexpanded, masked
    # below; and at depth 1, where only the root was expanded and match is empty)
    row = F.pad((match * torch.arange(1, rows, device=match.device)).sum(-1), (1, 0))  # [b, N]
    out = probs.gather(1, row.unsqueeze(-1).expand(-1, -1, V))
    return torch.where(expanded.unsqueeze(-1), out, torch.zeros((), device=out.device))
