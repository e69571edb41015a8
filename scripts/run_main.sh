#!/usr/bin/env bash
# The main job: on a fresh Debian 12 machine, install what is missing, fetch
# MNIST, build fp4lab (Release, CPU), and compare the fp32, mx_baseline and
# nvfp4 recipes on a short ViT/MNIST training (configs/vit_mnist_quick.json:
# fp4-trainkit's one-block ViT, 1 epoch), ending with the comparison table and
# a loss-curve plot (runs/main/compare.png). About 5 minutes on 2 cores.
#
#   scripts/run_main.sh [--recipes a,b,c] [--config configs/vit_mnist.json]
set -euo pipefail
cd "$(dirname "$0")/.."
recipes=fp32,mx_baseline,nvfp4
config=configs/vit_mnist_quick.json
while [ $# -gt 0 ]; do
  case "$1" in
    --recipes) recipes="$2"; shift 2 ;;
    --config) config="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "run_main.sh: unknown option '$1' (valid: --recipes LIST, --config FILE)" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
scripts/setup.sh --with-data
scripts/get_mnist.sh
build=build-main
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP4LAB_CUDA=OFF -DFP4LAB_NATIVE=ON >/dev/null
ninja -C "$build" -j "$(nproc)" fp4lab
echo "run_main: built in $(( $(date +%s) - start )) s; training $recipes on $config"
"$build/apps/fp4lab" sweep "$config" --recipes "$recipes" --force --set output.dir=runs/main \
  --plot runs/main/compare.png
echo "run_main: done in $(( $(date +%s) - start )) s (runs in runs/main/)"
