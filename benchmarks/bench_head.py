"""Head-rollout latency, every backend this machine can time, side by side.

For each shape, batch, weight dtype and GRU-input mode it times one k-step greedy rollout
(median of repeats, warm-up excluded) and reports the bytes the rollout must move (the
floor: every weight once per step, one base-logit row per sequence per step), the achieved
GB/s, that as a share of the device's copy bandwidth (measured in the same run) and the
speedup over eager PyTorch.

- On a GPU: the hand-written CUDA kernels vs the Triton kernels vs eager PyTorch, each
  plain and captured in a CUDA graph (``triton.testing.do_bench`` medians), batch 1/8/32,
  plus the paper's Figure 1 split: one head step vs one LM-head matmul of the same size.
- On the CPU (always): the C++ CPU kernel, once per instruction-set build this CPU runs
  (``avx512``, ``avx2``, ``sse2``: see domino_ops.cpu; each column names its build), vs
  eager PyTorch, then ``sample``, ``filtered_probs``, ``verify_greedy`` and ``verify_sampling``
  over a 151936-token vocabulary at batch 1 and 32 the same way (bytes = the rows they must
  read, and filtered_probs' probabilities written),
  one Domino tree step (``domino_head_expand``) for frontiers of 4-64 nodes against one
  batch-1 chain step (with w2 packed too, on a CPU that runs the packed kernel: AVX512-BF16 or AVX2), with the floor of that
  ratio there (the w2 product alone through ``small_batch_linear_packed``,
  the fastest CPU product here),
  and the correctness status of the CUDA kernels under the SIMT emulator and of the Triton
  kernels under the interpreter (those run here for correctness only, never for time).
  The CPU model, the build the ops pick by default (``DOMINO_CPU_ISA``, else the widest)
  and the copy bandwidth are printed first; %copy is against that bandwidth, and it is
  measured again after the tables to show how far a shared machine drifted meanwhile.

    python benchmarks/bench_head.py                 # full tables (paper + small shape)
    python benchmarks/bench_head.py --quick         # small shape only
    python benchmarks/bench_head.py --isas avx2     # one build only
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # Triton kernels can only be interpreted here
    os.environ.setdefault("TRITON_INTERPRET", "1")

import domino_ops  # noqa: E402
from domino_ops import cpu, reference  # noqa: E402
from domino_ops.ops import expand_outputs  # noqa: E402
from timing import copy_bandwidth_gbs, interleaved_median_seconds, median_seconds  # noqa: E402

SHAPES = {
    # name: (H, G, r, V)
    "paper": (4096, 1024, 256, 151936),
    "small": (576, 256, 64, 49152),
}


def median_ms(fn, repeats: int, warmup: int = 1) -> float:
    return median_seconds(fn, repeats, warmup) * 1e3


def rollout_bytes(b, k, H, G, r, V, wbytes, table: bool) -> int:
    """Bytes a k-step rollout must move: weights once per step plus per-sequence rows."""
    per_step = (V * r + 3 * G * G + r * G) * wbytes  # w2, w_hh, w1s
    per_step += b * 3 * G * wbytes if table else (3 * G * H + b * H) * wbytes  # table rows or w_ih + E rows
    per_step += b * V * wbytes + b * r * 4  # base-logit row (same dtype as weights here) + hproj
    return k * per_step


def make_inputs(b, k, H, G, r, V, dtype, table: bool, gen: torch.Generator):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    base = rnd(b, k, V, scale=2.0)
    hproj = torch.randn(b, k, r, generator=gen)
    state = torch.randn(b, G, generator=gen) * 0.5
    w_hh, w1s, w2 = rnd(3 * G, G, scale=G ** -0.5), rnd(r, G, scale=G ** -0.5), rnd(V, r, scale=r ** -0.5)
    if table:
        gru_input, w_ih = rnd(V, 3 * G), None
    else:
        gru_input, w_ih = rnd(V, H), rnd(3 * G, H, scale=H ** -0.5)
    return base, hproj, state, gru_input, w_ih, w_hh, w1s, w2


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def rollout_cases(args, batches, device="cpu"):
    """Every (shape, dtype, GRU-input mode, batch) of a table: yields (row label, inputs on
    ``device``, bytes the rollout must move)."""
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes:
        H, G, r, V = SHAPES[shape]
        for dname in args.dtypes:
            dtype = DTYPES[dname]
            for table in (True, False):
                for b in batches:
                    inputs = [x.to(device) if x is not None else None
                              for x in make_inputs(b, args.k, H, G, r, V, dtype, table, gen)]
                    mode = "table" if table else "embed+w_ih"
                    yield (f"{shape:6} {b:>2} {dname:4} {mode:10}", inputs,
                           rollout_bytes(b, args.k, H, G, r, V, dtype.itemsize, table))


def cpu_header(args) -> float:
    """Prints the CPU, the kernel builds and the copy bandwidth; returns the bandwidth."""
    copy_bw = copy_bandwidth_gbs()
    try:
        default = cpu.isa()
    except ValueError as err:  # a bad DOMINO_CPU_ISA: every build is still timed below
        default = f"none ({err})"
    print(f"CPU: {cpu.model()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"CPU kernel builds compiled: {', '.join(cpu.compiled_isas())}; this CPU runs: "
          f"{', '.join(cpu.supported_isas())}; the ops run {default} by default "
          f"(DOMINO_CPU_ISA={os.environ.get('DOMINO_CPU_ISA', 'auto')}); timed here: {', '.join(args.isas)}")
    print(f"copy bandwidth {copy_bw:.1f} GB/s (read+write of a 1 GiB tensor, before the tables)")
    return copy_bw


def cells(ms: float, nbytes: int, copy_bw: float, eager_ms: float | None = None) -> str:
    gbs = nbytes / ms / 1e6
    out = f"{ms:9.2f} {gbs:6.1f} {100 * gbs / copy_bw:5.1f}%"
    return out + (f" {eager_ms / ms:5.2f}x" if eager_ms is not None else "")


def cpu_table(args, copy_bw: float) -> None:
    """The C++ CPU kernel, once per instruction-set build, vs eager PyTorch."""
    batches = args.batches or [1, 8]
    print(f"greedy rollout, k = {args.k}; median of {args.repeats} after warm-up; "
          "bytes = weights once per step + one base row per sequence per step; "
          "x eager = eager ms / kernel ms")
    head = "".join(f" | {isa + ' ms':>9} {'GB/s':>6} {'%copy':>6} {'x eager':>6}" for isa in args.isas)
    header = f"{'shape':6} {'b':>2} {'wt':4} {'gru_input':10} | {'MB/roll':>8}{head} | {'eager ms':>9} {'GB/s':>6} {'%copy':>6}"
    print(header)
    print("-" * len(header))
    for label, inputs, nbytes in rollout_cases(args, batches):
        eager = median_ms(lambda: reference.domino_head_rollout(*inputs), args.repeats)
        row = f"{label} | {nbytes / 1e6:8.1f}"
        for isa in args.isas:
            with cpu.forced_isa(isa):
                kern = median_ms(lambda: domino_ops.domino_head_rollout(*inputs), args.repeats)
            row += " | " + cells(kern, nbytes, copy_bw, eager)
        print(row + " | " + cells(eager, nbytes, copy_bw))
        del inputs


def ops_cases(V: int, batches, k: int = 4):
    """(label, kernel fn, eager fn, bytes it must read) for the row-streaming ops."""
    gen = torch.Generator().manual_seed(0)
    for b in batches:
        for dname, dtype in DTYPES.items():
            logits = (torch.randn(b, V, generator=gen) * 3).to(dtype)
            nb = b * V * dtype.itemsize
            yield (f"sample greedy        {b:>2} {dname:4}", lambda x=logits: domino_ops.sample(x),
                   lambda x=logits: reference.sample(x), nb)
        logits = torch.randn(b, V, generator=gen) * 3
        for label, kw in (("T=1", {}), ("T=1 top_p=.9", {"top_p": 0.9}), ("T=1 top_k=50", {"top_k": 50})):
            yield (f"sample {label:13} {b:>2} fp32", lambda x=logits, kw=kw: domino_ops.sample(
                       x, temperature=1.0, generator=torch.Generator().manual_seed(1), **kw),
                   lambda x=logits, kw=kw: reference.sample(
                       x, temperature=1.0, generator=torch.Generator().manual_seed(1), **kw), b * V * 4)
        for dname, dtype in DTYPES.items():  # the law sample draws from, written out (read the row, write probs)
            logits = (torch.randn(b, V, generator=gen) * 3).to(dtype)
            for label, kw in (("T=.7", {}), ("p=.9", {"top_p": 0.9})):  # both at T = 0.7
                yield (f"filtered_probs {label:5} {b:>2} {dname:4}",
                       lambda x=logits, kw=kw: domino_ops.filtered_probs(x, 0.7, **kw),
                       lambda x=logits, kw=kw: reference.filtered_probs(x, 0.7, **kw), b * V * (dtype.itemsize + 4))
        for dname, dtype in DTYPES.items():  # every draft accepted: k + 1 rows per sequence
            target = (torch.randn(b, k + 1, V, generator=gen) * 3).to(dtype)
            draft = target[:, :k].float().argmax(-1)
            yield (f"verify_greedy k={k}   {b:>2} {dname:4}",
                   lambda d=draft, t=target: domino_ops.verify_greedy(d, t),
                   lambda d=draft, t=target: reference.verify_greedy(d, t), b * (k + 1) * V * dtype.itemsize)
        q = torch.softmax(torch.randn(b, k, V, generator=gen) * 2, -1)
        p = torch.softmax(torch.randn(b, k + 1, V, generator=gen) * 2, -1)
        draft = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(b, k)
        p[torch.arange(b), 0, draft[:, 0]] = 0.0  # rejected at once: the residual p - q of row 0
        yield (f"verify_sampling k={k} {b:>2} fp32",
               lambda d=draft, q=q, p=p: domino_ops.verify_sampling(d, q, p, generator=torch.Generator().manual_seed(2)),
               lambda d=draft, q=q, p=p: reference.verify_sampling(d, q, p, generator=torch.Generator().manual_seed(2)),
               b * 2 * V * 4)


def ops_table(args, copy_bw: float) -> None:
    """sample / filtered_probs / verify_greedy / verify_sampling over a full vocabulary, per build, vs eager."""
    V = SHAPES["paper"][3]
    repeats = max(args.repeats, 11)
    print(f"row ops, V = {V}; median of {repeats} after warm-up; bytes = the logits / probability rows the op "
          "must read (sampling: the row once; its scratch rows are not counted)")
    head = "".join(f" | {isa + ' ms':>9} {'GB/s':>6} {'%copy':>6} {'x eager':>6}" for isa in args.isas)
    header = f"{'op':20} {'b':>2} {'dt':4} | {'MB':>6}{head} | {'eager ms':>9} {'GB/s':>6} {'%copy':>6}"
    print(header)
    print("-" * len(header))
    for label, fn, eager_fn, nbytes in ops_cases(V, args.ops_batches):
        eager = median_ms(eager_fn, repeats)
        row = f"{label} | {nbytes / 1e6:6.1f}"
        for isa in args.isas:
            with cpu.forced_isa(isa):
                row += " | " + cells(median_ms(fn, repeats), nbytes, copy_bw, eager)
        print(row + " | " + cells(eager, nbytes, copy_bw))


def expand_bytes(n, m, G, r, V, wbytes) -> int:
    """Bytes one greedy tree step (domino_head_expand, table mode, write_node_logits=False as
    draft_tree's greedy steps call it) must move: the weights once, the one base-logit row
    the frontier's nodes share (one sequence, one depth) and the children's table rows. No
    logits rows: the CPU kernel keeps them in cache; the CUDA and Triton kernels still write
    them to a scratch tensor and read them back, which this count leaves out."""
    return (V * r + 3 * G * G + r * G) * wbytes + V * wbytes + n * m * 3 * G * wbytes


def print_header(header: str) -> None:
    print(header)
    print("-" * len(header))


def batch1_head_inputs(args):
    """(shape, its generator, (H, G, r, V), make_inputs' tensors) per shape of args.shapes: one
    sequence, one position, bf16 weights, table mode, from a fixed seed."""
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes:
        H, G, r, V = SHAPES[shape]
        yield shape, gen, (H, G, r, V), make_inputs(1, 1, H, G, r, V, torch.bfloat16, True, gen)


def tree_table(args, copy_bw: float) -> None:
    """One Domino tree step (domino_head_expand) for frontiers of n nodes of one sequence at
    one depth, per build, against one batch-1 chain step (a k = 1 greedy rollout)."""
    m = args.tree_children
    packed = domino_ops.small_batch_linear_packed_supported()
    print(f"tree head step (domino_head_expand, greedy, {m} children per node, table mode), bf16 weights; "
          f"median of {args.repeats} after warm-up; write_node_logits=False and outputs allocated once and passed as "
          f"out= (a greedy draft_tree's steps write no node logits); x chain = step ms / one batch-1 rollout step ms, the two "
          "timed taking turns in blocks of 6 calls, each after 3 untimed ones (each in its own steady state, as "
          "tree_step_ab.py; goal at n = 16: <= 1.5x)" + (f"; packed: w2_packed and w_hh_packed given (the packed products, as the engine runs them: "
                                 f"{domino_ops.small_batch_linear_packed_path()}), "
                                 f"{args.isas[0]} build, against its chain step" if packed else ""))
    head = "".join(f" | {isa + ' ms':>9} {'GB/s':>6} {'%copy':>6} {'x chain':>7}" for isa in args.isas)
    if packed:
        head += f" | {'packed ms':>9} {'GB/s':>6} {'%copy':>6} {'x chain':>7}"
    print_header(f"{'shape':6} {'n':>3} | {'MB':>6}{head}")
    for shape, gen, (H, G, r, V), (base, hproj, state, gru_input, _, w_hh, w1s, w2) in batch1_head_inputs(args):
        chain = {}
        for isa in args.isas:
            with cpu.forced_isa(isa):
                chain[isa] = median_ms(lambda: domino_ops.domino_head_rollout(base, hproj, state, gru_input, None,
                                                                              w_hh, w1s, w2), args.repeats)
        nbytes = rollout_bytes(1, 1, H, G, r, V, 2, True)
        print(f"{shape:6} {'chain':>5} | {nbytes / 1e6:6.1f}" +
              "".join(" | " + cells(chain[isa], nbytes, copy_bw) + f" {1.0:6.2f}x" for isa in args.isas) +
              (" | " + cells(chain[args.isas[0]], nbytes, copy_bw) + f" {1.0:6.2f}x" if packed else ""))
        packs = ({"w2_packed": domino_ops.pack_small_batch_linear_weight(w2),
                  "w_hh_packed": domino_ops.pack_small_batch_linear_weight(w_hh)} if packed else {})
        for n in args.tree_frontiers:
            node_state = torch.randn(n, G, generator=gen) * 0.5
            zeros = torch.zeros(n, dtype=torch.long)
            out = expand_outputs(n, m, G, V, "cpu", write_node_logits=False)
            nbytes = expand_bytes(n, m, G, r, V, 2)
            row = f"{shape:6} {n:>5} | {nbytes / 1e6:6.1f}"
            for isa, kw in [(isa, {}) for isa in args.isas] + ([(args.isas[0], packs)] if packed else []):
                with cpu.forced_isa(isa):
                    # the step and a chain step taking turns: their ratio from the same minutes
                    seconds, chain_seconds = interleaved_median_seconds([
                        lambda: domino_ops.domino_head_expand(
                            base, hproj, node_state, zeros, zeros, gru_input, None, w_hh, w1s, w2, num_children=m,
                            write_node_logits=False, out=out, **kw),
                        lambda: domino_ops.domino_head_rollout(base, hproj, state, gru_input, None, w_hh, w1s, w2)],
                        args.repeats, warmup=3, block=6)
                row += " | " + cells(seconds * 1e3, nbytes, copy_bw) + f" {seconds / chain_seconds:6.2f}x"
            print(row)
    if domino_ops.small_batch_linear_packed_supported():
        print()
        w2_floor_table(args)


def w2_floor_table(args) -> None:
    """What bounds the tree-step table's ratios from below on this CPU: the w2 product alone
    (x [n, r] times w2 [V, r]: the step's only large stream and nearly all its
    multiply-adds) with the fastest CPU product domino_ops has, ``small_batch_linear_packed``
    (AVX512-BF16 dot products on a VNNI-packed copy of w2, activations rounded to bf16, so
    cheaper per multiply-add than the head's float32 activations: a floor for them too), for
    n rows against one row and against a batch-1 chain step timed in the same table."""
    print("floor: the w2 product alone, x [n, r] bf16 @ w2 [V, r]^T bf16 -> [n, V] bf16 "
          f"(small_batch_linear_packed, {domino_ops.small_batch_linear_packed_path()}, w2 packed once beforehand); median of {args.repeats}; "
          "x n=1 = ms / the 1-row product's ms; x chain = ms / a batch-1 chain step (default build); row-major: the "
          "same product by small_batch_linear on the unpacked w2 (VDPBF16PS with a lane reduction per output)")
    print_header(f"{'shape':6} {'n':>5} | {'ms':>7} {'GFLOP/s':>8} {'x n=1':>6} {'x chain':>7} | "
                 f"{'row-major ms':>12} {'x chain':>7}")
    for shape, gen, (H, G, r, V), (base, hproj, state, gru_input, _, w_hh, w1s, w2) in batch1_head_inputs(args):
        chain = median_ms(lambda: domino_ops.domino_head_rollout(base, hproj, state, gru_input, None, w_hh, w1s, w2),
                          args.repeats)
        packed = domino_ops.pack_small_batch_linear_weight(w2)
        print(f"{shape:6} {'chain':>5} | {chain:7.2f} {'':>8} {'':>6} {1.0:6.2f}x |")
        one = None
        for n in (1, *args.tree_frontiers):
            x = torch.randn(n, r, generator=gen).to(torch.bfloat16)
            ms = median_ms(lambda: domino_ops.small_batch_linear_packed(x, packed), args.repeats)
            row_major = median_ms(lambda: domino_ops.small_batch_linear(x, w2), args.repeats)
            one = one or ms
            print(f"{shape:6} {n:>5} | {ms:7.2f} {2 * n * V * r / ms / 1e6:8.1f} {ms / one:5.2f}x {ms / chain:6.2f}x | "
                  f"{row_major:12.2f} {row_major / chain:6.2f}x")


def engine_table(args, copy_bw: float) -> None:
    """The head exactly as DominoGenerator calls it: the shipped drafter's weights in the
    engine's dtype (load_default's), the target's embedding with w_ih as the GRU input,
    float32 base logits, batch 1. Two rows: the chain rollout (python/domino/model.py
    choose_tokens; sampled requests and tree=None), k = the block's drafts after the
    base-drafted prefix, and the tree drafting of default greedy generation
    (domino_ops.draft_tree with domino.tree.DEFAULT_TREE: its expand steps and frontier
    selection, the first depth from the base logits as the drafter does). Each timed warm
    (back to back) and cold (a 256 MB buffer streamed before each call, as the target's
    forward leaves the caches). Loads SmolLM2 and the default drafter."""
    import time

    from domino import load_default
    gen = load_default()
    d = gen.drafter
    c = d.config
    E, w_ih, w_hh, w1h, w1s, w2 = d.head_weights()
    k = c.num_drafts - c.pure_draft_prefix_len
    V, r, G = w2.shape[0], w2.shape[1], w_hh.shape[1]
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, k, V, generator=g) * 2
    hproj = torch.randn(1, k, r, generator=g)
    state = torch.randn(1, G, generator=g) * 0.5
    H = E.shape[1]
    wbytes = w2.element_size()
    nbytes = rollout_bytes(1, k, H, G, r, V, wbytes, table=False) + k * V * (4 - wbytes)  # float32 base rows
    flush_src = torch.ones(64 << 20)  # 256 MB
    flush_dst = torch.empty_like(flush_src)

    from domino.tree import DEFAULT_TREE
    topk, depth = DEFAULT_TREE.topk, DEFAULT_TREE.depth
    root = torch.zeros(1, dtype=torch.long)
    plain = min(c.pure_draft_prefix_len, depth)

    def chain():
        domino_ops.domino_head_rollout(base, hproj, state, E, w_ih, w_hh, w1s, w2)

    # as DominoDraftModel.draft_tree passes them (None where they do not apply)
    w2_packed = d._packed_head_weight("w2", w2, d.embed_proj[2].weight)
    w_hh_packed = d._packed_head_weight("w_hh", w_hh, d.prefix_gru.weight_hh_l0)

    def tree():
        domino_ops.draft_tree(base[:, :depth], hproj[:, :depth], state, E, w_ih, w_hh, w1s, w2, root, topk=topk,
                              depth=depth, plain_depths=plain, w2_packed=w2_packed, w_hh_packed=w_hh_packed)

    def cold_ms(call, repeats):
        times = []
        for i in range(repeats + 1):
            flush_dst.copy_(flush_src)
            t0 = time.perf_counter()
            call()
            if i:  # the first call is the warm-up
                times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]

    print(f"the head as generation calls it: SmolLM2 drafter, {w2.dtype}, embed + w_ih, batch 1, V = {V}, r = {r}, "
          f"G = {G}; chain: a rollout of k = {k}; tree: draft_tree {topk},{depth} (generate's default at T = 0; "
          f"MB: each step's weights, without the frontier's GRU inputs); median of {args.repeats}; "
          "cold = a 256 MB copy before each call")
    print(f"{'build':6} | {'call':5} | {'MB':>6} | {'warm ms':>8} {'GB/s':>6} {'%copy':>6} | "
          f"{'cold ms':>8} {'GB/s':>6} {'%copy':>6}")
    tree_bytes = depth * ((V * r + 3 * G * G + r * G) * wbytes + V * 4)
    for isa in args.isas:
        for name, call, mb in (("chain", chain, nbytes), ("tree", tree, tree_bytes)):
            with cpu.forced_isa(isa):
                warm = median_ms(call, args.repeats)
                cold = cold_ms(call, args.repeats)
            print(f"{isa:6} | {name:5} | {mb / 1e6:6.1f} | " + cells(warm, mb, copy_bw) + " | " + cells(cold, mb, copy_bw))


def gpu_bench_ms(fn) -> float:
    """Median ms of ``fn`` on the GPU (triton's do_bench: warm-up excluded, L2 flushed)."""
    from triton.testing import do_bench
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def graphed(fn):
    """``fn`` captured in a CUDA graph (after one warm-up call): the graph's replay."""
    fn()  # warm up allocations and compilation outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def gpu_table(args) -> None:
    """CUDA kernels vs Triton vs eager, plain and in CUDA graphs, on the current GPU."""
    dev = torch.device("cuda")
    batches = args.batches or [1, 8, 32]
    bench = gpu_bench_ms

    src = torch.empty(1 << 28, dtype=torch.float32, device=dev)  # 1 GiB
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() * 4 / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e9
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, copy bandwidth {copy_bw:.0f} GB/s "
          f"(read+write of a 1 GiB tensor); greedy rollout, k = {args.k}, do_bench medians")
    header = (f"{'shape':6} {'b':>2} {'wt':4} {'gru_input':10} | {'MB/roll':>8} | "
              + " | ".join(f"{n:>13}" for n in ("cuda", "cuda+graph", "triton", "triton+graph", "eager",
                                                 "eager+graph"))
              + f" | {'best GB/s':>9} {'%copy':>6}")
    print(header)
    print("-" * len(header))
    for label, inputs, nbytes in rollout_cases(args, batches, dev):
        fns = {
            "cuda": lambda: domino_ops.domino_head_rollout(*inputs, backend="native"),
            "triton": lambda: domino_ops.domino_head_rollout(*inputs, backend="triton"),
            "eager": lambda: reference.domino_head_rollout(*inputs),
        }
        times = {}
        for name, fn in fns.items():
            try:
                times[name] = bench(fn)
                times[name + "+graph"] = bench(graphed(fn))
            except RuntimeError as err:  # e.g. a kernel's shared-memory limit
                print(f"  {name} skipped: {str(err).splitlines()[0]}")
        best = min(times.values())
        cells = " | ".join(f"{times[n]:10.3f} ms" if n in times else f"{'-':>13}" for n in
                           ("cuda", "cuda+graph", "triton", "triton+graph", "eager", "eager+graph"))
        gbs = nbytes / best / 1e6
        print(f"{label} | {nbytes / 1e6:8.1f} | {cells} | {gbs:9.0f} {100 * gbs / copy_bw:5.1f}%")
        del inputs
    # Figure 1 split: one head step vs one LM-head matmul of the same size
    gen = torch.Generator().manual_seed(0)
    for shape in args.shapes:
        H, G, r, V = SHAPES[shape]
        for b in batches:
            inputs = [x.to(dev) if x is not None else None
                      for x in make_inputs(b, args.k, H, G, r, V, torch.bfloat16, True, gen)]
            step = bench(graphed(lambda: domino_ops.domino_head_rollout(*inputs, backend="native"))) / args.k
            x = torch.randn(b, H, device=dev, dtype=torch.bfloat16)
            lm_head = torch.randn(V, H, device=dev, dtype=torch.bfloat16)
            lm = bench(lambda: x @ lm_head.T)
            print(f"Figure 1 split, {shape}, b={b}, bf16: head step {step * 1e3:.1f} us vs LM-head matmul "
                  f"[{b}x{H}] @ [{H}x{V}] {lm * 1e3:.1f} us ({100 * step / lm:.0f}%)")
            del inputs, lm_head


def gpu_tree_table(args) -> None:
    """One tree step (domino_head_expand: greedy, table mode, bf16 weights, n nodes of one
    sequence at one depth, m children each) on the GPU, CUDA kernels and Triton, each in a
    CUDA graph, against one batch-1 chain step (a k = 1 greedy rollout) of the same backend."""
    dev, m = torch.device("cuda"), args.tree_children
    gen = torch.Generator().manual_seed(0)
    print(f"tree step on the GPU, {m} children per node, bf16 weights, table mode, CUDA graphs, do_bench medians")
    header = f"{'shape':6} {'n':>5} | {'MB':>6} | {'cuda us':>8} {'x chain':>8} | {'triton us':>9} {'x chain':>8}"
    print(header)
    print("-" * len(header))
    for shape in args.shapes:
        H, G, r, V = SHAPES[shape]
        base, hproj, state, gru_input, w_ih, w_hh, w1s, w2 = [
            x.to(dev) if x is not None else None for x in make_inputs(1, 1, H, G, r, V, torch.bfloat16, True, gen)]
        chain = {be: gpu_bench_ms(graphed(lambda: domino_ops.domino_head_rollout(
            base, hproj, state, gru_input, None, w_hh, w1s, w2, backend=be))) for be in ("native", "triton")}
        nbytes = rollout_bytes(1, 1, H, G, r, V, 2, True)
        print(f"{shape:6} {'chain':>5} | {nbytes / 1e6:6.1f} | {chain['native'] * 1e3:8.1f} {1.0:7.2f}x | "
              f"{chain['triton'] * 1e3:9.1f} {1.0:7.2f}x")
        for n in args.tree_frontiers:
            node_state = (torch.randn(n, G, generator=gen) * 0.5).to(dev)
            zeros = torch.zeros(n, dtype=torch.long, device=dev)
            row = f"{shape:6} {n:>5} | {expand_bytes(n, m, G, r, V, 2) / 1e6:6.1f} |"
            for be in ("native", "triton"):
                try:
                    ms = gpu_bench_ms(graphed(lambda: domino_ops.domino_head_expand(
                        base, hproj, node_state, zeros, zeros, gru_input, None, w_hh, w1s, w2, num_children=m,
                        write_node_logits=False, backend=be)))
                    row += f" {ms * 1e3:8.1f} {ms / chain[be]:7.2f}x"
                except RuntimeError as err:  # e.g. a launch limit; the table goes on
                    row += f" {'-':>8} {'-':>8}"
                    print(f"  {shape} n={n} {be} skipped: {str(err).splitlines()[0]}")
                row += " |" if be == "native" else ""
            print(row)
        del base, w2


def correctness_status() -> None:
    """The GPU kernels' correctness checks that run on this machine (not timed)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 300, generator=gen)
    draft = logits[:, :3].argmax(-1)
    draft[1, 1] += 1
    ref_out, ref_acc = reference.verify_greedy(draft, logits)
    try:
        # test infrastructure, never installed: `make simt` builds it into build/simt/
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build" / "simt"))
        import domino_simt  # noqa: F401

        out, acc = torch.empty(3, 4, dtype=torch.int64), torch.empty(3, dtype=torch.int64)
        torch.ops.domino_simt.verify_greedy(draft, logits, out, acc)
        simt_ok = torch.equal(out, ref_out) and torch.equal(acc, ref_acc)
        print(f"CUDA kernels under the SIMT emulator: verify_greedy {'matches' if simt_ok else 'DIFFERS FROM'} "
              "the reference (full checks: pytest tests/test_cuda_kernels_simt.py)")
    except ImportError:
        print("CUDA kernels under the SIMT emulator: not built (make simt)")
    if domino_ops.triton.available("cpu"):
        out, acc = domino_ops.verify_greedy(draft, logits, backend="triton")
        tri_ok = torch.equal(out, ref_out) and torch.equal(acc, ref_acc)
        print(f"Triton kernels under the interpreter: verify_greedy {'matches' if tri_ok else 'DIFFERS FROM'} "
              "the reference (full checks: pytest tests/test_triton_kernels.py)")
    else:
        print("Triton kernels under the interpreter: unavailable (triton not installed)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="default: 1 8 (CPU), 1 8 32 (GPU)")
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--k", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5, help="CPU table: timed repeats per cell")
    parser.add_argument("--quick", action="store_true", help="small shape, fewer repeats")
    parser.add_argument("--isas", nargs="+", default=None,
                        help="CPU kernel builds to time (default: every build this CPU runs)")
    parser.add_argument("--ops-batches", nargs="*", type=int, default=[1, 32],
                        help="batches of the sample/verify table (none: skip it)")
    parser.add_argument("--no-rollout", action="store_true", help="skip the head-rollout table")
    parser.add_argument("--tree-frontiers", nargs="*", type=int, default=[4, 8, 16, 64],
                        help="frontier sizes of the tree-step table (none: skip it)")
    parser.add_argument("--tree-children", type=int, default=4, help="children per node in the tree-step table")
    parser.add_argument("--engine", action="store_true",
                        help="also time the head as DominoGenerator calls it, chain rollout and default tree "
                             "(loads SmolLM2 and the drafter)")
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.repeats = ["small"], 3
    supported = cpu.supported_isas()
    args.isas = args.isas or supported
    for isa in args.isas:
        if isa not in supported:
            parser.error(f"--isas {isa}: this CPU runs {', '.join(supported)}")

    gpu = torch.cuda.is_available() and domino_ops.cuda_compiled
    timed = ["C++ CPU kernels (every instruction-set build this CPU runs)", "eager PyTorch (CPU)"]
    if gpu:
        timed += ["CUDA kernels", "Triton kernels", "eager PyTorch (GPU)", "all three in CUDA graphs"]
    print("Backends timed on this machine: " + ", ".join(timed))
    if not gpu:
        reason = "no CUDA device" if not torch.cuda.is_available() else "domino_ops built without CUDA kernels"
        print(f"Not timed here ({reason}): CUDA kernels, Triton kernels, CUDA graphs.")
    correctness_status()
    print()
    if gpu:
        gpu_table(args)
        print()
        if args.tree_frontiers:
            gpu_tree_table(args)
            print()
    copy_bw = cpu_header(args)
    if not args.no_rollout:
        print()
        cpu_table(args, copy_bw)
    if args.engine:
        print()
        engine_table(args, copy_bw)
    if args.tree_frontiers:
        print()
        tree_table(args, copy_bw)
    if args.ops_batches:
        print()
        ops_table(args, copy_bw)
    copy_after = copy_bandwidth_gbs()
    print(f"\ncopy bandwidth {copy_after:.1f} GB/s after the tables ({copy_bw:.1f} before; %copy uses the before value)")


if __name__ == "__main__":
    main()
