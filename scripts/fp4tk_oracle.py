#!/usr/bin/env python3
"""fp4-trainkit's own simulators as the oracle of fp4lab's fp4tk quantizers.

Runs fp4-trainkit's MXFP4Simulator / NVFP4Simulator (src/fp4tk/quantizer of a
checkout of github.com/vuiseng9/fp4-trainkit) on the inputs of
tests/cli/fp4tk_cases.py, on the CPU and on the GPU (torch), in round to
nearest and in stochastic rounding. For stochastic rounding torch.rand_like is
replaced, for the duration of the call, by the uniform values fp4lab derives
from the same random words ((word >> 8) * 2^-24), so SR is compared bit for
bit too, not only in distribution.

Writes JSON with fp4-trainkit's commit, torch's version, the devices and one
SHA-256 per case and device (tests/data/fp4tk_oracle.json is this output),
and with --fp4lab BINARY also runs `fp4lab quantize` on every case and prints
each disagreement (element index, input, both outputs).

Needs torch and numpy. Usage:
  python3 scripts/fp4tk_oracle.py --fp4tk PATH/fp4-trainkit [--commit SHA] \
      [--fp4lab build/apps/fp4lab] --out oracle.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'cli'))
import fp4tk_cases  # noqa: E402


def run_fp4tk(fp4tk, case, x_np, words_np, device):
    from fp4tk.recipe import QuantFormat, BlockAxis, Rounding, ScaleImpl, QuantConfig
    from fp4tk.quantizer import MXFP4Simulator, NVFP4Simulator
    fmt = QuantFormat.MXFP4 if case['fmt'] == 'mxfp4' else QuantFormat.NVFP4
    axis = BlockAxis.RowWise if case['axis'] == 'row' else BlockAxis.ColWise
    rnd = Rounding.Nearest if case['round'] == 'rn' else Rounding.Stochastic
    cfg = QuantConfig(fmt, axis, rnd, getattr(ScaleImpl, case['scale_impl']))
    sim = MXFP4Simulator(cfg) if case['fmt'] == 'mxfp4' else NVFP4Simulator(cfg)
    x = torch.from_numpy(x_np.copy()).to(device)
    u = torch.from_numpy(((words_np >> 8).astype(np.float64) * 2.0 ** -24).astype(np.float32)).to(device)
    k = sim.K
    # element (r, c)'s uniform value, in the layout fp4-trainkit's m has
    ut = u.T.contiguous() if case['axis'] == 'col' else u
    uu = ut.reshape(ut.shape[0], -1, k)
    real = torch.rand_like
    calls = []

    def fake(t, *a, **kw):
        assert t.shape == uu.shape, (t.shape, uu.shape)
        calls.append(1)
        return uu.clone()

    torch.rand_like = fake
    try:
        y = sim(x)
    finally:
        torch.rand_like = real
    assert len(calls) == (1 if case['round'] == 'rs' else 0)
    return y.cpu().numpy().astype(np.float32)


def run_fp4lab(binary, case, x_np, words_np):
    with tempfile.TemporaryDirectory() as d:
        xp, wp, yp = os.path.join(d, 'x.npy'), os.path.join(d, 'w.npy'), os.path.join(d, 'y.npy')
        np.save(xp, x_np)
        np.save(wp, words_np)
        cmd = [binary, 'quantize', '--quantizer', json.dumps(case['quantizer']), xp, '--dequant', yp]
        if case['round'] == 'rs':
            cmd += ['--rbits', wp]
        subprocess.run(cmd, check=True)
        return np.load(yp)


def bits_of(a):
    return a.astype(np.float32).view(np.uint32).ravel().tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--fp4tk', required=True, help='checkout of fp4-trainkit (holding src/fp4tk)')
    ap.add_argument('--commit', default='', help="fp4-trainkit's commit (default: PATH/COMMIT or git)")
    ap.add_argument('--fp4lab', default='', help='an fp4lab binary to compare directly')
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.fp4tk, 'src'))
    commit = a.commit
    if not commit and os.path.exists(os.path.join(a.fp4tk, 'COMMIT')):
        commit = open(os.path.join(a.fp4tk, 'COMMIT')).read().strip()
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    inputs = fp4tk_cases.inputs()
    result = {'fp4tk_commit': commit, 'torch': torch.__version__, 'devices': devices,
              'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else '', 'cases': {}}
    bad = 0
    for case in fp4tk_cases.cases():
        rows, cols, vals = inputs[case['input']]
        x = np.array(vals, dtype=np.float32).reshape(rows, cols)
        w = np.array(fp4tk_cases.words(case['input'], rows, cols), dtype=np.uint32).reshape(rows, cols)
        entry = {}
        outs = {}
        for dev in devices:
            y = run_fp4tk(a.fp4tk, case, x, w, dev)
            outs[dev] = y
            entry[dev] = fp4tk_cases.digest(bits_of(y))
        if a.fp4lab:
            ours = run_fp4lab(a.fp4lab, case, x, w)
            entry['fp4lab'] = fp4tk_cases.digest(bits_of(ours))
            for dev in devices:
                if entry[dev] != entry['fp4lab']:
                    bad += 1
                    ob, tb = np.array(bits_of(ours)), np.array(bits_of(outs[dev]))
                    nan_o, nan_t = np.isnan(ours.ravel()), np.isnan(outs[dev].ravel())
                    diff = np.nonzero((ob != tb) & ~(nan_o & nan_t))[0]
                    print('MISMATCH %s on %s: %d elements, first: %s' % (
                        case['name'], dev, len(diff),
                        [(int(i), float(x.ravel()[i]), float(outs[dev].ravel()[i]), float(ours.ravel()[i]))
                         for i in diff[:6]]))
        if len(devices) == 2 and entry['cpu'] != entry['cuda']:
            print('NOTE %s: fp4-trainkit on cpu and on cuda differ' % case['name'])
        result['cases'][case['name']] = entry
    with open(a.out, 'w') as f:
        json.dump(result, f, indent=1, sort_keys=True)
    n = len(result['cases'])
    print('fp4tk oracle: %d cases, devices %s, torch %s, fp4-trainkit %s; %s' % (
        n, devices, torch.__version__, commit, ('%d mismatches' % bad) if a.fp4lab else 'no fp4lab comparison'))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
