"""Grows a saved drafter's Domino head (its rank r, its GRU width G), starting where it was.

    python -m training.grow_head python/domino/checkpoints/smollm2-135m-instruct training/runs/rank128 --rank 128
    training/long_run.sh --init-from training/runs/rank128 ...    # then train it (the later --init-from wins)

The head's correction ``W2 @ SiLU(W1 @ [h; S])`` can move the base logits only within the
r-dimensional span of ``W2``'s columns, and it knows the drafted prefix only through the
GRU's G-dimensional state S (the shipped SmolLM2 drafter: r = 64, G = 256, the paper's 256
and 1024 scaled down with the hidden size). Whether either holds the head back cannot be
told from a small-budget run from scratch, which would have to catch up with the lineage's
~50,000 steps; growing answers it at the cost of one stage, as :mod:`training.grow_layers`
does for depth. Every new weight that the old outputs would read is zero, every other new
weight is random with the spread of the trained weights it sits beside:

- rank: new rows of ``W1`` random, new columns of ``W2`` zero;
- GRU width: new units' rows of ``weight_ih`` and ``weight_hh`` random, the old units'
  ``weight_hh`` columns for the new units zero, and ``W1``'s columns for them zero.

So at the start the grown drafter drafts what the one it came from drafts (tested: the same
tokens, and the same logits bit for bit on the engine's kernels, within rounding on
PyTorch's products), and training starts at that drafter's acceptance. (Gradients reach the
zero weights at once, the random ones behind them from the second step on.)

The price is drafting time: each head step streams ``W2``'s rows of the draft vocabulary
(K x r values), ``W1``'s state columns (r x G), the GRU's ``weight_ih`` (3G x H) and
``weight_hh`` (3G x G); doubling r doubles the first, doubling G the other three. The
draft vocabulary and the calibration are carried over (refit the calibration after
training: ``benchmarks/calibration.py --write``). The exactness above is tested on the CPU;
the GPU kernels read the same weights but were not run on grown drafters.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

import torch
from torch import nn

from domino.fast_linear import use_small_batch_linear, uses_small_batch_linear
from domino.model import DominoDraftModel
from training.grow_layers import grow_cli


def _random_like(spread_of: torch.Tensor, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """N(0, s^2) of ``shape``, s the standard deviation of ``spread_of``, in its dtype and device."""
    s = spread_of.detach().float().std()
    return (torch.randn(shape, generator=generator) * s).to(spread_of.dtype).to(spread_of.device)


def _check_larger(name: str, value, old: int) -> None:
    """Refuses (ValueError naming ``name``) a size that is not an int larger than ``old``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= old:
        raise ValueError(f"{name} must be an int > the drafter's {old}, got {value!r}")


def grow_head(drafter: DominoDraftModel, *, rank: int | None = None, gru: int | None = None,
              seed: int = 0) -> DominoDraftModel:
    """Returns a new drafter whose head has rank ``rank`` and GRU width ``gru`` (each larger
    than the drafter's ``emb_dim`` / ``gru_hidden_dim``; None keeps it; ``drafter`` is not
    changed), grown as the module docstring says, random weights from a ``torch.Generator``
    seeded with ``seed``, so that it drafts as ``drafter`` does: ``W1`` [r1, H + G1], ``W2``
    [V, r1], ``weight_ih`` [3 G1, H], ``weight_hh`` [3 G1, G1], in the drafter's dtype and on
    its device. Everything else is a copy; the draft vocabulary, the calibration, the target
    it is bound to (not copied) and the small-batch linear switch are carried over."""
    c = drafter.config
    if not c.has_head:
        raise ValueError("the drafter has no Domino head to grow (a backbone-only DFlash drafter)")
    if rank is None and gru is None:
        raise ValueError("give rank, gru or both: the head's new size")
    if rank is not None:
        _check_larger("rank", rank, c.emb_dim)
    if gru is not None:
        _check_larger("gru", gru, c.gru_hidden_dim)
    r0, g0, H = c.emb_dim, c.gru_hidden_dim, c.hidden_size
    r1, g1 = rank or r0, gru or g0
    g = torch.Generator().manual_seed(seed)
    w_ih, w_hh = drafter.prefix_gru.weight_ih_l0.detach(), drafter.prefix_gru.weight_hh_l0.detach()
    w1, w2 = drafter.embed_proj[0].weight.detach(), drafter.embed_proj[2].weight.detach()

    # W1 [r, H + G]: old rows gain zero columns for the new units, new rows are random
    new_w1 = torch.cat([w1, w1.new_zeros(r0, g1 - g0)], dim=1)
    new_w1 = torch.cat([new_w1, _random_like(w1, (r1 - r0, H + g1), g)])
    new_w2 = torch.cat([w2, w2.new_zeros(w2.shape[0], r1 - r0)], dim=1)
    # GRU weights: three gate blocks (r, z, n) of G rows each, every one widened alike
    ih_blocks, hh_blocks = [], []
    for gate in range(3):
        ih, hh = w_ih[gate * g0:(gate + 1) * g0], w_hh[gate * g0:(gate + 1) * g0]
        ih_blocks += [ih, _random_like(w_ih, (g1 - g0, H), g)]
        hh_blocks += [torch.cat([hh, hh.new_zeros(g0, g1 - g0)], dim=1), _random_like(w_hh, (g1 - g0, g1), g)]
    new_ih, new_hh = torch.cat(ih_blocks), torch.cat(hh_blocks)

    # the target's embedding and LM head it borrows stay the target's (shared, not copied)
    grown = copy.deepcopy(drafter, {id(drafter._target): drafter._target})
    grown.config = dataclasses.replace(c, emb_dim=r1, gru_hidden_dim=g1)
    grown.prefix_gru = nn.GRU(H, g1, bias=False, batch_first=True, device=w_ih.device, dtype=w_ih.dtype)
    grown.embed_proj = nn.Sequential(nn.Linear(H + g1, r1, bias=False, device=w1.device, dtype=w1.dtype), nn.SiLU(),
                                     nn.Linear(r1, w2.shape[0], bias=False, device=w2.device, dtype=w2.dtype))
    pairs = ((grown.prefix_gru.weight_ih_l0, new_ih, drafter.prefix_gru.weight_ih_l0),
             (grown.prefix_gru.weight_hh_l0, new_hh, drafter.prefix_gru.weight_hh_l0),
             (grown.embed_proj[0].weight, new_w1, drafter.embed_proj[0].weight),
             (grown.embed_proj[2].weight, new_w2, drafter.embed_proj[2].weight))
    with torch.no_grad():
        for param, value, was in pairs:
            param.copy_(value)
            param.requires_grad_(was.requires_grad)
    grown.train(drafter.training)
    if uses_small_batch_linear(drafter.embed_proj):
        use_small_batch_linear(grown.embed_proj)
    # the caches deepcopy copied (the old head's draft-vocabulary rows and packs) would only
    # miss (their keys hold the old weights' shapes and addresses) and hold memory: setting the
    # vocabulary again drops them, and the new head's are made on first use
    return grown.set_draft_vocab(drafter.draft_vocab)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    """The command line's own arguments (the shared ones: :func:`training.grow_layers.grow_cli`)."""
    p.add_argument("--rank", type=int, default=None, help="the grown head's rank r (> the drafter's)")
    p.add_argument("--gru", type=int, default=None, help="the grown head's GRU width G (> the drafter's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the new random weights (default 0)")


def main(argv=None) -> None:
    """Command line (module docstring; ``--help``)."""
    drafter, grown, out = grow_cli(__doc__.splitlines()[0], _add_arguments,
                                   lambda d, args: grow_head(d, rank=args.rank, gru=args.gru, seed=args.seed), argv)
    old, new = drafter.config, grown.config
    print(f"wrote {out}: head rank {old.emb_dim} -> {new.emb_dim}, GRU width {old.gru_hidden_dim} -> "
          f"{new.gru_hidden_dim}")


if __name__ == "__main__":
    main()
