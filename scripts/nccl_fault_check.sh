#!/usr/bin/env bash
# On a 2-GPU machine (device kind nvidia-h100-x2): the NCCL communicator's fault handling of issue 42,
# which the CPU-only CI cannot run. Two ranks of `fp4lab train` (backend cuda, file rendezvous):
#   1. different configs: every rank exits with one line naming the mismatch, within seconds;
#   2. rank 1 stopped (SIGSTOP) mid-run: rank 0 exits 1 after distributed.timeout_s (10 s) with the
#      "no answer" line, instead of hanging.
# Usage, from the repository root: OUT=DIR bash scripts/nccl_fault_check.sh   (logs under $OUT)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
repo=$(pwd)
cmake -S . -B /tmp/b -G Ninja -DFP4LAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/cmake.log" 2>&1 || exit 1
grep -i "nccl" "$OUT/cmake.log"
ninja -C /tmp/b -j16 fp4lab >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -20; exit 1; }
F=/tmp/b/apps/fp4lab
common=(train "$repo/configs/gpt_baby.json" --quiet --set backend=cuda --set "data.path=$repo/docs/DESIGN.md"
        --set distributed.timeout_s=10 --set output.dir=/tmp/runs --world 2)
launch() {  # launch CASE SETS_RANK0 SETS_RANK1
  rm -rf /tmp/rdv_$1 /tmp/runs
  "$F" "${common[@]}" --rendezvous "file:/tmp/rdv_$1" --rank 0 $2 >"$OUT/$1_r0.log" 2>&1 &
  p0=$!
  "$F" "${common[@]}" --rendezvous "file:/tmp/rdv_$1" --rank 1 $3 >"$OUT/$1_r1.log" 2>&1 &
  p1=$!
}
t0=$(date +%s)
launch mismatch "--set training.steps=50" "--set training.steps=60"
wait $p0; rc0=$?; wait $p1; rc1=$?
echo "mismatch: rank0 rc=$rc0 rank1 rc=$rc1 after $(($(date +%s) - t0)) s"; cat "$OUT/mismatch_r0.log" "$OUT/mismatch_r1.log"
launch stopped "--set training.steps=100000" "--set training.steps=100000"
for i in $(seq 1 60); do grep -q '"step"' /tmp/runs/*/metrics.jsonl 2>/dev/null && break; sleep 1; done
kill -STOP $p1; t1=$(date +%s)
for i in $(seq 1 60); do kill -0 $p0 2>/dev/null || break; sleep 1; done
if kill -0 $p0 2>/dev/null; then echo "stopped: rank 0 still running 60 s after rank 1 stopped (HANG)"; kill -9 $p0; fi
wait $p0; rc0=$?
echo "stopped: rank0 rc=$rc0 after $(($(date +%s) - t1)) s"; tail -2 "$OUT/stopped_r0.log"
kill -9 $p1 2>/dev/null
