#!/usr/bin/env python3
"""fp4lab's emulate quartet2_eden_triton against Quartet II's own Triton backward MS-EDEN quantizer
(`eden_1x16s_fp4_kernel` of src/models/quantization/schemes/quartet_2.py: optional 128-point rotation, tensor-amax
FP32 global scale, 1x16 E4M3 block scales, per-128 EDEN correction, stochastically rounded scales, bf16 output).

tests/data/quartet2_eden_oracle.json holds, per case of tests/cli/quartet2_eden_cases.py, the SHA-256 of the bf16
output the Triton kernel returned (its bit patterns as little-endian uint16, row-major; Quartet II commit, torch /
triton versions and the GPU in the file), computed by scripts/quartet2_eden_oracle.py on the GPU machine. This test
regenerates each input, runs `fp4lab quantize IN.npy --quantizer <json> --dequant OUT.npy --seed <seed> --stream 0`,
rounds the float32 dequant to bf16 (nearest even) and compares the SHA-256 of those bf16 bytes. The dequant
comparison of tests/cli/dequant_oracle.py does not fit: it hashes the float32 dequant and passes no --seed.
Until the oracle file exists the test prints SKIPPED and passes.

Usage: test_quartet2_eden.py FP4LAB_BINARY [ORACLE_JSON]   (Python stdlib only)
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
import quartet2_eden_cases as qcases  # noqa: E402

LABEL = 'quartet2_eden_triton'
SCRIPT = 'scripts/quartet2_eden_oracle.py'
PEER = 'Quartet II EDEN Triton kernel'


def run_case(fp4lab, d, c, rows, cols, vals):
    """(the bf16 bytes of fp4lab's dequant, None) or (None, why not)."""
    xp, yp = os.path.join(d, 'x.npy'), os.path.join(d, 'y.npy')
    npyio.write_raw(xp, '<f4', (rows, cols), qcases.f32_bytes(vals))
    if os.path.exists(yp):
        os.remove(yp)
    r = subprocess.run([fp4lab, 'quantize', xp, '--quantizer', json.dumps(c['quantizer']), '--dequant', yp,
                        '--seed', str(c['seed']), '--stream', '0'],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
    if r.returncode != 0:
        return None, 'fp4lab quantize exited %d: %s' % (r.returncode, r.stderr.strip())
    descr, shape, data = npyio.read_npy(yp)
    if descr != '<f4' or shape != (rows, cols):
        return None, 'fp4lab wrote dequant %s %s, not <f4 %s' % (descr, shape, (rows, cols))
    return qcases.bf16_bytes(data), None


def mismatch_note(got, want):
    """Where fp4lab's bf16 output visibly departs from the kernel's summary (first 8 outputs, zero count)."""
    words = struct.unpack('<%dH' % (len(got) // 2), got)
    first = ['%04x' % w for w in words[:8]]
    note = ''
    if first != want['first8']:
        i = next(i for i in range(8) if first[i] != want['first8'][i])
        note += '; element %d is %s, the kernel\'s %s' % (i, first[i], want['first8'][i])
    zeros = sum(1 for w in words if w & 0x7FFF == 0)
    if zeros != want['zeros']:
        note += '; %d zeros, the kernel %d' % (zeros, want['zeros'])
    return note


def main():
    fp4lab = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, '..', 'data', 'quartet2_eden_oracle.json')
    if not os.path.exists(path):
        print('%s: SKIPPED (no %s yet: produce it with %s on the GPU machine)' % (
            LABEL, os.path.normpath(path), SCRIPT))
        return 0
    oracle = json.load(open(path))
    inputs = qcases.inputs()
    cases = qcases.cases()
    if set(c['name'] for c in cases) != set(oracle['cases']):
        print('FAIL: the cases of %s.py and the oracle file differ; rerun %s' % (qcases.__name__, SCRIPT))
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
            want = oracle['cases'][c['name']]
            if c['input'] in bad_inputs:
                bad += 1
                continue
            if [want['seed'], want['rht_seed'], want['quantizer']] != [c['seed'], c['rht_seed'], c['quantizer']]:
                print('FAIL %s: the seed, rht_seed or quantizer of %s.py is not the oracle\'s; rerun %s' % (
                    c['name'], qcases.__name__, SCRIPT))
                bad += 1
                continue
            rows, cols, vals = inputs[c['input']]
            got, why = run_case(fp4lab, d, c, rows, cols, vals)
            if why:
                print('FAIL %s: %s' % (c['name'], why))
                bad += 1
            elif qcases.digest_bytes(got) != want['sha256']:
                print('FAIL %s: fp4lab\'s dequant (rounded to bf16) differs from the %s\'s output (SHA-256)%s' % (
                    c['name'], PEER, mismatch_note(got, want)))
                bad += 1
    t = oracle['quartet2']
    print('%s: %d of %d cases bit-equal to %s %s (torch %s, triton %s, %s %s)' % (
        LABEL, len(cases) - bad, len(cases), PEER, t['commit'][:12], oracle['torch'], oracle['triton'],
        oracle['device']['name'], oracle['device']['capability']))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
