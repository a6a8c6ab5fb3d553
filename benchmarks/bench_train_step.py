"""One drafter training step (forward, loss, backward) as training.train runs it, with the
loss over the vocabulary computed two ways, side by side in one run:

- ``whole``: base and final logits [N*A*n, V] built whole and differentiated by autograd
  (what the trainer did before 2026-11-23, and still does for ``--ttt``);
- ``chunked``: training/chunked_loss.py, 128 draft positions at a time, the gradients
  made in the forward (what the trainer does now);
- ``chunked`` under ``--bf16`` (bf16 autocast for the matmuls), over all V tokens and over
  the drafter's draft vocabulary (training.data.restrict_to_draft_vocab).

Plus the LM head's forward alone on the drafter's hidden states as a strided view (how
they reached it before 2026-11-23) and contiguous. The shipped SmolLM2 drafter, fp32, on
the regenerated mix (its features must exist: run training.generate_data once), 16
sequences x 8 anchors, CE; median of ``--repeats`` after one warm-up each.

    python benchmarks/bench_train_step.py              # torch's default threads
    python benchmarks/bench_train_step.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def median_s(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    import sys

    sys.path.insert(0, str(REPO))
    from transformers import AutoModelForCausalLM

    from domino.loading import DEFAULT_DRAFTER_DIR, smollm2_dir
    from domino_ops import cpu
    from domino.model import DominoDraftModel
    from training.data import load_shards, make_batch, restrict_to_draft_vocab
    from training.train import forward_batch, position_weights, weighted_loss

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=REPO / "training" / "regenerated" / "smollm2_mix")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    target = AutoModelForCausalLM.from_pretrained(smollm2_dir(quiet=True), dtype=torch.float32).eval()
    target.requires_grad_(False)
    model = DominoDraftModel.from_pretrained(DEFAULT_DRAFTER_DIR).bind_target(target).float().train()
    c = model.config
    # four training shards (shard 0 is held out) whose features exist on this machine
    have = sorted(int(f.name[6:11]) for f in args.data.glob("shard_*.features.safetensors"))
    convs = load_shards(args.data, [s for s in have if s != 0][:4])
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, len(convs), (16,), generator=g).tolist()
    batch = make_batch([convs[i] for i in idx], 8, c.block_size, c.num_drafts, c.mask_token_id, g)
    w = (position_weights(c.num_drafts, 7.0)[None, None, :] * batch.label_valid).view(-1, c.num_drafts)
    w = w / w.sum()
    lam = 0.5

    def step_whole():
        N, A = batch.anchors.shape
        h = model.packed_draft_hidden(*batch.backbone_inputs())
        base = model.lm_head(h)
        final = base + model.embed_proj[2](model.teacher_forced_head_input(h, batch.teacher.reshape(N * A, -1)))
        loss = (1 - lam) * weighted_loss("ce", final, batch, w) + lam * weighted_loss("ce", base, batch, w)
        model.zero_grad(set_to_none=True)
        loss.backward()
        return loss.detach()

    def step_chunked(autocast=False, batch=batch, w=w):
        loss, _, _ = forward_batch(model, batch, kind="ce", weights=w, lam=lam, ttt=False, autocast=autocast)
        model.zero_grad(set_to_none=True)
        loss.backward()
        return loss.detach()

    torch.testing.assert_close(step_whole(), step_chunked(), rtol=1e-4, atol=1e-4)  # the same loss
    with torch.no_grad():
        h = model.packed_draft_hidden(*batch.backbone_inputs())
        # the drafting positions as a slice of a block-shaped tensor, as they used to arrive
        strided = torch.cat([h[:, :1], h], dim=1)[:, 1:]
        contiguous = strided.contiguous()
        head = model.lm_head
        t_strided = median_s(lambda: head(strided), args.repeats)
        t_contig = median_s(lambda: head(contiguous), args.repeats)
    t_whole = median_s(step_whole, args.repeats)
    t_chunked = median_s(step_chunked, args.repeats)
    # --bf16: autocast for the matmuls, fp32 weights and optimizer (pays where the CPU has
    # native bf16 dot products, AVX512-BF16 or AMX; on AVX2 it is ~25x slower)
    t_bf16 = median_s(lambda: step_chunked(autocast=True), args.repeats)
    # the loss over the drafter's draft vocabulary only (what the trainer does for a drafter
    # that has one): the LM head's K rows instead of V
    vb = restrict_to_draft_vocab(batch, model.draft_vocab, c.vocab_size)
    wv = (position_weights(c.num_drafts, 7.0)[None, None, :] * vb.label_valid).view(-1, c.num_drafts)
    t_vocab = median_s(lambda: step_chunked(autocast=True, batch=vb, w=wv / wv.sum()), args.repeats)

    rows = h.shape[0] * h.shape[1]
    print(f"{cpu.model()} ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"SmolLM2 drafter fp32, 16 x 8 blocks = {rows} draft positions x V {c.vocab_size}; "
          f"median of {args.repeats} after a warm-up")
    print(f"{'what':40} | {'before':>9} | {'now':>9} | speedup")
    print(f"{'LM head forward (strided / contiguous)':40} | {t_strided:8.2f}s | {t_contig:8.2f}s | "
          f"{t_strided / t_contig:5.2f}x")
    print(f"{'training step (whole / chunked loss)':40} | {t_whole:8.2f}s | {t_chunked:8.2f}s | "
          f"{t_whole / t_chunked:5.2f}x")
    print(f"{'training step (chunked fp32 / --bf16)':40} | {t_chunked:8.2f}s | {t_bf16:8.2f}s | "
          f"{t_chunked / t_bf16:5.2f}x")
    label = f"--bf16 step (all V / draft vocab {model.draft_vocab.numel()})"
    print(f"{label:40} | {t_bf16:8.2f}s | {t_vocab:8.2f}s | "
          f"{t_bf16 / t_vocab:5.2f}x")


if __name__ == "__main__":
    main()
