#!/usr/bin/env bash
# One batched device call: build the CUDA backend, run the GPU tests and the
# two CUDA benchmarks, logs to $OUT (see /work/.library/device/README.md).
# Usage on the device machine, from the repository root: bash cuda/run_device.sh [tests|bench|all]
set -o pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"
t0=$(date +%s)
cmake -S . -B /tmp/b -G Ninja -DFP4LAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
# -k 0: other modules' work in progress must not stop test_cuda from building.
ninja -C /tmp/b -k 0 -j16 test_cuda fp4lab >"$OUT/build.log" 2>&1 || grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40
echo "build: $(( $(date +%s) - t0 )) s"
if [ "$what" = tests ] || [ "$what" = all ]; then
  /tmp/b/tests/test_cuda 2>&1 | tee "$OUT/test_cuda.log" | tail -60
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  /tmp/b/apps/fp4lab bench quantize --backend cuda --rows 8192 --cols 8192 --repeats 20 2>&1 | tee "$OUT/bench_quantize.log"
  /tmp/b/apps/fp4lab bench gemm --backend cuda --m 8192 --n 8192 --k 8192 --repeats 20 2>&1 | tee "$OUT/bench_gemm.log"
fi
