"""The comparison shared by the tests whose oracle is a peer's fake quantizer (its output tensor): each case's
input regenerated from its cases module, `fp4lab quantize --quantizer <json> IN.npy --dequant OUT.npy` (with
`--seed S --stream 0` where the case has a seed), the SHA-256 of the dequantized bytes (float32, or rounded to
bf16 by the cases module's bf16_bytes where the peer's output is bf16) against the oracle file's (written on
the GPU machine by the matching scripts/*_oracle.py). Until the oracle file exists the test prints SKIPPED and
passes. Python stdlib only.
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


# output form -> (struct code of one word, mask of the magnitude bits)
WORDS = {'f32': ('I', 0x7FFFFFFF), 'bf16': ('H', 0x7FFF)}


def mismatch_note(got, want, output):
    """Where fp4lab's output visibly departs from the oracle's summary (first 8 words, zero count)."""
    code, mask = WORDS[output]
    words = struct.unpack('<%d%s' % (len(got) // struct.calcsize(code), code), got)
    first = ['%0*x' % (2 * struct.calcsize(code), w) for w in words[:8]]
    note = ''
    if first != want['first8']:
        i = next(i for i in range(8) if first[i] != want['first8'][i])
        note += '; element %d is %s, the kernel\'s %s' % (i, first[i], want['first8'][i])
    zeros = sum(1 for w in words if w & mask == 0)
    if zeros != want['zeros']:
        note += '; %d zeros, the kernel %d' % (zeros, want['zeros'])
    return note


def compare(fp4lab, path, cases_mod, label, script, peer, meta_key, output='f32', checked=()):
    """label: the test's name in its lines; script: the oracle script; peer: what the oracle ran (for messages);
    meta_key: the oracle file's key holding the peer's commit; output: 'f32' or 'bf16' (the peer's output
    dtype); checked: the case keys that must equal the oracle file's (seeds, quantizer). Returns the exit
    status."""
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
            if any(want[k] != c[k] for k in checked):
                print('FAIL %s: the %s of %s.py is not the oracle\'s; rerun %s' % (
                    c['name'], ', '.join(checked), cases_mod.__name__, script))
                bad += 1
                continue
            rows, cols, vals = inputs[c['input']]
            xp, yp = os.path.join(d, 'x.npy'), os.path.join(d, 'y.npy')
            npyio.write_raw(xp, '<f4', (rows, cols), cases_mod.f32_bytes(vals))
            if os.path.exists(yp):
                os.remove(yp)
            seed = ['--seed', str(c['seed']), '--stream', '0'] if 'seed' in c else []
            r = subprocess.run([fp4lab, 'quantize', '--quantizer', quantizer_arg(c['quantizer']), xp, '--dequant', yp]
                               + seed, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
            if r.returncode != 0:
                print('FAIL %s: fp4lab quantize exited %d: %s' % (c['name'], r.returncode, r.stderr.strip()))
                bad += 1
                continue
            descr, shape, data = npyio.read_npy(yp)
            if descr != '<f4' or shape != (rows, cols):
                print('FAIL %s: fp4lab wrote dequant %s %s, not <f4 %s' % (c['name'], descr, shape, (rows, cols)))
                bad += 1
                continue
            got = cases_mod.bf16_bytes(data) if output == 'bf16' else data
            if cases_mod.digest_bytes(got) != want['sha256']:
                print('FAIL %s: fp4lab\'s dequant%s differs from the %s\'s output (SHA-256)%s' % (
                    c['name'], ' (rounded to bf16)' if output == 'bf16' else '', peer, mismatch_note(got, want, output)))
                bad += 1
    t = oracle[meta_key]
    print('%s: %d of %d cases bit-equal to %s %s (torch %s, triton %s, %s %s)' % (
        label, len(cases) - bad, len(cases), peer, t['commit'][:12], oracle['torch'], oracle['triton'],
        oracle['device']['name'], oracle['device']['capability']))
    return 1 if bad else 0
