#!/usr/bin/env bash
# One device call: a part of the `gpu` preset (its runs concurrently), then the training
# benchmarks. Results land in $OUT (the device tool copies them back):
#   grid.tar      the part's result JSONs (refreshed every 20 s, so an interrupted call keeps
#                 what finished)        bench_h200.json   benchmarks/bench_training.py output
#   ecd_commits.json  benchmarks/bench_ecd_commits.py output      grid.log, bench.log, nvidia-smi.csv
# Usage on the device (repo root): PART=seed0 WALL=200 WORKERS=16 bash benchmarks/gpu_session.sh
# BENCH=0 skips the benchmarks (e.g. a first call with one part, a second with the next + BENCH=1).
set -u
PART=${PART:-seed0}; WALL=${WALL:-200}; WORKERS=${WORKERS:-16}; GRID_TIMEOUT=${GRID_TIMEOUT:-300}
BENCH=${BENCH:-1}; BENCH_TIMEOUT=${BENCH_TIMEOUT:-150}; OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/grid
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then  # pytorch-optimizer (SOAP) is not in the device image
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.csv"
snapshot() { tar -C /tmp -cf "$OUT/grid.tar.tmp" grid && mv "$OUT/grid.tar.tmp" "$OUT/grid.tar"; }
( while sleep 20; do snapshot; done ) &
saver=$!
start=$(date +%s)
timeout "$GRID_TIMEOUT" python3 -m gaugebook.experiment --preset gpu --part "$PART" \
  --out /tmp/grid --workers "$WORKERS" --set max_wall_s="$WALL" > "$OUT/grid.log" 2>&1
echo "grid exit $? after $(( $(date +%s) - start )) s"
kill $saver; snapshot
ls /tmp/grid
[ "$BENCH" = 1 ] || exit 0
start=$(date +%s)
timeout "$BENCH_TIMEOUT" python3 benchmarks/bench_training.py --device cuda \
  --out "$OUT/bench_h200.json" > "$OUT/bench.log" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s"
# the ECD step before (commit of the recorded H200 run) and after the fast-path rewrite; the
# device has no git: carry .whl/optim_303d9f3.py (git show 303d9f3:gaugebook/optim.py)
timeout 60 python3 benchmarks/bench_ecd_commits.py --old 303d9f3 --old-file .whl/optim_303d9f3.py \
  --reps 50 --out "$OUT/ecd_commits.json" >> "$OUT/bench.log" 2>&1
tail -c 1500 "$OUT/bench.log"
