#!/usr/bin/env bash
# Runs on the device machine (GPU host with numpy + ml_dtypes): builds the
# fp4lab CLI (CPU only) in a fresh directory, compares `fp4lab cast` with
# ml_dtypes (tests/core/mldtypes_oracle.py) and prints `fp4lab bench cast`.
# Usage: scripts/device_mldtypes_check.sh [BUILD_DIR]    (default /tmp/fp4lab-mld)
set -euo pipefail
B=${1:-/tmp/fp4lab-mld}
cd "$(dirname "$0")/.."
cmake -S . -B "$B" -G Ninja -DFP4LAB_CUDA=OFF >/dev/null
ninja -C "$B" fp4lab >/dev/null
python3 tests/core/mldtypes_oracle.py "$B/apps/fp4lab" "$B/mld"
echo
"$B/apps/fp4lab" bench cast
