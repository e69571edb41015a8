#!/usr/bin/env bash
# The main job, a one-seed smoke test: on a fresh Debian 12 machine, install
# what is missing, fetch MNIST, build fp4lab into build/ (the tests' build
# directory), and train the fp32, mx_baseline and nvfp4 recipes on a short
# ViT/MNIST run (configs/vit_mnist_quick.json: fp4-trainkit's one-block ViT, 1
# epoch, seed 1). It prints the comparison table and writes runs/main/ (one run
# directory per recipe, compare.png: loss and accuracy curves, compare.json).
# One seed of one epoch shows the pipeline works; it does not rank recipes.
#
#   scripts/run_main.sh [--recipes a,b,c] [--config configs/vit_mnist.json] [--seeds 1,2,3] [--dry-run]
#
# --dry-run prints the commands (setup, data, configure or not, build, sweep) without running them.
set -euo pipefail
cd "$(dirname "$0")/.."
recipes=fp32,mx_baseline,nvfp4
config=configs/vit_mnist_quick.json
seeds=""
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --recipes) recipes="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "run_main.sh: unknown option '$1' (valid: --recipes LIST, --config FILE, --seeds LIST, --dry-run)" >&2
       exit 2 ;;
  esac
done
x() {  # run a command, or with --dry-run print it (shell-quoted, after '+ ')
  if [ "$dry" = 1 ]; then printf '+'; printf ' %q' "$@"; echo; else "$@"; fi
}
[ -f "$config" ] || { echo "run_main.sh: --config $config: no such file" >&2; exit 2; }
start=$(date +%s)
x scripts/setup.sh --with-data
# The config's name, data, length and seed (for the data script, the plot's title and the caveat).
read -r name dtype length cseed < <(python3 - "$config" <<'PY' || true
import json, sys
c = json.load(open(sys.argv[1]))
t = c.get("training", {})
if t.get("steps"):
    length = "%d-steps" % t["steps"]
else:
    e = t.get("epochs", 0)
    length = "%g-epoch%s" % (e, "" if e == 1 else "s")
print(c.get("name", "config"), c.get("data", {}).get("type", "?"), length, c.get("seed", 0))
PY
)
[ -n "${name:-}" ] || { echo "run_main.sh: could not read $config (JSON with name, data, training)" >&2; exit 2; }
case "$dtype" in
  mnist) x scripts/get_mnist.sh ;;
  char) x scripts/get_shakespeare.sh ;;
esac
# One build directory for the main job and the tests (scripts/test.sh, CI): an
# existing build/ is built as configured (its cache kept: CUDA on or off, build
# type, native), never reconfigured with other options; a missing one is
# configured with the defaults, as scripts/test.sh does with no arguments
# (FP4LAB_CUDA=AUTO: the CUDA backend where nvcc and a GPU are present; the
# main job trains on the CPU either way).
build=build
if [ -f "$build/CMakeCache.txt" ]; then
  echo "run_main: reusing $build/ as configured"
else
  x cmake -S . -B "$build" -G Ninja
fi
x cmake --build "$build" --target fp4lab --parallel "$(nproc)"
[ "$dry" = 1 ] || echo "run_main: built in $(( $(date +%s) - start )) s; training $recipes on $config"
seed_args=()
nseeds=1
seed_text="seed $cseed"
if [ -n "$seeds" ]; then
  seed_args=(--seeds "$seeds")
  nseeds=$(tr ',' '\n' <<<"$seeds" | grep -c .)
  seed_text="seeds $seeds ($nseeds seeds)"
fi
title="$name: ${length//-/ }, $seed_text"
if [ "$nseeds" = 1 ]; then
  caveat="run_main: a ONE-SEED SMOKE TEST ($title). Differences of a few points between recipes
  (1-2, at times more) are seed noise here, not results; for claims see docs/results/ (multi-seed tables with 95% intervals)
  and \`fp4lab sweep CONFIG --recipes ... --seeds 1,2,3,4,5\` (or scripts/run_main.sh --seeds 1,2,3)."
  title="$title: one-seed smoke test, not a ranking"
else
  caveat="run_main: $title; the per-recipe means, 95% intervals and paired differences follow the table."
fi
echo "$caveat"
x "$build/apps/fp4lab" sweep "$config" --recipes "$recipes" "${seed_args[@]}" --force --set output.dir=runs/main \
  --plot runs/main/compare.png --title "$title"
echo "$caveat"
[ "$dry" = 1 ] || echo "run_main: done in $(( $(date +%s) - start )) s (runs/main/: one run directory per recipe and seed," \
  "compare.png: loss and accuracy curves, compare.json: the table's statistics)"
