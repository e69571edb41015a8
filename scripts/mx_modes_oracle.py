#!/usr/bin/env python3
"""torchao's own `to_mx` as the oracle of fp4lab's scale rules torchao_floor, torchao_ceil, torchao_even and
torchao_rceil (schemes/mx_scale_modes/scalar.hpp).

Runs, on the inputs of tests/cli/mx_modes_cases.py, torchao's to_mx (torchao/prototype/mx_formats/mx_tensor.py
of a checkout of github.com/pytorch/ao) with block_size 32 and ScaleCalculationMode FLOOR / CEIL / EVEN / RCEIL
for each element dtype, on the CPU and on the GPU, and writes JSON with the torchao commit, torch's version, the
devices, each input's SHA-256 and, per case and device, the SHA-256 of the element codes (one byte per element,
row-major, as `fp4lab quantize --codes` writes them: FP8 bytes, torchao's unpacked FP6 bytes, FP4 nibbles
unpacked from torchao's packing, the even element in the low nibble) and of the E8M0 scale bytes.
tests/data/mx_modes_oracle.json is this output. With --fp4lab BINARY it also runs `fp4lab quantize` and prints,
per case, whether it agrees.

torchao is not imported as a package (its __init__ and mx_formats/kernels.py pull in triton, C++/CUDA
extensions and DTensor machinery): the oracle parses the checkout's files and executes only torchao's own
source of the functions that to_mx's eager path calls, unchanged, in a namespace holding what they reference:
  mx_tensor.py       to_mx, _to_mx_rceil, _f32_to_e8m0_rceil, _e8m0_scale_to_reciprocal_fp32, its module
                     constants (SBITS, EBITS_*/MBITS_*, _TORCH_VERSION_AT_LEAST_2_13/_2_14)
  constants.py       the whole module (imports torch only)
  config.py          class ScaleCalculationMode (without its pytree-registration decorator)
  kernels.py         f32_to_f4_unpacked, f32_to_f6_e2m3_unpacked, f32_to_f6_e3m2_unpacked, pack_uint4,
                     down_size and its module constants
  custom_fp_utils.py the whole module (torchao/prototype/, imports torch only)
  utils.py           torch_version_at_least, parse_version, is_fbcode, is_sm_at_least_100
Names that only to_mx's branches not taken here use (swizzled scales; inline PTX under torch.compile on
sm_100) are stubs that raise. Every free name of the extracted functions is checked to be defined.

to_mx needs the last dimension to be a multiple of 32: inputs with a partial last block are padded with zero
columns and the padding's codes dropped (mx_modes_cases.py's docstring).

Needs torch (>= 2.10, torchao's floor; float4_e2m1fn_x2 and float8_e8m0fnu); no NumPy, no torchao install.
Usage (from the repository root):
  python3 scripts/mx_modes_oracle.py --torchao PATH_TO_AO_CHECKOUT [--torchao-commit SHA] \
      [--fp4lab build/apps/fp4lab] --out oracle.json
The checkout may be the few files above under their repository paths (.oracle/torchao/, with a file COMMIT
holding the commit, is such an export).
"""
import argparse
import ast
import builtins
import enum
import hashlib
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import typing

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'cli'))
import mx_modes_cases  # noqa: E402
import npyio  # noqa: E402

FILES = {
    'mx_tensor': 'torchao/prototype/mx_formats/mx_tensor.py',
    'constants': 'torchao/prototype/mx_formats/constants.py',
    'config': 'torchao/prototype/mx_formats/config.py',
    'kernels': 'torchao/prototype/mx_formats/kernels.py',
    'custom_fp_utils': 'torchao/prototype/custom_fp_utils.py',
    'utils': 'torchao/utils.py',
}
MX_FUNCTIONS = ['to_mx', '_to_mx_rceil', '_f32_to_e8m0_rceil', '_e8m0_scale_to_reciprocal_fp32']
MX_CONSTANTS = ['SBITS', 'EBITS_F32', 'MBITS_F32', 'EBITS_F4_E2M1', 'MBITS_F4_E2M1', 'EBITS_F6_E2M3',
                'MBITS_F6_E2M3', 'EBITS_F6_E3M2', 'MBITS_F6_E3M2', 'EBITS_F8_E4M3', 'MBITS_F8_E4M3', 'EBITS_F8_E5M2',
                'MBITS_F8_E5M2', '_TORCH_VERSION_AT_LEAST_2_13', '_TORCH_VERSION_AT_LEAST_2_14']
KERNEL_FUNCTIONS = ['f32_to_f4_unpacked', 'f32_to_f6_e2m3_unpacked', 'f32_to_f6_e3m2_unpacked', 'pack_uint4',
                    'down_size']
KERNEL_CONSTANTS = ['EBITS_F32', 'MBITS_F32', 'EBITS_F4_E2M1', 'MBITS_F4_E2M1', 'EBITS_F6_E2M3', 'MBITS_F6_E2M3',
                    'EBITS_F6_E3M2', 'MBITS_F6_E3M2']
UTILS_FUNCTIONS = ['parse_version', 'is_fbcode', 'torch_version_at_least', 'is_sm_at_least_100']


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _assigned(node):
    return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def extract(path, names, g, strip_decorators=()):
    """Execute, in namespace g, the top-level definitions (functions, classes) and assignments of the file at
    path whose names are in `names`, in file order, from the file's own source. Returns the nodes executed."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    want, body, found = set(names), [], set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in want:
            if node.name in strip_decorators:
                node.decorator_list = []
            body.append(node)
            found.add(node.name)
        elif isinstance(node, ast.Assign) and _assigned(node) and _assigned(node) <= want:
            body.append(node)
            found |= _assigned(node)
    if want - found:
        raise RuntimeError('%s: not found at top level: %s' % (path, ', '.join(sorted(want - found))))
    exec(compile(ast.Module(body=body, type_ignores=[]), path, 'exec'), g)
    return body


def free_names(fn):
    """The names a function definition reads that it does not bind itself (parameters, assignments)."""
    bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    loads = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.Lambda)) and n is not fn:
            bound |= {a.arg for a in ast.walk(n.args) if isinstance(a, ast.arg)}
    return loads - bound


def _unavailable(name):
    def stub(*a, **k):
        raise RuntimeError('%s: not loaded by scripts/mx_modes_oracle.py (a to_mx branch it does not take)' % name)
    return stub


def load_to_mx(root):
    """(to_mx, ScaleCalculationMode, constants module) from torchao's own source under root."""
    p = {k: os.path.join(root, v) for k, v in FILES.items()}
    constants = load_module(p['constants'], 'torchao_prototype_mx_formats_constants')
    cfu = load_module(p['custom_fp_utils'], 'torchao_prototype_custom_fp_utils')

    gu = {'__name__': 'torchao.utils', '__builtins__': builtins, 'torch': torch, 're': re}
    extract(p['utils'], UTILS_FUNCTIONS, gu)

    gc = {'__name__': 'torchao.prototype.mx_formats.config', '__builtins__': builtins, 'torch': torch,
          'Enum': enum.Enum}
    extract(p['config'], ['ScaleCalculationMode'], gc, strip_decorators=('ScaleCalculationMode',))

    gk = {'__name__': 'torchao.prototype.mx_formats.kernels', '__builtins__': builtins, 'torch': torch,
          'Optional': typing.Optional, 'Tuple': typing.Tuple,
          '_f32_to_floatx_unpacked': cfu._f32_to_floatx_unpacked}
    kernel_nodes = extract(p['kernels'], KERNEL_FUNCTIONS + KERNEL_CONSTANTS, gk)

    from torch._subclasses.fake_tensor import is_fake
    importlib.import_module('torch._dynamo')  # to_mx reads torch._dynamo.is_compiling(); torchao's imports load it
    g = {'__name__': 'torchao.prototype.mx_formats.mx_tensor', '__builtins__': builtins, 'torch': torch,
         'math': math, 'Union': typing.Union, 'Optional': typing.Optional, 'is_fake': is_fake,
         'F': torch.nn.functional, 'ScaleCalculationMode': gc['ScaleCalculationMode'],
         'torch_version_at_least': gu['torch_version_at_least'], 'is_sm_at_least_100': gu['is_sm_at_least_100']}
    g.update({k: getattr(constants, k) for k in dir(constants) if k.isupper()})
    g.update({k: gk[k] for k in KERNEL_FUNCTIONS})
    for name in ('to_blocked', 'hp_data_dims_to_swizzled_scale_dims_mx', 'from_blocked', 'triton_to_mxfp8_dim0',
                 'inline_asm_elementwise'):
        g[name] = _unavailable(name)
    if gu['torch_version_at_least']('2.12.0.dev0'):  # as mx_tensor.py imports it
        try:
            from torch._higher_order_ops.inline_asm_elementwise import inline_asm_elementwise
            g['inline_asm_elementwise'] = inline_asm_elementwise
        except ImportError:
            pass
    mx_nodes = extract(p['mx_tensor'], MX_FUNCTIONS + MX_CONSTANTS, g)

    missing = []
    for ns, nodes in ((g, mx_nodes), (gk, kernel_nodes)):
        for node in nodes:
            if isinstance(node, ast.FunctionDef):
                missing += ['%s: %s' % (node.name, n) for n in sorted(free_names(node))
                            if n not in ns and not hasattr(builtins, n)]
    if missing:
        raise RuntimeError('names the extracted torchao functions read but the oracle does not define: '
                           + ', '.join(missing))
    return g['to_mx'], gc['ScaleCalculationMode'], constants


def elem_dtypes(constants):
    return {'e2m1': torch.float4_e2m1fn_x2, 'e2m3': constants.DTYPE_FP6_E2M3, 'e3m2': constants.DTYPE_FP6_E3M2,
            'e4m3': torch.float8_e4m3fn, 'e5m2': torch.float8_e5m2}


def run_case(to_mx, mode, dtype, elem, x_bytes, rows, cols, dev):
    """(codes bytes, scale bytes) of torchao's to_mx on the input, as fp4lab's --codes / --scales lay them."""
    block = mx_modes_cases.BLOCK
    x = torch.frombuffer(bytearray(x_bytes), dtype=torch.float32).reshape(rows, cols).clone()
    pad = (-cols) % block
    if pad:
        x = torch.cat([x, torch.zeros(rows, pad, dtype=torch.float32)], dim=1)
    x = x.contiguous().to(dev)
    scale, data = to_mx(x, dtype, block, mode)
    s = scale.contiguous().view(torch.uint8).cpu().reshape(rows, (cols + pad) // block)
    d = data.contiguous().cpu()
    if d.dtype != torch.uint8:
        d = d.view(torch.uint8)
    d = d.reshape(rows, -1)
    if elem == 'e2m1':  # torchao's pack_uint4: element 2i in the low nibble, 2i+1 in the high nibble
        d = torch.stack([d & 0xF, d >> 4], dim=-1).reshape(rows, -1)
    assert d.shape == (rows, cols + pad), (elem, tuple(d.shape))
    codes = bytes(d[:, :cols].contiguous().reshape(-1).tolist())
    return codes, bytes(s.reshape(-1).tolist())


def fp4lab_digests(binary, case, xp, d):
    cp, sp = os.path.join(d, 'c.npy'), os.path.join(d, 's.npy')
    subprocess.run([binary, 'quantize', '--quantizer', json.dumps(case['quantizer']), xp, '--dequant',
                    os.path.join(d, 'y.npy'), '--codes', cp, '--scales', sp], check=True, stderr=subprocess.DEVNULL)
    return (mx_modes_cases.digest_bytes(npyio.read_npy(cp)[2]),
            mx_modes_cases.digest_bytes(npyio.read_npy(sp)[2]))


def cpu_name():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--torchao', required=True, help='a pytorch/ao checkout (or the export of the files above)')
    ap.add_argument('--torchao-commit', help='default: the checkout\'s COMMIT file, else git rev-parse HEAD')
    ap.add_argument('--fp4lab')
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    commit = a.torchao_commit
    if not commit and os.path.exists(os.path.join(a.torchao, 'COMMIT')):
        commit = open(os.path.join(a.torchao, 'COMMIT')).read().strip()
    if not commit:
        r = subprocess.run(['git', '-C', a.torchao, 'rev-parse', 'HEAD'], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True)
        commit = r.stdout.strip() if r.returncode == 0 else 'unknown'
    to_mx, Mode, constants = load_to_mx(a.torchao)
    dtypes = elem_dtypes(constants)
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    names = {'cpu': cpu_name()}
    if 'cuda' in devices:
        names['cuda'] = '%s (sm_%d%d, CUDA %s)' % ((torch.cuda.get_device_name(0),)
                                                  + torch.cuda.get_device_capability(0) + (torch.version.cuda,))
    files = {}
    for rel in FILES.values():
        with open(os.path.join(a.torchao, rel), 'rb') as f:
            files[rel] = hashlib.sha256(f.read()).hexdigest()
    inputs = mx_modes_cases.inputs()
    out = {'torchao': {'commit': commit, 'files': files, 'functions': MX_FUNCTIONS + KERNEL_FUNCTIONS},
           'torch': torch.__version__, 'python': platform.python_version(), 'devices': devices,
           'device_names': names,
           'inputs': {k: mx_modes_cases.digest_input(v[2]) for k, v in inputs.items()},
           'layout': 'codes: one byte per element, row-major [rows, cols] (FP4 nibbles unpacked, even element from '
                     'the low nibble); scales: E8M0 bytes [rows, ceil(cols/32)]; inputs with cols % 32 != 0 '
                     'padded with zero columns for to_mx, the padding\'s codes dropped',
           'cases': {}}
    agree = {}
    with tempfile.TemporaryDirectory() as d:
        written = set()
        for c in mx_modes_cases.cases():
            rows, cols, vals = inputs[c['input']]
            xb = mx_modes_cases.f32_bytes(vals)
            entry = {}
            for dev in devices:
                try:
                    codes, scales = run_case(to_mx, Mode[c['mode'].upper()], dtypes[c['element']], c['element'], xb,
                                             rows, cols, dev)
                    entry[dev] = {'codes': mx_modes_cases.digest_bytes(codes),
                                  'scales': mx_modes_cases.digest_bytes(scales)}
                except Exception as e:  # noqa: BLE001 (recorded; the test skips such a case)
                    entry[dev] = {'error': '%s: %s' % (type(e).__name__, str(e).splitlines()[0] if str(e) else '')}
                    print('%s on %s: %s' % (c['name'], dev, entry[dev]['error']), file=sys.stderr)
            out['cases'][c['name']] = entry
            if a.fp4lab:
                xp = os.path.join(d, c['input'] + '.npy')
                if c['input'] not in written:
                    npyio.write_raw(xp, '<f4', (rows, cols), xb)
                    written.add(c['input'])
                got = fp4lab_digests(a.fp4lab, c, xp, d)
                agree[c['name']] = {dev: (None, None) if 'error' in entry[dev] else
                                    (got[0] == entry[dev]['codes'], got[1] == entry[dev]['scales'])
                                    for dev in devices}
    with open(a.out, 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    differ = 0
    for name, v in agree.items():
        print(name, ' '.join('%s codes %s scales %s' % (dev, *v[dev]) for dev in devices))
        differ += any(x is not True for dev in devices for x in v[dev])
    cpu_cuda = sum(1 for e in out['cases'].values() if len(devices) == 2 and e['cpu'] != e['cuda'])
    errors = sum(1 for e in out['cases'].values() for r in e.values() if 'error' in r)
    print('torchao %s, torch %s, %s: %d cases, %d with cpu != cuda, %d to_mx errors%s' % (
        commit[:12], torch.__version__, ', '.join(names[dv] for dv in devices), len(out['cases']), cpu_cuda, errors,
        ', %d where fp4lab differs' % differ if a.fp4lab else ''))
    return 0


if __name__ == '__main__':
    sys.exit(main())
