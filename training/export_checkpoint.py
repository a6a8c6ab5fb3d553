"""Exports a training checkpoint (``training/train.py``'s checkpoint.pt) as a drafter directory.

    python -m training.export_checkpoint training/runs/long/checkpoint.pt /tmp/drafter_step2500

A running job saves its full state every ``--ckpt-every`` steps (weights, optimiser,
step, config, draft vocabulary) but writes a loadable drafter only when it ends. This
writes one at any time: the checkpoint's weights under its own config (checked against
``--base``, the drafter the run started from, when given) and its draft vocabulary
(checkpoints written before they held one: ``--base``'s, since a vocabulary is chosen from
the data, not trained), in ``--dtype``, without calibration (a calibration belongs to the
weights it was fitted on: refit with ``benchmarks/calibration.py --write``). The
checkpoint file is only read, so this is safe while the job runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from domino.budget import Calibration
from domino.config import DominoConfig
from domino.model import DominoDraftModel


def export_checkpoint(checkpoint: Path, out: Path, base: Path | None = None,
                      dtype: torch.dtype = torch.bfloat16) -> int:
    """Writes the checkpoint's drafter to ``out``; returns the last step it trained."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    vocab = state.get("draft_vocab")
    if base is not None:
        start = DominoDraftModel.from_pretrained(base)
        if state["config"] != start.config.to_json_dict():
            raise ValueError(f"checkpoint {checkpoint} was trained with another config than --base {base}: "
                             f"{json.dumps(state['config'])} vs {json.dumps(start.config.to_json_dict())}")
        if vocab is None:  # a checkpoint from before they kept their vocabulary
            vocab = start.draft_vocab
    model = DominoDraftModel(DominoConfig.from_json_dict(state["config"])).set_draft_vocab(vocab)
    model.load_state_dict(state["model"])  # strict: every weight
    model.calibration = Calibration()
    model.save_pretrained(out, dtype=dtype)
    return int(state["step"])


def main(argv=None) -> None:
    """Command line (module docstring; ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", type=Path, help="checkpoint.pt written by training/train.py")
    p.add_argument("out", type=Path, help="drafter directory to write")
    p.add_argument("--base", type=Path, default=None,
                   help="the drafter the run started from (--init-from), if any: its config is checked against the "
                        "checkpoint's, and its draft vocabulary used for a checkpoint that holds none")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = p.parse_args(argv)
    step = export_checkpoint(args.checkpoint, args.out, args.base, getattr(torch, args.dtype))
    print(f"wrote {args.out} (step {step})")


if __name__ == "__main__":
    main()
