#!/usr/bin/env bash
# Training ablation at a reduced budget: same data, steps, batch and seed for each run.
set -e
cd "$(dirname "$0")/.."
COMMON="--data training/data/smollm2 --steps ${STEPS:-400} --seqs-per-step 8 --anchors 8 --lr 1e-3 --bf16 --init-from-target --eval-every 1000 --ckpt-every 100"
.venv/bin/python -m training.train $COMMON --out training/runs/abl_ttt --ttt --no-curriculum
.venv/bin/python -m training.train $COMMON --out training/runs/abl_tf --no-curriculum
.venv/bin/python -m training.train $COMMON --out training/runs/abl_tf_curriculum
