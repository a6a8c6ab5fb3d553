#!/usr/bin/env bash
# The paper's ablation (TTT vs TF vs TF + curriculum): same data, steps, batch and seed for
# each run; resumable (rerun the script after an interruption); extra arguments go to every
# run (e.g. --train-shards). TTT runs last: its step costs ~3x a teacher-forced one. Then measure acceptance
# through the generator and plot the backbone loss curves:
#   .venv/bin/python benchmarks/eval_acceptance.py ablation training/runs/abl_* --num-prompts 32
set -e
cd "$(dirname "$0")/.."
DATA=${DATA:-training/regenerated/smollm2_mix}
# bf16 autocast where bf16 is fast (a GPU, a CPU with AVX512-BF16 or AMX), else fp32; every
# drafter drafts from and trains over the 16384 response tokens most frequent in the data
# (as the shipped drafter does: a step costs ~half of one over all 49152).
COMMON="--data $DATA --steps ${STEPS:-2000} --seqs-per-step 16 --anchors 8 --lr 6e-4 --bf16 auto --draft-vocab-size 16384 --init-from-target --eval-every 500 --ckpt-every 50"
.venv/bin/python -m training.train $COMMON --out training/runs/abl_tf --no-curriculum "$@"
.venv/bin/python -m training.train $COMMON --out training/runs/abl_tf_curriculum "$@"
.venv/bin/python -m training.train $COMMON --out training/runs/abl_ttt --ttt --no-curriculum "$@"
