#!/usr/bin/env bash
# The paper's ablation (TTT vs TF vs TF + curriculum): same data, steps, batch and seed for
# each run; resumable (rerun the script after an interruption). Then measure acceptance
# through the generator and plot the backbone loss curves:
#   .venv/bin/python benchmarks/eval_acceptance.py ablation training/runs/abl_* --num-prompts 32
set -e
cd "$(dirname "$0")/.."
DATA=${DATA:-training/regenerated/smollm2_mix}
# BF16=--bf16 on a GPU or an AVX-512 CPU; on an AVX2 CPU bf16 training is ~25x slower than fp32
BF16=${BF16:-}
COMMON="--data $DATA --steps ${STEPS:-2000} --seqs-per-step 16 --anchors 8 --lr 6e-4 $BF16 --init-from-target --eval-every 500 --ckpt-every 50"
.venv/bin/python -m training.train $COMMON --out training/runs/abl_ttt --ttt --no-curriculum
.venv/bin/python -m training.train $COMMON --out training/runs/abl_tf --no-curriculum
.venv/bin/python -m training.train $COMMON --out training/runs/abl_tf_curriculum
