#!/usr/bin/env python3
"""Quartet II's own Triton forward round-to-nearest NVFP4 fake quantizer as the oracle of fp4lab's emulate
quartet2_triton (quantizer {"element":"e2m1","scale":"ue4m3","block":[1,16],"scale_rule":"nv",
"global_scale":"tensor_amax","round":"rna","overflow":"saturate","emulate":"quartet2_triton"}).

Runs, on the inputs of tests/cli/quartet2_triton_cases.py (float32, cols % 16 == 0), the kernel
`rtn_1x16s_fp4_kernel` of IST-DASLab/Quartet-II (src/models/quantization/quantizers/nvfp4_triton.py) through that
file's own launcher `rtn_1x16s_fp4_kernel_wrapper(x, 1.0, 16, False)` (scale_override 1, group_size 16, no
four_over_six; amax_ptr = x.abs().max(); grid cdiv(numel, BLOCK_SIZE), BLOCK_SIZE autotuned over 2048, 4096,
8192, 16384 with key [], Triton's default launch options), on CUDA float32 tensors, and writes JSON with the
Quartet II commit, the SHA-256 of the kernel file, the torch, triton and CUDA versions, the device and its
capability, the autotuner's chosen config, each input's SHA-256 and, per case, the SHA-256 of the float32 output
bytes (row-major [rows, cols], as `fp4lab quantize --dequant` writes them), the number of output elements equal to
zero (+0 and -0), the number not finite, and the bits of the first 8 outputs (hex).
tests/data/quartet2_triton_oracle.json is this output.

The kernel's only reduction is the per-16 tl.max (exact and order-free), and amax comes from torch's exact max, so
neither BLOCK_SIZE nor num_warps can change a bit; the oracle checks that by launching the jitted function itself
(the autotuner's .fn) with BLOCK_SIZE 2048 and 16384 (num_warps 4) and with num_warps 1 and 8 (BLOCK_SIZE 2048),
and records per case whether each agrees with the launcher ("block_size_invariant", "num_warps_invariant").
It also records, per case, how many outputs differ from (a) the div.full model of tests/cli/quartet2_triton_cases
.model (the arithmetic fp4lab is expected to implement) and (b) an IEEE float32 model in torch on the CPU
(correctly rounded division, a saturating RNE cast to float8_e4m3fn): diagnostics, not part of the oracle.
From the PTX of the pinned launch (BLOCK_SIZE 2048) it records a count of each arithmetic instruction
(div / rcp / cvt / mul / fma / ...), to show which division and conversions Triton emitted; --ptx FILE saves it.

With --npy-dir DIR it writes, per case, DIR/<case>.in.npy (the input), DIR/<case>.out.npy (the kernel's float32
output), DIR/<case>.model.npy (the div.full model's) and DIR/<case>.ieee.npy (the IEEE model's), so that a
mismatch can be diagnosed elsewhere. With --fp4lab BINARY it also runs
`fp4lab quantize --quantizer <json> IN.npy --dequant OUT.npy` and prints, per case, whether it agrees and, if not,
how many elements differ.

The kernel file is loaded by path (importlib), not as a package: Quartet II is not installed (the file imports
only torch, triton and random). Needs torch and triton and a CUDA GPU of capability >= 8.9 (the kernel casts to
float8e4nv); no NumPy.
Usage (from the repository root):
  python3 scripts/quartet2_triton_oracle.py --quartet .oracle/quartet2 [--quartet-commit SHA] \
      [--fp4lab build/apps/fp4lab] [--npy-dir DIR] [--ptx FILE] --out quartet2_triton_oracle.json
The checkout may be the kernel file under its repository path (.oracle/quartet2/, with a file COMMIT holding the
commit, is such an export).
"""
import argparse
import collections
import hashlib
import importlib.util
import json
import os
import platform
import re
import struct
import subprocess
import sys
import tempfile

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'cli'))
import npyio  # noqa: E402
import quartet2_triton_cases as qcases  # noqa: E402

FILE = 'src/models/quantization/quantizers/nvfp4_triton.py'
KERNEL = 'rtn_1x16s_fp4_kernel'
BLOCK_SIZES = (2048, 16384)
NUM_WARPS = (1, 8)
PTX_OPS = re.compile(r'^\s*(?:@%p\d+\s+)?((?:div|rcp|sqrt|cvt|mul|fma|add|sub|max|min|abs|neg|setp|selp|ex2|lg2)'
                     r'(?:\.[a-z0-9]+)*)\s', re.M)


def quantizer_arg(q):
    """The --quantizer argument: a canned name as is, an object as JSON."""
    return q if isinstance(q, str) else json.dumps(q)


def load_quartet(root):
    """The kernel module, from Quartet II's own file under root (registered in sys.modules: Triton's JIT reads
    the defining module's globals and source)."""
    name = 'quartet2_nvfp4_triton'
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, FILE))
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


def to_bytes(t):
    return bytes(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).tolist())


def run_wrapper(m, x):
    y = m.rtn_1x16s_fp4_kernel_wrapper(x, 1.0, 16, False)
    torch.cuda.synchronize()
    return y


def run_direct(m, x, block, num_warps):
    """The wrapper's launch with the autotuner bypassed: the jitted function, BLOCK_SIZE and num_warps given.
    Returns (output, the compiled kernel or None)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    k = getattr(m, KERNEL).fn[(triton.cdiv(n, block),)](
        x_ptr=x, amax_ptr=x.abs().max(), output_ptr=y, n_elements=n, scale_override=1.0, group_size=16,
        four_over_six=False, BLOCK_SIZE=block, num_warps=num_warps)
    torch.cuda.synchronize()
    return y, k


def ptx_of(k):
    asm = getattr(k, 'asm', None)
    try:
        return asm['ptx'] if asm is not None else None
    except (KeyError, TypeError):
        return None


def ptx_ops(ptx):
    return dict(sorted(collections.Counter(PTX_OPS.findall(ptx)).items()))


def ieee_model(x):
    """The kernel's arithmetic in float32 on the CPU with IEEE division (a diagnostic; see the docstring)."""
    x = x.detach().cpu().float().reshape(-1)
    amax = x.abs().max()
    s_dec = torch.where(amax == 0, torch.ones_like(amax), amax / 448.0 / 6.0)
    xg = x.reshape(-1, 16)
    s_dec_b = xg.abs().amax(dim=1, keepdim=True) / 6.0
    s = (s_dec_b / s_dec).clamp(max=448.0).to(torch.float8_e4m3fn).to(torch.float32)
    s = torch.where(s == 0, torch.ones_like(s), s)
    sp = s * s_dec
    q = xg / sp
    a = q.abs()
    fa = torch.zeros_like(a)
    for t, v in ((0.25, 0.5), (0.75, 1.0), (1.25, 1.5), (1.75, 2.0), (2.5, 3.0), (3.5, 4.0), (5.0, 6.0)):
        fa = torch.where(a >= t, torch.full_like(a, v), fa)
    sign = torch.where(q > 0, 1.0, -1.0)
    return ((fa * sign) * sp).reshape(-1)


def summary(b):
    n = len(b) // 4
    vals = struct.unpack('<%df' % n, b)
    words = struct.unpack('<%dI' % n, b)
    return {'sha256': qcases.digest_bytes(b),
            'zeros': sum(1 for v in vals if v == 0.0),
            'nonfinite': sum(1 for w in words if (w & 0x7F800000) == 0x7F800000),
            'first8': ['%08x' % w for w in words[:8]]}


def differing(a, b):
    n = min(len(a), len(b)) // 4
    wa, wb = struct.unpack('<%dI' % n, a[:4 * n]), struct.unpack('<%dI' % n, b[:4 * n])
    return sum(1 for u, v in zip(wa, wb) if u != v) + abs(len(a) - len(b)) // 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--quartet', required=True, help='a Quartet-II checkout (or the export above)')
    ap.add_argument('--quartet-commit', help='default: the checkout\'s COMMIT file, else git rev-parse HEAD')
    ap.add_argument('--fp4lab')
    ap.add_argument('--npy-dir')
    ap.add_argument('--ptx', help='write the PTX of the pinned launch (BLOCK_SIZE 2048, last case) here')
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    commit = a.quartet_commit
    if not commit and os.path.exists(os.path.join(a.quartet, 'COMMIT')):
        commit = open(os.path.join(a.quartet, 'COMMIT')).read().strip()
    if not commit:
        r = subprocess.run(['git', '-C', a.quartet, 'rev-parse', 'HEAD'], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True)
        commit = r.stdout.strip() if r.returncode == 0 else 'unknown'
    if not torch.cuda.is_available():
        print('quartet2_triton_oracle: no CUDA device', file=sys.stderr)
        return 2
    m = load_quartet(a.quartet)
    with open(os.path.join(a.quartet, FILE), 'rb') as f:
        files = {FILE: hashlib.sha256(f.read()).hexdigest()}
    cap = torch.cuda.get_device_capability(0)
    dev_name = torch.cuda.get_device_name(0)
    if a.npy_dir:
        os.makedirs(a.npy_dir, exist_ok=True)
    inputs = qcases.inputs()
    out = {'quartet2': {'commit': commit, 'files': files, 'kernel': KERNEL,
                        'launcher': 'rtn_1x16s_fp4_kernel_wrapper(x, 1.0, 16, False)'},
           'torch': torch.__version__, 'triton': triton.__version__, 'cuda': torch.version.cuda,
           'python': platform.python_version(),
           'device': {'name': dev_name, 'capability': 'sm_%d%d' % cap},
           'quantizer': qcases.QUANTIZER,
           'launch': {'grid': 'cdiv(numel, BLOCK_SIZE)', 'group_size': 16, 'scale_override': 1.0,
                      'four_over_six': False, 'autotune': 'BLOCK_SIZE in 2048, 4096, 8192, 16384, key []',
                      'block_sizes_checked': list(BLOCK_SIZES), 'num_warps_checked': [4] + list(NUM_WARPS)},
           'inputs': {k: qcases.digest_input(v[2]) for k, v in inputs.items()},
           'layout': 'float32 output of the kernel, little-endian, row-major [rows, cols] (= the input\'s shape); '
                     'zeros counts +0 and -0; first8: the bits of the first 8 outputs',
           'cases': {}}
    agree = {}
    ptx = None
    with tempfile.TemporaryDirectory() as d:
        for c in qcases.cases():
            rows, cols, vals = inputs[c['input']]
            xb = qcases.f32_bytes(vals)
            xc = torch.frombuffer(bytearray(xb), dtype=torch.float32).reshape(rows, cols).clone()
            x = xc.cuda()
            y = run_wrapper(m, x)
            assert y.dtype == torch.float32 and tuple(y.shape) == (rows, cols), (y.dtype, tuple(y.shape))
            yb = to_bytes(y)
            entry = summary(yb)
            best = getattr(getattr(m, KERNEL), 'best_config', None)
            entry['autotuned_config'] = str(best) if best is not None else None
            same = []
            for bs in BLOCK_SIZES:
                yd, k = run_direct(m, x, bs, 4)
                same.append(to_bytes(yd) == yb)
                if bs == BLOCK_SIZES[0] and ptx_of(k):
                    ptx = ptx_of(k)
            entry['block_size_invariant'] = all(same)
            entry['num_warps_invariant'] = all(to_bytes(run_direct(m, x, BLOCK_SIZES[0], w)[0]) == yb
                                               for w in NUM_WARPS)
            entry['rerun_equal'] = to_bytes(run_wrapper(m, x)) == yb
            mb = qcases.f32_bytes(qcases.model(vals))
            ib = to_bytes(ieee_model(xc))
            entry['div_full_model_differs'] = differing(yb, mb)
            entry['ieee_model_differs'] = differing(yb, ib)
            out['cases'][c['name']] = entry
            if a.npy_dir:
                base = os.path.join(a.npy_dir, c['name'])
                npyio.write_raw(base + '.in.npy', '<f4', (rows, cols), xb)
                npyio.write_raw(base + '.out.npy', '<f4', (rows, cols), yb)
                npyio.write_raw(base + '.model.npy', '<f4', (rows, cols), mb)
                npyio.write_raw(base + '.ieee.npy', '<f4', (rows, cols), ib)
            print('%s: %s zeros %d nonfinite %d block_size_invariant %s num_warps_invariant %s rerun_equal %s '
                  'div_full_model_differs %d ieee_model_differs %d (autotuned %s)' % (
                      c['name'], entry['sha256'][:16], entry['zeros'], entry['nonfinite'],
                      entry['block_size_invariant'], entry['num_warps_invariant'], entry['rerun_equal'],
                      entry['div_full_model_differs'], entry['ieee_model_differs'], entry['autotuned_config']))
            if a.fp4lab:
                xp, yp = os.path.join(d, 'x.npy'), os.path.join(d, 'y.npy')
                npyio.write_raw(xp, '<f4', (rows, cols), xb)
                if os.path.exists(yp):
                    os.remove(yp)
                r = subprocess.run([a.fp4lab, 'quantize', '--quantizer', quantizer_arg(c['quantizer']), xp,
                                    '--dequant', yp], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   universal_newlines=True)
                if r.returncode != 0:
                    agree[c['name']] = 'fp4lab exited %d: %s' % (r.returncode, r.stderr.strip()[:300])
                else:
                    got = npyio.read_npy(yp)[2]
                    agree[c['name']] = True if got == yb else '%d of %d elements differ' % (
                        differing(got, yb), rows * cols)
    out['ptx_ops'] = ptx_ops(ptx) if ptx else None
    if ptx and a.ptx:
        with open(a.ptx, 'w') as f:
            f.write(ptx)
    with open(a.out, 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print('ptx ops (BLOCK_SIZE %d): %s' % (BLOCK_SIZES[0], json.dumps(out['ptx_ops'])))
    for name, v in agree.items():
        print('fp4lab %s: %s' % (name, 'agrees' if v is True else v))
    print('quartet2 %s, torch %s, triton %s, %s (sm_%d%d): %d cases%s' % (
        commit[:12], torch.__version__, triton.__version__, dev_name, cap[0], cap[1], len(out['cases']),
        ', fp4lab differs in %d' % sum(1 for v in agree.values() if v is not True) if a.fp4lab else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
