#!/usr/bin/env python3
"""fp4lab's emulate quartet2_triton against Quartet II's own Triton forward round-to-nearest NVFP4 fake quantizer
(`rtn_1x16s_fp4_kernel` through `rtn_1x16s_fp4_kernel_wrapper(x, 1.0, 16, False)`: tensor-amax FP32 global
scale, 1x16 E4M3 block scales).

tests/data/quartet2_triton_oracle.json holds, per case of tests/cli/quartet2_triton_cases.py, the SHA-256 of the
float32 output the Triton kernel returned (row-major; Quartet II commit, torch / triton versions and the GPU in
the file), computed by scripts/quartet2_triton_oracle.py on the GPU machine. This test regenerates each input, runs
`fp4lab quantize --quantizer <json> IN.npy --dequant OUT.npy` and compares the SHA-256 of the dequantized bytes.
Until the oracle file exists the test prints SKIPPED and passes.

Usage: test_quartet2_triton.py FP4LAB_BINARY [ORACLE_JSON]   (Python stdlib only)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import npyio  # noqa: E402
import quartet2_triton_cases as qcases  # noqa: E402


def quantizer_arg(q):
    """The --quantizer argument: a canned name as is, an object as JSON."""
    return q if isinstance(q, str) else json.dumps(q)


def main():
    fp4lab = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, '..', 'data', 'quartet2_triton_oracle.json')
    if not os.path.exists(path):
        print('quartet2_triton: SKIPPED (no %s yet: produce it with scripts/quartet2_triton_oracle.py on the GPU '
              'machine)'
              % os.path.normpath(path))
        return 0
    oracle = json.load(open(path))
    inputs = qcases.inputs()
    cases = qcases.cases()
    if set(c['name'] for c in cases) != set(oracle['cases']):
        print('FAIL: the cases of quartet2_triton_cases.py and the oracle file differ; rerun '
              'scripts/quartet2_triton_oracle.py')
        return 1
    bad_inputs = set()
    for name, (rows, cols, vals) in inputs.items():
        if oracle['inputs'].get(name) != qcases.digest_input(vals):
            print('FAIL input %s: the regenerated input differs from the one the oracle quantized '
                  '(another Python `random`?); its cases are not compared' % name)
            bad_inputs.add(name)
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for c in cases:
            if c['input'] in bad_inputs:
                bad += 1
                continue
            want = oracle['cases'][c['name']]
            rows, cols, vals = inputs[c['input']]
            xp, yp = os.path.join(d, 'x.npy'), os.path.join(d, 'y.npy')
            npyio.write_raw(xp, '<f4', (rows, cols), qcases.f32_bytes(vals))
            if os.path.exists(yp):
                os.remove(yp)
            r = subprocess.run([fp4lab, 'quantize', '--quantizer', quantizer_arg(c['quantizer']), xp, '--dequant', yp],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
            if r.returncode != 0:
                print('FAIL %s: fp4lab quantize exited %d: %s' % (c['name'], r.returncode, r.stderr.strip()))
                bad += 1
                continue
            descr, shape, data = npyio.read_npy(yp)
            if descr != '<f4' or shape != (rows, cols):
                print('FAIL %s: fp4lab wrote dequant %s %s, not <f4 %s' % (c['name'], descr, shape, (rows, cols)))
                bad += 1
                continue
            if qcases.digest_bytes(data) != want['sha256']:
                words = struct.unpack('<%dI' % (len(data) // 4), data)
                vals_out = struct.unpack('<%df' % (len(data) // 4), data)
                first = ['%08x' % w for w in words[:8]]
                note = ''
                if first != want['first8']:
                    i = next(i for i in range(8) if first[i] != want['first8'][i])
                    note += '; element %d is %s, the kernel\'s %s' % (i, first[i], want['first8'][i])
                zeros = sum(1 for v in vals_out if v == 0.0)
                if zeros != want['zeros']:
                    note += '; %d zeros, the kernel %d' % (zeros, want['zeros'])
                print('FAIL %s: fp4lab\'s dequant differs from the Quartet II Triton kernel\'s output (SHA-256)%s'
                      % (c['name'], note))
                bad += 1
    t = oracle['quartet2']
    print('quartet2_triton: %d of %d cases bit-equal to Quartet II %s Triton kernel (torch %s, triton %s, %s %s)' % (
        len(cases) - bad, len(cases), t['commit'][:12], oracle['torch'], oracle['triton'],
        oracle['device']['name'], oracle['device']['capability']))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
