#!/usr/bin/env bash
# CLI tests of `fp4lab formats`, `cast`, `decode`, `bench cast` and the argument checks of `bench attention`, `bench moe` on the CPU;
# test_robust.py (called at the end): outputs all-or-none, exit codes, NaN warnings, `verify`;
# test_quantize_groups.py: `quantize --groups`.
# Usage: test_cli.sh PATH/TO/fp4lab
# Writes its .npy inputs and reads the outputs with Python's standard library
# only (no NumPy needed); exits 77 (ctest: skipped) when python3 is missing.
set -u
FP4LAB=${1:?usage: test_cli.sh PATH/TO/fp4lab}
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# npy helper: write DESCR SHAPE VALUES... / read FILE (prints "descr shape v1 v2 ...")
cat > "$T/npy.py" <<'PY'
import struct, sys, ast
def write(path, descr, shape, vals):
    fmt = {'<f4': 'f', '<f8': 'd', '|u1': 'B', '<u2': 'H'}[descr]
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    n = 10 + len(d) + 1
    d += ' ' * ((64 - n % 64) % 64) + '\n'
    data = b''.join(struct.pack('<' + fmt, float(v) if fmt in 'fd' else int(v, 0)) for v in vals)
    open(path, 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(d)) + d.encode() + data)
def read(path):
    b = open(path, 'rb').read()
    assert b[:8] == b'\x93NUMPY\x01\x00', 'bad magic/version'
    hl = struct.unpack('<H', b[8:10])[0]
    h = ast.literal_eval(b[10:10 + hl].decode())
    fmt = {'<f4': 'f', '<f8': 'd', '|u1': 'B', '<u2': 'H'}[h['descr']]
    size = struct.calcsize(fmt)
    data = b[10 + hl:]
    vals = [struct.unpack('<' + fmt, data[i:i + size])[0] for i in range(0, len(data), size)]
    out = [h['descr'], str(h['shape']).replace(' ', '')]
    out += ['0x%X' % v if fmt in 'BH' else repr(v) for v in vals]
    print(' '.join(out))
if sys.argv[1] == 'write': write(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
else: read(sys.argv[2])
PY
npy_write() { python3 "$T/npy.py" write "$@"; }
npy_read() { python3 "$T/npy.py" read "$1"; }

# expect_out NAME WANT COMMAND...: command succeeds and OUT file reads as WANT
check_read() {
  local name=$1 want=$2 file=$3 got
  got=$(npy_read "$file" 2>&1) || { fail "$name: cannot read output: $got"; return; }
  [ "$got" == "$want" ] || fail "$name: want '$want' got '$got'"
}
# expect_error NAME PATTERN COMMAND...: non-zero exit, one stderr line matching
# PATTERN, and no file $T/out.npy left behind.
expect_error() {
  local name=$1 pat=$2
  shift 2
  rm -f "$T/out.npy"
  "$@" >"$T/stdout" 2>"$T/stderr"
  local rc=$?
  [ $rc -ne 0 ] || fail "$name: exit status 0, expected an error"
  [ "$rc" -lt 128 ] || fail "$name: crashed (exit status $rc)"
  grep -q -- "$pat" "$T/stderr" || fail "$name: stderr lacks '$pat': $(cat "$T/stderr")"
  [ ! -e "$T/out.npy" ] || fail "$name: left an output file"
  ls "$T" | grep -q '\.tmp\.' && fail "$name: left a temporary file"
}

# --- formats --------------------------------------------------------------
out=$("$FP4LAB" formats) || fail "formats: non-zero exit"
echo "$out" | grep -q "float4_e2m1fn" || fail "formats: no float4_e2m1fn row"
echo "$out" | grep "float8_e4m3fn " | grep -q "448" || fail "formats: e4m3fn max 448 missing"

# --- cast -------------------------------------------------------------------
npy_write "$T/x.npy" '<f4' '(2, 4)' 0.25 -0.25 2.5 7.0 -100 0.3 nan inf
"$FP4LAB" cast --to e2m1 "$T/x.npy" "$T/c.npy" || fail "cast e2m1: non-zero exit"
check_read "cast e2m1 rn" "|u1 (2,4) 0x0 0x8 0x4 0x7 0xF 0x1 0x7 0x7" "$T/c.npy"
"$FP4LAB" cast --to float4_e2m1fn --round rna "$T/x.npy" "$T/c.npy" || fail "cast rna: non-zero exit"
check_read "cast e2m1 rna" "|u1 (2,4) 0x1 0x9 0x5 0x7 0xF 0x1 0x7 0x7" "$T/c.npy"
"$FP4LAB" cast --to e2m1 --round rz "$T/x.npy" "$T/c.npy" || fail "cast rz: non-zero exit"
check_read "cast e2m1 rz" "|u1 (2,4) 0x0 0x8 0x4 0x7 0xF 0x0 0x7 0x7" "$T/c.npy"

# 464 = 448 + half ulp (ties to even 448 in e4m3); 480 in e5m2 ties to 512 (0x60).
npy_write "$T/y.npy" '<f4' '(4,)' 464 -464 480 1e9
"$FP4LAB" cast --to e4m3 --overflow nonsaturate "$T/y.npy" "$T/c.npy" || fail "cast nonsat: non-zero exit"
check_read "cast e4m3 nonsaturate" "|u1 (4,) 0x7E 0xFE 0x7F 0x7F" "$T/c.npy"
"$FP4LAB" cast --to e5m2 --overflow nonsaturate "$T/y.npy" "$T/c.npy" || fail "cast e5m2: non-zero exit"
check_read "cast e5m2 nonsaturate" "|u1 (4,) 0x5F 0xDF 0x60 0x7C" "$T/c.npy"
"$FP4LAB" cast --to e5m2 "$T/y.npy" "$T/c.npy" || fail "cast e5m2 sat: non-zero exit"
check_read "cast e5m2 saturate" "|u1 (4,) 0x5F 0xDF 0x60 0x7B" "$T/c.npy"

npy_write "$T/z.npy" '<f4' '(3,)' 1.0 -2.0 65504
"$FP4LAB" cast --to bf16 "$T/z.npy" "$T/c.npy" || fail "cast bf16: non-zero exit"
check_read "cast bf16" "<u2 (3,) 0x3F80 0xC000 0x4780" "$T/c.npy"
"$FP4LAB" cast --to float16 "$T/z.npy" "$T/c.npy" || fail "cast f16: non-zero exit"
check_read "cast f16" "<u2 (3,) 0x3C00 0xC000 0x7BFF" "$T/c.npy"

# float64 input is rounded once: 2.5 + 2^-30 rounds up to 3 (code 5).
npy_write "$T/d.npy" '<f8' '(2,)' 2.5000000009313226 2.5
"$FP4LAB" cast --to e2m1 "$T/d.npy" "$T/c.npy" || fail "cast f64: non-zero exit"
check_read "cast float64" "|u1 (2,) 0x5 0x4" "$T/c.npy"

# Stochastic rounding: reproducible per seed.
vals=$(for i in $(seq 1 256); do printf '0.3 '; done)
npy_write "$T/s.npy" '<f4' '(256,)' $vals
"$FP4LAB" cast --to e2m1 --round rs --seed 7 "$T/s.npy" "$T/s1.npy" || fail "cast rs: non-zero exit"
"$FP4LAB" cast --to e2m1 --round stochastic --seed 7 "$T/s.npy" "$T/s2.npy" || fail "cast rs: non-zero exit"
"$FP4LAB" cast --to e2m1 --round rs --seed 8 "$T/s.npy" "$T/s3.npy" || fail "cast rs: non-zero exit"
cmp -s "$T/s1.npy" "$T/s2.npy" || fail "cast rs: same seed gave different codes"
cmp -s "$T/s1.npy" "$T/s3.npy" && fail "cast rs: different seeds gave identical codes"
npy_read "$T/s1.npy" | tr ' ' '\n' | tail -n +3 | grep -qv '^0x[01]$' && fail "cast rs: 0.3 gave a code other than 0 or 1"

# --- decode -----------------------------------------------------------------
npy_write "$T/k.npy" '|u1' '(16,)' $(seq 0 15)
"$FP4LAB" decode --from e2m1 "$T/k.npy" "$T/v.npy" || fail "decode: non-zero exit"
check_read "decode e2m1" "<f4 (16,) 0.0 0.5 1.0 1.5 2.0 3.0 4.0 6.0 -0.0 -0.5 -1.0 -1.5 -2.0 -3.0 -4.0 -6.0" "$T/v.npy"
npy_write "$T/k8.npy" '|u1' '(4,)' 0x7E 0x7F 0xFF 0x01
"$FP4LAB" decode --from float8_e4m3fn "$T/k8.npy" "$T/v.npy" || fail "decode e4m3: non-zero exit"
check_read "decode e4m3" "<f4 (4,) 448.0 nan nan 0.001953125" "$T/v.npy"
npy_write "$T/k16.npy" '<u2' '(2,)' 0x3F80 0xFF80
"$FP4LAB" decode --from bf16 "$T/k16.npy" "$T/v.npy" || fail "decode bf16: non-zero exit"
check_read "decode bf16" "<f4 (2,) 1.0 -inf" "$T/v.npy"

# --- errors: one clear line, non-zero exit, no output file ------------------
expect_error "unknown format" "unknown format 'e9m9'" "$FP4LAB" cast --to e9m9 "$T/x.npy" "$T/out.npy"
expect_error "unknown rounding" "unknown rounding mode 'nearest_odd'" "$FP4LAB" cast --to e2m1 --round nearest_odd "$T/x.npy" "$T/out.npy"
expect_error "unknown overflow" "unknown overflow policy" "$FP4LAB" cast --to e2m1 --overflow clip "$T/x.npy" "$T/out.npy"
expect_error "missing input" "cannot open" "$FP4LAB" cast --to e2m1 "$T/nope.npy" "$T/out.npy"
expect_error "uint8 into cast" "float32 or float64" "$FP4LAB" cast --to e2m1 "$T/k.npy" "$T/out.npy"
printf 'not an npy file at all' > "$T/bad.npy"
expect_error "bad magic" "wrong magic" "$FP4LAB" cast --to e2m1 "$T/bad.npy" "$T/out.npy"
head -c 100 "$T/s.npy" > "$T/trunc.npy"
expect_error "truncated" "truncated" "$FP4LAB" cast --to e2m1 "$T/trunc.npy" "$T/out.npy"
expect_error "cast to float32" "float32" "$FP4LAB" cast --to float32 "$T/x.npy" "$T/out.npy"
expect_error "missing --to" "--to" "$FP4LAB" cast "$T/x.npy" "$T/out.npy"
npy_write "$T/k20.npy" '|u1' '(3,)' 1 2 20
expect_error "code out of range" "element 2 holds code 20" "$FP4LAB" decode --from e2m1 "$T/k20.npy" "$T/out.npy"
expect_error "decode wrong dtype" "must be stored as uint16" "$FP4LAB" decode --from bf16 "$T/k.npy" "$T/out.npy"
expect_error "decode float input" "must be stored as uint8" "$FP4LAB" decode --from e4m3 "$T/x.npy" "$T/out.npy"
rm -f "$T/out.npy"
"$FP4LAB" cast --to e2m1 "$T/x.npy" "$T/no_dir/out.npy" 2>"$T/stderr" && fail "write into missing dir: exit 0"
grep -q "cannot open" "$T/stderr" || fail "write into missing dir: $(cat "$T/stderr")"
# An error keeps an existing output file untouched.
cp "$T/c.npy" "$T/keep.npy"
"$FP4LAB" cast --to e9m9 "$T/x.npy" "$T/keep.npy" 2>/dev/null && fail "bad cast over existing file: exit 0"
cmp -s "$T/c.npy" "$T/keep.npy" || fail "bad cast modified the existing output file"

# --- help and bench -------------------------------------------------------------
for c in formats cast decode; do
  "$FP4LAB" $c --help >/dev/null || fail "$c --help: non-zero exit"
done
"$FP4LAB" bench cast --elements 1000 --repeats 1 >"$T/bench.txt" || fail "bench cast: non-zero exit"
grep -q "float8_e4m3fn" "$T/bench.txt" || fail "bench cast: no e4m3 row"
# GPU benchmarks: argument errors are named before any GPU is needed.
expect_error "bench attention cpu" "measures the CUDA attention only" "$FP4LAB" bench attention --backend cpu
expect_error "bench attention dropout" "--dropout must be in" "$FP4LAB" bench attention --dropout 1.5
# bench moe runs on the CPU backend too: every row present, the copy baseline at 100%; bad values named.
"$FP4LAB" bench moe --backend cpu --threads 1 --tokens 512 --width 36 --experts 6 --top-k 2 --dispatch capacity \
  --repeats 1 --inner 1 >"$T/moe.txt" || fail "bench moe: non-zero exit"
for row in "copy of x" "route" "gather" "combine, gated" "combine backward" "router gradient"; do
  grep -q "^$row" "$T/moe.txt" || fail "bench moe: no '$row' row: $(cat "$T/moe.txt")"
done
grep -q "capacity dispatch (1344 grouped rows)" "$T/moe.txt" || fail "bench moe: capacity rows not 6 x 224 (ceil(1.25 x 512 x 2 / 6) = 214 rounded up to 16): $(head -1 "$T/moe.txt")"
expect_error "bench moe top-k" "--top-k 7: at most --experts (6)" "$FP4LAB" bench moe --backend cpu --experts 6 --top-k 7
expect_error "bench moe dispatch" "--dispatch 'padded': valid: dropless, capacity" "$FP4LAB" bench moe --backend cpu --dispatch padded

# --- scripts/gpu_jobs.sh: a job list over GPUs (here GPUS=2 slots on the CPU), resumable, bad lines named --------
SRC=$(cd "$(dirname "$0")/../.." && pwd) FP4LAB_ABS=$(realpath "$FP4LAB")
mkdir -p "$T/data"  # gpt_baby's character data, relative to the working directory: any text will do
for i in $(seq 1 600); do echo "line $i: the quick brown fox jumps over the lazy dog, again and again."; done >"$T/data/tinyshakespeare.txt"
printf '%s\n' "# two tiny runs" \
  "j1 $SRC/configs/gpt_baby.json bf16 1 training.steps=2 training.eval_interval=1000 threads=1 backend=cpu" \
  "j2 $SRC/configs/gpt_baby.json fp32 2 training.steps=2 training.eval_interval=1000 threads=1 backend=cpu # c" >"$T/jobs.txt"
(cd "$T" && GPUS=2 bash "$SRC/scripts/gpu_jobs.sh" "$FP4LAB_ABS" "$T/jobs.txt" "$T/gj" >"$T/gj1.txt" 2>&1) ||
  fail "gpu_jobs.sh: exit $?: $(cat "$T/gj1.txt")"
for j in j1 j2; do grep -q '"status": *"completed"' "$T/gj/$j/summary.json" || fail "gpu_jobs.sh: $j not completed"; done
grep -q '"seed": 2' "$T/gj/j2/summary.json" || fail "gpu_jobs.sh: j2's seed is not 2: $(cat "$T/gj/j2/summary.json")"
(cd "$T" && GPUS=2 bash "$SRC/scripts/gpu_jobs.sh" "$FP4LAB_ABS" "$T/jobs.txt" "$T/gj" >"$T/gj2.txt" 2>&1) || fail "gpu_jobs.sh: second call"
[ "$(grep -c 'already completed' "$T/gj2.txt")" = 2 ] || fail "gpu_jobs.sh: a second call reran finished jobs: $(cat "$T/gj2.txt")"
echo "j3 x.json bf16 one" >"$T/bad_jobs.txt"
expect_error "gpu_jobs.sh bad seed" "bad_jobs.txt:1: seed 'one' is not a non-negative integer" \
  bash "$SRC/scripts/gpu_jobs.sh" "$FP4LAB" "$T/bad_jobs.txt" "$T/gj"

# --- outputs all-or-none, exit codes, NaN warnings, verify (python3 stdlib) ------
python3 "$(dirname "$0")/test_robust.py" "$FP4LAB" || fail "test_robust.py (FAIL lines above)"
# SR contracts with given random words against an oracle of TE's cvt.rs reading (python3 stdlib).
python3 "$(dirname "$0")/test_sr_words.py" "$FP4LAB" || fail "test_sr_words.py (FAIL lines above)"
# fp4tk quantizers bit-equal to fp4-trainkit's own outputs (hashes in tests/data; python3 stdlib).
python3 "$(dirname "$0")/test_fp4tk.py" "$FP4LAB" || fail "test_fp4tk.py (FAIL lines above)"
# FP8 block scaling bit-equal to DeepGEMM's and TransformerEngine's own quantizers (hashes in tests/data).
python3 "$(dirname "$0")/test_fp8_block.py" "$FP4LAB" || fail "test_fp8_block.py (FAIL lines above)"
python3 "$(dirname "$0")/test_mx_modes.py" "$FP4LAB" || fail "test_mx_modes.py (FAIL lines above)"
python3 "$(dirname "$0")/test_te_nvfp4.py" "$FP4LAB" || fail "test_te_nvfp4.py (FAIL lines above)"
python3 "$(dirname "$0")/test_tetrajet2.py" "$FP4LAB" || fail "test_tetrajet2.py (FAIL lines above)"
python3 "$(dirname "$0")/test_quartet2_triton.py" "$FP4LAB" || fail "test_quartet2_triton.py (FAIL lines above)"
python3 "$(dirname "$0")/test_quartet2_eden.py" "$FP4LAB" || fail "test_quartet2_eden.py (FAIL lines above)"
# `quantize --groups` against each group's rows quantized alone; bad sizes files (python3 stdlib).
python3 "$(dirname "$0")/test_quantize_groups.py" "$FP4LAB" || fail "test_quantize_groups.py (FAIL lines above)"
# Golden-suite manifests: 200 mutations, each a verdict or one clean error.
python3 "$(dirname "$0")/fuzz_manifest.py" "$FP4LAB" 200 || fail "fuzz_manifest.py (FAIL line above)"

if [ $fails -ne 0 ]; then
  echo "$fails CLI check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
