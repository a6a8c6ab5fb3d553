#!/usr/bin/env bash
# CE against KL distillation from the stored top-32 target log-probabilities (issue 14,
# section 3) at the same budget: both runs continue the shipped drafter on the same data,
# steps, batch, learning rate and seed, and differ only in --loss. They run side by side,
# one thread each. Resumable: rerun the script after an interruption.
# The trainer's held-out evaluation at the last step (generation-stepping tau, head on and
# off, in each run's log.jsonl) compares them; then through the generator:
#   .venv/bin/python benchmarks/eval_acceptance.py ablation training/runs/loss_ce training/runs/loss_kl --num-prompts 16
set -e
cd "$(dirname "$0")/.."
DATA=${DATA:-training/regenerated/smollm2_mix}
STEPS=${STEPS:-300}
# shards 1-20 for training (shard 0 is held out), whatever generation has added since
COMMON="--data $DATA --steps $STEPS --seqs-per-step 16 --anchors 8 --lr 3e-4 --max-shards 20
        --init-from python/domino/checkpoints/smollm2-135m-instruct --eval-every $STEPS --ckpt-every 25"
mkdir -p training/runs
for loss in ce kl; do
  OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python -m training.train $COMMON --loss $loss \
      --out training/runs/loss_$loss >> training/runs/loss_$loss.log 2>&1 &
done
wait
