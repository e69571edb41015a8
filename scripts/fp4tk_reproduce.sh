#!/usr/bin/env bash
# fp4-trainkit's ViT/MNIST table reproduced with its own arithmetic (the fp4tk_*
# recipes, emulate fp4tk), and the diagnosis of its fp4_all_the_way collapse:
# each of its deviations switched on alone in fp4lab's fp4_all_the_way, and
# its SR switched off alone in the full emulation (configs/recipes/fp4tk_diagnosis).
#
#   scripts/fp4tk_reproduce.sh FP4LAB OUT_DIR [SEEDS] [--set key=value ...]
#     SEEDS comma-separated (default 1,2,3,4,5); JOBS as scripts/seed_sweep.sh
#   OUT_DIR/lr1e-3: fp32 and the four fp4tk recipes (+ fp4lab's fp4_all_the_way) at lr 1e-3,
#                   fp4-trainkit's lr for its MX recipes (examples/run_early_results.sh)
#   OUT_DIR/lr5e-4: fp4_all_the_way's variants at lr 5e-4, the lr of its fp4_all_the_way run
# Each directory gets compare.txt / compare.png against fp32 (scripts/seed_sweep.sh).
set -uo pipefail
if [ $# -lt 2 ]; then sed -n '2,13p' "$0"; exit 2; fi
fp4lab=$1 out=$2
seeds=${3:-1,2,3,4,5}
shift $(($# >= 3 ? 3 : 2))
here=$(cd "$(dirname "$0")" && pwd)
d=$here/../configs/recipes/fp4tk_diagnosis
status=0
"$here/seed_sweep.sh" "$fp4lab" "$here/../configs/vit_mnist.json" \
  fp32,fp4tk_mx_baseline,fp4tk_nvidia_round_to_infinity,fp4tk_tetrajet,fp4tk_fp4_all_the_way,fp4_all_the_way \
  "$seeds" "$out/lr1e-3" --baseline fp32 "$@" || status=1
"$here/seed_sweep.sh" "$fp4lab" "$here/../configs/vit_mnist.json" \
  "fp32,fp4_all_the_way,fp4tk_fp4_all_the_way,$d/atw+fp4tk_sr.json,$d/atw+fp4tk_sr_dy.json,$d/atw+fp4tk_rn.json,$d/atw+no_fwd_bias.json,$d/fp4tk_atw-fp4tk_sr.json" \
  "$seeds" "$out/lr5e-4" --baseline fp32 --set training.lr=5e-4 "$@" || status=1
exit $status
