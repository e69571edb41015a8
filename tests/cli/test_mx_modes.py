#!/usr/bin/env python3
"""fp4lab's torchao MX scale rules (torchao_floor, torchao_ceil, torchao_even, torchao_rceil) against torchao's
own `to_mx`.

tests/data/mx_modes_oracle.json holds, per case of tests/cli/mx_modes_cases.py, the SHA-256 of the element codes
(one byte per element, fp4lab's --codes layout: FP4 unpacked from torchao's two-per-byte packing) and of the
E8M0 scale bytes that torchao's to_mx returned (torchao commit, torch version and devices in the file),
computed by scripts/mx_modes_oracle.py on the GPU machine. This test regenerates each input, runs
`fp4lab quantize` with the case's quantizer and compares hashes with the CUDA device's results (the CPU's where
the file has no CUDA). Until the oracle file exists the test prints SKIPPED and passes.

Usage: test_mx_modes.py FP4LAB_BINARY [ORACLE_JSON]   (Python stdlib only)
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mx_modes_cases  # noqa: E402
import npyio  # noqa: E402


def main():
    fp4lab = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, '..', 'data', 'mx_modes_oracle.json')
    if not os.path.exists(path):
        print('mx modes: SKIPPED (no %s yet: produce it with scripts/mx_modes_oracle.py on the GPU machine)'
              % os.path.normpath(path))
        return 0
    oracle = json.load(open(path))
    inputs = mx_modes_cases.inputs()
    cases = mx_modes_cases.cases()
    if set(c['name'] for c in cases) != set(oracle['cases']):
        print('FAIL: the cases of mx_modes_cases.py and the oracle file differ; rerun scripts/mx_modes_oracle.py')
        return 1
    device = 'cuda' if 'cuda' in oracle['devices'] else 'cpu'
    other = [d for d in oracle['devices'] if d != device]
    bad_inputs = set()
    for name, (rows, cols, vals) in inputs.items():
        if oracle['inputs'].get(name) != mx_modes_cases.digest_input(vals):
            print('FAIL input %s: the regenerated input differs from the one the oracle quantized '
                  '(another Python `random`?); its cases are not compared' % name)
            bad_inputs.add(name)
    bad = skipped = undefined = 0
    with tempfile.TemporaryDirectory() as d:
        written = set()
        for c in cases:
            if c['input'] in bad_inputs:
                bad += 1
                continue
            want = oracle['cases'][c['name']][device]
            if 'error' in want:
                print('SKIP %s: torchao\'s to_mx failed on %s: %s' % (c['name'], device, want['error']))
                skipped += 1
                continue
            rows, cols, vals = inputs[c['input']]
            xp = os.path.join(d, c['input'] + '.npy')
            if c['input'] not in written:
                npyio.write_raw(xp, '<f4', (rows, cols), mx_modes_cases.f32_bytes(vals))
                written.add(c['input'])
            cp, sp = os.path.join(d, 'c.npy'), os.path.join(d, 's.npy')
            r = subprocess.run([fp4lab, 'quantize', '--quantizer', json.dumps(c['quantizer']), xp, '--dequant',
                                os.path.join(d, 'y.npy'), '--codes', cp, '--scales', sp],
                               stderr=subprocess.PIPE, universal_newlines=True)
            if r.returncode != 0:
                print('FAIL %s: fp4lab quantize exited %d: %s' % (c['name'], r.returncode, r.stderr.strip()))
                bad += 1
                continue
            cdescr, cshape, codes = npyio.read_npy(cp)
            sdescr, sshape, scales = npyio.read_npy(sp)
            if cdescr != '|u1' or cshape != (rows, cols) or sdescr != '|u1' or \
                    sshape != (rows, (cols + mx_modes_cases.BLOCK - 1) // mx_modes_cases.BLOCK):
                print('FAIL %s: fp4lab wrote codes %s %s, scales %s %s' % (c['name'], cdescr, cshape, sdescr, sshape))
                bad += 1
                continue
            got = {'codes': mx_modes_cases.digest_bytes(codes), 'scales': mx_modes_cases.digest_bytes(scales)}
            wrong = [k for k in ('codes', 'scales') if got[k] != want[k]]
            # torchao casts a NaN-scaled block's elements (x / NaN) to FP4 / FP6 through its software path, which
            # has no NaN: the bits it returns differ between its CPU and CUDA runs. Such a case has no oracle for
            # its codes; its scales must still agree and fp4lab must show the NaN scale (0xFF) that explains it.
            devices_differ = any('error' not in oracle['cases'][c['name']][o] and
                                 oracle['cases'][c['name']][o]['codes'] != want['codes'] for o in other)
            if wrong == ['codes'] and devices_differ and 0xFF in bytes(scales):
                print('NO ORACLE %s: a block with a NaN scale, whose FP4/FP6 codes torchao leaves to the device '
                      '(its cpu and cuda differ); scales equal' % c['name'])
                undefined += 1
                continue
            if wrong:
                note = ''
                for o in other:
                    ow = oracle['cases'][c['name']][o]
                    if 'error' not in ow and any(ow[k] != want[k] for k in ('codes', 'scales')):
                        note += '; torchao\'s %s and %s differ here' % (o, device)
                    if 'error' not in ow and all(got[k] == ow[k] for k in ('codes', 'scales')):
                        note += '; fp4lab equals torchao on %s' % o
                print('FAIL %s: fp4lab\'s %s differ from torchao\'s to_mx (%s)%s' % (
                    c['name'], ' and '.join(wrong), device, note))
                bad += 1
    t = oracle['torchao']
    print('mx modes: %d of %d cases bit-equal to torchao %s to_mx (torch %s, %s)%s%s' % (
        len(cases) - bad - skipped - undefined, len(cases), t['commit'][:12], oracle['torch'], device,
        ', %d skipped' % skipped if skipped else '',
        ', %d with equal scales and NaN-scaled FP4/FP6 codes torchao leaves to the device' % undefined
        if undefined else ''))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
