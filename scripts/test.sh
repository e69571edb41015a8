#!/usr/bin/env bash
# The test suite from a fresh clone: install dependencies, configure, build,
# run every test. Usage: scripts/test.sh [BUILD_DIR]   (default: build)
# CUDA is detected automatically (FP4LAB_CUDA=AUTO); its tests skip without a GPU.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure
