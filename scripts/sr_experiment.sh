#!/usr/bin/env bash
# The stochastic-rounding contract experiment of docs/results (issue 27): the
# GPT of configs/gpt_shakespeare_char.json trained for STEPS steps (cosine to
# STEPS) under nvfp4, tetrajet and fp4_all_the_way, each with fp4lab's
# per-element SR (the canned recipe) and with PTX cvt.rs's 8-bit SR
# (configs/recipes/<recipe>_ptx_x4.json), seeds 1..SEEDS, every run a process
# of its own on one GPU at once; then `fp4lab compare` per recipe pair (the
# canned recipe as the baseline: paired differences by seed).
#
#   scripts/sr_experiment.sh FP4LAB OUT_DIR [STEPS=2000] [SEEDS=3] [BACKEND=cuda]
set -uo pipefail
if [ $# -lt 2 ]; then sed -n '2,10p' "$0"; exit 2; fi
fp4lab=$1 out=$2 steps=${3:-2000} seeds=${4:-3} backend=${5:-cuda}
mkdir -p "$out/logs"
pids=()
for recipe in nvfp4 tetrajet fp4_all_the_way; do
  for variant in "$recipe" "configs/recipes/${recipe}_ptx_x4.json"; do
    for seed in $(seq 1 "$seeds"); do
      label=$(basename "$variant" .json)
      "$fp4lab" train configs/gpt_shakespeare_char.json --recipe "$variant" --set backend="$backend" \
        --set seed="$seed" --set training.steps="$steps" --set training.decay_steps="$steps" \
        --set output.dir="$out" --quiet >"$out/logs/$label-s$seed.log" 2>&1 &
      pids+=($!)
    done
  done
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for recipe in nvfp4 tetrajet fp4_all_the_way; do
  "$fp4lab" compare "$out"/gpt_shakespeare_char-"$recipe"-s* "$out"/gpt_shakespeare_char-"$recipe"_ptx_x4-s* \
    --baseline "$recipe" --plot "$out/compare_$recipe.png" || status=1
done
exit $status
