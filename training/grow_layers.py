"""Grows a saved drafter by draft layers that start as the identity, to train on from there.

    python -m training.grow_layers python/domino/checkpoints/smollm2-135m-instruct training/runs/grown3 --add 1
    training/long_run.sh --init-from training/runs/grown3 ...    # then train it (the later --init-from wins)

A deeper drafter trained from scratch has to catch up with every step the shallower one
already took (the shipped drafter's lineage is ~50,000 steps), so the sizing study's small
budget cannot say whether a deeper one would end ahead. Growing answers that at the cost of
one stage: each new layer is appended after the last one as a copy of it, with the two
projections that write into the residual stream (attention's ``o_proj``, the MLP's
``down_proj``) set to zero. At the start such a layer adds nothing, so the grown drafter
drafts what the one it came from drafts (tested: on the engine's batch-invariant CPU kernels
bit for bit, logits included; on PyTorch's products the same tokens, the logits within
rounding, since the old last layer now runs every block row), and training starts at that
drafter's acceptance; the copy's attention already reads the context the way a trained
layer does. (Gradients reach the zeroed projections at once, the rest of the new layer from
the second step on.)

The draft vocabulary and the calibration are carried over: the grown drafter's drafts are
the same until it is trained (after that, refit the calibration with
``benchmarks/calibration.py --write``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path
from typing import Callable

import torch

from domino.model import DominoDraftModel


def grow_layers(drafter: DominoDraftModel, add: int) -> DominoDraftModel:
    """Returns a new drafter with ``add`` more draft layers than ``drafter`` (which is not
    changed), each a copy of its last layer whose ``self_attn.o_proj`` and ``mlp.down_proj``
    are zero, so that it drafts as ``drafter`` does (module docstring). Same dtype and device; the
    draft vocabulary and calibration are carried over."""
    if isinstance(add, bool) or not isinstance(add, int) or add < 1:
        raise ValueError(f"add must be an int >= 1 (draft layers to append), got {add!r}")
    if len(drafter.layers) < 1:
        raise ValueError("the drafter has no draft layer to copy")
    config = dataclasses.replace(drafter.config, num_hidden_layers=drafter.config.num_hidden_layers + add)
    # the target's embedding and LM head it borrows stay the target's (shared, not copied)
    grown = copy.deepcopy(drafter, {id(drafter._target): drafter._target})
    grown.config = config
    for _ in range(add):
        layer = copy.deepcopy(drafter.layers[-1])
        with torch.no_grad():
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        grown.layers.append(layer)
    return grown


def grow_cli(description: str, add_arguments: Callable[[argparse.ArgumentParser], None],
             grow: Callable[[DominoDraftModel, argparse.Namespace], DominoDraftModel],
             argv=None) -> tuple[DominoDraftModel, DominoDraftModel, Path]:
    """The command line the growing tools share (this module's and :mod:`training.grow_head`):
    ``DRAFTER OUT [--dtype]`` plus the arguments ``add_arguments(parser)`` adds; loads DRAFTER,
    grows it with ``grow(drafter, args)`` (its ValueError a usage error), writes OUT and
    returns (drafter, grown, OUT)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("drafter", type=Path, help="the drafter directory to grow (read only)")
    p.add_argument("out", type=Path, help="drafter directory to write")
    add_arguments(p)
    p.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"],
                   help="dtype of the written weights (default float32: a bf16 drafter's weights exactly, "
                        "and the new ones unrounded)")
    args = p.parse_args(argv)
    if args.out.resolve() == args.drafter.resolve():
        p.error("out must be another directory than drafter")
    drafter = DominoDraftModel.from_pretrained(args.drafter)
    try:
        grown = grow(drafter, args)
    except ValueError as e:  # the growing function's own checks, as a usage error
        p.error(str(e))
    grown.save_pretrained(args.out, dtype=getattr(torch, args.dtype))
    return drafter, grown, args.out


def main(argv=None) -> None:
    """Command line (module docstring; ``--help``)."""
    drafter, grown, out = grow_cli(
        __doc__.splitlines()[0],
        lambda p: p.add_argument("--add", type=int, default=1, help="draft layers to append (default 1)"),
        lambda d, args: grow_layers(d, args.add), argv)
    print(f"wrote {out}: {len(drafter.layers)} -> {len(grown.layers)} draft layers")


if __name__ == "__main__":
    main()
