#!/usr/bin/env bash
# What a lent GPU machine should run, in two calls of the device tool made back to back
# (the machine stays warm ~30 s after a call, and keeps /tmp/site while warm; a cold one
# rebuilds, 2-4 minutes of nvcc):
#
#     run(command="bash benchmarks/gpu_session.sh test", timeout_s=600)
#     run(command="bash benchmarks/gpu_session.sh bench", timeout_s=600)
#
# test:  build domino_ops against the machine's own torch, the CUDA kernels required
#        (ptxas's resource report kept); the kernel tests on real CUDA tensors (the `cuda`
#        backend of tests/kernel_backends.py and tests/tree_backends.py), the Triton kernels
#        compiled rather than interpreted, CUDA-graph capture and replay of a rollout
#        (tests/test_cuda_graph.py); and, where the machine's CPU has AVX-512, the CPU kernel
#        tests under the avx512 build (issue 11: no machine of this project has one).
# bench: the GPU half of bench_head.py (CUDA vs Triton vs eager, plain and in CUDA graphs,
#        both shapes; the tree step on the GPU) and bench_tree.py; the CPU tree-step and
#        row-op tables (and, with AVX-512, the CPU rollout table) per build. ~5 minutes.
# all:   test, then a smaller bench, in ONE call sized for a 15-device-minute lease
#        (a fresh machine takes 1-2 minutes to start and goes back 30 s after a call, so a
#        second call rarely finds it warm): the GPU tests (240 s), the GPU rollout table at
#        batch 1 and 32 in bf16 and the GPU tree-step table (200 s), bench_tree.py (60 s);
#        where the host has AVX-512, its packed-linear (AMX) and ISA tests (120 s).
#        Each step's log lands in $OUT as it runs, so a step cut off still reports.
# expand: after a change to the expand kernels: their GPU tests and CUDA-graph capture,
#        the GPU tree-step table (and the batch-1 bf16 rollout rows), the profile. ~4 minutes.
# head:  after a change to the kernels the rollout and the expand step share
#        (head_kernels.cuh): the head rollout's, expand's, tree-draft and CUDA-graph GPU
#        tests; the GPU rollout table (bf16, b = 1, 16, 32) and tree-step table; the
#        profile. ~5 minutes on a cold machine, one call.
# profile: the per-kernel split of a paper-shape rollout step and expand step (torch
#        profiler), for the kernel that dominates.
#
# The device tool sends at most 64 MiB of working tree; with the committed token shards of
# training/regenerated the tree is ~65 MiB, so move that folder out of the checkout for the
# calls (nothing here reads it) and back after (the 2026-11-26 session did).
#
# Output goes to $OUT (the device tool brings that folder back) or /tmp/gpu_session.
# Nothing is fetched there: the machine has torch, triton, pytest, hypothesis, transformers,
# scikit-build-core, cmake and ninja; tests that need SmolLM2 or HumanEval are not run.
# Record the device, the date and the numbers in benchmarks/README.md.
set -uo pipefail
PHASE=${1:?usage: gpu_session.sh build|test|bench|all|expand|head|profile}
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
AVX512=$(grep -qw avx512f /proc/cpuinfo && echo yes || echo no)

{ date -u; nvidia-smi; lscpu | grep -E "Model name|^Flags" | cut -c1-400; echo "avx512f: $AVX512"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  > "$OUT/machine.txt" 2>&1

if [ ! -d /tmp/site/domino_ops ]; then
  echo "== build (DOMINO_CUDA=ON, against the machine's torch)"
  # sm_90 only (H100/H200): half the nvcc time of the default "80;90"
  if ! CMAKE_ARGS="${CMAKE_ARGS:--DDOMINO_CUDA_ARCHS=90}" DOMINO_CUDA=ON python3 -m pip install -v --no-build-isolation --no-deps --no-index --target /tmp/site . \
      > "$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log"
    rm -rf /tmp/site
    exit 1
  fi
  grep -E "spill|Used [0-9]+ registers|stack frame" "$OUT/build.log" | sort | uniq -c | sort -rn > "$OUT/ptxas.txt"
fi
export PYTHONPATH=/tmp/site

case "$PHASE" in
build) ;;
test)
  echo "== kernel tests on the GPU (real CUDA tensors, compiled Triton)"
  # xdist: a test that crashes its worker is reported as failed and the run goes on
  timeout 420 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs -k "((cuda or triton) and not emulated_cuda) or libstdcxx or extension_raises" \
    tests/test_op_registration.py tests/test_cuda_graph.py tests/test_kernel_backends.py tests/test_domino_head_expand.py \
    tests/test_build_tree_kernel_efficient.py tests/test_verify_tree_greedy.py tests/test_verify_tree_sampling.py \
    tests/test_tree_speculative_sampling_target_only.py tests/test_small_batch_linear.py tests/test_bad_input.py \
    2>&1 | tee "$OUT/tests_gpu.log" | tail -30
  if [ "$AVX512" = yes ]; then
    echo "== CPU kernel tests under the avx512 build"
    DOMINO_CPU_ISA=avx512 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -rfE -k "not emulated_cuda" \
      tests/test_cpu_isa.py tests/test_domino_head_rollout.py tests/test_sample.py tests/test_filtered_probs.py tests/test_verify_greedy.py \
      tests/test_verify_sampling.py tests/test_small_batch_linear.py 2>&1 | tee "$OUT/tests_avx512.log" | tail -15
  fi
  ;;
bench)
  echo "== bench_head.py: GPU table (and the CPU rollout per build where AVX-512 exists)"
  rollout=--no-rollout
  [ "$AVX512" = yes ] && rollout=""
  timeout 400 python3 benchmarks/bench_head.py --shapes small paper --repeats 5 $rollout \
    --tree-frontiers 4 8 16 64 --ops-batches 1 32 2>&1 | tee "$OUT/bench_head.txt" | tail -50
  echo "== bench_tree.py"
  timeout 120 python3 benchmarks/bench_tree.py --quick 2>&1 | tee "$OUT/bench_tree.txt" | tail -30
  ;;
all)
  echo "== kernel tests on the GPU (real CUDA tensors, compiled Triton)"
  timeout 220 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs --durations=15 -k "((cuda or triton) and not emulated_cuda) or libstdcxx or extension_raises" \
    tests/test_op_registration.py tests/test_cuda_graph.py tests/test_kernel_backends.py tests/test_domino_head_expand.py \
    tests/test_build_tree_kernel_efficient.py tests/test_verify_tree_greedy.py tests/test_verify_tree_sampling.py \
    tests/test_tree_speculative_sampling_target_only.py tests/test_small_batch_linear.py tests/test_bad_input.py \
    > "$OUT/tests_gpu.log" 2>&1
  tail -25 "$OUT/tests_gpu.log"
  if [ "$AVX512" = yes ]; then
    # the host's AVX-512/AMX CPU paths (packed small-batch linear: amx, avx512_bf16, avx2;
    # the ISA builds), which no 2-core machine of this project can run
    echo "== CPU packed-linear and ISA tests on the host (AVX-512/AMX)"
    timeout 120 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs -k "not cuda and not triton" \
      tests/test_small_batch_linear_packed.py tests/test_cpu_isa.py tests/test_small_batch_linear.py \
      > "$OUT/tests_cpu_avx512.log" 2>&1
    tail -8 "$OUT/tests_cpu_avx512.log"
  fi
  echo "== bench_head.py: GPU rollout table (bf16, b = 1 and 32) and GPU tree-step table"
  timeout 180 python3 benchmarks/bench_head.py --shapes small paper --batches 1 32 --dtypes bf16 --repeats 3 \
    --no-rollout --tree-frontiers 4 16 64 --ops-batches > "$OUT/bench_head.txt" 2>&1
  grep -v "^CPU\|cpu" "$OUT/bench_head.txt" | head -60
  echo "== bench_tree.py"
  timeout 60 python3 benchmarks/bench_tree.py --quick > "$OUT/bench_tree.txt" 2>&1
  tail -30 "$OUT/bench_tree.txt"
  ;;
expand)
  echo "== expand kernel tests on the GPU"
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs -k "(cuda or triton) and not emulated_cuda" \
    tests/test_domino_head_expand.py tests/test_cuda_graph.py tests/test_tree_draft.py > "$OUT/tests_expand.log" 2>&1
  tail -15 "$OUT/tests_expand.log"
  echo "== bench_head.py: the tree step on the GPU"
  timeout 120 python3 benchmarks/bench_head.py --shapes small paper --batches 1 --dtypes bf16 --no-rollout \
    --tree-frontiers 4 16 64 --ops-batches > "$OUT/bench_head.txt" 2>&1
  sed -n '/tree step on the GPU/,/^$/p' "$OUT/bench_head.txt"
  timeout 60 python3 benchmarks/profile_head_gpu.py > "$OUT/profile.txt" 2>&1
  grep -E "^==|kernel" "$OUT/profile.txt" | cut -c1-70,180-215
  ;;
head)
  echo "== head rollout, expand, tree-draft and CUDA-graph tests on the GPU"
  timeout 170 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs -k "(cuda or triton) and not emulated_cuda and (head or expand or graph or tree_draft or draft)" \
    tests/test_kernel_backends.py tests/test_domino_head_expand.py tests/test_cuda_graph.py tests/test_tree_draft.py \
    > "$OUT/tests_head.log" 2>&1
  tail -15 "$OUT/tests_head.log"
  echo "== bench_head.py: GPU rollout table (bf16, b = 1, 16, 32) and the tree step on the GPU"
  timeout 150 python3 benchmarks/bench_head.py --shapes small paper --batches 1 16 32 --dtypes bf16 --repeats 3 \
    --no-rollout --tree-frontiers 4 16 64 --ops-batches > "$OUT/bench_head.txt" 2>&1
  grep -v "^CPU\|cpu" "$OUT/bench_head.txt" | head -70
  timeout 60 python3 benchmarks/profile_head_gpu.py > "$OUT/profile.txt" 2>&1
  grep -E "^==|kernel" "$OUT/profile.txt" | cut -c1-70,180-215
  ;;
profile)
  timeout 200 python3 benchmarks/profile_head_gpu.py 2>&1 | tee "$OUT/profile.txt" | tail -60
  ;;
*) echo "unknown phase $PHASE (build|test|bench|all|expand|head|profile)"; exit 2 ;;
esac
