#!/usr/bin/env python3
"""fp4lab's fp4tk quantizers against fp4-trainkit's own outputs.

tests/data/fp4tk_oracle.json holds, per case of tests/cli/fp4tk_cases.py, the
SHA-256 of what fp4-trainkit's MXFP4Simulator / NVFP4Simulator (commit and
torch version in the file) returned on its CPU path, computed by
scripts/fp4tk_oracle.py on the GPU machine. This test regenerates each
input, runs `fp4lab quantize` with the case's quantizer (stochastic
rounding with the case's random words, --rbits) and compares hashes. A
mismatch names the case; scripts/fp4tk_oracle.py --fp4lab shows the elements.

Usage: test_fp4tk.py FP4LAB_BINARY   (Python stdlib only)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fp4tk_cases  # noqa: E402
import npyio  # noqa: E402


def read_f32_bits(path):
    with open(path, 'rb') as f:
        b = f.read()
    hl = struct.unpack('<H', b[8:10])[0]
    data = b[10 + hl:]
    return list(struct.unpack('<%dI' % (len(data) // 4), data))


def main():
    fp4lab = sys.argv[1]
    oracle = json.load(open(os.path.join(HERE, '..', 'data', 'fp4tk_oracle.json')))
    inputs = fp4tk_cases.inputs()
    cases = fp4tk_cases.cases()
    if set(c['name'] for c in cases) != set(oracle['cases']):
        print('FAIL: the cases of fp4tk_cases.py and the oracle file differ; rerun scripts/fp4tk_oracle.py')
        return 1
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        written = set()
        for c in cases:
            rows, cols, vals = inputs[c['input']]
            xp, wp = os.path.join(d, c['input'] + '.npy'), os.path.join(d, c['input'] + '.words.npy')
            if c['input'] not in written:
                npyio.write_npy(xp, '<f4', (rows, cols), vals)
                npyio.write_npy(wp, '<u4', (rows, cols), fp4tk_cases.words(c['input'], rows, cols))
                written.add(c['input'])
            yp = os.path.join(d, 'y.npy')
            cmd = [fp4lab, 'quantize', '--quantizer', json.dumps(c['quantizer']), xp, '--dequant', yp]
            if c['round'] == 'rs':
                cmd += ['--rbits', wp]
            subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
            got = fp4tk_cases.digest(read_f32_bits(yp))
            if got != oracle['cases'][c['name']]['cpu']:
                print('FAIL %s: fp4lab differs from fp4-trainkit (%s, torch %s, cpu)' % (
                    c['name'], oracle['fp4tk_commit'][:12], oracle['torch']))
                bad += 1
    print('fp4tk: %d of %d cases bit-equal to fp4-trainkit %s (torch %s, cpu)' % (
        len(cases) - bad, len(cases), oracle['fp4tk_commit'][:12], oracle['torch']))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
