#!/usr/bin/env bash
# Builds fp4lab, test_cuda and test_train_cuda for sm_90a (Release) here and packs
# them, stripped, into DIR/bins.tar.xz for `PREBUILT=DIR bash scripts/run_device.sh`
# (DIR must be git-ignored and named in the device call's carry).
# Usage: bash scripts/pack_bins.sh [BUILD_DIR] [DIR]     (default build-cuda, .carry)
set -euo pipefail
B=${1:-build-cuda} D=${2:-.carry}
cd "$(dirname "$0")/.."
[ -f "$B/build.ninja" ] ||
  # Portable: the binaries run on the device host, not on the machine that built them.
  cmake -S . -B "$B" -G Ninja -DFP4LAB_CUDA=ON -DFP4LAB_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$B" fp4lab test_cuda test_train_cuda
mkdir -p "$D/pack"
for f in apps/fp4lab tests/test_cuda tests/test_train_cuda; do strip -o "$D/pack/$(basename $f)" "$B/$f"; done
tar -cJf "$D/bins.tar.xz" -C "$D/pack" fp4lab test_cuda test_train_cuda
rm -rf "$D/pack"
ls -l "$D/bins.tar.xz"
