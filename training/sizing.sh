#!/usr/bin/env bash
# Sizing the drafter for this target at equal (small) budget before the long run: draft
# layers 2 vs 3, block 8 vs 16, and the loss (CE vs KL distillation vs CE + TV).
# Extra arguments go to every run (e.g. --train-shards). Resumable; each run logs the acceptance generation would see on held-out conversations
# (tau_head_on / tau_head_off in log.jsonl), compared with
#   .venv/bin/python benchmarks/eval_acceptance.py ablation training/runs/size_* --num-prompts 32
set -e
cd "$(dirname "$0")/.."
DATA=${DATA:-training/regenerated/smollm2_mix}
# bf16 autocast where bf16 is fast (a GPU, a CPU with AVX512-BF16 or AMX), else fp32; every
# drafter drafts from and trains over the 16384 response tokens most frequent in the data
# (as the shipped drafter does: a step costs ~half of one over all 49152).
COMMON="--data $DATA --steps ${STEPS:-1000} --seqs-per-step 16 --anchors 8 --lr 6e-4 --bf16 auto --draft-vocab-size 16384 --init-from-target --eval-every 250 --ckpt-every 50"
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b16 --layers 2 --block-size 16 "$@"
.venv/bin/python -m training.train $COMMON --out training/runs/size_l3_b16 --layers 3 --block-size 16 "$@"
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b8 --layers 2 --block-size 8 "$@"
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b16_kl --layers 2 --block-size 16 --loss kl "$@"
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b16_cetv --layers 2 --block-size 16 --loss ce_tv "$@"
