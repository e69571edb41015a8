#!/usr/bin/env bash
# The test suite from a fresh clone: install dependencies, configure, build,
# run every test. Usage: scripts/test.sh [BUILD_DIR [CMAKE_ARGS...]]
# (default BUILD_DIR: build). The CUDA backend is built where nvcc and a GPU
# are present (-DFP4LAB_CUDA=AUTO); `-DFP4LAB_CUDA=ON` builds it without a GPU
# too (CI does, to compile the kernels), and its tests then report SKIPPED.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja "$@"
cmake --build "$build"
ctest --test-dir "$build" --output-on-failure
