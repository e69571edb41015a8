#!/usr/bin/env bash
# Train one config under several recipes at once, one `fp4lab train` process per
# recipe (each with its own OpenMP threads), then print `fp4lab compare`.
# For a many-core machine; `fp4lab sweep` runs the same recipes one after another.
# A run directory that already holds a checkpoint is resumed (bit-exact), so a
# sweep cut off by a time limit continues where it stopped when run again.
#
#   scripts/parallel_sweep.sh FP4LAB CONFIG RECIPES THREADS OUT_DIR [TIME_LIMIT_S] [--set k=v ...]
#     FP4LAB      path of the fp4lab binary
#     RECIPES     comma-separated recipe names
#     THREADS     OpenMP threads per run
#     OUT_DIR     runs go to OUT_DIR/<run name>
#     TIME_LIMIT_S  stop the runs after this many seconds (default: none); exit 3 if any was stopped
set -uo pipefail
if [ $# -lt 5 ]; then sed -n '2,13p' "$0"; exit 2; fi
fp4lab=$1 config=$2 recipes=$3 threads=$4 out=$5
limit=${6:-0}
shift 5
[ $# -gt 0 ] && shift
sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --set) sets+=(--set "$2"); shift 2 ;;
    *) echo "parallel_sweep.sh: unknown argument '$1' (valid: --set key=value)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/logs"
pids=()
launched=()
IFS=, read -ra names <<<"$recipes"
for r in "${names[@]}"; do
  # Run directory: <out>/<config name>-<recipe>-s<seed> (run_directory() in train/config.cpp).
  d=$(ls -d "$out"/*-"$r"-s* 2>/dev/null | head -1)
  if [ -n "$d" ] && [ -f "$d/summary.json" ]; then echo "parallel_sweep: $r already finished ($d)"; continue; fi
  cmd=("$fp4lab" train "$config" --recipe "$r" --quiet --set output.dir="$out" --set threads="$threads" "${sets[@]}")
  if [ -n "$d" ] && [ -f "$d/checkpoint.bin" ]; then cmd+=(--resume); else cmd+=(--force); fi
  if [ "$limit" -gt 0 ]; then cmd=(timeout "$limit" "${cmd[@]}"); fi
  "${cmd[@]}" >"$out/logs/$r.log" 2>&1 &
  pids+=($!)
  launched+=("$r")
done
status=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  if [ $rc -eq 124 ]; then status=3; echo "parallel_sweep: ${launched[$i]} stopped by the time limit (resume by running again)";
  elif [ $rc -ne 0 ]; then echo "parallel_sweep: ${launched[$i]} failed (rc $rc):"; tail -3 "$out/logs/${launched[$i]}.log"; fi
done
if [ $status -eq 0 ]; then
  runs=()
  for f in "$out"/*/summary.json; do runs+=("$(dirname "$f")"); done
  "$fp4lab" compare "${runs[@]}" --plot "$out/compare.png"
fi
exit $status
