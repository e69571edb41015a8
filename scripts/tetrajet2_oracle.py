#!/usr/bin/env python3
"""TetraJet-v2's own Triton baseline NVFP4 double-scale fake quantizer as the oracle of fp4lab's
emulate tetrajet2_triton (quantizer {"element":"e2m1","scale":"ue4m3","block":[1,16],"scale_rule":"nv",
"global_scale":"none","round":"rn","overflow":"saturate","emulate":"tetrajet2_triton"}).

Runs, on the inputs of tests/cli/tetrajet2_cases.py (float32, cols % 128 == 0), the round-to-nearest kernel
`_E2M1_DoubleScale_fake_quantize_fused_kernel` of thu-ml/TetraJet-v2-NVFP4Training
(kernels/baseline_fakequant/nvfp4_quant_fused_kernel.py) through that repository's own launcher
`nvfp4_double_quantize_fused(x)` (kernels/baseline_fakequant/nvfp4_quant_fused.py: stochastic=False,
blocksize_outer 128, blocksize_inner 16, grid (cdiv(numel, 128),), no autotune, Triton's default launch options),
on CUDA float32 tensors, and writes JSON with the TetraJet commit, the SHA-256 of the two kernel files, the torch,
triton and CUDA versions, the device and its capability, each input's SHA-256 and, per case, the SHA-256 of the
float32 output bytes (row-major [rows, cols], as `fp4lab quantize --dequant` writes them), the number of output
elements equal to zero (+0 and -0), the number not finite, and the bits of the first 8 outputs (hex).
tests/data/tetrajet2_oracle.json is this output.

The kernel's reductions are tl.max over a 1x128 and 1x16 blocks: exact and order-free on finite inputs, so the
launch's num_warps cannot change a bit; the oracle checks that by launching the jitted kernel itself with
num_warps 1, 2, 4 and 8 beside the launcher and records per case whether all agree ("num_warps_invariant").
It also records, per case, how many outputs differ from an IEEE float32 model of the kernel run in torch on the
CPU (correctly rounded division, torch's log2, a saturating RNE cast to float8_e4m3fn): a diagnostic of where
Triton's div.full.f32 / approximate log2 / exp2 matter, not part of the oracle.

With --npy-dir DIR it writes, per case, DIR/<case>.in.npy (the input), DIR/<case>.out.npy (the kernel's float32
output), DIR/<case>.ieee.npy (the IEEE model's) and DIR/<case>.scale_only.npy (TetraJet's
_DoubleScale_NVQuant_ScaleOnly_kernel: sp = s * sg per element; it replaces an E4M3 scale of 0 by 2^-9, which
the round-to-nearest kernel does not), so that a mismatch can be diagnosed elsewhere. With --fp4lab BINARY it
also runs `fp4lab quantize --quantizer <json> IN.npy --dequant OUT.npy` and prints, per case, whether it agrees
and, if not, how many elements differ.

The kernel files are loaded by path (importlib), not as a package: TetraJet is not installed. Needs torch and
triton and a CUDA GPU of capability >= 8.9 (the kernel casts to float8e4nv); no NumPy.
Usage (from the repository root):
  python3 scripts/tetrajet2_oracle.py --tetrajet .oracle/tetrajet2 [--tetrajet-commit SHA] \
      [--fp4lab build/apps/fp4lab] [--npy-dir DIR] --out tetrajet2_oracle.json
The checkout may be the kernel files under their repository paths (.oracle/tetrajet2/, with a file COMMIT
holding the commit, is such an export).
"""
import argparse
import hashlib
import importlib.util
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'cli'))
import npyio  # noqa: E402
import tetrajet2_cases  # noqa: E402

KERNEL_DIR = 'kernels/baseline_fakequant'
FILES = [KERNEL_DIR + '/nvfp4_quant_fused_kernel.py', KERNEL_DIR + '/nvfp4_quant_fused.py']
KERNEL = '_E2M1_DoubleScale_fake_quantize_fused_kernel'
NUM_WARPS = (1, 2, 4, 8)


def quantizer_arg(q):
    """The --quantizer argument: a canned name as is, an object as JSON."""
    return q if isinstance(q, str) else json.dumps(q)


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m  # Triton's JIT reads the defining module (globals, source) of the kernels
    spec.loader.exec_module(m)
    return m


def load_tetrajet(root):
    """(launcher module, kernel module) from TetraJet's own files under root. The launcher's
    `from .nvfp4_quant_fused_kernel import ...` fails outside a package and falls back to
    `from nvfp4_quant_fused_kernel import ...`: the kernel module is registered under that name first, so the
    launcher calls exactly the jitted functions loaded here."""
    d = os.path.join(root, KERNEL_DIR)
    kern = load_module(os.path.join(d, 'nvfp4_quant_fused_kernel.py'), 'nvfp4_quant_fused_kernel')
    launcher = load_module(os.path.join(d, 'nvfp4_quant_fused.py'), 'nvfp4_quant_fused')
    assert getattr(launcher, KERNEL) is getattr(kern, KERNEL)
    return launcher, kern


def to_bytes(t):
    return bytes(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).tolist())


def run_launcher(launcher, x):
    y = launcher.nvfp4_double_quantize_fused(x, quantize_enabled=True, stochastic=False)
    torch.cuda.synchronize()
    return y


def run_direct(kern, x, num_warps):
    """The launcher's call with num_warps given explicitly."""
    y = torch.empty_like(x)
    n = x.numel()
    getattr(kern, KERNEL)[(triton.cdiv(n, 128),)](x, y, n, 128, 16, num_warps=num_warps)
    torch.cuda.synchronize()
    return y


def ieee_model(x):
    """The kernel's arithmetic in float32 on the CPU with IEEE division (a diagnostic; see the docstring)."""
    x = x.detach().cpu().float().reshape(-1, 128)
    sign = torch.where(torch.signbit(x), -1.0, 1.0)
    xa = x.abs()
    sg = xa.amax(dim=1, keepdim=True) / 448.0 / 6.0
    sg = torch.where(sg == 0, torch.ones_like(sg), sg).unsqueeze(-1)
    xb = xa.reshape(-1, 8, 16)
    sb = xb.amax(dim=2, keepdim=True) / sg / 6.0
    sb = sb.clamp(max=448.0).to(torch.float8_e4m3fn).to(torch.float32)
    sp = sb * sg
    q = torch.where(sp == 0, torch.zeros_like(xb), xb / sp)
    expo = torch.floor(torch.log2(q)).clamp(0, 2)
    mant = q / torch.exp2(expo)
    mi = torch.floor(mant)
    mf = torch.round((mant - mi) * 2.0)  # round half to even, as rint
    y = torch.exp2(expo) * (mi + mf / 2.0)
    y = y.clamp(0, 6) * sp
    return (y.reshape(-1, 128) * sign).reshape(-1)


def summary(b):
    n = len(b) // 4
    vals = struct.unpack('<%df' % n, b)
    words = struct.unpack('<%dI' % n, b)
    return {'sha256': tetrajet2_cases.digest_bytes(b),
            'zeros': sum(1 for v in vals if v == 0.0),
            'nonfinite': sum(1 for w in words if (w & 0x7F800000) == 0x7F800000),
            'first8': ['%08x' % w for w in words[:8]]}


def differing(a, b):
    n = min(len(a), len(b)) // 4
    wa, wb = struct.unpack('<%dI' % n, a[:4 * n]), struct.unpack('<%dI' % n, b[:4 * n])
    return sum(1 for u, v in zip(wa, wb) if u != v) + abs(len(a) - len(b)) // 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--tetrajet', required=True, help='a TetraJet-v2-NVFP4Training checkout (or the export above)')
    ap.add_argument('--tetrajet-commit', help='default: the checkout\'s COMMIT file, else git rev-parse HEAD')
    ap.add_argument('--fp4lab')
    ap.add_argument('--npy-dir')
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    commit = a.tetrajet_commit
    if not commit and os.path.exists(os.path.join(a.tetrajet, 'COMMIT')):
        commit = open(os.path.join(a.tetrajet, 'COMMIT')).read().strip()
    if not commit:
        r = subprocess.run(['git', '-C', a.tetrajet, 'rev-parse', 'HEAD'], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True)
        commit = r.stdout.strip() if r.returncode == 0 else 'unknown'
    if not torch.cuda.is_available():
        print('tetrajet2_oracle: no CUDA device', file=sys.stderr)
        return 2
    launcher, kern = load_tetrajet(a.tetrajet)
    files = {}
    for rel in FILES:
        with open(os.path.join(a.tetrajet, rel), 'rb') as f:
            files[rel] = hashlib.sha256(f.read()).hexdigest()
    cap = torch.cuda.get_device_capability(0)
    dev_name = torch.cuda.get_device_name(0)
    if a.npy_dir:
        os.makedirs(a.npy_dir, exist_ok=True)
    inputs = tetrajet2_cases.inputs()
    out = {'tetrajet': {'commit': commit, 'files': files, 'kernel': KERNEL,
                        'launcher': 'nvfp4_double_quantize_fused(x, quantize_enabled=True, stochastic=False)'},
           'torch': torch.__version__, 'triton': triton.__version__, 'cuda': torch.version.cuda,
           'python': platform.python_version(),
           'device': {'name': dev_name, 'capability': 'sm_%d%d' % cap},
           'quantizer': tetrajet2_cases.QUANTIZER,
           'launch': {'grid': 'cdiv(numel, 128)', 'BLOCKSIZE_outer': 128, 'BLOCKSIZE_inner': 16,
                      'autotune': False, 'num_warps_checked': list(NUM_WARPS)},
           'inputs': {k: tetrajet2_cases.digest_input(v[2]) for k, v in inputs.items()},
           'layout': 'float32 output of the kernel, little-endian, row-major [rows, cols] (= the input\'s shape); '
                     'zeros counts +0 and -0; first8: the bits of the first 8 outputs',
           'cases': {}}
    agree = {}
    with tempfile.TemporaryDirectory() as d:
        for c in tetrajet2_cases.cases():
            rows, cols, vals = inputs[c['input']]
            xb = tetrajet2_cases.f32_bytes(vals)
            xc = torch.frombuffer(bytearray(xb), dtype=torch.float32).reshape(rows, cols).clone()
            x = xc.cuda()
            y = run_launcher(launcher, x)
            assert y.dtype == torch.float32 and tuple(y.shape) == (rows, cols), (y.dtype, tuple(y.shape))
            yb = to_bytes(y)
            entry = summary(yb)
            entry['num_warps_invariant'] = all(to_bytes(run_direct(kern, x, w)) == yb for w in NUM_WARPS)
            entry['rerun_equal'] = to_bytes(run_launcher(launcher, x)) == yb
            ib = to_bytes(ieee_model(xc))
            entry['ieee_model_differs'] = differing(yb, ib)
            out['cases'][c['name']] = entry
            if a.npy_dir:
                base = os.path.join(a.npy_dir, c['name'])
                npyio.write_raw(base + '.in.npy', '<f4', (rows, cols), xb)
                npyio.write_raw(base + '.out.npy', '<f4', (rows, cols), yb)
                npyio.write_raw(base + '.ieee.npy', '<f4', (rows, cols), ib)
                npyio.write_raw(base + '.scale_only.npy', '<f4', (rows, cols), to_bytes(launcher.nvfp4_scale_only(x)))
            print('%s: %s zeros %d nonfinite %d num_warps_invariant %s rerun_equal %s ieee_model_differs %d' % (
                c['name'], entry['sha256'][:16], entry['zeros'], entry['nonfinite'], entry['num_warps_invariant'],
                entry['rerun_equal'], entry['ieee_model_differs']))
            if a.fp4lab:
                xp, yp = os.path.join(d, 'x.npy'), os.path.join(d, 'y.npy')
                npyio.write_raw(xp, '<f4', (rows, cols), xb)
                r = subprocess.run([a.fp4lab, 'quantize', '--quantizer', quantizer_arg(c['quantizer']), xp, '--dequant',
                                    yp], stderr=subprocess.PIPE, universal_newlines=True)
                if r.returncode != 0:
                    agree[c['name']] = 'fp4lab exited %d: %s' % (r.returncode, r.stderr.strip()[:300])
                else:
                    got = npyio.read_npy(yp)[2]
                    agree[c['name']] = True if got == yb else '%d of %d elements differ' % (
                        differing(got, yb), rows * cols)
    with open(a.out, 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    for name, v in agree.items():
        print('fp4lab %s: %s' % (name, 'agrees' if v is True else v))
    print('tetrajet %s, torch %s, triton %s, %s (sm_%d%d): %d cases%s' % (
        commit[:12], torch.__version__, triton.__version__, dev_name, cap[0], cap[1], len(out['cases']),
        ', fp4lab differs in %d' % sum(1 for v in agree.values() if v is not True) if a.fp4lab else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
