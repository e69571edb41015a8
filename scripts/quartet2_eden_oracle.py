#!/usr/bin/env python3
"""Quartet II's own Triton backward MS-EDEN quantizer as the oracle of fp4lab's emulate quartet2_eden_triton
(quantizer {"element":"e2m1","scale":"e4m3","block":[1,16],"scale_rule":"nv","global_scale":"tensor_amax",
"round":"rna","overflow":"saturate","emulate":"quartet2_eden_triton"}, with "rht":true,"rht_kind":"quartet2_128",
"rht_seed":RS for the cases with the 128-point rotation).

Runs, on the inputs of tests/cli/quartet2_eden_cases.py (bf16 values, cols % 128 == 0), the kernel
`eden_1x16s_fp4_kernel` of IST-DASLab/Quartet-II (src/models/quantization/schemes/quartet_2.py) with the launch of
its wrapper `eden_1x16s_fp4_kernel_wrapper` (grid cdiv(numel, BLOCK_SIZE), hadamard_dim 128, group_size 16,
scale_override Quartet_II_fn.backward_scale_override = (17 / 16) * 0.93, next_amax zeros) but through the
autotuner's jitted function (.fn) with BLOCK_SIZE 2048 and num_warps 4 pinned, the case's seed (the wrapper draws
randint(0, 1000000)), and, for hadamard_matrix, the matrix the wrapper would pass: Hk = (H @ diag(d)).T in bf16,
H = get_hadamard_matrix(128, float32) (scipy's hadamard(128) / sqrt(128)), d fp4lab's 128 signs of the case's
rht_seed (rerotate_hadamard's product with these signs in place of its torch.randint draw; `.to(bfloat16)` as
Quartet_II_fn.backward; the wrapper's .T.contiguous()), checked equal to quartet2_eden_cases.kernel_matrix; or the
bf16 identity for the cases without a rotation. current_amax is max |x @ Hk| computed exactly on the host and
rounded to FP32 (what fp4lab's tensor_amax sees; Quartet II computes it in torch, or carries it over from the
previous step). x is a CUDA bfloat16 tensor, so the output is bfloat16.

It writes JSON with the Quartet II commit, the SHA-256 of the two peer files, the torch, triton and CUDA versions,
the device and its capability, each input's SHA-256 and, per case, the SHA-256 of the output's bf16 bit patterns
(little-endian uint16, row-major [rows, cols]: the bytes tests/cli/test_quartet2_eden.py hashes after rounding
fp4lab's float32 dequant to bf16), the number of outputs equal to zero (+0 and -0), the number not finite, the
bits of the first 8 outputs (hex), the seed, rht_seed, quantizer and FP32 amax of the case, and the kernel's
next_amax (its atomic max of |x @ Hk|: equal to the amax where the tensor core's sums are exact).
tests/data/quartet2_eden_oracle.json is this output.

The output may depend on the launch: the EDEN sums over each 128-chunk are tl.sum reductions in an order Triton
picks from the layout. The oracle checks that by launching, per case, with BLOCK_SIZE 4096, 8192 and 16384 (the
autotuner's other configs; num_warps 4) and with num_warps 2 and 8 (BLOCK_SIZE 2048), and again with the pinned
launch, and records per case how many outputs each launch changes ("launch_differs") and whether all agree
("block_size_invariant", "num_warps_invariant", "rerun_equal"). The SR draw, tl.rand(seed, group index over the
tensor), does not depend on the launch. From the PTX of the pinned launch (last case) it records a count of each
arithmetic instruction (div / rcp / cvt / mul / fma / ...); --ptx FILE saves it.

With --npy-dir DIR it writes, per case, DIR/<case>.in.npy (the input, float32) and DIR/<case>.out.npy (the
kernel's output, bf16 bit patterns as uint16), and with --fp4lab also DIR/<case>.fp4lab.npy (fp4lab's float32
dequant). With --fp4lab BINARY it runs `fp4lab quantize IN.npy --quantizer <json> --dequant OUT.npy --seed <seed>
--stream 0` per case, rounds the dequant to bf16 (nearest even) and prints whether it agrees and, if not, how many
elements differ and the first few.

The two peer files are loaded by path (importlib), not as a package: Quartet II is not installed.
nvfp4_triton.py (torch, triton, random) is registered as models.quantization.quantizers.nvfp4_triton, the module
quartet_2.py imports from; quartet_2.py also needs scipy. Needs torch and triton and a CUDA GPU of capability
>= 8.9 (the kernel casts to float8e4nv); no NumPy.
Usage (from the repository root):
  python3 scripts/quartet2_eden_oracle.py --quartet .oracle/quartet2 [--quartet-commit SHA] \
      [--fp4lab build/apps/fp4lab] [--npy-dir DIR] [--ptx FILE] --out quartet2_eden_oracle.json
The checkout may be the two files under their repository paths (.oracle/quartet2/, with a file COMMIT holding the
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
import quartet2_eden_cases as qcases  # noqa: E402

NVFP4_FILE = 'src/models/quantization/quantizers/nvfp4_triton.py'
NVFP4_MODULE = 'models.quantization.quantizers.nvfp4_triton'
SCHEME_FILE = 'src/models/quantization/schemes/quartet_2.py'
SCHEME_MODULE = 'models.quantization.schemes.quartet_2'
KERNEL = 'eden_1x16s_fp4_kernel'
PINNED = (2048, 4)  # BLOCK_SIZE, num_warps
VARIANTS = ((4096, 4), (8192, 4), (16384, 4), (2048, 2), (2048, 8))
PTX_OPS = re.compile(r'^\s*(?:@%p\d+\s+)?((?:div|rcp|sqrt|cvt|mul|fma|add|sub|max|min|abs|neg|setp|selp|ex2|lg2)'
                     r'(?:\.[a-z0-9]+)*)\s', re.M)
SHOW = 5  # differing elements printed per case


def quantizer_arg(q):
    """The --quantizer argument: a canned name as is, an object as JSON."""
    return q if isinstance(q, str) else json.dumps(q)


def load_module(name, path):
    """The module of the file at path, registered in sys.modules as name (Triton's JIT reads the defining
    module's globals and source; quartet_2.py imports nvfp4_triton by its package name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


def load_quartet(root):
    load_module(NVFP4_MODULE, os.path.join(root, NVFP4_FILE))
    return load_module(SCHEME_MODULE, os.path.join(root, SCHEME_FILE))


def to_bytes(t):
    return bytes(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).tolist())


def kernel_matrix(m, rht_seed):
    """The bf16 hadamard_matrix argument (see the docstring), checked against the cases module's."""
    if rht_seed is None:
        hk = torch.eye(qcases.CHUNK, dtype=torch.bfloat16, device='cuda')
    else:
        h = m.get_hadamard_matrix(qcases.CHUNK, torch.float32, torch.device('cuda'))
        d = torch.tensor(qcases.signs(rht_seed), dtype=torch.float32, device='cuda')
        hk = (h @ torch.diag(d)).to(torch.bfloat16).T.contiguous()
    want = torch.tensor(qcases.kernel_matrix(rht_seed), dtype=torch.float32).to(torch.bfloat16)
    assert to_bytes(hk) == to_bytes(want), 'the peer\'s matrix for rht_seed %r is not kernel_matrix\'s' % rht_seed
    return hk


def run_direct(m, x, hk, amax, seed, scale_override, block, num_warps):
    """The wrapper's launch with the autotuner bypassed and the seed given. Returns (output, next_amax, the
    compiled kernel)."""
    y = torch.empty_like(x)
    nxt = torch.zeros_like(amax)
    n = x.numel()
    k = getattr(m, KERNEL).fn[(triton.cdiv(n, block),)](
        x_ptr=x, hadamard_matrix_ptr=hk, current_amax_ptr=amax, output_ptr=y, next_amax_ptr=nxt, n_elements=n,
        hadamard_dim=qcases.CHUNK, scale_override=scale_override, group_size=qcases.INNER, seed=seed,
        BLOCK_SIZE=block, num_warps=num_warps)
    torch.cuda.synchronize()
    return y, nxt, k


def ptx_of(k):
    asm = getattr(k, 'asm', None)
    try:
        return asm['ptx'] if asm is not None else None
    except (KeyError, TypeError):
        return None


def ptx_ops(ptx):
    return dict(sorted(collections.Counter(PTX_OPS.findall(ptx)).items()))


def words16(b):
    return struct.unpack('<%dH' % (len(b) // 2), b)


def summary(b):
    w = words16(b)
    return {'sha256': qcases.digest_bytes(b),
            'zeros': sum(1 for u in w if u & 0x7FFF == 0),
            'nonfinite': sum(1 for u in w if (u & 0x7F80) == 0x7F80),
            'first8': ['%04x' % u for u in w[:8]]}


def differing(a, b):
    """The indices at which the bf16 words of a and b differ (all of them where the lengths differ)."""
    wa, wb = words16(a), words16(b)
    if len(wa) != len(wb):
        return list(range(max(len(wa), len(wb))))
    return [i for i, (u, v) in enumerate(zip(wa, wb)) if u != v]


def bf16_value(u):
    return struct.unpack('<f', struct.pack('<I', u << 16))[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--quartet', required=True, help='a Quartet-II checkout (or the export above)')
    ap.add_argument('--quartet-commit', help='default: the checkout\'s COMMIT file, else git rev-parse HEAD')
    ap.add_argument('--fp4lab')
    ap.add_argument('--npy-dir')
    ap.add_argument('--ptx', help='write the PTX of the pinned launch (last case) here')
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
        print('quartet2_eden_oracle: no CUDA device', file=sys.stderr)
        return 2
    m = load_quartet(a.quartet)
    files = {}
    for f in (NVFP4_FILE, SCHEME_FILE):
        with open(os.path.join(a.quartet, f), 'rb') as fh:
            files[f] = hashlib.sha256(fh.read()).hexdigest()
    scale_override = m.Quartet_II_fn.backward_scale_override
    assert m.Quartet_II_fn.group_size == qcases.INNER, m.Quartet_II_fn.group_size
    assert 6.0 / scale_override == qcases.VAL_MAX, scale_override
    cap = torch.cuda.get_device_capability(0)
    dev_name = torch.cuda.get_device_name(0)
    if a.npy_dir:
        os.makedirs(a.npy_dir, exist_ok=True)
    inputs = qcases.inputs()
    out = {'quartet2': {'commit': commit, 'files': files, 'kernel': KERNEL,
                        'launcher': 'eden_1x16s_fp4_kernel_wrapper\'s launch through %s.fn' % KERNEL},
           'torch': torch.__version__, 'triton': triton.__version__, 'cuda': torch.version.cuda,
           'python': platform.python_version(),
           'device': {'name': dev_name, 'capability': 'sm_%d%d' % cap},
           'launch': {'grid': 'cdiv(numel, BLOCK_SIZE)', 'hadamard_dim': qcases.CHUNK, 'group_size': qcases.INNER,
                      'scale_override': scale_override,
                      'pinned': {'BLOCK_SIZE': PINNED[0], 'num_warps': PINNED[1]},
                      'checked': [{'BLOCK_SIZE': b, 'num_warps': w} for b, w in VARIANTS],
                      'hadamard_matrix': '(get_hadamard_matrix(128, float32) @ diag(signs(rht_seed)))'
                                         '.to(bfloat16).T.contiguous(), or the bf16 identity',
                      'current_amax': 'FP32 [1]: max |x @ hadamard_matrix|, exact, rounded to FP32',
                      'next_amax': 'FP32 [1] zeros'},
           'inputs': {k: qcases.digest_input(v[2]) for k, v in inputs.items()},
           'layout': 'bfloat16 output of the kernel as uint16 bit patterns, little-endian, row-major [rows, cols] '
                     '(= the input\'s shape); zeros counts +0 and -0; first8: the bits of the first 8 outputs; '
                     'amax and next_amax: FP32 bits',
           'cases': {}}
    agree = {}
    ptx = None
    with tempfile.TemporaryDirectory() as d:
        for c in qcases.cases():
            rows, cols, vals = inputs[c['input']]
            xb = qcases.f32_bytes(vals)
            x = torch.frombuffer(bytearray(xb), dtype=torch.float32).reshape(rows, cols).to(torch.bfloat16).cuda()
            assert to_bytes(x.float()) == xb, c['name']  # the input's values are bf16 values
            hk = kernel_matrix(m, c['rht_seed'])
            amax_v = qcases.amax(cols, vals, c['rht_seed'])
            amax = torch.tensor([amax_v], dtype=torch.float32, device='cuda')
            y, nxt, k = run_direct(m, x, hk, amax, c['seed'], scale_override, *PINNED)
            assert y.dtype == torch.bfloat16 and tuple(y.shape) == (rows, cols), (y.dtype, tuple(y.shape))
            yb = to_bytes(y)
            if ptx_of(k):
                ptx = ptx_of(k)
            entry = summary(yb)
            entry.update({'seed': c['seed'], 'rht_seed': c['rht_seed'], 'quantizer': c['quantizer'],
                          'amax': '%08x' % qcases.bits(amax_v), 'next_amax': '%08x' % qcases.bits(nxt.item())})
            entry['next_amax_equal'] = entry['next_amax'] == entry['amax']
            entry['launch_differs'] = {}
            for bs, w in VARIANTS:
                entry['launch_differs']['BLOCK_SIZE=%d,num_warps=%d' % (bs, w)] = len(differing(
                    to_bytes(run_direct(m, x, hk, amax, c['seed'], scale_override, bs, w)[0]), yb))
            entry['block_size_invariant'] = all(n == 0 for (bs, w), n in zip(
                VARIANTS, entry['launch_differs'].values()) if w == PINNED[1])
            entry['num_warps_invariant'] = all(n == 0 for (bs, w), n in zip(
                VARIANTS, entry['launch_differs'].values()) if bs == PINNED[0])
            entry['rerun_equal'] = to_bytes(run_direct(m, x, hk, amax, c['seed'], scale_override, *PINNED)[0]) == yb
            out['cases'][c['name']] = entry
            if a.npy_dir:
                base = os.path.join(a.npy_dir, c['name'])
                npyio.write_raw(base + '.in.npy', '<f4', (rows, cols), xb)
                npyio.write_raw(base + '.out.npy', '<u2', (rows, cols), yb)
            print('%s: %s zeros %d nonfinite %d amax %s next_amax %s launch_differs %s rerun_equal %s' % (
                c['name'], entry['sha256'][:16], entry['zeros'], entry['nonfinite'], entry['amax'],
                entry['next_amax'], json.dumps(entry['launch_differs']), entry['rerun_equal']))
            if a.fp4lab:
                xp, yp = os.path.join(d, 'x.npy'), os.path.join(d, 'y.npy')
                npyio.write_raw(xp, '<f4', (rows, cols), xb)
                if os.path.exists(yp):
                    os.remove(yp)
                r = subprocess.run([a.fp4lab, 'quantize', xp, '--quantizer', quantizer_arg(c['quantizer']),
                                    '--dequant', yp, '--seed', str(c['seed']), '--stream', '0'],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
                if r.returncode != 0:
                    agree[c['name']] = 'fp4lab exited %d: %s' % (r.returncode, r.stderr.strip()[:300])
                    continue
                got = npyio.read_npy(yp)[2]
                if a.npy_dir:
                    npyio.write_raw(base + '.fp4lab.npy', '<f4', (rows, cols), got)
                gb = qcases.bf16_bytes(got)
                diff = differing(gb, yb)
                if not diff:
                    agree[c['name']] = True
                    continue
                gw, yw = words16(gb), words16(yb)
                shown = ['[%d,%d] fp4lab %04x (%g) kernel %04x (%g)' % (
                    i // cols, i % cols, gw[i], bf16_value(gw[i]), yw[i], bf16_value(yw[i]))
                    for i in diff[:SHOW] if i < min(len(gw), len(yw))]
                agree[c['name']] = '%d of %d elements differ: %s' % (len(diff), rows * cols, '; '.join(shown))
    out['ptx_ops'] = ptx_ops(ptx) if ptx else None
    if ptx and a.ptx:
        with open(a.ptx, 'w') as f:
            f.write(ptx)
    with open(a.out, 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print('ptx ops (BLOCK_SIZE %d, num_warps %d): %s' % (PINNED[0], PINNED[1], json.dumps(out['ptx_ops'])))
    for name, v in agree.items():
        print('fp4lab %s: %s' % (name, 'agrees' if v is True else v))
    print('quartet2 %s, torch %s, triton %s, %s (sm_%d%d): %d cases%s' % (
        commit[:12], torch.__version__, triton.__version__, dev_name, cap[0], cap[1], len(out['cases']),
        ', fp4lab differs in %d' % sum(1 for v in agree.values() if v is not True) if a.fp4lab else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
