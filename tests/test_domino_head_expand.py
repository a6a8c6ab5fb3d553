"""domino_head_expand (one step of Domino tree drafting) on every backend (reference, native
CPU, emulated CUDA, interpreted Triton): a frontier of one node with one child walks
exactly that backend's own rollout chain; each kernel's children are the best tokens of its
own logits, which match the reference's; permuting the frontier permutes the outputs;
sampled children are draws without replacement (the joint of the first two against the
exact law, with a with-replacement negative control); bad input. The GPU backends run
emulated or interpreted here: fixed small cases, populations by backend (POPULATION),
outputs poisoned."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import domino_ops
from domino_ops import reference
from domino_ops import triton as triton_ops
from domino_ops.sampling import expand_uniforms, kernel_sampling_args, may_sample
from kernel_backends import emulated_cuda_kernel
from kernel_cases import head_input_strategy, head_rollout_inputs, weights_as_float64
from packed_paths import PACKED_PATHS, packed_path
from poisoned_calls import run_head_poisoned
from stats import assert_matches_distribution
from tree_backends import GPU, device_of, params


SIZES = dict(b=[1, 3], k=[1, 4], V=[1, 7, 300], r=[1, 16, 33], G=[1, 24], H=[1, 8])
# The GPU backends' cases (interpreted programs are slow): head_rollout_inputs
# arguments (b, k, V, r, G, H, weight dtype, base dtype, table) covering both dtypes, both GRU
# inputs, vocabularies over several tiles (300: two emulated 256-row tiles, three Triton 128-row
# tiles) and ranks over one column chunk.
GPU_CASES = [(2, 3, 300, 16, 8, 4, torch.bfloat16, torch.float32, False),
             (1, 2, 17, 33, 5, 3, torch.float32, torch.bfloat16, True),
             (3, 2, 7, 3, 40, 8, torch.float32, torch.float32, False)]


def _kernel(backend, op):
    """The op itself on ``backend`` (native and cuda: the dispatcher op, which picks the
    kernel by the tensors' device)."""
    if backend == "emulated_cuda":
        return emulated_cuda_kernel(op)
    return triton_ops.kernel(op) if backend == "triton" else getattr(torch.ops.domino_ops, op)


def expand(inputs, node_state, node_seq, node_depth, m, backend="native", temperature=0.0, top_k=0, top_p=1.0,
           generator=None, w2_packed=None, w_hh_packed=None, write_node_logits=True):
    """domino_head_expand on ``backend``: the wrapper for the reference, else the op with
    poisoned outputs passed in (and the uniforms the wrapper would draw; sampling parameters
    as [b] tensors go to the op as its row tensors); ``w2_packed`` and
    ``w_hh_packed`` (PackedLinearWeights) go to the op as their data; without
    ``write_node_logits`` the op gets None for node_logits (and None comes back)."""
    base, hproj, _, gru_input, w_ih, w_hh, w1s, w2 = inputs
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    if backend == "reference":
        return domino_ops.domino_head_expand(base, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh,
                                             w1s, w2, num_children=m, generator=generator, backend=backend,
                                             write_node_logits=write_node_logits, **kw)
    n, V, G = node_state.shape[0], base.shape[2], node_state.shape[1]
    u = expand_uniforms(node_seq, m, generator) if may_sample(temperature) else None
    T, top_k, top_p, *rows = kernel_sampling_args(temperature, top_k, top_p, V)
    outs = (torch.full((n, m), -7, dtype=torch.long), torch.full((n, m), float("nan")),
            torch.full((n, m, G), float("nan")), torch.full((n, V), float("nan")))
    dev = device_of(backend)
    moved = [x.to(dev) if x is not None else None for x in (base, hproj, node_state, node_seq, node_depth, gru_input,
                                                            w_ih, w_hh, w1s, w2)]
    dev_outs = [o.to(dev) for o in outs[:4 if write_node_logits else 3]] + ([] if write_node_logits else [None])
    _kernel(backend, "domino_head_expand")(*moved, T, top_k, top_p, u.to(dev) if u is not None else None, *dev_outs,
                                           None if w2_packed is None else w2_packed.data,
                                           None if w_hh_packed is None else w_hh_packed.data,
                                           *[x.to(dev) if x is not None else None for x in rows])
    return tuple(o.cpu() if o is not None else None for o in dev_outs)


def rollout(backend, inputs):
    """The greedy head rollout on ``backend``: tokens, logprobs, final state."""
    if backend == "reference":
        return domino_ops.domino_head_rollout(inputs[0].clone(), *inputs[1:], backend="reference")
    dev = device_of(backend)
    return run_head_poisoned(_kernel(backend, "domino_head_rollout"), [inputs[0].clone(), *inputs[1:]],
                             device=dev)[:3]


def random_frontier(inputs, n, seed):
    b, k, _ = inputs[0].shape
    g = torch.Generator().manual_seed(seed)
    G = inputs[2].shape[1]
    return (torch.randn(n, G, generator=g) * 0.5, torch.randint(0, b, (n,), generator=g),
            torch.randint(0, k, (n,), generator=g))


def assert_chain_is_rollout(inputs, backend):
    base, hproj, state = inputs[:3]
    b, k, _ = base.shape
    tokens, logprobs, final = rollout(backend, inputs)
    S = state
    for d in range(k):
        t, lp, child, _ = expand(inputs, S, torch.arange(b), torch.full((b,), d), 1, backend=backend)
        assert torch.equal(t[:, 0], tokens[:, d])
        assert torch.equal(lp[:, 0], logprobs[:, d])
        S = child[:, 0]
    assert torch.equal(S, final)


@pytest.mark.parametrize("backend", params(("reference", "native")))
@given(case=head_input_strategy(**SIZES))
def test_one_node_one_child_walks_the_rollout_chain(case, backend):
    """Expanding each sequence's single node with one child, depth by depth, is exactly
    domino_head_rollout at temperature 0 on the same backend: same tokens, log-probabilities
    and final state."""
    assert_chain_is_rollout(head_rollout_inputs(**case), backend)


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("case", GPU_CASES, ids=range(len(GPU_CASES)))
def test_one_node_one_child_walks_the_rollout_chain_gpu(case, backend):
    assert_chain_is_rollout(head_rollout_inputs(*case, seed=7), backend)


def greedy_order_ok(L: torch.Tensor, tokens: torch.Tensor) -> bool:
    return torch.equal(tokens, reference.greedy_children(L, tokens.shape[1]))


@given(case=head_input_strategy(**SIZES), n=st.integers(1, 11), m=st.integers(1, 4))
def test_native_matches_reference(case, n, m):
    assert_kernel_matches_reference(head_rollout_inputs(**case), n, m, case["seed"], "native")


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 0.9)])
def test_gpu_sampled_children_equal_native(backend, top_k, top_p):
    """Given the same uniforms the GPU kernels draw the native kernel's children (their
    float64 totals are block reductions: a draw could differ only within ~1e-16 of a CDF
    step), with the same log-probabilities up to float32 rounding."""
    inputs = head_rollout_inputs(*GPU_CASES[0], seed=10)
    frontier = random_frontier(inputs, 5, 11)
    kw = dict(temperature=0.9, top_k=top_k, top_p=top_p)
    got = expand(inputs, *frontier, 3, backend=backend, generator=torch.Generator().manual_seed(12), **kw)
    want = expand(inputs, *frontier, 3, generator=torch.Generator().manual_seed(12), **kw)
    assert torch.equal(got[0], want[0])
    for x, y in zip(got[1:], want[1:]):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("case", GPU_CASES, ids=range(len(GPU_CASES)))
def test_gpu_kernels_match_reference(case, backend):
    """And the GPU kernels' outputs equal the native kernel's (same arithmetic up to fp32
    summation order: logits within 1e-5, the same children)."""
    inputs = head_rollout_inputs(*case, seed=8)
    n, m = 9, min(3, case[2])  # 9 nodes: two groups of 8 in the CUDA logits kernel
    got = assert_kernel_matches_reference(inputs, n, m, 9, backend)
    want = expand(inputs, *random_frontier(inputs, n, 9), m)
    assert torch.equal(got[0], want[0])
    for x, y in zip(got[1:], want[1:]):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("m", [1, 8, 11])
def test_gpu_greedy_children_with_ties_and_nans(backend, m):
    """With w2 = 0 the node's logits are its base row exactly, so the children must be the
    greedy order of that row token for token: NaN first, then descending, ties by the lower
    index (here many: the row is rounded to halves). m = 8 is the CUDA choose kernel's
    one-pass limit, 11 goes past it (the further children one pass each). The kernels merge
    per-slice candidates: 64-logit slices under the emulator and the interpreter, so 260
    spans five; 4096 on a GPU, where the row is 8196: three. Either way the last slice
    holds 4 logits, fewer than the 8 candidates a slice gives."""
    g = torch.Generator().manual_seed(m)
    V, G, r, n = 8196 if device_of(backend) == "cuda" else 260, 4, 2, 3
    base = (torch.randn(2, 1, V, generator=g) * 2).round() / 2
    base[1, 0, [7, 258, 3]] = float("nan")
    inputs = (base, torch.zeros(2, 1, r), None, torch.randn(V, 3 * G, generator=g), None,
              torch.randn(3 * G, G, generator=g), torch.randn(r, G, generator=g), torch.zeros(V, r))
    frontier = (torch.randn(n, G, generator=g), torch.tensor([0, 1, 1]), torch.zeros(n, dtype=torch.long))
    t, lp, _, L = expand(inputs, *frontier, m, backend=backend)
    rows = base[frontier[1], 0]
    torch.testing.assert_close(L, rows, rtol=0, atol=0, equal_nan=True)
    key = torch.where(rows.isnan(), float("inf"), rows)  # NaN first
    want = torch.tensor([sorted(range(V), key=lambda j, i=i: (-key[i, j].item(), j))[:m] for i in range(n)])
    assert torch.equal(t, want)
    native = expand(inputs, *frontier, m)
    assert torch.equal(t, native[0])
    torch.testing.assert_close(lp, native[1], equal_nan=True)


def assert_kernel_matches_reference(inputs, n, m, seed, backend):
    V = inputs[0].shape[2]
    m = min(m, V)
    frontier = random_frontier(inputs, n, seed)
    base_before = inputs[0].clone()
    t, lp, child, L = out = expand(inputs, *frontier, m, backend=backend)
    assert torch.equal(inputs[0], base_before)  # base_logits is read only
    # the reference in float64 (the kernel widens bf16 weights exactly, accumulates in fp32)
    t_ref, _, _, L_ref = reference.domino_head_expand(*weights_as_float64(inputs)[:2], *frontier,
                                                      *weights_as_float64(inputs)[3:], num_children=m)
    torch.testing.assert_close(L, L_ref, atol=2e-4, rtol=2e-4)
    # the kernel's children are the best tokens of its own logits (the reference's up to ties
    # that rounding can swap), with their log_softmax
    assert greedy_order_ok(L, t)
    agree = (t == t_ref).all(dim=1)
    assert agree.float().mean() > 0.5
    torch.testing.assert_close(lp, torch.log_softmax(L, -1).gather(-1, t), atol=1e-5, rtol=1e-5)
    # each child's state is GRUCell(E[child], S) of its own node
    base, hproj, _, gru_input, w_ih, w_hh, w1s, w2 = inputs
    x = t.reshape(-1)
    gi = gru_input[x].double() if w_ih is None else F.linear(gru_input[x].double(), w_ih.double())
    S = frontier[0].repeat_interleave(m, dim=0).double()
    gh = F.linear(S, w_hh.double())
    ir, iz, i_n = gi.chunk(3, -1)
    hr, hz, hn = gh.chunk(3, -1)
    r_, z_ = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
    want = (1 - z_) * torch.tanh(i_n + r_ * hn) + z_ * S
    torch.testing.assert_close(child.reshape(-1, child.shape[-1]), want.float(), atol=1e-4, rtol=1e-4)
    return out


# One sequence per request: greedy, top-k and top-p, plain temperature.
SEQ_PARAMS = [(0.0, 0, 1.0), (0.9, 5, 0.8), (1.3, 0, 1.0)]


def seq_params(rows=SEQ_PARAMS):
    T, k, p = zip(*rows)
    return dict(temperature=torch.tensor(T), top_k=torch.tensor(k), top_p=torch.tensor(p))


@pytest.mark.parametrize("backend", params())
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_per_sequence_parameters_equal_each_sequence_alone(backend, wdtype):
    """Temperature, top-k and top-p as [b] tensors, one per sequence, and one generator per
    sequence: every node gets what a call over its sequence's nodes alone, with that
    sequence's scalar parameters and generator, gives it (the greedy sequence's children
    exactly a greedy call's, its log-probabilities up to rounding). A kernel that sampled
    every node with one sequence's parameters, or drew a node's uniforms by its place in
    the whole frontier, fails."""
    inputs = head_rollout_inputs(3, 2, 300, 16, 8, 4, wdtype, torch.float32, False, seed=21)
    node_state, node_seq, node_depth = random_frontier(inputs, 8, 22)
    node_seq = torch.tensor([2, 0, 1, 1, 0, 2, 1, 2])  # every sequence, interleaved
    gens = [torch.Generator().manual_seed(30 + s) for s in range(3)]
    got = expand(inputs, node_state, node_seq, node_depth, 3, backend=backend, generator=gens, **seq_params())
    for s, (T, top_k, top_p) in enumerate(SEQ_PARAMS):
        nodes = torch.nonzero(node_seq == s)[:, 0]
        want = expand(inputs, node_state[nodes], node_seq[nodes], node_depth[nodes], 3, backend=backend,
                      temperature=T, top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(30 + s))
        assert torch.equal(got[0][nodes], want[0]), (s, got[0][nodes], want[0])
        torch.testing.assert_close(got[1][nodes], want[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[2][nodes], want[2], atol=1e-6, rtol=1e-6)
        # the kernels' logits rows are batch-invariant; the reference's float32 products are not
        # (PyTorch's blocking changes with the rows: 3e-5 relative apart on an AVX-512/AMX Xeon)
        exact = backend != "reference"
        torch.testing.assert_close(got[3][nodes], want[3], atol=0 if exact else 1e-4, rtol=0 if exact else 1e-4)


@pytest.mark.parametrize("backend", params())
@pytest.mark.parametrize("fill", [float("nan"), float("-inf")])
@pytest.mark.parametrize("rows", [[(0.0, 0, 1.0), (0.8, 5, 1.0)], [(0.9, 0, 0.7), (0.0, 0, 1.0)]], ids=["greedy-first",
                                                                                                     "sampled-first"])
def test_per_sequence_parameters_with_extreme_rows(backend, fill, rows):
    """Sequence 0's base logits all NaN or -inf, greedy or sampled, beside a normal sequence:
    every child is a distinct token of the vocabulary, and each node gets what its sequence
    alone gets (a greedy node of a -inf row: NaN log-probabilities, as log_softmax)."""
    inputs = list(head_rollout_inputs(2, 2, 40, 8, 16, 8, torch.float32, torch.float32, True, seed=1))
    inputs[0][0] = fill
    node_state, _, node_depth = random_frontier(inputs, 6, 7)
    node_seq = torch.tensor([0, 1, 0, 1, 1, 0])
    got = expand(inputs, node_state, node_seq, node_depth, 3, backend=backend,
                 generator=[torch.Generator().manual_seed(50 + s) for s in range(2)], **seq_params(rows))
    assert bool(((got[0] >= 0) & (got[0] < 40)).all()), got[0]
    assert all(len(set(r)) == 3 for r in got[0].tolist()), got[0]
    for s, (T, top_k, top_p) in enumerate(rows):
        nodes = torch.nonzero(node_seq == s)[:, 0]
        want = expand(inputs, node_state[nodes], node_seq[nodes], node_depth[nodes], 3, backend=backend,
                      temperature=T, top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(50 + s))
        assert torch.equal(got[0][nodes], want[0]), (s, got[0][nodes], want[0])
        torch.testing.assert_close(got[1][nodes], want[1], atol=1e-5, rtol=1e-5, equal_nan=True)


def test_per_sequence_parameters_match_the_float64_reference():
    """The native kernel's per-sequence call against the float64 oracle on the same uniforms."""
    inputs = head_rollout_inputs(3, 3, 200, 8, 16, 8, torch.float32, torch.float32, True, seed=23)
    frontier = random_frontier(inputs, 11, 24)
    u = torch.rand(11, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(25))
    want = reference.domino_head_expand(*weights_as_float64(inputs)[:2], frontier[0], frontier[1], frontier[2],
                                        *weights_as_float64(inputs)[3:], num_children=4, uniforms=u, **seq_params())
    base, hproj, _, *weights = inputs
    T, top_k, top_p, *rows = kernel_sampling_args(**seq_params(), vocab_size=200)
    got = run_head_poisoned_expand(base, hproj, *frontier, *weights, T, top_k, top_p, u, 4, rows)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[2], want[2].float(), atol=1e-5, rtol=1e-5)


def run_head_poisoned_expand(base, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s, w2, T, top_k,
                             top_p, u, m, rows):
    """The native op with poisoned outputs and the given uniforms and row tensors."""
    n, V, G = node_state.shape[0], base.shape[2], node_state.shape[1]
    outs = (torch.full((n, m), -7, dtype=torch.long), torch.full((n, m), float("nan")),
            torch.full((n, m, G), float("nan")), torch.full((n, V), float("nan")))
    torch.ops.domino_ops.domino_head_expand(base, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh, w1s,
                                            w2, T, top_k, top_p, u, *outs, None, None, *rows)
    return outs


def test_per_sequence_generators_draw_each_sequences_uniforms_in_node_order():
    seq = torch.tensor([1, 0, 1, 1])
    u = expand_uniforms(seq, 2, [torch.Generator().manual_seed(5), torch.Generator().manual_seed(6)])
    assert torch.equal(u[[1]], torch.rand(1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5)))
    assert torch.equal(u[[0, 2, 3]], torch.rand(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6)))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_permuting_the_frontier_permutes_the_outputs(temperature):
    inputs = head_rollout_inputs(3, 4, 300, 16, 24, 8, torch.bfloat16, torch.float32, False, seed=1)
    frontier = random_frontier(inputs, 9, seed=2)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(4)
    u = domino_ops.draw_uniforms((9, 3), "cpu", g)
    kw = dict(temperature=temperature, top_k=50)
    # the uniforms follow their nodes: draw them once and permute them with the frontier
    out = torch.ops.domino_ops.domino_head_expand
    def run(state, seq, depth, uniforms):  # outputs poisoned: every element must be written
        res = (torch.full((9, 3), -7, dtype=torch.long), torch.full((9, 3), float("nan")),
               torch.full((9, 3, 24), float("nan")), torch.full((9, 300), float("nan")))
        out(inputs[0], inputs[1], state, seq, depth, inputs[3], inputs[4], inputs[5], inputs[6], inputs[7],
            kw["temperature"], kw["top_k"], 1.0, uniforms if temperature > 0 else None, *res)
        assert bool((res[0] >= 0).all()) and not any(bool(x.isnan().any()) for x in res[1:])
        return res
    a = run(*frontier, u)
    b = run(*(x[perm] for x in frontier), u[perm])
    assert torch.equal(a[0][perm], b[0])  # the same children
    for x, y in zip(a[1:], b[1:]):  # the dot products group nodes by 8: rounding may differ
        torch.testing.assert_close(x[perm], y, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", params(GPU))
@pytest.mark.parametrize("case", GPU_CASES[:2], ids=range(2))
def test_gpu_frontier_is_batch_invariant(case, backend):
    """On the GPU kernels a node's outputs are the same bits whether it is expanded alone or
    among 17 (two groups of 16 in the CUDA logits kernel): every dot product runs one fma
    chain per (row, node) whatever the group or batch."""
    inputs = head_rollout_inputs(*case, seed=12)
    n, m = 17, min(2, case[2])
    frontier = random_frontier(inputs, n, 13)
    together = expand(inputs, *frontier, m, backend=backend)
    alone = [expand(inputs, *(x[i:i + 1] for x in frontier), m, backend=backend) for i in range(n)]
    for got, want in zip(together, zip(*alone)):
        assert torch.equal(got, torch.cat(want))


# --- sampling ---------------------------------------------------------------------------------

def single_node_population(N, V=6, seed=0):
    """N identical nodes (one sequence, depth 0) of a head whose correction is zero (w2 = 0):
    L = base, so the draft distribution is known exactly."""
    g = torch.Generator().manual_seed(seed)
    G, r = 4, 2
    base = torch.randn(1, 1, V, generator=g) * 1.2
    inputs = (base, torch.zeros(1, 1, r), torch.zeros(1, G), torch.randn(V, 3 * G, generator=g), None,
              torch.randn(3 * G, G, generator=g), torch.randn(r, G, generator=g), torch.zeros(V, r))
    return inputs, (torch.zeros(N, G), torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long))


def without_replacement_joint(q: torch.Tensor) -> torch.Tensor:
    """P(first = i, second = j) = q_i q_j / (1 - q_i), i != j: [V * V] float64."""
    q = q.double()
    joint = q[:, None] * q[None, :] / (1 - q[:, None])
    joint.fill_diagonal_(0.0)
    return joint.reshape(-1)


# Nodes per distribution check. The CUDA op takes at most 65535 nodes per call (its grids'
# y axis), any number of children: 40,000 x 2 here; the emulated CUDA kernels (~0.4 ms a
# node) 4,000, as the reference. The interpreted Triton kernels (~0.03 s a node) get 200:
# enough that two draws with replacement (the negative control below, at each population)
# fail with near certainty (a miss ~4e-8 at 300 nodes, ~1e-5 at 200 scaling its exponent
# with the population; 200 keeps make test's time), not enough to resolve subtler bias;
# that their draws follow the native kernel's law exactly rests on
# test_gpu_sampled_children_equal_native (the native kernel's children for the same uniforms).
POPULATION = {"native": 40_000, "reference": 4_000, "emulated_cuda": 4_000, "cuda": 40_000, "triton": 200}


@pytest.mark.parametrize("backend", params())
def test_sampled_children_are_draws_without_replacement(backend):
    N = POPULATION[backend]
    inputs, frontier = single_node_population(N)
    T = 0.8
    t, lp, _, L = expand(inputs, *frontier, 2, temperature=T, generator=torch.Generator().manual_seed(5),
                         backend=backend)
    q = domino_ops.filtered_probs(inputs[0][0], T)[0]
    V = q.shape[0]
    assert bool((t[:, 0] != t[:, 1]).all())
    assert_matches_distribution(t[:, 0].numpy(), q.double().numpy(), what="first child")
    assert_matches_distribution((t[:, 0] * V + t[:, 1]).numpy(), without_replacement_joint(q).numpy(),
                                what="first two children")
    torch.testing.assert_close(lp, q.log()[t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("N", sorted(set(POPULATION.values())))
def test_negative_control_with_replacement_fails(N):
    """Two independent draws (with replacement, distinct by rejection) are a different law:
    the same check must catch it, at each backend's population."""
    inputs, _ = single_node_population(1)
    q = domino_ops.filtered_probs(inputs[0][0], 0.8)[0]
    g = torch.Generator().manual_seed(6)
    pairs = torch.empty(0, 2, dtype=torch.long)
    while pairs.shape[0] < N:  # N distinct pairs
        drawn = torch.multinomial(q, 2 * N, replacement=True, generator=g).view(N, 2)
        pairs = torch.cat([pairs, drawn[drawn[:, 0] != drawn[:, 1]]])[:N]
    with pytest.raises(AssertionError, match="chi-square"):
        assert_matches_distribution((pairs[:, 0] * 6 + pairs[:, 1]).numpy(), without_replacement_joint(q).numpy())


@pytest.mark.parametrize("backend", params())
def test_children_past_the_filtered_support_are_the_best_remaining_at_minus_inf(backend):
    inputs, frontier = single_node_population(8)
    t, lp, _, L = expand(inputs, *frontier, 4, temperature=1.0, top_k=2,
                         generator=torch.Generator().manual_seed(7), backend=backend)
    top2 = set(reference.greedy_children(L[:1], 2)[0].tolist())
    assert all(set(row[:2].tolist()) == top2 for row in t)
    assert torch.equal(t[:, 2:], reference.greedy_children(L[:1], 4)[0, 2:].expand(8, 2))
    assert bool(torch.isfinite(lp[:, :2]).all()) and bool((lp[:, 2:] == float("-inf")).all())


# --- w2 packed: the packed bf16 product (native, bf16 weights; AVX2+FMA or AVX512-BF16) --------

needs_packed = pytest.mark.skipif(not domino_ops.small_batch_linear_packed_supported(),
                                  reason="no packed bf16 kernel runs on this CPU (it needs AVX2 and FMA, or "
                                         "AVX512-BF16): the packed w2 product cannot run")

# vocabularies around the 48-row panels, the 288-row product tiles and the 4608-row chunks
PACKED_SIZES = dict(b=[1, 3], k=[1, 4], V=[1, 7, 48, 49, 300, 4609], r=[1, 16, 33], G=[1, 24], H=[1, 8])


def a_rounding_ambiguous(inputs, node_state, node_seq, node_depth) -> torch.Tensor:
    """[n] bool: whether some element of node f's correction input a lies so near a midpoint
    between two bf16 values that the kernel's float32 a (its sum w1s @ S within a generous
    error bound, its silu within 16 float32 ulps) could round to either: such a node's logits
    may differ from the oracle's by a whole bf16 step of a, so they are not compared."""
    hproj, w1s = inputs[1], inputs[6]
    hp, S, W = hproj[node_seq, node_depth].double(), node_state.double(), w1s.double()
    v = hp + S @ W.T
    err = 2.0 ** -24 * (W.shape[1] + 2) * (hp.abs() + S.abs() @ W.abs().T)
    ulps = 16 * 2.0 ** -24
    ends = [(F.silu(v + dv) * (1 + da)).to(torch.bfloat16) for dv in (-err, err) for da in (-ulps, ulps)]
    return torch.stack([e != ends[0] for e in ends[1:]]).any(0).any(-1)


@needs_packed
@given(case=head_input_strategy(**PACKED_SIZES), n=st.integers(1, 19), m=st.sampled_from([1, 2, 4, 33]))
@pytest.mark.parametrize("pack_w_hh", [False, True])
@pytest.mark.parametrize("path", PACKED_PATHS)
def test_packed_w2_matches_the_float64_oracle(path, pack_w_hh, case, n, m):
    """With w2_packed the logits are base + w2 @ bf16(a) summed in float32 (the float64 oracle
    with a rounded to bf16), the children are the best tokens of the kernel's own logits with
    their log_softmax (the chunk-merged scan for m <= 32, the partial sort past it), and each
    child's state is its own node's GRU step: w_hh @ S in float32 FMAs on S as it is, or with
    w_hh_packed the packed product on S rounded to bf16 (the float64 oracle with S rounded). n
    up to 19 covers two 8-row product tiles and a remainder (vector path), one 16-row tile
    block and a padded one (AMX path); outputs are poisoned."""
    case = dict(case, wdtype=torch.bfloat16)
    inputs = head_rollout_inputs(**case)
    V = case["V"]
    m = min(m, V)
    frontier = random_frontier(inputs, n, case["seed"])
    with packed_path(path):
        t, lp, child, L = expand(inputs, *frontier, m,
                                 w2_packed=domino_ops.pack_small_batch_linear_weight(inputs[7]),
                                 w_hh_packed=domino_ops.pack_small_batch_linear_weight(inputs[5]) if pack_w_hh else None)
    as64 = weights_as_float64(inputs)
    _, _, _, L_ref = reference.domino_head_expand(as64[0], as64[1], *frontier, *as64[3:], num_children=m,
                                                          a_dtype=torch.bfloat16)
    clear = ~a_rounding_ambiguous(inputs, *frontier)
    torch.testing.assert_close(L[clear], L_ref[clear].float(), atol=2e-4, rtol=2e-4)
    assert greedy_order_ok(L, t)
    torch.testing.assert_close(lp, torch.log_softmax(L.double(), -1).gather(-1, t).float(), atol=1e-5, rtol=1e-5)
    # the GRU step given the kernel's own children
    gi = (as64[3][t.reshape(-1)] if as64[4] is None else F.linear(as64[3][t.reshape(-1)], as64[4]))
    S_in = frontier[0].bfloat16() if pack_w_hh else frontier[0]
    gh = F.linear(S_in.double(), as64[5]).repeat_interleave(m, 0)
    S = frontier[0].double().repeat_interleave(m, 0)
    want = reference.gru_cell(gi, gh, S).view(n, m, -1)
    torch.testing.assert_close(child, want.float(), atol=1e-4, rtol=1e-4)


@needs_packed
def test_packed_w2_children_match_the_row_major_kernel():
    """The packed and row-major kernels' logits differ only by a's rounding to bf16 (at most
    |w2| |a| 2^-9 per row, plus float32 sums), so they pick the same children wherever the
    row-major logits' best five are further apart than twice that."""
    inputs = head_rollout_inputs(3, 4, 300, 16, 24, 8, torch.bfloat16, torch.float32, False, seed=21)
    frontier = random_frontier(inputs, 17, 22)
    packed = expand(inputs, *frontier, 4, w2_packed=domino_ops.pack_small_batch_linear_weight(inputs[7]))
    plain = expand(inputs, *frontier, 4)
    a = F.silu(inputs[1][frontier[1], frontier[2]] + frontier[0] @ inputs[6].float().T)  # [n, r]
    bound = (a.abs().max(-1).values[:, None] * inputs[7].float().abs().sum(-1)[None, :] * 2.0 ** -9 + 1e-4)
    assert bool(((packed[3] - plain[3]).abs() <= bound).all())
    top = plain[3].topk(5, -1).values
    clear = (top[:, :-1] - top[:, 1:] > 2 * bound.max(-1).values[:, None]).all(-1)
    assert int(clear.sum()) >= 6
    assert torch.equal(packed[0][clear], plain[0][clear])


@needs_packed
def test_packed_w2_sampled_children_are_draws_without_replacement():
    """The sampled path with w2 packed: a zero correction (w2 = 0 in bf16), so L = base and
    the children follow the exact without-replacement law."""
    N = 20_000
    inputs, frontier = single_node_population(N)
    inputs = (*inputs[:3], *(x.bfloat16() if x is not None else None for x in inputs[3:]))
    T = 0.8
    t, lp, _, L = expand(inputs, *frontier, 2, temperature=T, generator=torch.Generator().manual_seed(5),
                         w2_packed=domino_ops.pack_small_batch_linear_weight(inputs[7]))
    assert torch.equal(L, inputs[0][0, 0].expand(N, -1))
    q = domino_ops.filtered_probs(inputs[0][0], T)[0]
    V = q.shape[0]
    assert bool((t[:, 0] != t[:, 1]).all())
    assert_matches_distribution((t[:, 0] * V + t[:, 1]).numpy(), without_replacement_joint(q).numpy(),
                                what="first two children")


# --- bad input ----------------------------------------------------------------------------------

def args(**over):
    inputs = head_rollout_inputs(2, 3, 20, 4, 5, 3, torch.float32, torch.float32, True, seed=0)
    base, hproj, _, gru_input, w_ih, w_hh, w1s, w2 = inputs
    a = dict(base_logits=base, hproj=hproj, node_state=torch.zeros(4, 5), node_seq=torch.tensor([0, 1, 1, 0]),
             node_depth=torch.tensor([0, 2, 1, 1]), gru_input=gru_input, w_ih=w_ih, w_hh=w_hh, w1s=w1s, w2=w2,
             num_children=2)
    a.update(over)
    return a


@pytest.mark.parametrize("backend", params(("native", "reference", "triton")))  # the wrapper's checks
@pytest.mark.parametrize("over,exc,msg", [
    (dict(num_children=0), ValueError, r"num_children must be in \[1, 20\]"),
    (dict(num_children=21), ValueError, "num_children must be in"),
    (dict(num_children=2.0), TypeError, "num_children must be an int"),
    (dict(node_seq=torch.tensor([0, 2, 1, 0])), ValueError, r"node_seq must hold values in \[0, 2\)"),
    (dict(node_depth=torch.tensor([0, 3, 1, 0])), ValueError, r"node_depth must hold values in \[0, 3\)"),
    (dict(node_depth=torch.tensor([0, 1, 1])), ValueError, "node_depth must have shape"),
    (dict(node_state=torch.zeros(4, 6)), ValueError, "node_state must have shape"),
    (dict(node_seq=torch.tensor([0, 1, 1, 0], dtype=torch.int32)), TypeError, "node_seq"),
    (dict(temperature=torch.ones(4)), ValueError, r"temperature as a tensor must have shape \[2\] \(one value per row"),
    (dict(top_k=torch.tensor([1, -1])), ValueError, "top_k must be >= 0 in every row"),
    (dict(temperature=1.0, generator=[torch.Generator()] * 3), ValueError, r"one generator per row \(2\)"),
    (dict(top_p=0.0), ValueError, "top_p"),
])
def test_wrapper_bad_input(over, exc, msg, backend):
    with pytest.raises(exc, match=msg):
        domino_ops.domino_head_expand(**args(**over), backend=backend)


def packed_args(**over):
    """args() with bf16 weights and their w2 and w_hh packed."""
    a = args()
    for name in ("gru_input", "w_hh", "w1s", "w2"):
        a[name] = a[name].bfloat16()
    a["w2_packed"] = domino_ops.pack_small_batch_linear_weight(a["w2"])
    a["w_hh_packed"] = domino_ops.pack_small_batch_linear_weight(a["w_hh"])
    a.update(over)
    return a


@pytest.mark.parametrize("over,exc,msg", [
    (dict(w2_packed="packed"), TypeError, "w2_packed must be a PackedLinearWeight"),
    (dict(w2_packed=domino_ops.pack_small_batch_linear_weight(torch.ones(21, 4))), ValueError,
     r"w2_packed must be w2 \[20, 4\] packed"),
    (dict(w2_packed=domino_ops.pack_small_batch_linear_weight(torch.ones(20, 4))), ValueError,
     "w2_packed is not pack_small_batch_linear_weight"),
    (dict(w_hh_packed="packed"), TypeError, "w_hh_packed must be a PackedLinearWeight"),
    (dict(w_hh_packed=domino_ops.pack_small_batch_linear_weight(torch.ones(20, 4))), ValueError,
     r"w_hh_packed must be w_hh \[15, 5\] packed"),
    (dict(w_hh_packed=domino_ops.pack_small_batch_linear_weight(torch.ones(15, 5))), ValueError,
     r"w_hh_packed is not pack_small_batch_linear_weight\(w_hh\)"),
    # float32 panels (pack_small_batch_linear_weight(w2, dtype=float32)) for a bf16 w2
    (dict(w2_packed=domino_ops.pack_small_batch_linear_weight(torch.ones(20, 4), dtype=torch.float32)), ValueError,
     r"w2_packed must hold bfloat16 panels on cpu \(pack_small_batch_linear_weight\(w2\), its default dtype\)"),
])
def test_wrapper_rejects_a_wrong_w2_packed(over, exc, msg):
    with pytest.raises(exc, match=msg):
        domino_ops.domino_head_expand(**packed_args(**over))


@needs_packed
def test_wrapper_checks_a_pair_again_after_an_in_place_change():
    """The wrapper remembers a (packed, weight) pair it has compared, so a tree's steps skip
    the comparison; an in-place change to either tensor (w2, or w2_packed's data) must
    bring it back, as must a new weight object."""
    a = packed_args()
    domino_ops.domino_head_expand(**a)
    kept = a["w2"][0, 0].item()
    a["w2"][0, 0] = kept + 1.0
    with pytest.raises(ValueError, match="w2_packed is not pack_small_batch_linear_weight"):
        domino_ops.domino_head_expand(**a)
    a["w2"][0, 0] = kept
    domino_ops.domino_head_expand(**a)
    a["w2_packed"].data[0, 0, 0, 0] = kept + 1.0  # the packed copy of w2[0, 0]
    with pytest.raises(ValueError, match="w2_packed is not pack_small_batch_linear_weight"):
        domino_ops.domino_head_expand(**a)
    a["w2_packed"].data[0, 0, 0, 0] = kept
    domino_ops.domino_head_expand(**a)
    other = a["w2"].clone()
    other[-1, -1] += 1.0
    with pytest.raises(ValueError, match="w2_packed is not pack_small_batch_linear_weight"):
        domino_ops.domino_head_expand(**{**a, "w2": other})


@needs_packed
def test_wrapper_remembers_inference_tensors_by_the_pair_alone():
    """Inference tensors keep no version counter: a pair made under inference_mode is
    accepted call after call, and another weight is still compared (and refused)."""
    with torch.inference_mode():
        a = packed_args()
        domino_ops.domino_head_expand(**a)
        domino_ops.domino_head_expand(**a)
        other = a["w2"].clone()
        other[0, 0] += 1.0
        with pytest.raises(ValueError, match="w2_packed is not pack_small_batch_linear_weight"):
            domino_ops.domino_head_expand(**{**a, "w2": other})


@needs_packed
def test_wrapper_accepts_the_packing_of_a_w2_with_nan_in_its_checked_rows():
    """The wrapper's spot check of rows 0 and V - 1 compares bits: NaN weights match."""
    a = packed_args()
    a["w2"][0, 1] = a["w2"][-1, 0] = float("nan")
    a["w2_packed"] = domino_ops.pack_small_batch_linear_weight(a["w2"])
    domino_ops.domino_head_expand(**a)


def test_wrapper_rejects_w2_packed_with_float32_weights_or_the_triton_backend():
    fp32 = args()
    with pytest.raises(ValueError, match="w2_packed needs a bfloat16 w2"):
        domino_ops.domino_head_expand(**fp32, w2_packed=domino_ops.pack_small_batch_linear_weight(fp32["w2"]))
    with pytest.raises(ValueError, match="w_hh_packed needs a bfloat16 w_hh"):
        domino_ops.domino_head_expand(**fp32, w_hh_packed=domino_ops.pack_small_batch_linear_weight(fp32["w_hh"]))
    # Triton takes CPU tensors only under the interpreter (on a GPU machine it refuses them
    # before w2_packed is looked at); CUDA tensors with the CPU layout are refused anywhere.
    if triton_ops.available(torch.device("cpu")):
        with pytest.raises(ValueError, match="w2_packed is a CPU layout"):
            domino_ops.domino_head_expand(**packed_args(), backend="triton")
    if torch.cuda.is_available():
        on_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in packed_args().items()}
        with pytest.raises(ValueError, match="w2_packed is a CPU layout"):
            domino_ops.domino_head_expand(**on_gpu)


def op_args(a):
    """``a`` (as args() gives it) as the op's positional inputs, and fresh outputs for it."""
    pos = [a[k] for k in ("base_logits", "hproj", "node_state", "node_seq", "node_depth", "gru_input", "w_ih",
                          "w_hh", "w1s", "w2")]
    return pos, (torch.empty(4, 2, dtype=torch.long), torch.empty(4, 2), torch.empty(4, 2, 5), torch.empty(4, 20))


@needs_packed
def test_direct_call_checks_w2_packed():
    a = packed_args()
    pos, outs = op_args(a)
    op = torch.ops.domino_ops.domino_head_expand
    with pytest.raises(RuntimeError, match="w2_packed must have shape"):
        op(*pos, 0.0, 0, 1.0, None, *outs, a["w2_packed"].data[:, :1].contiguous())
    with pytest.raises(RuntimeError, match="w2_packed needs a bfloat16 w2"):
        as_fp32 = [x.float() if i >= 5 and x is not None else x for i, x in enumerate(pos)]
        op(*as_fp32, 0.0, 0, 1.0, None, *outs, a["w2_packed"].data)
    with pytest.raises(RuntimeError, match="w2_packed is a CPU layout"):
        emulated_cuda_kernel("domino_head_expand")(*pos, 0.0, 0, 1.0, None, *outs, a["w2_packed"].data)
    with pytest.raises(RuntimeError, match="w_hh_packed must have shape"):
        op(*pos, 0.0, 0, 1.0, None, *outs, None, a["w_hh_packed"].data[:, :1].contiguous())
    with pytest.raises(RuntimeError, match="w_hh_packed needs a bfloat16 w_hh"):
        op(*as_fp32, 0.0, 0, 1.0, None, *outs, None, a["w_hh_packed"].data)
    with pytest.raises(RuntimeError, match="w_hh_packed is a CPU layout"):
        emulated_cuda_kernel("domino_head_expand")(*pos, 0.0, 0, 1.0, None, *outs, None, a["w_hh_packed"].data)
    # an output over a packed weight's bytes: written before the weight is read
    for name, packed in (("w2_packed", a["w2_packed"].data), ("w_hh_packed", a["w_hh_packed"].data)):
        over = packed.clone()
        tokens = over.view(-1).view(torch.int64)[:8].view(4, 2)
        given = (over, None) if name == "w2_packed" else (None, over)
        with pytest.raises(RuntimeError, match=f"child_tokens must not share memory with {name}"):
            op(*pos, 0.0, 0, 1.0, None, tokens, *outs[1:], *given)


def test_direct_call_checks_indices_and_aliasing():
    pos, outs = op_args(args())
    op = torch.ops.domino_ops.domino_head_expand
    pos_bad = list(pos)
    pos_bad[3] = torch.tensor([0, 5, 0, 0])
    with pytest.raises(RuntimeError, match="node_seq must hold sequence indices"):
        op(*pos_bad, 0.0, 0, 1.0, None, *outs)
    pos_bad = list(pos)
    pos_bad[4] = torch.tensor([0, 0, 0, -1])
    with pytest.raises(RuntimeError, match="node_depth must hold depths"):
        op(*pos_bad, 0.0, 0, 1.0, None, *outs)
    with pytest.raises(RuntimeError, match="must not share memory"):
        op(*pos, 0.0, 0, 1.0, None, outs[0], outs[1], outs[2], pos[0].view(2 * 3, 20)[:4])
    with pytest.raises(RuntimeError, match="uniforms are required"):
        op(*pos, 1.0, 0, 1.0, None, *outs)
    u = torch.rand(4, outs[0].shape[1], dtype=torch.float64)
    with pytest.raises(RuntimeError, match="row_top_p must have shape \\[2\\]"):  # one per sequence, not per node
        op(*pos, 1.0, 0, 1.0, u, *outs, None, None, None, None, torch.ones(4))
    top_p = outs[1].view(-1)[:2].fill_(0.5)  # a row tensor aliasing an output
    with pytest.raises(RuntimeError, match="must not share memory"):
        op(*pos, 1.0, 0, 1.0, u, *outs, None, None, None, None, top_p)


def test_cuda_kernel_refuses_more_nodes_than_its_grid_takes():
    """The CUDA kernels put the frontier's nodes on the grid's y axis, which CUDA caps at
    65535 blocks: one node more is a ValueError naming node_state, raised before any launch
    (the emulator holds launches to the same limit). Children are not limited by it (each
    node's block loops over its children): the GPU population check runs 40,000 nodes x 2."""
    n = 65536
    pos, _ = op_args(args(node_state=torch.zeros(n, 5), node_seq=torch.zeros(n, dtype=torch.long),
                          node_depth=torch.zeros(n, dtype=torch.long)))
    outs = (torch.empty(n, 1, dtype=torch.long), torch.empty(n, 1), torch.empty(n, 1, 5), torch.empty(n, 20))
    with pytest.raises(ValueError, match=r"domino_head_expand: node_state has 65536 rows; the CUDA kernel takes at most 65535"):
        emulated_cuda_kernel("domino_head_expand")(*pos, 0.0, 0, 1.0, None, *outs)


def test_opcheck():
    pos, outs = op_args(args())
    torch.library.opcheck(torch.ops.domino_ops.domino_head_expand.default, (*pos, 0.0, 0, 1.0, None, *outs),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    torch.library.opcheck(torch.ops.domino_ops.domino_head_expand.default, (*pos, 0.0, 0, 1.0, None, *outs[:3], None),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@needs_packed
def test_opcheck_with_w2_packed():
    a = packed_args()
    pos, outs = op_args(a)
    torch.library.opcheck(torch.ops.domino_ops.domino_head_expand.default,
                          (*pos, 0.0, 0, 1.0, None, *outs, a["w2_packed"].data, a["w_hh_packed"].data),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("backend", params(("native", "reference")))
def test_out_is_written_and_returned(backend):
    """out: the four outputs preallocated (poisoned) come back written, equal to a call
    without it."""
    a = args()
    want = domino_ops.domino_head_expand(**a, backend=backend)
    out = (torch.full((4, 2), -7, dtype=torch.long), torch.full((4, 2), float("nan")),
           torch.full((4, 2, 5), float("nan")), torch.full((4, 20), float("nan")))
    got = domino_ops.domino_head_expand(**a, backend=backend, out=out)
    assert all(g is o for g, o in zip(got, out))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("backend", params(("reference", "native", *GPU)))
@pytest.mark.parametrize("temperature,m", [(0.0, 3), (0.0, 40), (0.8, 3)], ids=["greedy", "greedy_m40", "sampled"])
def test_without_node_logits_the_other_outputs_are_the_same_bits(backend, temperature, m):
    """write_node_logits=False (node_logits None): the children, their log-probabilities
    and states are bit for bit those of the same call with the rows written, greedy with
    the native kernel's one-pass children (m <= 32, where it never stores the rows) and
    past them (m = 40, a scratch row per node; the interpreted Triton kernel, at ~0.1 s a
    child, goes to 11, past the 8 its first pass finds), and sampled; None comes back."""
    if backend == "triton":
        m = min(m, 11)
    inputs = head_rollout_inputs(*GPU_CASES[0], seed=21)  # V = 300, two emulated tiles
    frontier = random_frontier(inputs, 5, 22)
    kw = dict(backend=backend, temperature=temperature)
    want = expand(inputs, *frontier, m, generator=torch.Generator().manual_seed(23), **kw)
    got = expand(inputs, *frontier, m, generator=torch.Generator().manual_seed(23), write_node_logits=False, **kw)
    assert got[3] is None and not want[3].isnan().any()
    for g, w in zip(got[:3], want[:3]):
        assert torch.equal(g, w)


@needs_packed
@pytest.mark.parametrize("path", PACKED_PATHS)
def test_without_node_logits_packed_w2_gives_the_same_bits(path):
    a = packed_args()
    frontier = (a["node_state"], a["node_seq"], a["node_depth"])
    inputs = (a["base_logits"], a["hproj"], None, a["gru_input"], a["w_ih"], a["w_hh"], a["w1s"], a["w2"])
    packs = dict(w2_packed=a["w2_packed"], w_hh_packed=a["w_hh_packed"])
    with packed_path(path):
        want = expand(inputs, *frontier, 2, **packs)
        got = expand(inputs, *frontier, 2, write_node_logits=False, **packs)
    assert got[3] is None
    for g, w in zip(got[:3], want[:3]):
        assert torch.equal(g, w)


@pytest.mark.parametrize("write,out_logits,exc,msg", [
    (False, torch.empty(4, 20), ValueError, "out's node_logits must be None, since write_node_logits is False"),
    (True, None, ValueError, "out's node_logits must be a tensor, since write_node_logits is True"),
    (1, None, TypeError, "write_node_logits must be a bool"),
])
def test_wrapper_rejects_node_logits_that_disagree_with_write_node_logits(write, out_logits, exc, msg):
    out = (torch.empty(4, 2, dtype=torch.long), torch.empty(4, 2), torch.empty(4, 2, 5), out_logits)
    with pytest.raises(exc, match=msg):
        domino_ops.domino_head_expand(**args(), write_node_logits=write, out=out)


@pytest.mark.parametrize("out,exc,msg", [
    ((torch.empty(4, 2, dtype=torch.long),) * 3, TypeError, "out must be a tuple"),
    ((torch.empty(4, 2), torch.empty(4, 2), torch.empty(4, 2, 5), torch.empty(4, 20)), TypeError,
     "out's child_tokens must be int64"),
    ((torch.empty(4, 3, dtype=torch.long), torch.empty(4, 2), torch.empty(4, 2, 5), torch.empty(4, 20)), ValueError,
     r"out's child_tokens must have shape \[4, 2\]"),
    ((torch.empty(4, 2, dtype=torch.long), torch.empty(4, 2), torch.empty(4, 2, 5), torch.empty(4, 21)), ValueError,
     r"out's node_logits must have shape \[4, 20\]"),
    ((torch.empty(4, 2, dtype=torch.long), torch.empty(4, 2), torch.empty(4, 5, 2).transpose(1, 2),
      torch.empty(4, 20)), ValueError, "out's child_state must be contiguous"),
])
def test_wrapper_rejects_a_wrong_out(out, exc, msg):
    with pytest.raises(exc, match=msg):
        domino_ops.domino_head_expand(**args(), out=out)


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_wrapper_refuses_to_overwrite_a_protected_out(backend):
    """out's tensors are written in place: one autograd tracks, or an inference tensor
    outside inference mode, is refused by name (the native kernel wrote over both, the
    reference raised autograd's own error from its copy)."""
    def out(**over):
        o = dict(child_tokens=torch.empty(4, 2, dtype=torch.long), child_logprobs=torch.empty(4, 2),
                 child_state=torch.empty(4, 2, 5), node_logits=torch.empty(4, 20))
        return tuple({**o, **over}.values())

    with pytest.raises(ValueError, match="out's child_state is overwritten in place, but requires grad"):
        domino_ops.domino_head_expand(**args(), backend=backend, out=out(child_state=torch.empty(4, 2, 5,
                                                                                              requires_grad=True)))
    with torch.inference_mode():
        logits = torch.empty(4, 20)
    with pytest.raises(ValueError, match="out's node_logits is overwritten in place, but is an inference tensor"):
        domino_ops.domino_head_expand(**args(), backend=backend, out=out(node_logits=logits))
    with torch.inference_mode():  # inside it: fine
        domino_ops.domino_head_expand(**args(), backend=backend, out=out(node_logits=logits))


@pytest.mark.parametrize("backend", params(("native", "reference", "triton")))
def test_wrapper_rejects_outputs_that_share_memory(backend):
    """out's tensors sharing memory with each other or with an input: the result would
    depend on the order a backend writes in (the reference copied its results over each
    other, the Triton kernel read its own node logits back), so every backend refuses them
    by name, before anything runs."""
    buf = torch.empty(4 * 2 * 5 + 4 * 20)  # the child states and the node logits over one buffer
    out = (torch.empty(4, 2, dtype=torch.long), torch.empty(4, 2), buf[:40].view(4, 2, 5), buf[:80].view(4, 20))
    with pytest.raises(ValueError, match="out's child_state must not share memory with out's node_logits"):
        domino_ops.domino_head_expand(**args(), backend=backend, out=out)
    a = args()
    node_state = torch.zeros(4 * 20)  # node logits written over the states they are computed from
    a["node_state"] = node_state[:20].view(4, 5)
    out = (torch.empty(4, 2, dtype=torch.long), torch.empty(4, 2), torch.empty(4, 2, 5), node_state.view(4, 20))
    with pytest.raises(ValueError, match="out's node_logits must not share memory with node_state"):
        domino_ops.domino_head_expand(**a, backend=backend, out=out)
    a = args()
    out = (torch.empty(4, 2, dtype=torch.long), a["w2"].view(-1)[:8].view(4, 2), torch.empty(4, 2, 5),
           torch.empty(4, 20))
    with pytest.raises(ValueError, match="out's child_logprobs must not share memory with w2"):
        domino_ops.domino_head_expand(**a, backend=backend, out=out)
