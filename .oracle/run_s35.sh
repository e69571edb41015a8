#!/usr/bin/env bash
# Session 35 device run: build, test_train_cuda (op table, bf16 cases), bench train fp32 vs bf16 activations.
set -o pipefail
OUT=${OUT:-/tmp/out}; B=${B:-/tmp/b}; mkdir -p "$OUT"
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B "$B" -G Ninja -DFP4LAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release -DFP4LAB_PYTHON=OFF >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C "$B" -k 0 -j16 test_train_cuda fp4lab >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  "$B/tests/test_train_cuda" ${TTF:+-tc="$TTF"} > "$OUT/test_train_cuda.log" 2>&1; echo "test_train_cuda rc $?"; tail -4 "$OUT/test_train_cuda.log"
  grep -E "ERROR|FAILED" -A5 "$OUT/test_train_cuda.log" | head -40
  echo "tests done: $(($(date +%s) - t0)) s"
fi
for mode in fp32 bf16; do
  "$B/apps/fp4lab" bench train --config configs/gpt_shakespeare_char.json --backend cuda --recipes bf16,nvfp4 \
    --steps 20 --repeats 3 --pytorch off --set model.attention=bf16_flash --set precision.activations=$mode \
    > "$OUT/bench_$mode.log" 2>&1; echo "bench $mode rc $?"; tail -6 "$OUT/bench_$mode.log"
done
echo "total: $(($(date +%s) - t0)) s"
