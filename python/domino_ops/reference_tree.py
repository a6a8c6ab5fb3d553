"""Pure-PyTorch references of the sgl-kernel-compatible tree ops (:mod:`domino_ops.tree_ops`).

Same signatures as the ops and, like them, they write into the output tensors passed in and
return None. They follow sgl-kernel's algorithms step by step (sgl-project/sglang,
``sgl-kernel/csrc/speculative/eagle_utils.cu`` and ``speculative_sampling.cuh``) in plain
Python loops over one request at a time, with float32 arithmetic where sgl-kernel uses it,
so that the C++ kernels can be tested against them for exact equality; they are the test
oracle and the ``backend="reference"`` path, never a fast path. Arguments are assumed
valid (the wrappers in :mod:`domino_ops.tree_ops` check them); malformed links raise
ValueError.

The tree layout (left-child / right-sibling): request ``b`` has ``N`` nodes, node 0 the
root (the last verified token). ``retrive_next_token[b, u]`` is u's first child,
``retrive_next_sibling[b, u]`` its next sibling, -1 for none; ``retrive_index[b, u]`` is u's
slot in the flat ``predicts`` buffer (``b * N + u`` as built by
:func:`build_tree_kernel_efficient`).
"""

from __future__ import annotations

import warnings

import torch

from domino_ops.reference import inverse_cdf_pick, positive

__all__ = ["build_tree_kernel_efficient", "verify_tree_greedy", "tree_speculative_sampling_target_only",
           "verify_tree_sampling", "FULL_MASK", "QLEN_ONLY", "QLEN_ONLY_BITPACKING", "packed_mask_dtype"]

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2  # sgl-kernel's TreeMaskMode


def packed_mask_dtype(draft_token_num: int) -> torch.dtype:
    """The dtype SGLang allocates for a QLEN_ONLY_BITPACKING mask: one word per row."""
    if draft_token_num > 32:
        raise ValueError(f"QLEN_ONLY_BITPACKING needs draft_token_num <= 32, got {draft_token_num}")
    return torch.uint8 if draft_token_num <= 8 else (torch.uint16 if draft_token_num <= 16 else torch.uint32)


def _tree_parents(sel: list[int], plist: list[int], topk: int, n: int) -> list[int]:
    """Parent node of each node (-1 for the root and for a node whose parent was not
    selected): the root when ``sel[i-1] // topk == 0``, else the first node whose selected
    index equals ``plist[sel[i-1] // topk]``."""
    parent = [-1] * n
    for i in range(1, n):
        slot = sel[i - 1] // topk
        if slot == 0:
            parent[i] = 0
            continue
        want = plist[slot]
        parent[i] = next((p + 1 for p in range(n - 1) if sel[p] == want), -1)
    return parent


def _ancestry(parent: list[int], t: int) -> list[int]:
    """t and its ancestors below the root (stops at the root or at a missing parent)."""
    chain = []
    while t > 0:
        chain.append(t)
        if len(chain) >= len(parent):
            raise ValueError(f"parent_list and selected_index do not form a tree: node {chain[0]} is its own ancestor")
        t = parent[t]
    return chain


def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                retrive_index, retrive_next_token, retrive_next_sibling,
                                topk, depth, draft_token_num, tree_mask_mode):
    """Reference of :func:`domino_ops.build_tree_kernel_efficient`."""
    n = draft_token_num
    bs = selected_index.shape[0]
    sel = selected_index.tolist()
    plist = parent_list.tolist() if parent_list.numel() else [[] for _ in range(bs)]
    seq = verified_seq_len.tolist()
    flat_mask = tree_mask.view(-1)
    flat_pos = positions.view(-1)
    packed = (flat_mask.view(torch.uint8).view(flat_mask.numel(), flat_mask.element_size())  # [words, bytes]
              if tree_mask_mode == QLEN_ONLY_BITPACKING else None)
    offset = 0  # FULL_MASK: start of request b's block
    orphans = 0
    for b in range(bs):
        parent = _tree_parents(sel[b], plist[b], topk, n)
        orphans += parent.count(-1) - 1
        chains = [_ancestry(parent, t) for t in range(n)]
        first_child, next_sibling = [-1] * n, [-1] * n
        for i in range(n - 1, 0, -1):  # prepend in descending order: ascending child lists
            if parent[i] >= 0:
                next_sibling[i] = first_child[parent[i]]
                first_child[parent[i]] = i
        retrive_index[b] = torch.arange(b * n, (b + 1) * n)
        retrive_next_token[b] = torch.tensor(first_child)
        retrive_next_sibling[b] = torch.tensor(next_sibling)
        flat_pos[b * n:(b + 1) * n] = torch.tensor([seq[b] + len(c) for c in chains])
        rows = torch.zeros(n, n, dtype=torch.bool)
        rows[:, 0] = True
        for t, chain in enumerate(chains):
            rows[t, chain] = True
        if tree_mask_mode == FULL_MASK:
            width = seq[b] + n
            block = flat_mask[offset:offset + n * width].view(n, width)
            block[:, seq[b]:] = rows
            offset += n * width
        elif tree_mask_mode == QLEN_ONLY:
            flat_mask[b * n * n:(b + 1) * n * n] = rows.reshape(-1)
        else:
            weights = torch.tensor([1 << j for j in range(n)], dtype=torch.int64)
            words = (rows.to(torch.int64) * weights).sum(dim=1)  # bit j = column j
            nbytes = packed.shape[1]
            le = torch.stack([(words >> (8 * k)) & 0xFF for k in range(nbytes)], dim=1).to(torch.uint8)
            packed[b * n:(b + 1) * n] = le  # little-endian words
    if orphans:
        warnings.warn(f"build_tree_kernel_efficient: invalid eagle tree, {orphans} draft token(s) whose parent was "
                      "not selected were left unlinked (NaN or tied -inf draft scores?)", stacklevel=2)


def _walk_links(next_token: list[int], next_sibling: list[int], node: int, n: int):
    """u's children in sibling order (ValueError on a sibling cycle)."""
    child, seen = next_token[node], 0
    while child != -1:
        yield child
        seen += 1
        child = next_sibling[child]
        if seen >= n and child != -1:
            raise ValueError("retrive_next_sibling has a cycle")


def _write_paths(predicts, accept_index, accept_token_num, ridx, paths, emitted):
    """predicts[r(u)] = -1 for every node, then the emitted tokens along each path."""
    pred = predicts.tolist()
    for row in ridx:
        for r in row:
            pred[r] = -1
    steps = accept_index.shape[1]
    acc = []
    for b, (path, toks) in enumerate(zip(paths, emitted)):
        for u, tok in zip(path, toks):
            pred[ridx[b][u]] = tok
        acc.append([ridx[b][u] for u in path] + [-1] * (steps - len(path)))
    predicts.copy_(torch.tensor(pred, dtype=torch.int32))
    accept_index.copy_(torch.tensor(acc, dtype=torch.int32).view(accept_index.shape))
    accept_token_num.copy_(torch.tensor([len(p) - 1 for p in paths], dtype=torch.int32))


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       retrive_next_token, retrive_next_sibling, target_predict):
    """Reference of :func:`domino_ops.verify_tree_greedy`."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nt, ns = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()  # addressed by retrive_index, like predicts
    paths, emitted = [], []
    for b in range(bs):
        path, toks, node = [0], [], 0
        while len(path) < steps:
            want = target[ridx[b][node]]
            child = next((c for c in _walk_links(nt[b], ns[b], node, n) if cand[b][c] == want), -1)
            if child == -1:
                break
            toks.append(want)
            path.append(child)
            node = child
        toks.append(target[ridx[b][node]])  # the bonus token
        paths.append(path)
        emitted.append(toks)
    _write_paths(predicts, accept_index, accept_token_num, ridx, paths, emitted)


def _draw_residual(p_row, q_row, rejected, coin) -> int:
    """First token whose float64 cumulative residual exceeds coin * total; else the last
    token with positive residual; else the last token (sgl-kernel's fallbacks)."""
    r = torch.fmax(p_row - q_row if q_row is not None else p_row, torch.zeros((), dtype=torch.float32))
    if rejected:
        r[torch.tensor(rejected)] = 0.0
    cdf = torch.cumsum(r.double(), dim=0)
    u = float(coin) * float(cdf[-1])
    positive = r > 0
    hit = torch.nonzero(positive & (cdf > u))
    if hit.numel():
        return int(hit[0, 0])
    valid = torch.nonzero(positive)
    return int(valid[-1, 0]) if valid.numel() else r.numel() - 1


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs=None,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True):
    """Reference of :func:`domino_ops.tree_speculative_sampling_target_only`."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nt, ns = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    f32 = torch.float32
    single = torch.tensor(threshold_single, dtype=f32)
    acc_div = torch.maximum(torch.tensor(threshold_acc, dtype=f32), torch.tensor(1e-9, dtype=f32))
    paths, emitted = [], []
    for b in range(bs):
        path, toks, node, rejected = [0], [], 0, []
        while len(path) < steps:
            coin = uniform_samples[b, node]
            acc = torch.zeros((), dtype=f32)
            chosen = -1
            rejected = []
            for child in _walk_links(nt[b], ns[b], node, n):
                p = target_probs[b, node, cand[b][child]]
                acc = acc + p  # float32, in sibling order
                if bool(coin <= acc / acc_div) or bool(p >= single):
                    chosen = child
                    break
                rejected.append(cand[b][child])
            if chosen == -1:
                break
            rejected = []
            toks.append(cand[b][chosen])
            path.append(chosen)
            node = chosen
        full = len(path) == steps
        q_row = None if draft_probs is None or full else draft_probs[b, node]
        toks.append(_draw_residual(target_probs[b, node], q_row, rejected, uniform_samples_for_final_sampling[b]))
        paths.append(path)
        emitted.append(toks)
    _write_paths(predicts, accept_index, accept_token_num, ridx, paths, emitted)


def _total(w: torch.Tensor) -> float:
    return float(torch.cumsum(w, dim=0)[-1])  # float64, in index order, as the kernels


def next_target(p: torch.Tensor, pn: float, q: torch.Tensor, qn: float) -> tuple[torch.Tensor, float]:
    """After a rejection: the residual ``max(0, p/pn - q/qn)`` and its total, the target
    the next sibling is verified against (unchanged when the residual is zero: then the
    rejection had probability zero and happened by rounding)."""
    r = positive(p / pn - (q / qn if qn > 0 else 0.0))
    total = _total(r)
    return (r, total) if total > 0 else (p, pn)


def next_draft(q: torch.Tensor, x: int) -> tuple[torch.Tensor, float]:
    """After a rejection of token x: the draft the next sibling was drawn from, q without x
    (children are drawn without replacement), and its total."""
    q = q.clone()
    q[x] = 0.0
    return q, _total(q)


def verify_tree_sampling(predicts, accept_index, accept_token_num, candidates, retrive_index,
                         retrive_next_token, retrive_next_sibling, uniform_samples,
                         uniform_samples_for_final_sampling, target_probs, draft_probs):
    """Reference of :func:`domino_ops.verify_tree_sampling` (float64, as the kernels)."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nt, ns = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    coins = uniform_samples.double().tolist()
    paths, emitted = [], []
    for b in range(bs):
        path, toks, node = [0], [], 0
        while True:
            p, pn = target_probs[b, node].double(), 1.0  # p/pn: the target the children face
            q, qn = draft_probs[b, node].double(), 1.0  # q/qn: the draft they were drawn from
            chosen = -1
            if len(path) < steps:
                for child in _walk_links(nt[b], ns[b], node, n):
                    x = cand[b][child]
                    qx = float(q[x]) / qn if qn > 0 else 0.0
                    # a child the draft gives no mass could not have been drawn: it is rejected
                    # (a no-op: the residual of a zero draft is the target itself)
                    if qx > 0 and coins[b][child] * qx < float(p[x]) / pn:
                        chosen = child
                        break
                    p, pn = next_target(p, pn, q, qn)
                    q, qn = next_draft(q, x)
            if chosen == -1:
                break
            toks.append(cand[b][chosen])
            path.append(chosen)
            node = chosen
        toks.append(inverse_cdf_pick(positive(p), uniform_samples_for_final_sampling[b]))
        paths.append(path)
        emitted.append(toks)
    _write_paths(predicts, accept_index, accept_token_num, ridx, paths, emitted)
