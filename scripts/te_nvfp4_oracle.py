#!/usr/bin/env python3
"""TransformerEngine's own Python reference NVFP4 quantizer as the oracle of fp4lab's nv rule and of its RHT
with TE's signs (rht_signs "te", rht_output "bf16").

Runs, on the inputs of tests/cli/te_nvfp4_cases.py (BF16 tensors), TE's NVFP4QuantizerRef
(transformer_engine/pytorch/custom_recipes/reference_nvfp4.py of a TE checkout; TE d0067d0da is what this was
written against), on the CPU and on the GPU when there is one, and writes JSON with TE's commit, the SHA-256 of
the TE files it executed, torch's version, the devices and their names, each input's SHA-256, each case's chunk
spread, and, per case and device, the SHA-256 of
  codes         one byte per element, [rows, cols] of the input X, row-major (fp4lab's --codes layout): TE's
                packed nibbles (even element in the low nibble) unpacked; for the columnwise outputs TE's codes
                of X^T transposed back;
  scales        the UE4M3 scale bytes in fp4lab's --scales layout [ceil(rows/br), ceil(cols/bc)]: TE's
                [rows, ceil(cols/16)] for 1x16; every 16th row of TE's row-repeated 16x16 scales; TE's scales of
                X^T transposed for the columnwise outputs;
  global_scale  the global decode scale (fp4lab's --global-scale, float32[1]): TE's reference does not return
                it, so it is recomputed here from the amax it returns (global_amax_row / global_amax_col) with
                the reference's own three lines (_quantize_blockwise_reference: S_enc = min(2688 / amax,
                FLT_MAX), 1 if that is 0, decode = 1 / S_enc), on the same device.
tests/data/te_nvfp4_oracle.json is this output. With --fp4lab BINARY it also runs `fp4lab quantize` and prints,
per case, whether it agrees with each device.

TE is not installed: its package __init__ files pull in the C++/CUDA extension. The oracle executes, unchanged,
  transformer_engine/pytorch/custom_recipes/reference_nvfp4.py   (NVFP4QuantizerRef, cast_to_fp4x2, ...)
  transformer_engine/pytorch/custom_recipes/reference_utils.py   (Fp4Formats, imports torch only)
  transformer_engine/pytorch/custom_recipes/gemm.py              (GEMMType, MMParams: qgemm's annotations)
under their package names, with stub modules for the package levels and for what those import and the
quantizer does not use: transformer_engine.pytorch.quantized_tensor (QuantizedTensorStorage, an empty base of
the NVFP4TensorRef dataclass; Quantizer, whose __init__ is TE's: it sets rowwise_usage, columnwise_usage and
internal = False, quantized_tensor.py:402-405) and transformer_engine.pytorch.tensor.utils (is_custom, used by
gemm.custom_gemm only).

Quantizers (tests/cli/te_nvfp4_cases.py): row = NVFP4QuantizerRef(E2M1, tile (1,16)) rowwise; row_2d = tile
(16,16) rowwise; col = tile (1,16) columnwise without RHT; col_rht = tile (1,16) columnwise, with_rht=True,
with_random_sign_mask=True (TE's default for the forward input and dy). pow_2_scales False, eps 0, no 4over6,
no row scaling. TE's stochastic rounding is not referenced (the reference has none: its SR lives in the kernels).

Needs torch (BF16, float8_e4m3fn); no NumPy. Usage (from the repository root):
  python3 scripts/te_nvfp4_oracle.py --te .oracle/te_ref [--te-commit SHA] [--fp4lab build/apps/fp4lab] \
      --out oracle.json
--te is a TE checkout, or an export of the three files above under their repository paths with a file COMMIT
holding the commit (.oracle/te_ref/ is such an export).
"""
import argparse
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'cli'))
import npyio  # noqa: E402
import te_nvfp4_cases  # noqa: E402

PKG = 'transformer_engine/pytorch/custom_recipes/'
FILES = {
    'reference_utils': PKG + 'reference_utils.py',
    'gemm': PKG + 'gemm.py',
    'reference_nvfp4': PKG + 'reference_nvfp4.py',
}


def _module(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__path__ = []  # importable as a package: its submodules are registered in sys.modules
    sys.modules[name] = m
    if '.' in name:
        parent, child = name.rsplit('.', 1)
        setattr(sys.modules[parent], child, m)
    return m


def load_te(root):
    """The module reference_nvfp4 of the checkout/export root, with the stubs of the module docstring."""
    class QuantizedTensorStorage:  # noqa: D401 (stub: NVFP4TensorRef's base; the dataclass needs nothing)
        """Stub of transformer_engine.pytorch.quantized_tensor.QuantizedTensorStorage."""

    class Quantizer:
        """Stub of transformer_engine.pytorch.quantized_tensor.Quantizer: its __init__ (TE's lines 402-405)."""

        def __init__(self, *, rowwise, columnwise):
            self.rowwise_usage = rowwise
            self.columnwise_usage = columnwise
            self.internal = False

    def is_custom(x=None):
        raise NotImplementedError('stub: transformer_engine.pytorch.tensor.utils.is_custom')

    _module('transformer_engine')
    _module('transformer_engine.pytorch')
    _module('transformer_engine.pytorch.quantized_tensor', QuantizedTensorStorage=QuantizedTensorStorage,
            Quantizer=Quantizer)
    _module('transformer_engine.pytorch.tensor')
    _module('transformer_engine.pytorch.tensor.utils', is_custom=is_custom)
    _module('transformer_engine.pytorch.custom_recipes')
    mods = {}
    for key in ('reference_utils', 'gemm', 'reference_nvfp4'):
        name = 'transformer_engine.pytorch.custom_recipes.' + key
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, FILES[key]))
        m = importlib.util.module_from_spec(spec)
        sys.modules[name] = m
        setattr(sys.modules['transformer_engine.pytorch.custom_recipes'], key, m)
        spec.loader.exec_module(m)
        mods[key] = m
    return mods['reference_nvfp4']


def quantizer(ref, output):
    E2M1 = sys.modules['transformer_engine.pytorch.custom_recipes.reference_utils'].Fp4Formats.E2M1
    row = output in ('row', 'row_2d')
    return ref.NVFP4QuantizerRef(dtype=E2M1, rowwise=row, columnwise=not row, pow_2_scales=False, eps=0.0,
                                 quant_tile_shape=(16, 16) if output == 'row_2d' else (1, 16),
                                 with_rht=output == 'col_rht', with_random_sign_mask=True)


def global_decode_scale(amax):
    """_quantize_blockwise_reference's global scale (its lines, non-4over6, one tensor amax), on amax's device."""
    x = amax.to(torch.float32)
    enc = torch.div(torch.tensor(448.0, device=x.device, dtype=torch.float32) *
                    torch.tensor(6.0, device=x.device, dtype=torch.float32), x)
    enc = torch.min(enc, torch.tensor(torch.finfo(torch.float32).max, device=x.device, dtype=torch.float32))
    if enc.numel() == 1 and enc == torch.tensor(0.0, device=x.device, dtype=torch.float32):
        enc = torch.tensor(1.0, device=x.device, dtype=torch.float32)
    return torch.div(1.0, enc).reshape(-1)


def unpack(q, rows, cols):
    """TE's packed uint8 [rows, cols // 2] (even element in the low nibble) -> list of rows of codes."""
    q = q.to(torch.int32)
    c = torch.empty((rows, cols), dtype=torch.int32, device=q.device)
    c[:, 0::2] = q & 15
    c[:, 1::2] = q >> 4
    return c


def run_case(ref, case, x_f32, dev):
    rows, cols = x_f32.shape
    x = x_f32.to(dev).to(torch.bfloat16)
    r = quantizer(ref, case['output']).quantize(x)
    o = case['output']
    if o in ('row', 'row_2d'):
        codes = unpack(r.data, rows, cols)
        s = r.scale
        if o == 'row_2d':
            s = s[::16]
        amax = r.global_amax_row
    else:
        codes = unpack(r.data_t, cols, rows).t()
        s = r.scale_t.t()
        amax = r.global_amax_col
    sr, sc = te_nvfp4_cases.scale_shape(rows, cols, o)
    if tuple(codes.shape) != (rows, cols) or s.shape[0] < sr or s.shape[1] < sc:
        raise RuntimeError('unexpected shapes: codes %s, scales %s' % (tuple(codes.shape), tuple(s.shape)))
    s = s[:sr, :sc].contiguous().view(torch.uint8)
    g = global_decode_scale(amax)
    code_bytes = bytes(codes.to(torch.uint8).contiguous().cpu().reshape(-1).tolist())
    scale_bytes = bytes(s.cpu().reshape(-1).tolist())
    return {'codes': te_nvfp4_cases.digest_bytes(code_bytes), 'scales': te_nvfp4_cases.digest_bytes(scale_bytes),
            'global_scale': te_nvfp4_cases.digest_f32(g.cpu().tolist()),
            'amax': float(amax.reshape(-1)[0].item())}


def fp4lab_digests(binary, case, xp, d):
    cp, sp, gp = (os.path.join(d, n) for n in ('c.npy', 's.npy', 'g.npy'))
    subprocess.run([binary, 'quantize', '--quantizer', te_nvfp4_cases.quantizer_arg(case['quantizer']), xp, '--dequant',
                    os.path.join(d, 'y.npy'), '--codes', cp, '--scales', sp, '--global-scale', gp], check=True,
                   stderr=subprocess.DEVNULL)
    return {'codes': te_nvfp4_cases.digest_bytes(npyio.read_npy(cp)[2]),
            'scales': te_nvfp4_cases.digest_bytes(npyio.read_npy(sp)[2]),
            'global_scale': te_nvfp4_cases.digest_f32(npyio.read_f32(gp)[2])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--te', required=True, help='TE checkout, or an export of the three files with COMMIT')
    ap.add_argument('--te-commit', default=None)
    ap.add_argument('--fp4lab')
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    commit = a.te_commit
    if commit is None:
        cf = os.path.join(a.te, 'COMMIT')
        commit = open(cf).read().strip() if os.path.exists(cf) else 'unknown'
    ref = load_te(a.te)
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    names = {'cpu': platform.processor() or platform.machine()}
    if 'cuda' in devices:
        names['cuda'] = torch.cuda.get_device_name(0)
    out = {'transformer_engine': {'commit': commit, 'files': {
               p: hashlib.sha256(open(os.path.join(a.te, p), 'rb').read()).hexdigest() for p in FILES.values()},
               'quantizer': 'NVFP4QuantizerRef'},
           'torch': torch.__version__, 'torch_cuda': torch.version.cuda, 'devices': devices, 'device_names': names,
           'allow_bf16_reduced_precision_reduction': getattr(torch.backends.cuda.matmul,
                                                             'allow_bf16_reduced_precision_reduction', None),
           'inputs': {}, 'cases': {}}
    inputs = te_nvfp4_cases.inputs()
    for name, (rows, cols, vals) in inputs.items():
        out['inputs'][name] = te_nvfp4_cases.digest_input(vals)
    agree = {}
    with tempfile.TemporaryDirectory() as d:
        for c in te_nvfp4_cases.cases():
            rows, cols, vals = inputs[c['input']]
            x = torch.tensor(vals, dtype=torch.float32).reshape(rows, cols)
            entry = {'exact': c['exact'], 'spread': c['spread']}
            for dev in devices:
                try:
                    entry[dev] = run_case(ref, c, x, dev)
                except Exception as e:  # noqa: BLE001 (recorded: the test reports it as a skip)
                    entry[dev] = {'error': '%s: %s' % (type(e).__name__, e)}
            out['cases'][c['name']] = entry
            if a.fp4lab:
                xp = os.path.join(d, c['input'] + '.npy')
                if not os.path.exists(xp):
                    npyio.write_raw(xp, '<f4', (rows, cols), te_nvfp4_cases.f32_bytes(vals))
                got = fp4lab_digests(a.fp4lab, c, xp, d)
                agree[c['name']] = {dev: ('error' if 'error' in entry[dev] else
                                          ' '.join('%s %s' % (k, got[k] == entry[dev][k])
                                                   for k in ('codes', 'scales', 'global_scale')))
                                    for dev in devices}
    with open(a.out, 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    for name, e in out['cases'].items():
        errs = [dev for dev in devices if 'error' in e[dev]]
        for dev in errs:
            print('ERROR %s %s: %s' % (name, dev, e[dev]['error']))
        if len(devices) > 1 and not errs:
            diff = [k for k in ('codes', 'scales', 'global_scale') if e['cpu'][k] != e['cuda'][k]]
            if diff:
                print('cpu != cuda %s: %s%s' % (name, ' '.join(diff), '' if e['exact'] else ' (not exact by construction)'))
    for name, v in agree.items():
        print('fp4lab', name, ' | '.join('%s: %s' % (dev, v[dev]) for dev in devices))
    print('wrote %s: %d cases, devices %s, torch %s, TE %s' % (a.out, len(out['cases']), names, torch.__version__,
                                                                  commit[:12]))
    return 0


if __name__ == '__main__':
    sys.exit(main())
