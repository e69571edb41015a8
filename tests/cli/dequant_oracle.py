"""The comparison shared by the tests whose oracle is a peer's fake quantizer (its float32 output): each case's
input regenerated from its cases module, `fp4lab quantize --quantizer <json> IN.npy --dequant OUT.npy`, the
SHA-256 of the dequantized bytes against the oracle file's (written on the GPU machine by the matching
scripts/*_oracle.py). Until the oracle file exists the test prints SKIPPED and passes. Python stdlib only.
"""
import json
import os
import struct
import subprocess
import tempfile

import npyio


def quantizer_arg(q):
    """The --quantizer argument: a canned name as is, an object as JSON."""
    return q if isinstance(q, str) else json.dumps(q)


def compare(fp4lab, path, cases_mod, label, script, peer, meta_key):
    """label: the test's name in its lines; script: the oracle script; peer: what the oracle ran (for messages);
    meta_key: the oracle file's key holding the peer's commit. Returns the exit status."""
    if not os.path.exists(path):
        print('%s: SKIPPED (no %s yet: produce it with %s on the GPU machine)' % (label, os.path.normpath(path), script))
        return 0
    oracle = json.load(open(path))
    inputs = cases_mod.inputs()
    cases = cases_mod.cases()
    if set(c['name'] for c in cases) != set(oracle['cases']):
        print('FAIL: the cases of %s.py and the oracle file differ; rerun %s' % (cases_mod.__name__, script))
        return 1
    bad_inputs = set()
    for name, (rows, cols, vals) in inputs.items():
        if oracle['inputs'].get(name) != cases_mod.digest_input(vals):
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
            npyio.write_raw(xp, '<f4', (rows, cols), cases_mod.f32_bytes(vals))
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
            if cases_mod.digest_bytes(data) != want['sha256']:
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
                print('FAIL %s: fp4lab\'s dequant differs from the %s\'s output (SHA-256)%s' % (c['name'], peer, note))
                bad += 1
    t = oracle[meta_key]
    print('%s: %d of %d cases bit-equal to %s %s (torch %s, triton %s, %s %s)' % (
        label, len(cases) - bad, len(cases), peer, t['commit'][:12], oracle['torch'], oracle['triton'],
        oracle['device']['name'], oracle['device']['capability']))
    return 1 if bad else 0
