"""build_tree_kernel_efficient on every backend (tree_backends.py: reference, native CPU,
emulated CUDA, Triton): sgl-kernel's hand-built case, random EAGLE drafts against a
parent-pointer oracle in all three mask modes with poisoned outputs, and bad input."""

import random
import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference_tree
from tree_backends import ALL, CPU_KERNELS, GPU, check_direct_call_raises, params, run_guarded, tree_op, wrapper_params
from tree_backends import with_ as with_args
from tree_cases import POISON, ancestry, oracle_tree, pack_rows, random_eagle_draft

FULL, QLEN, PACKED = 0, 1, 2


def outputs(bs, n, seq_lens, mode, *, fill=None, gen=None, extra_positions=0):
    """Poisoned outputs: positions/retrive_* = POISON; the mask random (or ``fill``)."""
    if mode == PACKED:
        numel, dtype = bs * n, reference_tree.packed_mask_dtype(n)
    else:
        numel, dtype = (sum(seq_lens) * n if mode == FULL else 0) + bs * n * n, torch.bool
    if fill is None:
        raw = torch.randint(0, 256, (numel * torch.empty((), dtype=dtype).element_size(),), dtype=torch.uint8,
                            generator=gen)
        mask = raw.view(dtype) if dtype != torch.bool else (raw & 1).bool()
    else:
        mask = torch.full((numel,), fill, dtype=dtype)
    positions = torch.full((bs * n + extra_positions,), POISON, dtype=torch.int64)
    links = [torch.full((bs, n), POISON, dtype=torch.int64) for _ in range(3)]
    return mask, positions, *links


def run(backend, parent_list, selected_index, seq_lens, topk, depth, n, mode, outs, *, checked=True):
    tree_op(backend, "build_tree_kernel_efficient", checked=checked)(
        parent_list, selected_index, torch.tensor(seq_lens, dtype=torch.int64), *outs, topk, depth, n, mode)


def check_against_oracle(outs, parents, seq_lens, mode, mask_before):
    mask, positions, ridx, rnext, rsib = outs
    bs, n = len(parents), len(parents[0])
    exp_masks, exp_pos, exp_ridx, exp_next, exp_sib = oracle_tree(parents, seq_lens)
    assert torch.equal(positions[: bs * n], exp_pos)
    assert (positions[bs * n:] == POISON).all()  # past bs*n: untouched
    assert torch.equal(ridx, exp_ridx)
    assert torch.equal(rnext, exp_next)
    assert torch.equal(rsib, exp_sib)
    if mode == FULL:
        offset = 0
        for b in range(bs):
            width = seq_lens[b] + n
            block = mask[offset: offset + n * width].view(n, width)
            before = mask_before[offset: offset + n * width].view(n, width)
            assert torch.equal(block[:, : seq_lens[b]], before[:, : seq_lens[b]])  # caller's prefix kept
            assert torch.equal(block[:, seq_lens[b]:], exp_masks[b])
            offset += n * width
        assert torch.equal(mask[offset:], mask_before[offset:])
    elif mode == QLEN:
        assert torch.equal(mask.view(bs, n, n), exp_masks)
    else:
        assert torch.equal(mask.view(torch.uint8).view(bs * n, -1), pack_rows(exp_masks.view(bs * n, n)))


# --- sgl-kernel's own case ------------------------------------------------------------------
# test/srt/test_build_eagle_tree.py (sgl-project/sglang): two requests, topk 4, depth 4,
# N 8, seq_lens [5, 10]; the per-step scores, tokens and parents of an EAGLE draft.

SGL_SCORES = [
    [[[7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]], [[9.7476e-01, 2.2219e-02, 6.5031e-04, 1.3212e-04]]],
    [[[6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03], [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
      [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08], [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05]],
     [[8.4832e-02, 6.6068e-02, 5.8304e-02, 5.7851e-02], [2.3616e-03, 1.1243e-03, 5.4368e-04, 2.7768e-04],
      [2.5286e-04, 1.5578e-04, 2.8817e-05, 1.2888e-05], [1.2834e-04, 2.5417e-06, 1.1279e-06, 1.6088e-08]]],
    [[[6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06], [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
      [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05], [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05]],
     [[2.3263e-02, 2.0054e-02, 9.3990e-03, 2.7783e-03], [6.4156e-02, 5.5506e-04, 1.0429e-04, 9.7211e-05],
      [4.9950e-02, 5.0630e-03, 9.0068e-04, 3.3656e-04], [7.5817e-03, 8.5731e-04, 6.9972e-04, 6.0793e-04]]],
    [[[6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06], [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
      [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05], [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05]],
     [[5.8608e-02, 1.8840e-03, 7.8535e-04, 4.4400e-04], [1.2185e-02, 2.0684e-03, 1.7418e-03, 1.4327e-03],
      [6.2455e-03, 6.1487e-03, 2.6862e-03, 1.8034e-03], [1.8590e-03, 1.6151e-03, 1.2481e-03, 3.6038e-04]]],
]
SGL_PARENTS = [[[-1, 0, 1, 2, 3], [-1, 0, 1, 2, 3]], [[4, 8, 9, 10], [4, 5, 6, 7]],
               [[20, 24, 21, 28], [24, 28, 20, 21]], [[36, 40, 41, 44], [36, 40, 44, 45]]]
SGL_SEQ_LENS = [5, 10]
SGL_POSITIONS = [5, 6, 6, 7, 7, 8, 8, 9, 10, 11, 12, 12, 12, 12, 13, 14]
SGL_NEXT_TOKEN = [[1, 3, 4, 5, 6, 7, -1, -1], [1, 2, -1, 6, -1, -1, 7, -1]]
SGL_NEXT_SIBLING = [[-1, 2, -1, -1, -1, -1, -1, -1], [-1, -1, 3, 4, 5, -1, -1, -1]]


def sgl_case_inputs(n=8):
    """SGLang's organize_draft_results: the n-1 best scores, sorted by flat index."""
    scores = torch.cat([torch.tensor(s, dtype=torch.float32) for s in SGL_SCORES], dim=1).flatten(1)
    selected = torch.sort(torch.topk(scores, n - 1, dim=-1).indices).values
    parent_list = torch.cat([torch.tensor(p, dtype=torch.int64) for p in SGL_PARENTS[:-1]], dim=1)
    return parent_list, selected


def parents_from_links(next_token, next_sibling):
    parent = [-1] * len(next_token)
    for u, c in enumerate(next_token):
        while c != -1:
            parent[c] = u
            c = next_sibling[c]
    return parent


@pytest.mark.parametrize("backend", params())
@pytest.mark.parametrize("mode", [FULL, QLEN, PACKED])
def test_sglang_eagle_tree_case(backend, mode):
    parent_list, selected = sgl_case_inputs()
    outs = outputs(2, 8, SGL_SEQ_LENS, mode, fill=(True if mode == FULL else None), gen=torch.Generator().manual_seed(1))
    before = outs[0].clone()
    run(backend, parent_list, selected, SGL_SEQ_LENS, 4, 4, 8, mode, outs)
    mask, positions, ridx, rnext, rsib = outs
    assert positions.tolist() == SGL_POSITIONS
    assert ridx.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
    assert rnext.tolist() == SGL_NEXT_TOKEN
    assert rsib.tolist() == SGL_NEXT_SIBLING
    # The mask is the ancestor matrix of the tree those links describe.
    parents = [parents_from_links(a, s) for a, s in zip(SGL_NEXT_TOKEN, SGL_NEXT_SIBLING)]
    check_against_oracle(outs, parents, SGL_SEQ_LENS, mode, before)
    if mode == FULL:  # the caller's True prefix, root column True, root row attends to no draft
        assert mask[: 8 * 13].view(8, 13)[:, :6].all() and not mask[: 8 * 13].view(8, 13)[0, 6:].any()


@pytest.mark.parametrize("backend", params())
@pytest.mark.parametrize("n", [8, 9, 17, 32])
def test_star_tree_bitpacking_word_sizes(backend, n):
    """All nodes children of the root (selected_index < topk, repeated): each row holds the
    root bit and its own bit, in a 1/2/4-byte little-endian word."""
    topk, depth = 2, 2
    parent_list = torch.tensor([[-1, 0, 2]], dtype=torch.int64)
    selected = torch.tensor([[k % topk for k in range(n - 1)]], dtype=torch.int64)
    mask = torch.full((n,), 0x55, dtype=reference_tree.packed_mask_dtype(n))
    outs = (mask, torch.empty(n, dtype=torch.int64), *[torch.empty(1, n, dtype=torch.int64) for _ in range(3)])
    run(backend, parent_list, selected, [5], topk, depth, n, PACKED, outs)
    words = mask.view(torch.uint8).view(n, -1).to(torch.int64)
    values = sum(words[:, k] << (8 * k) for k in range(words.shape[1]))
    assert values.tolist() == [1] + [1 | (1 << t) for t in range(1, n)]
    assert outs[1].tolist() == [5] + [6] * (n - 1)
    assert outs[3].tolist() == [[1] + [-1] * (n - 1)]
    assert outs[4].tolist() == [[-1] + list(range(2, n)) + [-1]]


@pytest.mark.parametrize("backend", wrapper_params())
@pytest.mark.parametrize("n", [5, 9, 17])
def test_bitpacking_takes_a_byte_buffer_as_sgl_kernel_does(backend, n):
    """sgl-kernel addresses the packed mask as bytes (its own benchmark passes bs*N*nbytes
    uint8), so the wrapper takes such a buffer too: it gets the word buffer's bytes, a
    trailing byte past the rows is left alone, and a start that is not word-aligned is
    refused by name (the kernels write whole words)."""
    bs, topk, depth = 2, 3, 4
    parent_list, selected, _ = random_eagle_draft(random.Random(n), bs, topk, depth, n)
    nbytes = torch.empty((), dtype=reference_tree.packed_mask_dtype(n)).element_size()
    call = lambda mask: domino_ops.build_tree_kernel_efficient(  # noqa: E731
        parent_list, selected, torch.tensor([4, 7]), mask, *outputs(bs, n, [4, 7], PACKED)[1:], topk, depth, n,
        PACKED, backend=backend)
    words = torch.zeros(bs * n, dtype=reference_tree.packed_mask_dtype(n))
    call(words)
    for dtype in (torch.uint8, torch.int8):
        raw = torch.full((bs * n * nbytes + 1,), 0x5A, dtype=torch.uint8)
        call(raw.view(dtype))
        assert torch.equal(raw[:-1], words.view(torch.uint8)) and raw[-1] == 0x5A
    if nbytes > 1:
        with pytest.raises(ValueError, match=f"tree_mask as a byte buffer must start at a multiple of {nbytes}"):
            call(torch.zeros(bs * n * nbytes + 1, dtype=torch.uint8)[1:])
        with pytest.raises(ValueError, match=f"tree_mask must hold at least {bs * n * nbytes} bytes"):
            call(torch.zeros(bs * n * nbytes - 1, dtype=torch.uint8))


@pytest.mark.parametrize("backend", params())
def test_full_mask_of_2_31_minus_1_elements_is_addressed_in_64_bits(backend):
    """The Triton kernel typed the mask's element count as the i32 it is below 2^31, and its
    + 1 wrapped at 2^31 - 1 elements: every request's rows went 2 GiB before the mask. A
    mask that large (its untouched pages cost nothing) gets the draft cells an exact one
    gets, and keeps the rest of its bytes."""
    seq_lens, n = [3, 4], 5
    parent_list, selected, _ = random_eagle_draft(random.Random(5), 2, 2, 3, n)
    small = outputs(2, n, seq_lens, FULL)
    run(backend, parent_list, selected, seq_lens, 2, 3, n, FULL, small)
    cells, offset = [], 0
    for seq in seq_lens:  # request b's rows start after the earlier requests' (seq + n) x n blocks
        cells += [offset + i * (seq + n) + seq + j for i in range(n) for j in range(n)]
        offset += (seq + n) * n
    cells = torch.tensor(cells)
    big = (torch.empty(2**31 - 1, dtype=torch.bool), *outputs(2, n, seq_lens, FULL)[1:])
    poison = torch.rand(offset, generator=torch.Generator().manual_seed(0)) < 0.5
    big[0][:offset] = poison
    run(backend, parent_list, selected, seq_lens, 2, 3, n, FULL, big)
    want = poison.clone()
    want[cells] = small[0][cells]
    assert torch.equal(big[0][:offset], want)
    assert all(torch.equal(x, y) for x, y in zip(big[1:], small[1:]))


@pytest.mark.parametrize("backend", params())
@pytest.mark.parametrize("mode", [FULL, QLEN, PACKED])
def test_an_empty_batch_writes_nothing(backend, mode):
    """bs = 0 is a valid call in every mode (the reference's bit-packed path once failed on
    its empty mask): nothing to write, the extra positions left poisoned."""
    outs = outputs(0, 8, [], mode, extra_positions=3)
    run(backend, torch.empty(0, 5, dtype=torch.int64), torch.empty(0, 7, dtype=torch.int64), [], 4, 2, 8, mode, outs)
    assert (outs[1] == POISON).all() and outs[0].numel() == 0


# --- random drafts against the oracle --------------------------------------------------------

@pytest.mark.parametrize("backend", params())
@given(bs=st.integers(1, 3), topk=st.integers(1, 4), depth=st.integers(1, 5), frac=st.floats(0, 1),
       mode=st.sampled_from([FULL, QLEN, PACKED]), sort=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_random_drafts_match_parent_pointer_oracle(bs, topk, depth, frac, mode, sort, seed, backend):
    rng = random.Random(seed)
    total = topk + (depth - 1) * topk * topk
    n = 1 + round(frac * min(total, 31 if mode == PACKED else 48))
    parent_list, selected, parents = random_eagle_draft(rng, bs, topk, depth, n, sort=sort)
    seq_lens = [rng.randrange(0, 12) for _ in range(bs)]
    outs = outputs(bs, n, seq_lens, mode, gen=torch.Generator().manual_seed(seed), extra_positions=3)
    before = outs[0].clone()
    run(backend, parent_list, selected, seq_lens, topk, depth, n, mode, outs)
    check_against_oracle(outs, parents, seq_lens, mode, before)


@pytest.mark.parametrize("backend", params(b for b in ALL if b != "reference"))
@pytest.mark.parametrize("mode", [FULL, QLEN, PACKED])
def test_kernels_equal_reference_on_sglang_sizes(backend, mode):
    rng = random.Random(mode)
    bs, topk, depth, n = 8, 4, 5, 32 if mode == PACKED else 64
    parent_list, selected, _ = random_eagle_draft(rng, bs, topk, depth, n)
    seq_lens = [rng.randrange(0, 300) for _ in range(bs)]
    got = {}
    for be in ("reference", backend):
        outs = outputs(bs, n, seq_lens, mode, gen=torch.Generator().manual_seed(0))
        run(be, parent_list, selected, seq_lens, topk, depth, n, mode, outs)
        got[be] = outs
    for a, b in zip(got[backend], got["reference"]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", params())
def test_chain_is_lower_triangular(backend):
    """topk 1: a chain; positions seq_len + i, mask lower-triangular, links i -> i+1."""
    n, depth = 6, 5
    parent_list = torch.tensor([[-1, 0, 1, 2, 3]], dtype=torch.int64)
    selected = torch.arange(n - 1, dtype=torch.int64).view(1, n - 1)
    outs = outputs(1, n, [3], QLEN)
    run(backend, parent_list, selected, [3], 1, depth, n, QLEN, outs)
    assert torch.equal(outs[0].view(n, n), torch.ones(n, n, dtype=torch.bool).tril())
    assert outs[1].tolist() == [3, 4, 5, 6, 7, 8]
    assert outs[3].tolist() == [[1, 2, 3, 4, 5, -1]] and outs[4].tolist() == [[-1] * n]


@pytest.mark.parametrize("backend", params())
def test_depth_one_accepts_sglangs_empty_float_parent_list(backend):
    """SGLang passes torch.empty(bs, 0) (float32) as parent_list when spec_steps == 1."""
    topk, n = 4, 4
    selected = torch.tensor([[0, 1, 3], [1, 2, 3]], dtype=torch.int64)
    outs = outputs(2, n, [2, 0], FULL, fill=True)
    run(backend, torch.empty(2, 0), selected, [2, 0], topk, 1, n, FULL, outs)
    assert outs[1].tolist() == [2, 3, 3, 3, 0, 1, 1, 1]
    assert outs[3].tolist() == [[1, -1, -1, -1]] * 2
    assert outs[4].tolist() == [[-1, 2, 3, -1]] * 2


@pytest.mark.parametrize("backend", params())
def test_orphan_node_left_unlinked(backend, capfd):
    """A node whose parent was not selected: sgl-kernel warns and leaves it unlinked; its
    own child still hangs from it. Mask rows and positions cover the ancestry found."""
    topk, depth, n = 2, 3, 4
    # Step 1's frontier is flats 0, 1; step 2's flats 4, 5 (slots 3, 4). Node 1 = flat 0 (a
    # root child); node 2 = flat 4 (slot 2 -> flat 1, not selected: an orphan); node 3 =
    # flat 6 (slot 3 -> flat 4 = node 2).
    parent_list = torch.tensor([[-1, 0, 1, 4, 5]], dtype=torch.int64)
    selected = torch.tensor([[0, 4, 6]], dtype=torch.int64)
    outs = outputs(1, n, [0], QLEN)
    warning = "invalid eagle tree, 1 draft token.* whose parent was not selected"
    if backend == "reference":
        with pytest.warns(UserWarning, match=warning):
            run(backend, parent_list, selected, [0], topk, depth, n, QLEN, outs)
    elif backend == "native":  # a C++ warning: stderr (c10's handler) unless a Python warning handler is installed
        run(backend, parent_list, selected, [0], topk, depth, n, QLEN, outs)
        assert re.search(warning, capfd.readouterr().err)
    else:  # the GPU kernels cannot warn without a host sync: same outputs, no warning
        run(backend, parent_list, selected, [0], topk, depth, n, QLEN, outs)
    assert outs[3].tolist() == [[1, -1, 3, -1]] and outs[4].tolist() == [[-1, -1, -1, -1]]
    assert outs[1].tolist() == [0, 1, 1, 2]
    assert outs[0].view(n, n).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]


def test_parent_cycle_raises():
    """Node 1's parent is node 2 and node 2's parent node 1: not a tree."""
    topk, depth, n = 1, 3, 3
    parent_list = torch.tensor([[-1, 2, 1]], dtype=torch.int64)
    selected = torch.tensor([[1, 2]], dtype=torch.int64)
    outs = outputs(1, n, [0], QLEN)
    before = [t.clone() for t in outs]
    args = (parent_list, selected, torch.tensor([0]), *outs, topk, depth, n, QLEN)
    with pytest.raises(RuntimeError, match="do not form a tree"):
        torch.ops.domino_ops.build_tree_kernel_efficient(*args)
    for backend in CPU_KERNELS:
        with pytest.raises(ValueError, match="do not form a tree"):
            domino_ops.build_tree_kernel_efficient(*args, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(outs, before))  # nothing written


@pytest.mark.parametrize("backend", params(GPU))
def test_parent_cycle_nodes_become_orphans_on_gpu(backend):
    """The GPU kernels cannot raise: the nodes on a parent cycle are made orphans (linked to
    nothing, depth 1, mask row root + self)."""
    topk, depth, n = 1, 3, 4
    parent_list = torch.tensor([[-1, 2, 1]], dtype=torch.int64)
    selected = torch.tensor([[1, 2, 0]], dtype=torch.int64)  # node 3: a child of the root
    outs = outputs(1, n, [2], QLEN)
    run(backend, parent_list, selected, [2], topk, depth, n, QLEN, outs, checked=False)
    assert outs[1].tolist() == [2, 3, 3, 3]
    assert outs[3].tolist() == [[3, -1, -1, -1]] and outs[4].tolist() == [[-1, -1, -1, -1]]
    assert outs[0].view(n, n).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]


def test_opcheck():
    rng = random.Random(0)
    parent_list, selected, _ = random_eagle_draft(rng, 2, 3, 3, 7)
    for mode in (FULL, QLEN, PACKED):
        outs = outputs(2, 7, [3, 4], mode)
        torch.library.opcheck(torch.ops.domino_ops.build_tree_kernel_efficient.default,
                              (parent_list, selected, torch.tensor([3, 4]), *outs, 3, 3, 7, mode),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# --- bad input -----------------------------------------------------------------------------

def good_args(mode=QLEN):
    rng = random.Random(0)
    parent_list, selected, _ = random_eagle_draft(rng, 2, 2, 3, 5)
    mask, positions, ridx, rnext, rsib = outputs(2, 5, [3, 4], mode)
    return dict(parent_list=parent_list, selected_index=selected, verified_seq_len=torch.tensor([3, 4]),
                tree_mask=mask, positions=positions, retrive_index=ridx, retrive_next_token=rnext,
                retrive_next_sibling=rsib, topk=2, depth=3, draft_token_num=5, tree_mask_mode=mode)


def with_(mode=QLEN, **over):
    return with_args(lambda: good_args(mode), **over)


WRAPPER_CASES = [
    (with_(selected_index=torch.zeros(2, 4, dtype=torch.int32)), TypeError, "selected_index must be int64"),
    (with_(selected_index=torch.zeros(2, 3, dtype=torch.int64)), ValueError, r"selected_index must have shape \[2, 4\]"),
    (with_(selected_index=torch.zeros(4, 2, dtype=torch.int64).T), ValueError, "selected_index must be contiguous"),
    (with_(selected_index=[[0, 1, 2, 3]] * 2), TypeError, "selected_index must be a torch.Tensor"),
    (with_(parent_list=torch.zeros(2, 4, dtype=torch.int64)), ValueError, r"parent_list must have shape \[2, 5\]"),
    (with_(parent_list=torch.zeros(2, 5, dtype=torch.int32)), TypeError, "parent_list must be int64"),
    (with_(verified_seq_len=torch.tensor([3])), ValueError, r"verified_seq_len must have shape \[2\]"),
    (with_(verified_seq_len=torch.tensor([3, -1])), ValueError, r"verified_seq_len must be a length in \[0, 2\^31\)"),
    (with_(verified_seq_len=torch.tensor([3, 1 << 62])), ValueError, r"verified_seq_len must be a length in \[0, 2\^31\)"),
    (with_(tree_mask=torch.zeros(50, dtype=torch.uint8)), TypeError, "tree_mask must be bool"),
    (with_(tree_mask=torch.zeros(49, dtype=torch.bool)), ValueError, "tree_mask must hold at least 50"),
    (with_(FULL, tree_mask=torch.zeros(2 * 25 + 7 * 5 - 1, dtype=torch.bool)), ValueError, "tree_mask must hold sum"),
    (with_(PACKED, tree_mask=torch.zeros(10, dtype=torch.uint16)), TypeError, "tree_mask must be uint8 or int8"),
    (with_(positions=torch.zeros(9, dtype=torch.int64)), ValueError, "positions must hold at least"),
    (with_(positions=torch.zeros(10, dtype=torch.int32)), TypeError, "positions must be int64"),
    (with_(retrive_next_token=torch.zeros(2, 4, dtype=torch.int64)), ValueError, r"retrive_next_token must have shape \[2, 5\]"),
    (with_(retrive_index=torch.zeros(2, 5)), TypeError, "retrive_index must be int64"),
    (with_(topk=0), ValueError, "topk must be >= 1"),
    # the native kernel's bound on every backend (the reference and Triton had built a tree;
    # 2**70 had given a contradictory message from the schema, or Triton's OverflowError)
    (with_(topk=2 ** 40), ValueError, "topk must be <= 1048576"),
    (with_(depth=2 ** 70), ValueError, "depth must be <= 1048576"),
    (with_(topk=np.bool_(True)), TypeError, "topk must be an int, got a bool"),
    (with_(depth=2.0), TypeError, "depth must be an int"),
    (with_(draft_token_num=True), TypeError, "draft_token_num must be an int"),
    (with_(tree_mask_mode=3), ValueError, "tree_mask_mode must be 0"),
    (with_(selected_index=torch.tensor([[0, 1, 2, 10]] * 2)), ValueError, r"selected_index must be in \[0, .*10\)"),
    (with_(selected_index=torch.tensor([[-1, 1, 2, 3]] * 2)), ValueError, "selected_index must be in"),
]


@pytest.mark.parametrize("backend", wrapper_params())
@pytest.mark.parametrize("args,exc,msg", WRAPPER_CASES)
def test_wrapper_bad_input(args, exc, msg, backend):
    """Index values are checked by the native kernel (RuntimeError re-raised as ValueError)
    or by the wrapper before the reference runs, with the same wording."""
    before = {k: v.clone() for k, v in args.items() if k in ("tree_mask", "positions", "retrive_index")}
    with pytest.raises(exc, match=msg):
        domino_ops.build_tree_kernel_efficient(**args, backend=backend)
    assert all(torch.equal(args[k], v) for k, v in before.items())


def test_wrapper_bad_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        domino_ops.build_tree_kernel_efficient(**good_args(), backend="cuda")


@pytest.mark.parametrize("backend", wrapper_params())
def test_wrapper_rejects_aliasing(backend):
    args = good_args()
    args["retrive_next_sibling"] = args["retrive_next_token"]
    with pytest.raises(ValueError, match="output retrive_next_sibling overlaps output retrive_next_token"):
        domino_ops.build_tree_kernel_efficient(**args, backend=backend)
    args = good_args()
    args["positions"] = args["verified_seq_len"].new_zeros(12)
    args["verified_seq_len"] = args["positions"][10:]
    with pytest.raises(ValueError, match="output positions overlaps input verified_seq_len"):
        domino_ops.build_tree_kernel_efficient(**args, backend=backend)
    with pytest.raises(ValueError, match="draft_token_num must be <= 32 with QLEN_ONLY_BITPACKING"):
        domino_ops.build_tree_kernel_efficient(**with_(PACKED, draft_token_num=33))


DIRECT_CASES = [
    (with_(selected_index=torch.tensor([[0, 1, 2, 10]] * 2)), r"selected_index must be in \[0, .*10\)"),
    (with_(verified_seq_len=torch.tensor([3, -1])), r"verified_seq_len must be a length in \[0, 2\^31\)"),
    (with_(verified_seq_len=torch.tensor([3, 1 << 62])), r"verified_seq_len must be a length in \[0, 2\^31\)"),
    (with_(FULL, tree_mask=torch.zeros(84, dtype=torch.bool)), "tree_mask must hold sum"),
    (with_(FULL, verified_seq_len=torch.tensor([3, 2**30])), "tree_mask is too small"),
    (with_(tree_mask=torch.zeros(49, dtype=torch.bool)), "tree_mask must hold bs"),
    (with_(PACKED, tree_mask=torch.zeros(10, dtype=torch.int32)), "integer dtype of 1 byte"),
    (with_(PACKED, draft_token_num=33), "draft_token_num must be <= 32"),
    (with_(tree_mask_mode=-1), "tree_mask_mode must be 0"),
    (with_(parent_list=torch.zeros(2, 4, dtype=torch.int64)), "parent_list must have shape"),
    (with_(positions=torch.zeros(9, dtype=torch.int64)), "positions must hold"),
    (with_(retrive_index=torch.zeros(5, 2, dtype=torch.int64).T), "retrive_index must be contiguous"),
    (with_(topk=0), "topk must be >= 1"),
]


@pytest.mark.parametrize("args,msg", DIRECT_CASES)
def test_direct_call_bad_input_raises(args, msg):
    check_direct_call_raises("build_tree_kernel_efficient", args, msg)


def test_direct_call_rejects_aliasing():
    args = good_args()
    args["retrive_next_token"] = args["retrive_index"]
    check_direct_call_raises("build_tree_kernel_efficient", args,
                             "output retrive_next_token overlaps output retrive_index")
    args = good_args()
    args["selected_index"] = args["positions"][:8].view(2, 4)
    check_direct_call_raises("build_tree_kernel_efficient", args, "output positions overlaps input selected_index")


def test_ancestry_helper_sanity():
    assert ancestry([-1, 0, 1, 1], 3) == [3, 1]


# --- bad index values on the GPU kernels: no error (no host sync), never out of bounds ----------

BAD_VALUES = {
    "selected_index out of range": dict(selected_index=torch.tensor([[0, 1, 2, 2**40], [-1, 1, -(2**40), 3]])),
    "negative verified_seq_len": dict(mode=FULL, verified_seq_len=torch.tensor([-3, 4])),
    "FULL_MASK too small": dict(mode=FULL, verified_seq_len=torch.tensor([3, 2**62])),
    "FULL_MASK too small for the last request": dict(mode=FULL, verified_seq_len=torch.tensor([3, 5])),
}


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_gpu_kernels_never_go_out_of_bounds_on_bad_values(backend, case):
    """What the CPU kernel rejects, the GPU kernels must survive (build_tree_kernel_efficient.cu's
    header): outputs in guarded buffers (the FULL_MASK buffer sized for seq_lens [3, 4])."""
    over = dict(BAD_VALUES[case])
    args = with_(**over)
    run_guarded(backend, "build_tree_kernel_efficient", args, ("tree_mask", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling"))
    assert args["retrive_index"].view(-1).tolist() == list(range(10))
