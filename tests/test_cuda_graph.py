"""CUDA-graph capture of the head rollout, as a serving engine runs a decode step: capture
the op once on static buffers, then, for each new round, copy fresh inputs into those
buffers and replay. Every replay must give exactly what an eager call gives on the same
inputs (no host synchronisation or allocation may hide in the op, or capture fails; no
state may leak from one replay to the next). Needs a GPU and domino_ops built with its CUDA
kernels (``kernel_backends.CUDA``); skipped elsewhere."""

import pytest
import torch

import domino_ops
from kernel_backends import CUDA
from kernel_cases import head_rollout_inputs
from poisoned_calls import run_head_poisoned

pytestmark = pytest.mark.skipif(CUDA.skip_reason is not None, reason=str(CUDA.skip_reason))

# (b, k, V, r, G, H, weight dtype, table): the SmolLM2 drafter's shape (embed + w_ih, as
# generation calls it), and the paper's head at batch 8 (precomputed GRU-input table).
SHAPES = [(1, 15, 49152, 64, 256, 576, torch.bfloat16, False),
          (8, 15, 151936, 256, 1024, 4096, torch.bfloat16, True)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("b,k,V,r,G,H,wdtype,table", SHAPES)
def test_rollout_replays_in_a_cuda_graph(b, k, V, r, G, H, wdtype, table, temperature):
    op = torch.ops.domino_ops.domino_head_rollout
    dev = torch.device("cuda")

    def inputs(seed):
        return head_rollout_inputs(b, k, V, r, G, H, wdtype, torch.float32, table, seed=seed)

    def uniforms(seed):
        return domino_ops.draw_uniforms((b, k), "cpu", torch.Generator().manual_seed(seed)) if temperature > 0 else None

    static = [x.to(dev) if x is not None else None for x in inputs(0)]
    u = uniforms(0)
    static_u = u.to(dev) if u is not None else None
    tokens = torch.empty(b, k, dtype=torch.long, device=dev)
    logprobs = torch.empty(b, k, device=dev)
    state_out = torch.empty(b, G, device=dev)

    def call():
        op(*static, temperature, 0, 1.0, static_u, False, tokens, logprobs, state_out)

    call()  # warm-up outside the capture (lazy initialisation, allocator pools)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()

    for seed in (1, 2):  # new rounds: fresh values into the captured buffers, then replay
        fresh, u = inputs(seed), uniforms(seed)
        want = run_head_poisoned(op, [x.clone() if x is not None else None for x in fresh], device="cuda",
                                 temperature=temperature, u=u)
        for dst, src in zip(static, fresh):
            if dst is not None:
                dst.copy_(src)
        if static_u is not None:
            static_u.copy_(u)
        tokens.fill_(-7)
        logprobs.fill_(float("nan"))
        state_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(tokens.cpu(), want[0])
        assert torch.equal(logprobs.cpu(), want[1])
        assert torch.equal(state_out.cpu(), want[2])


@pytest.mark.parametrize("write_node_logits", [True, False])
@pytest.mark.parametrize("backend", ["native", "triton"])
def test_expand_step_replays_in_a_cuda_graph(backend, write_node_logits):
    """One tree step through the wrapper (as a tree-drafting engine calls it), captured once
    and replayed on fresh node states: equal to an eager call. The Triton wrapper used to
    build its scalar parameters with torch.tensor (a host-to-device copy), which capture
    refuses. Without node logits both kernels allocate a scratch [n, V] inside the call
    (the caching allocator's, which capture allows; a greedy draft_tree calls it so)."""
    dev = torch.device("cuda")
    n, m, G = 8, 4, 256
    base, hproj, _, gru_input, w_ih, w_hh, w1s, w2 = [
        x.to(dev) if x is not None else None
        for x in head_rollout_inputs(1, 3, 4099, 64, G, 576, torch.bfloat16, torch.float32, True, seed=0)]
    g = torch.Generator().manual_seed(1)
    node_state = (torch.randn(n, G, generator=g) * 0.5).to(dev)
    node_seq = torch.zeros(n, dtype=torch.long, device=dev)
    node_depth = torch.randint(0, 3, (n,), generator=g).to(dev)

    def call():
        return domino_ops.domino_head_expand(base, hproj, node_state, node_seq, node_depth, gru_input, w_ih, w_hh,
                                             w1s, w2, num_children=m, backend=backend,
                                             write_node_logits=write_node_logits)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    for seed in (2, 3):
        node_state.copy_(torch.randn(n, G, generator=torch.Generator().manual_seed(seed)) * 0.5)
        want = call()
        assert (captured[3] is None) == (not write_node_logits)
        for out in captured:
            if out is not None:
                out.fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        for got, exp in zip(captured, want):
            assert (got is None and exp is None) or torch.equal(got, exp)
