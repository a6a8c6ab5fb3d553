#!/usr/bin/env bash
# The long run (issue 14): the shipped drafter trained on, in the background, over every
# regenerated shard on disk (shard 0 held out), 16 sequences x 8 anchors per step, CE over
# its draft vocabulary, bf16 autocast where bf16 is fast (training.train --bf16 auto), with
# the acceptance through the generator on 32 HumanEval prompts logged every 500 steps.
# Resumable: run it again after any interruption and it continues from its last checkpoint
# (every 25 steps). Shards generated since the last start join the data at the next start.
#
#     setsid nohup nice -n 10 training/long_run.sh > /tmp/long_run.log 2>&1 &
#     python benchmarks/eval_acceptance.py curve training/runs/long    # the acceptance curve
# Extra arguments go to training.train (--train-shards to train on the shards whose features
# exist; a smoke test: OUT=/tmp/smoke training/long_run.sh --stop-after 2 --eval-every 1 --eval-generator-prompts 2 --eval-convs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-training/runs/long}
PYTHONPATH=. exec .venv/bin/python -m training.train --data training/regenerated/smollm2_mix --out "$OUT" \
    --init-from python/domino/checkpoints/smollm2-135m-instruct --steps "${STEPS:-10000}" \
    --seqs-per-step 16 --anchors 8 --lr "${LR:-3e-4}" --eval-every 500 --eval-generator-prompts 32 \
    --ckpt-every 25 --bf16 auto "$@"
