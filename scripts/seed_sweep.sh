#!/usr/bin/env bash
# A recipes x seeds sweep of one config with every run a process of its own,
# at most JOBS at once (one GPU shares small runs well; `fp4lab sweep` runs
# them one after another), then `fp4lab compare` of all of them: per recipe
# n, mean, std, 95% interval, paired differences against the baseline, and
# the plot with seed bands.
#
#   scripts/seed_sweep.sh FP4LAB CONFIG RECIPES SEEDS OUT_DIR [--baseline R] [--set key=value ...]
#     RECIPES, SEEDS  comma-separated (recipe names or recipe JSON files; seeds as integers)
#   environment: JOBS (default 12)
# Exit 0 when every run completed and compare succeeded.
set -uo pipefail
if [ $# -lt 5 ]; then sed -n '2,11p' "$0"; exit 2; fi
fp4lab=$1 config=$2 recipes=$3 seeds=$4 out=$5
shift 5
baseline=() sets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --baseline) baseline=(--baseline "$2"); shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    *) echo "seed_sweep.sh: unknown argument '$1' (valid: --baseline R, --set key=value)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/logs"
IFS=, read -ra rs <<<"$recipes"
IFS=, read -ra ss <<<"$seeds"
for r in "${rs[@]}"; do
  for s in "${ss[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-12}" ]; do wait -n; done
    "$fp4lab" train "$config" --recipe "$r" --set seed="$s" --set output.dir="$out" "${sets[@]}" --quiet \
      >"$out/logs/$(basename "$r" .json)-s$s.log" 2>&1 &
  done
done
wait
status=0
for log in "$out"/logs/*.log; do
  grep -q ": completed," "$log" || { echo "not completed: $log: $(tail -1 "$log")" >&2; status=1; }
done
dirs=()
for d in "$out"/*/; do [ -f "$d/summary.json" ] && dirs+=("$d"); done
"$fp4lab" compare "${dirs[@]}" "${baseline[@]}" --plot "$out/compare.png" >"$out/compare.txt" 2>&1 || status=1
cat "$out/compare.txt"
exit $status
