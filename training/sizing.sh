#!/usr/bin/env bash
# Sizing the drafter for this target at equal (small) budget before the long run: draft
# layers 2 vs 3, block 8 vs 16, and the loss (CE vs KL distillation vs CE + TV).
# Resumable; each run logs the acceptance generation would see on held-out conversations
# (tau_head_on / tau_head_off in log.jsonl), compared with
#   .venv/bin/python benchmarks/eval_acceptance.py ablation training/runs/size_* --num-prompts 32
set -e
cd "$(dirname "$0")/.."
DATA=${DATA:-training/regenerated/smollm2_mix}
# BF16=--bf16 on a GPU or an AVX-512 CPU; on an AVX2 CPU bf16 training is ~25x slower than fp32
BF16=${BF16:-}
COMMON="--data $DATA --steps ${STEPS:-1000} --seqs-per-step 16 --anchors 8 --lr 6e-4 $BF16 --init-from-target --eval-every 250 --ckpt-every 50"
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b16 --layers 2 --block-size 16
.venv/bin/python -m training.train $COMMON --out training/runs/size_l3_b16 --layers 3 --block-size 16
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b8 --layers 2 --block-size 8
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b16_kl --layers 2 --block-size 16 --loss kl
.venv/bin/python -m training.train $COMMON --out training/runs/size_l2_b16_cetv --layers 2 --block-size 16 --loss ce_tv
