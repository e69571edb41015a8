#!/usr/bin/env bash
# The robustness tests of issue 42 under AddressSanitizer + UBSan (a CPU build with -DFP4LAB_SANITIZE=ON):
# the run-lifecycle fault harness, hostile configs and run archives, data-parallel faults, and the doctest
# cases of the run lifecycle, configs, agreement and processes. Logs under $OUT (default /tmp/out).
# Usage, from the repository root: OUT=DIR bash scripts/sanitize_robustness.sh
OUT=${OUT:-/tmp/out}
set -o pipefail
mkdir -p $OUT
t0=$(date +%s)
cmake -S . -B /tmp/asan -G Ninja -DFP4LAB_CUDA=OFF -DFP4LAB_SANITIZE=ON -DFP4LAB_NATIVE=OFF > $OUT/cmake.log 2>&1 || { tail -20 $OUT/cmake.log; exit 1; }
ninja -C /tmp/asan -j16 fp4lab test_train test_core > $OUT/build.log 2>&1 || { grep -E "error|FAILED" -A3 $OUT/build.log | head -30; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
which gnuplot mpirun python3
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
F=/tmp/asan/apps/fp4lab
cd /tmp && for t in test_run_faults test_hostile_config test_hostile_compare; do
  timeout 500 python3 $OLDPWD/tests/cli/$t.py $F > $OUT/$t.log 2>&1; echo "$t rc=$?"; tail -3 $OUT/$t.log; done
cd $OLDPWD
timeout 300 python3 tests/cli/test_hostile_compare.py $F --plot > $OUT/plot.log 2>&1; echo "plot rc=$?"; tail -2 $OUT/plot.log
if which mpirun >/dev/null; then timeout 200 python3 tests/cli/test_dp_faults.py $F $(which mpirun) > $OUT/dp_faults.log 2>&1; echo "dp_faults rc=$?"; tail -3 $OUT/dp_faults.log; fi
(cd /tmp/asan/tests && timeout 400 ./test_train -tc="*resume*,*lifecycle*,*leftovers*,*force*,*config*,*agree*,*timeout*,*process*,*sweep*,*read_metrics*,*checkpoint*,*hostile*,*range*,*size*,*deep*" > $OUT/test_train.log 2>&1; echo "test_train subset rc=$?"; tail -3 $OUT/test_train.log)
(cd /tmp/asan/tests && timeout 200 ./test_core -tc="*json*" > $OUT/test_core.log 2>&1; echo "test_core json rc=$?"; tail -3 $OUT/test_core.log)
grep -l "ERROR: AddressSanitizer\|runtime error:\|LeakSanitizer" $OUT/*.log && echo "SANITIZER REPORTS FOUND" || echo "no sanitizer reports"
echo "total $(( $(date +%s) - t0 )) s"
