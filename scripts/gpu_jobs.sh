#!/usr/bin/env bash
# Runs a list of `fp4lab train` jobs over the GPUs of one machine, PER_GPU jobs
# at a time on each (CUDA_VISIBLE_DEVICES pins a job to its GPU), resumable:
# a job whose run directory holds a completed summary.json is skipped, one
# with a checkpoint is resumed (bit-exact), any other starts with --force.
# For issue 49's studies (learning-rate sweeps, seeds, the width ladder), where
# each run is one GPU's work and the machine has 1..N of them.
#
#   scripts/gpu_jobs.sh FP4LAB JOBS_FILE OUT_DIR
#     JOBS_FILE  one job a line: NAME CONFIG RECIPE SEED [key=value ...] (the keys are --set overrides;
#                '#' starts a comment); NAME is the run's directory under OUT_DIR (letters, digits, . _ -)
#   environment: GPUS (default: nvidia-smi's count, else 1), PER_GPU (default 1), TIME_LIMIT_S (default none:
#                each run stops after it, checkpointed, and a second call resumes it)
# Exit 0 when every job's summary.json says completed; 1 otherwise (the unfinished jobs are listed).
set -uo pipefail
if [ $# -ne 3 ]; then sed -n '2,14p' "$0"; exit 2; fi
fp4lab=$1 jobs=$2 out=$3
[ -x "$fp4lab" ] || { echo "gpu_jobs.sh: $fp4lab is not an executable" >&2; exit 2; }
[ -f "$jobs" ] || { echo "gpu_jobs.sh: $jobs is not a file" >&2; exit 2; }
gpus=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
[ "${gpus:-0}" -ge 1 ] 2>/dev/null || gpus=1
per=${PER_GPU:-1}
mkdir -p "$out/logs"

completed() { grep -q '"status": *"completed"' "$out/$1/summary.json" 2>/dev/null; }

# Validate every line first: a bad line is named before anything runs.
lineno=0
declare -a names=()
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  line=${line%%#*}
  read -ra f <<<"$line"
  [ ${#f[@]} -eq 0 ] && continue
  if [ ${#f[@]} -lt 4 ]; then echo "gpu_jobs.sh: $jobs:$lineno: expected NAME CONFIG RECIPE SEED [key=value ...], got '$line'" >&2; exit 2; fi
  [[ ${f[0]} =~ ^[A-Za-z0-9._-]+$ ]] || { echo "gpu_jobs.sh: $jobs:$lineno: name '${f[0]}': letters, digits, . _ - only" >&2; exit 2; }
  [[ ${f[3]} =~ ^[0-9]+$ ]] || { echo "gpu_jobs.sh: $jobs:$lineno: seed '${f[3]}' is not a non-negative integer" >&2; exit 2; }
  for kv in "${f[@]:4}"; do
    [[ $kv == *=* ]] || { echo "gpu_jobs.sh: $jobs:$lineno: '$kv' is not key=value" >&2; exit 2; }
  done
  for n in "${names[@]}"; do [ "$n" = "${f[0]}" ] && { echo "gpu_jobs.sh: $jobs:$lineno: name '${f[0]}' twice" >&2; exit 2; }; done
  names+=("${f[0]}")
done <"$jobs"

declare -A slot_pid=()  # "gpu.k" -> pid
run_job() {  # slot gpu name config recipe seed sets...
  local slot=$1 gpu=$2 name=$3 config=$4 recipe=$5 seed=$6
  shift 6
  local sets=() d="$out/$name"
  for kv in "$@"; do sets+=(--set "$kv"); done
  local cmd=("$fp4lab" train "$config" --recipe "$recipe" --quiet --set seed="$seed" --set output.dir="$out"
             --set output.name="$name" "${sets[@]}")
  if [ -f "$d/checkpoint.bin" ]; then cmd+=(--resume); else cmd+=(--force); fi
  [ -n "${TIME_LIMIT_S:-}" ] && cmd=(timeout "$TIME_LIMIT_S" "${cmd[@]}")
  CUDA_VISIBLE_DEVICES=$gpu "${cmd[@]}" >>"$out/logs/$name.log" 2>&1 &
  slot_pid[$slot]=$!
}
free_slot() {  # prints a free slot "gpu.k", waiting for one
  while :; do
    for ((g = 0; g < gpus; g++)); do
      for ((k = 0; k < per; k++)); do
        local s="$g.$k" p=${slot_pid["$g.$k"]:-}
        if [ -z "$p" ] || ! kill -0 "$p" 2>/dev/null; then echo "$s"; return; fi
      done
    done
    wait -n 2>/dev/null || sleep 1
  done
}

while IFS= read -r line || [ -n "$line" ]; do
  line=${line%%#*}
  read -ra f <<<"$line"
  [ ${#f[@]} -eq 0 ] && continue
  if completed "${f[0]}"; then echo "gpu_jobs: ${f[0]} already completed"; continue; fi
  s=$(free_slot)
  run_job "$s" "${s%%.*}" "${f[@]}"
  echo "gpu_jobs: ${f[0]} on GPU ${s%%.*}"
done <"$jobs"
wait

status=0
for n in "${names[@]}"; do
  completed "$n" || { echo "gpu_jobs: not completed: $n ($(tail -1 "$out/logs/$n.log" 2>/dev/null))"; status=1; }
done
exit $status
