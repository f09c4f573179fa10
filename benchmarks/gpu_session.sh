#!/usr/bin/env bash
# One device call (at most BUDGET seconds, default 540) for the decisive experiment of Part II
# (preset `paper`, one part per seed and arm, arm by arm: seed0-pt, seed1-pt, seed2-pt,
# seed0-global, ..., seed2-adamw), most valuable first, so that a call cut short keeps what
# matters:
#   1. the parts of the preset `paper` that have no complete results in results/gpu/paper, one
#      after another for WALL seconds (BUDGET - 100: 440): first the ones the recorded runs'
#      times say fit (gaugebook.experiment.plan_parts: one part when none is recorded), then,
#      planned again from this call's own runs, each further part that fits in the time left.
#      Batched, one cohort per arm, each cohort's whole step captured as a CUDA graph
#      (CUDA_GRAPHS=0: not); runs still going when the time is up are evaluated there and marked
#      truncated. Ways to train, fastest first: graphs (compiled, the step replayed as a CUDA
#      graph), graphs-eager (the same, uncompiled), cpp (compiled with inductor's C++ wrapper:
#      kernels launched from C++), compiled, eager. A part that fails within three minutes
#      (compilation included) is retried the next way, which the rest of the call keeps; a part
#      that fails later, or in the last way, ends the training
#                                                                       paper.tar, paper.log
#   (LR=1) the AdamW learning-rate sweep of preset `paper-lr`, 2,000 steps per run, eight runs
#      concurrently                                                    paper_lr.tar, paper_lr.log
#   2. benchmarks/bench_grid.py on the seed-0 parts (batched vs separate processes, ECD vs fused
#      AdamW, bqv vs symmetric), only while benchmarks/results/grid_$GPU.json does not exist ($GPU:
#      the chip, h100 or h200, from nvidia-smi) and at least 180 s are left (its limit is 170 s;
#      BENCH=0 skips it; a benchmark cut short comes back as grid_$GPU_partial.json). A call
#      after a full part has no such time: then PART= TESTS=0 bash benchmarks/gpu_session.sh
#      runs the benchmark alone                                      grid_$GPU.json, grid.log
#   Before 1, while the benchmark is not recorded: the ECD and fused AdamW optimizer steps alone
#      (bench_grid.py --steps-only, at most 30 s)                      grid_$GPU_steps.json
#   Before 1, on CUDA: ECD's fused Triton kernels (which the compiled ways take) against its
#      PyTorch operators (tests/test_ecd_kernels.py and tests/test_gpu.py -k fused_ecd, at
#      most 90 s); if they fail, the compiled ways are dropped          gpu_tests.txt
#   3. the GPU-only tests (tests/test_gpu.py and the CUDA tests of the library), in the time
#      left, skipped with TESTS=0                               gpu_tests.txt (appended)
# Throughout, the device's utilisation every 5 s                       gpu_utilisation.csv
# Results land in $OUT (the device tool copies them back); paper.tar is refreshed every 20 s, so
# an interrupted call keeps what finished. Afterwards, here:
#   python benchmarks/collect_gpu_call.py <files_at> --date <the call's date>
# Usage on the device (repo root; it has no git, so name the commit the results come from), with
# the device call's timeout about 30 s above BUDGET:
#   GAUGEBOOK_COMMIT=<git rev-parse HEAD, here> bash benchmarks/gpu_session.sh
#   PART=seed1-pt WALL=400 TESTS=0 BENCH=0 DATA_WORKERS=4 bash benchmarks/gpu_session.sh
# (a PART given is trained alone, with no further parts planned)
# Rehearsal on a CPU (tiny preset, minutes; results of an earlier rehearsal under
# /tmp/grid/paper-smoke are resumed if their settings match and refused if not, so remove them):
#   rm -rf /tmp/grid/paper-smoke && DEVICE=cpu PRESET=paper-smoke bash benchmarks/gpu_session.sh
set -u
BUDGET=${BUDGET:-540}; T0=$(date +%s); left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
WALL=${WALL:-$(( BUDGET - 100 ))}; BENCH_PART=${BENCH_PART:-seed0-pt,seed0-global,seed0-adamw}
PRESET=${PRESET:-paper}; DEVICE=${DEVICE:-cuda}; TESTS=${TESTS:-1}; LR=${LR:-0}
GPU=cpu  # the chip in the benchmark files' names: "NVIDIA H100 80GB HBM3" gives h100
if [ "$DEVICE" = cuda ]; then
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 \
    | grep -o '[A-Za-z][0-9]\{2,4\}' | head -n 1 | tr 'A-Z' 'a-z'); GPU=${GPU:-gpu}
fi
# The grid benchmark runs once per chip, in the time the parts leave (a part's runs come first).
if [ -f "benchmarks/results/grid_$GPU.json" ]; then BENCH=${BENCH:-0}; else BENCH=${BENCH:-1}; fi
DATA_WORKERS=${DATA_WORKERS:-4}; OUT=${OUT:-/tmp/out}
BENCH_STEPS=${BENCH_STEPS:-60}; CUDA_GRAPHS=${CUDA_GRAPHS:-1}
[ "$DEVICE" = cuda ] || CUDA_GRAPHS=0  # CUDA graphs exist on CUDA only
WAYS=${WAYS:-graphs graphs-eager cpp compiled eager}
[ "$CUDA_GRAPHS" = 1 ] || WAYS=$(printf '%s\n' $WAYS | grep -v '^graphs' | xargs)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then  # packages the device image lacks (see benchmarks/README)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
mkdir -p "$OUT" "/tmp/grid/$PRESET"
plan() {  # the parts without complete results (recorded here or in this call) that fit in $1 s
  python3 -c "from gaugebook.experiment import plan_parts
print(','.join(plan_parts('$PRESET', ['results/gpu/$PRESET', '/tmp/grid/$PRESET'], $1,
                          at_least_one=$2)))"
}
if [ -z "${PART+set}" ]; then
  AUTO=1; PART=$(plan "$WALL" True) || { echo "cannot plan the parts of $PRESET"; exit 1; }
  [ -n "$PART" ] || echo "every part of $PRESET is complete: nothing to train"
else
  AUTO=0
fi
echo "preset $PRESET part $PART device $DEVICE ($GPU) wall $WALL s"
if [ "$DEVICE" = cuda ]; then
  # the device, at the head of the log (at most 8 files come back)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/paper.log"
  # the device's busy share and memory every 5 s: host-bound steps show as low utilisation
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 \
    > "$OUT/gpu_utilisation.csv" 2>/dev/null &
fi
# the result files only: checkpoints (hundreds of MB) and lock files stay on the device
snapshot() { tar -C /tmp/grid --exclude=checkpoints --exclude='*.lock' --exclude='*.tmp*' \
  -cf "$OUT/paper.tar.tmp" "$PRESET" && mv "$OUT/paper.tar.tmp" "$OUT/paper.tar"; }
( while sleep 20; do snapshot; done ) &
saver=$!
paper() {  # $1: seconds, in the first way of $WAYS; runs stopped by max_wall_s are evaluated
  local wall=$1 way=${WAYS%% *} options=() env=()
  case $way in
    graphs) options=(--cuda-graphs) ;;
    graphs-eager) options=(--cuda-graphs --set compile=false) ;;
    cpp) env=(TORCHINDUCTOR_CPP_WRAPPER=1) ;;
    eager) options=(--set compile=false) ;;
  esac
  # an earlier way's results and checkpoints are taken up: compile and max_wall_s say how a
  # run is executed, not what it computes
  echo "=== part $PART, $wall s, $way" | tee -a "$OUT/paper.log"
  env "${env[@]}" TORCH_LOGS=perf_hints timeout $(( wall + 60 )) python3 -m gaugebook.experiment \
    --preset "$PRESET" --part "$PART" \
    --batched --workers 3 --data-workers "$DATA_WORKERS" --device "$DEVICE" \
    --out "/tmp/grid/$PRESET" --set max_wall_s="$wall" "${options[@]}" >> "$OUT/paper.log" 2>&1
}
failed() { ls "/tmp/grid/$PRESET"/*.error.json >/dev/null 2>&1; }
if [ "$BENCH" = 1 ]; then  # the optimizer steps first (seconds): known even if the grid waits
  timeout 30 python3 benchmarks/bench_grid.py --device "$DEVICE" --preset "$PRESET" \
    --part "$BENCH_PART" --steps-only --out "$OUT/grid_${GPU}_steps.json" > "$OUT/grid.log" 2>&1
  echo "optimizer steps exit $? ($(left) s left)"
fi
if [ "$DEVICE" = cuda ]; then  # ECD's fused kernels, first compiled here: checked before use
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_ecd_kernels.py tests/test_gpu.py \
    -k "(fused_ecd or ecd_kernels) and not hopper" \
    > "$OUT/gpu_tests.txt" 2>&1; rc=$?
  echo "fused ECD check exit $rc ($(left) s left): $(tail -n 1 "$OUT/gpu_tests.txt")"
  if [ $rc != 0 ]; then  # the compiled ways would take them: train uncompiled instead
    WAYS=$(printf '%s\n' $WAYS | grep -v -x -e graphs -e cpp -e compiled | xargs)
    echo "fused ECD kernels failed their check: ways $WAYS"
  fi
fi
END=$(( $(date +%s) + WALL )); tried=
while [ -n "$PART" ] && [ "$PART" != "$tried" ]; do
  tried=$PART; rc=1
  while [ $(( END - $(date +%s) )) -gt 30 ]; do
    start=$(date +%s); paper $(( END - start )); rc=$?
    echo "paper $PART exit $rc after $(( $(date +%s) - start )) s"
    { failed || [ $rc != 0 ]; } && [ $(( $(date +%s) - start )) -lt 180 ] \
      && [ "$WAYS" != "${WAYS#* }" ] || break
    echo "failed early: $(cat "/tmp/grid/$PRESET"/*.error.json 2>/dev/null | head -c 600)"
    rm -f "/tmp/grid/$PRESET"/*.error.json; WAYS=${WAYS#* }  # the next way, from now on
  done
  [ "$AUTO" = 1 ] && ! failed && [ $rc = 0 ] && [ $(( END - $(date +%s) )) -gt 60 ] || break
  PART=$(plan $(( END - $(date +%s) )) False)  # from this call's times too: what still fits
done
kill $saver; snapshot
ls "/tmp/grid/$PRESET"
if [ "$LR" = 1 ]; then
  start=$(date +%s)
  timeout 200 python3 -m gaugebook.experiment --preset paper-lr --workers 8 --device "$DEVICE" \
    --out /tmp/grid/paper-lr --set steps=2000 --set eval_every=250 --set max_wall_s=150 \
    > "$OUT/paper_lr.log" 2>&1
  echo "paper-lr exit $? after $(( $(date +%s) - start )) s"
  tar -C /tmp/grid --exclude=checkpoints --exclude='*.lock' -cf "$OUT/paper_lr.tar" paper-lr
fi
if [ "$BENCH" = 1 ] && [ "$(left)" -ge 180 ]; then  # else a later call (a cut JSON is no result)
  start=$(date +%s)
  timeout 170 python3 benchmarks/bench_grid.py \
    --device "$DEVICE" --preset "$PRESET" --part "$BENCH_PART" --steps "$BENCH_STEPS" \
    --data-workers 2 $([ "${WAYS%% *}" = graphs ] && echo --cuda-graphs) \
    --out "$OUT/grid_$GPU.json" >> "$OUT/grid.log" 2>&1
  echo "bench exit $? after $(( $(date +%s) - start )) s"
  tail -c 2500 "$OUT/grid.log"
  python3 -c "import json, sys; sys.exit('bias' not in json.load(open(sys.argv[1])))" \
    "$OUT/grid_$GPU.json" 2>/dev/null || {  # cut short: kept, but not as the result
    [ -f "$OUT/grid_$GPU.json" ] && mv "$OUT/grid_$GPU.json" "$OUT/grid_${GPU}_partial.json"; }
fi
if [ "$BENCH" = 1 ] && [ ! -f "$OUT/grid_$GPU.json" ] && [ ! -f "$OUT/grid_${GPU}_partial.json" ]
then
  echo "grid benchmark skipped: $(left) s left, it needs 180 (PART= TESTS=0 runs it alone)"
fi
if [ "$TESTS" = 1 ] && [ "$(left)" -gt 30 ]; then
  start=$(date +%s)
  timeout $(( $(left) - 10 )) python3 -m pytest -q -rs -p no:cacheprovider -n 4 tests/test_gpu.py \
    tests/test_gauge.py tests/test_alignment.py tests/test_moe.py >> "$OUT/gpu_tests.txt" 2>&1
  echo "tests exit $? after $(( $(date +%s) - start )) s: $(tail -n 1 "$OUT/gpu_tests.txt")"
fi
jobs -p | xargs -r kill 2>/dev/null  # the utilisation log
echo "call used $(( $(date +%s) - T0 )) of $BUDGET s"
