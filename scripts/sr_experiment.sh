#!/usr/bin/env bash
# The stochastic-rounding contract experiment of docs/results (issue 27): the
# GPT of configs/gpt_shakespeare_char.json trained for STEPS steps (cosine to
# STEPS) under nvfp4, tetrajet and fp4_all_the_way, each with fp4lab's
# per-element SR (the canned recipe) and with PTX cvt.rs's 8-bit SR
# (configs/recipes/<recipe>_ptx_x4.json), seeds 1..SEEDS, every run a process
# of its own on one GPU at once; then `fp4lab compare` per recipe pair (the
# canned recipe as the baseline: paired differences by seed). The nvfp4 seed-1
# run captures its linear operands at step STEPS/2 (output.capture_step); then
# `fp4lab sr-bias --tensor` measures both contracts on its output gradients
# with nvfp4's dgrad ([1,16]) and wgrad ([16,1] + RHT) gradient quantizers.
#
#   scripts/sr_experiment.sh FP4LAB OUT_DIR [STEPS=2000] [SEEDS=3] [BACKEND=cuda]
#   (environment: EVAL_ITERS, batches per split per evaluation, default the config's;
#    JOBS, runs at once, default 12: 18 of these GPT runs at once ran out of an
#    H100's 80 GB at start)
set -uo pipefail
if [ $# -lt 2 ]; then sed -n '2,10p' "$0"; exit 2; fi
fp4lab=$1 out=$2 steps=${3:-2000} seeds=${4:-3} backend=${5:-cuda}
mkdir -p "$out/logs"
for recipe in nvfp4 tetrajet fp4_all_the_way; do
  for variant in "$recipe" "configs/recipes/${recipe}_ptx_x4.json"; do
    for seed in $(seq 1 "$seeds"); do
      label=$(basename "$variant" .json)
      capture=-1
      [ "$variant" = nvfp4 ] && [ "$seed" = 1 ] && capture=$((steps / 2))
      while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-12}" ]; do wait -n; done
      "$fp4lab" train configs/gpt_shakespeare_char.json --recipe "$variant" --set backend="$backend" \
        --set seed="$seed" --set training.steps="$steps" --set training.decay_steps="$steps" ${EVAL_ITERS:+--set training.eval_iters=$EVAL_ITERS} \
        --set output.dir="$out" --set output.capture_step=$capture --quiet >"$out/logs/$label-s$seed.log" 2>&1 &
    done
  done
done
wait
status=0
for log in "$out"/logs/*.log; do  # a run that did not complete (its log says why)
  grep -q ": completed," "$log" || { echo "not completed: $log" >&2; status=1; }
done
for recipe in nvfp4 tetrajet fp4_all_the_way; do
  "$fp4lab" compare "$out"/gpt_shakespeare_char-"$recipe"-s* "$out"/gpt_shakespeare_char-"$recipe"_ptx_x4-s* \
    --baseline "$recipe" --plot "$out/compare_$recipe.png" || status=1
done
cap="$out/gpt_shakespeare_char-nvfp4-s1/capture/step_$((steps / 2))"
dgrad='{"element":"e2m1","scale":"ue4m3","block":[1,16],"scale_rule":"nv","global_scale":"tensor_amax","round":"rs"}'
wgrad='{"element":"e2m1","scale":"ue4m3","block":[16,1],"scale_rule":"nv","global_scale":"tensor_amax","round":"rs","rht":true}'
for t in h.0.attn.c_attn h.0.mlp.c_fc h.3.mlp.c_proj h.5.mlp.c_fc h.5.attn.c_proj lm_head; do
  [ -f "$cap/$t.dy.npy" ] || { echo "no $cap/$t.dy.npy" >>"$out/sr_tensor.txt"; continue; }
  for q in "$dgrad" "$wgrad"; do
    "$fp4lab" sr-bias --tensor "$cap/$t.dy.npy" --quantizer "$q" --rows 4096 >>"$out/sr_tensor.txt" 2>&1 || status=1
  done
done
exit $status
