#!/usr/bin/env bash
# One training stage of the shipped drafter (issue 14), start to finish, as the stages since
# the twelfth were made by hand: the features of a range of token shards, the shipped
# drafter trained on them, and both drafters measured through the generator, side by side.
#
#     training/stage.sh N START END          # e.g. training/stage.sh 30 1794 1976
#
# 1. rebuilds the features of the token shards in [START, END) that lack them, and of the
#    held-out shard 0 (two one-thread workers; ~35-40 s a shard per worker on the Zen 4 and
#    Xeon VMs, ~60-90 s on the Zen 3 VM);
# 2. trains training/runs/stageN from the shipped drafter on every shard in [START, END)
#    (the shards holding the held-out prompts, every 540th, are left out): STEPS (default
#    2000) steps of 16 sequences x 8 anchors, CE on the target's argmax, cosine with 2 %
#    warm-up (training/long_run.sh; resumable: run this again after an interruption);
#    TRAIN_ARGS adds training.train arguments (e.g. TRAIN_ARGS="--loss kl": distil the
#    target's stored top-32 instead);
# 3. measures the new drafter and the shipped one with benchmarks/eval_acceptance.py tau
#    (greedy, block 16, chains, 128 new tokens; HumanEval's EVAL_PROMPTS prompts, default
#    all 164, then CHAT_PROMPTS, default 64, held-out chat prompts), one thread each side by
#    side, into training/runs/stageN/eval.txt.
# Shipping stays a decision: copy training/runs/stageN/drafter into
# python/domino/checkpoints/smollm2-135m-instruct only where it measures better, then
# recalibrate (benchmarks/calibration.py --write) and record it (README, training/README.md,
# benchmarks/results/drafter_lineage.json).
#
# Where: any 2-core CPU fits a stage in a session. With AVX512-BF16 or AMX the trainer
# autocasts to bf16 (1.4-1.9 s a step); on an AVX2 CPU it runs in fp32: ~2.4 s a step on the
# 2-core Zen 3 VM with nothing else running (stage 30, 2026-12-03: 2000 steps in 97 minutes,
# 2.9 s a step on average with a test-suite run and other work beside it; the 4.6 s
# measured the session before had the data generators beside it). Stop or pause other jobs first (kill -STOP): they
# share the two cores.
set -euo pipefail
# The whole body is one compound command, so bash reads all of it before running any: an
# edit to this file during a 90-minute stage cannot shift what the running copy reads next
# (stage 30 lost its measurement step that way).
{
N=${1:?usage: stage.sh N START END}
START=${2:?usage: stage.sh N START END}
END=${3:?usage: stage.sh N START END}
cd "$(dirname "$0")/.."
DATA=training/regenerated/smollm2_mix
OUT=training/runs/stage$N
PY=.venv/bin/python

# an interrupted run takes its background jobs and their children with it (they would
# hold the two cores)
kill_tree() { local child; for child in $(pgrep -P "$1"); do kill_tree "$child"; done; kill "$1" 2>/dev/null || true; }
cleanup() { local job; for job in $(jobs -p); do kill_tree "$job"; done; }
trap cleanup EXIT
trap 'exit 130' INT TERM
wait_all() {  # waits for each PID given; fails if any failed
    local pid failed=0
    for pid in "$@"; do wait "$pid" || failed=1; done
    return $failed
}

echo "[stage $N] features of shards $START..$((END - 1)) and 0 (logs /tmp/stage${N}_features_*.log)"
pids=()
for I in 0 1; do
    OMP_NUM_THREADS=1 $PY -m training.generate_data --out $DATA --target-tokens 0 --threads 1 \
        --shard-range "$START" "$END" --worker $I/2 > "/tmp/stage${N}_features_$I.log" 2>&1 &
    pids+=($!)
done
wait_all "${pids[@]}"
OMP_NUM_THREADS=1 $PY -m training.generate_data --out $DATA --target-tokens 0 --threads 1 --shard-range 0 1 \
    > "/tmp/stage${N}_features_heldout.log" 2>&1 &
wait_all $!  # (in the background and waited for, so that a signal reaches the trap at once)

SHARDS=$($PY - "$DATA" "$START" "$END" <<'EOF'
import sys
from pathlib import Path
data, start, end = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
tokens = [i for i in range(start, end) if i % 540 != 0 and (data / f"shard_{i:05d}.jsonl").exists()]
featured = [i for i in tokens if (data / f"shard_{i:05d}.features.safetensors").exists()]
print(f"{len(featured)} of the {len(tokens)} token shards have features (missing: {sorted(set(tokens) - set(featured))})",
      file=sys.stderr)
print(" ".join(map(str, featured)))
EOF
)
[ -n "$SHARDS" ] || { echo "[stage $N] no token shards with features in $START..$((END - 1))" >&2; exit 1; }
echo "[stage $N] training on $(wc -w <<< "$SHARDS") shards"
STEPS=${STEPS:-2000}
OUT=$OUT STEPS=$STEPS OMP_NUM_THREADS=2 training/long_run.sh --train-shards $SHARDS --warmup 0.02 \
    --eval-every "$STEPS" --eval-convs 0 --eval-generator-prompts 0 --labels target_argmax ${TRAIN_ARGS:-} &
wait_all $!

echo "[stage $N] measuring stage $N and the shipped drafter"
measure() {  # $1: a label, the rest: eval_acceptance.py tau's --drafter (none: the shipped one)
    local label=$1; shift
    {
        echo "# $label"
        OMP_NUM_THREADS=1 $PY benchmarks/eval_acceptance.py tau "$@" --num-prompts "${EVAL_PROMPTS:-164}" \
            --max-new-tokens 128 --temperatures 0
        OMP_NUM_THREADS=1 $PY benchmarks/eval_acceptance.py tau "$@" --prompts chat \
            --num-prompts "${CHAT_PROMPTS:-64}" --max-new-tokens 128 --temperatures 0
    } > "$OUT/eval_$label.txt" 2> "$OUT/eval_$label.log"
}
measure "stage$N" --drafter "$OUT/drafter" &
pids=($!)
measure shipped &
pids+=($!)
wait_all "${pids[@]}"
cat "$OUT/eval_stage$N.txt" "$OUT/eval_shipped.txt" | tee "$OUT/eval.txt"
exit
}
