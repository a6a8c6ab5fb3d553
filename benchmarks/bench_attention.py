"""small_batch_attention against PyTorch's SDPA, side by side in one run, on the CPU.

Two tables, median of ``--repeats`` after a warm-up:

1. the op alone at SmolLM2-135M's attention shape (9 query heads, 3 kv heads, head dim
   64) for a decode step (1 query row) and verifications (4, 16 rows) over caches of
   100-2000 tokens, and prompts of 500 and 2000 tokens (a prefill's causal attention, fewer
   repeats): ``domino_ops`` (the dispatcher op, as the HF attention function calls it)
   against ``F.scaled_dot_product_attention`` with ``enable_gqa`` and the causal mask HF
   passes (``is_causal`` for the prompts);
2. what a user gets: one forward of SmolLM2-135M-Instruct (small-batch linear on, as the
   engine runs it) over 1, 4 and 16 new tokens after a prompt of 150 and of 2000 tokens
   (``--prompts``; each forward on a fresh copy of the prompt's cache), with HF's sdpa
   attention and with ``domino.fast_attention``.

    python benchmarks/bench_attention.py [--repeats 200] [--skip-model]

On a CPU with AMX the op's bf16 scores and value sums run on tiles by default; the op table
then also times each bf16 row with them forced onto the vector FMAs (``vector us``), back to
back.

Two builds of the op against each other: ``benchmarks/compare_builds.sh``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from timing import median_seconds


def amx_scores_available() -> bool:
    """Whether this CPU runs small_batch_attention's bf16 scores on AMX tiles (its default there)."""
    q = torch.zeros(1, 1, 1, 64, dtype=torch.bfloat16)
    with scores_path("amx"):
        try:
            torch.ops.domino_ops.small_batch_attention.default(q, q, q, None, 1.0, torch.empty_like(q))
            return True
        except (ValueError, RuntimeError):
            return False


def scores_path(path: str):
    """DOMINO_SMALL_BATCH_ATTENTION_SCORES for a with-block."""
    from domino_ops import cpu

    return cpu.kernel_switch("DOMINO_SMALL_BATCH_ATTENTION_SCORES", path)


def op_table(repeats: int) -> list[str]:
    """With AMX, a bf16 row also times the op with its scores and value sums forced onto the
    vector FMAs ("vector us"), the two timed back to back."""
    op = torch.ops.domino_ops.small_batch_attention.default
    amx = amx_scores_available()
    lines = [f"{'dtype':8} | {'rows':>4} | {'cache':>5} | {'SDPA us':>8} | {'domino us':>9} | speedup"
             + (f" | {'vector us':>9} | AMX gain" if amx else "")]
    # decode steps and verifications over caches, then prompts (a prefill: M = N, causal, the
    # op with no mask and SDPA with is_causal; fewer repeats)
    shapes = [(M, N) for N in (100, 300, 600, 2000) for M in (1, 4, 16)] + [(500, 500), (2000, 2000)]
    for dtype in (torch.float32, torch.bfloat16):
        for M, N in shapes:
            g = torch.Generator().manual_seed(0)
            q = torch.randn(1, M, 9, 64, generator=g).to(dtype).transpose(1, 2)  # HF's layout
            k = torch.randn(1, 3, N, 64, generator=g).to(dtype)
            v = torch.randn(1, 3, N, 64, generator=g).to(dtype)
            prompt = M == N
            mask = None if M == 1 or prompt else torch.ones(1, 1, M, N, dtype=torch.bool).tril(N - M)
            out = torch.empty(1, M, 9, 64, dtype=dtype)
            reps, warm = (max(5, repeats // 20), 2) if prompt else (repeats, 10)
            t_sdpa = 1e6 * median_seconds(
                lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=prompt, enable_gqa=True),
                reps, warmup=warm)
            t_op = 1e6 * median_seconds(lambda: op(q, k, v, mask, 0.125, out.transpose(1, 2)), reps, warmup=warm)
            line = (f"{str(dtype).replace('torch.', ''):8} | {M:4} | {N:5} | {t_sdpa:8.1f} | {t_op:9.1f} | "
                    f"{t_sdpa / t_op:6.2f}x")
            if amx and dtype == torch.bfloat16:
                with scores_path("vector"):
                    t_vec = 1e6 * median_seconds(lambda: op(q, k, v, mask, 0.125, out.transpose(1, 2)), reps,
                                                 warmup=warm)
                line += f" | {t_vec:9.1f} | {t_vec / t_op:6.2f}x"
            lines.append(line)
    return lines


def model_table(repeats: int, prompt_lengths: list[int]) -> list[str]:
    from transformers import AutoModelForCausalLM, DynamicCache

    from domino.fast_attention import undo_small_batch_attention, use_small_batch_attention
    from domino.fast_linear import use_small_batch_linear
    from domino.loading import smollm2_dir
    from domino.target import cache_kwarg

    lines = [f"{'dtype':8} | {'prompt':>6} | {'tokens':>6} | {'sdpa ms':>8} | {'domino ms':>9} | speedup"]
    for dtype in (torch.float32, torch.bfloat16):
        model = use_small_batch_linear(AutoModelForCausalLM.from_pretrained(smollm2_dir(quiet=True), dtype=dtype).eval())
        kv = cache_kwarg(model.forward)  # "cache" or "past_key_values" (the transformers version's)
        for T in prompt_lengths:
            prompt = torch.randint(100, 5000, (1, T), generator=torch.Generator().manual_seed(0))
            with torch.inference_mode():
                cache = DynamicCache()
                model(input_ids=prompt, **{kv: cache}, use_cache=True)
                for k in (1, 4, 16):
                    ids = torch.randint(100, 5000, (1, k), generator=torch.Generator().manual_seed(k))
                    ms = {}
                    for impl in ("sdpa", "domino"):
                        (use_small_batch_attention if impl == "domino" else undo_small_batch_attention)(model)
                        times = []
                        for r in range(repeats + 2):  # a fresh copy of the cache each time; 2 warm-ups
                            c = copy.deepcopy(cache)
                            t0 = time.perf_counter()
                            model(input_ids=ids, **{kv: c}, use_cache=True)
                            times.append(time.perf_counter() - t0)
                        ms[impl] = statistics.median(times[2:]) * 1e3
                    lines.append(f"{str(dtype).replace('torch.', ''):8} | {T:6} | {k:6} | {ms['sdpa']:8.2f} | "
                                 f"{ms['domino']:9.2f} | {ms['sdpa'] / ms['domino']:6.2f}x")
        undo_small_batch_attention(model)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=200, help="timed calls of the op (the model: repeats / 10)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--skip-model", action="store_true", help="the op table only")
    p.add_argument("--prompts", type=int, nargs="+", default=[150, 2000], help="the model table's prompt lengths")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import domino_ops
    from domino_ops import cpu

    print(f"{cpu.model()}, CPU build {cpu.isa()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"median of {args.repeats} (the model: {max(3, args.repeats // 10)}) after a warm-up")
    assert domino_ops.small_batch_attention is not None
    print("\nthe op alone: 9 query heads, 3 kv heads, head dim 64")
    print("\n".join(op_table(args.repeats)))
    if not args.skip_model:
        print("\nSmolLM2-135M-Instruct, one forward after a prompt, small-batch linear on")
        print("\n".join(model_table(max(3, args.repeats // 10), args.prompts)))


if __name__ == "__main__":
    main()
