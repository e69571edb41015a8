#!/usr/bin/env python3
"""DeepGEMM's and TransformerEngine's own FP8 block quantizers as the oracle of fp4lab's scale rules deepgemm
and te_fp8_block.

Runs, on the inputs of tests/cli/fp8_block_cases.py, DeepGEMM's per_token_cast_to_fp8 / per_block_cast_to_fp8
(deep_gemm/utils/math.py of a checkout of github.com/deepseek-ai/DeepGEMM, loaded from its file so that the
CUDA extension is not needed) and TransformerEngine's BlockwiseQuantizerReference
(tests/pytorch/references/ of a checkout of github.com/NVIDIA/TransformerEngine), each on the GPU and on the
CPU, and writes JSON with the commits, torch's version and, per case and device, the SHA-256 of the FP8 codes
(bytes) and of the scales (float32 bits: DeepGEMM's sf, TE's scale_inv). tests/data/fp8_block_oracle.json is
this output. With --fp4lab BINARY it also runs `fp4lab quantize` and prints, per case, whether it agrees.

Needs torch >= 2.1 (float8 dtypes). Usage:
  python3 scripts/fp8_block_oracle.py --deepgemm-math PATH/math.py --te-references PATH/tests/pytorch \
      --deepgemm-commit SHA --te-commit SHA [--fp4lab build/apps/fp4lab] --out oracle.json
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'cli'))
import fp8_block_cases  # noqa: E402


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def run_case(dg, te_ref, case, x):
    dtype = torch.float8_e4m3fn if case['element'] == 'e4m3' else torch.float8_e5m2
    if case['source'] == 'deepgemm':
        fn = dg.per_token_cast_to_fp8 if case['block'] == [1, 128] else dg.per_block_cast_to_fp8
        q, sf = fn(x, use_ue8m0=case['scale'] == 'e8m0')
    else:
        r = te_ref.BlockwiseQuantizerReference().quantize(
            x, dtype, return_transpose=False, eps=0.0, pow_2_scales=case['scale'] == 'e8m0',
            quant_tile_shape=tuple(case['block']), munge_scale_shapes=False)
        q, sf = r.data, r.scale
    codes = q.view(torch.uint8).cpu().numpy().reshape(-1).tolist()
    scales = sf.float().contiguous().cpu().numpy().view(np.uint32).reshape(-1).tolist()
    return fp8_block_cases.digest_bytes(codes), fp8_block_cases.digest_f32(scales)


def fp4lab_digests(binary, case, x_np, d):
    xp, cp, sp = (os.path.join(d, n) for n in ('x.npy', 'c.npy', 's.npy'))
    np.save(xp, x_np)
    subprocess.run([binary, 'quantize', '--quantizer', json.dumps(case['quantizer']), xp, '--dequant',
                    os.path.join(d, 'y.npy'), '--codes', cp, '--scales', sp], check=True, stderr=subprocess.DEVNULL)
    codes = np.load(cp).reshape(-1).tolist()
    s = np.load(sp).reshape(-1)
    scales = ([fp8_block_cases.e8m0_bits(int(c)) for c in s.tolist()] if s.dtype == np.uint8
              else s.astype(np.float32).view(np.uint32).tolist())
    return fp8_block_cases.digest_bytes(codes), fp8_block_cases.digest_f32(scales)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--deepgemm-math', required=True)
    ap.add_argument('--te-references', required=True, help='TE checkout tests/pytorch (holds references/)')
    ap.add_argument('--deepgemm-commit', default='unknown')
    ap.add_argument('--te-commit', default='unknown')
    ap.add_argument('--fp4lab')
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    dg = load_module(a.deepgemm_math, 'deepgemm_math')
    sys.path.insert(0, a.te_references)
    te_ref = importlib.import_module('references.blockwise_quantizer_reference')
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    inputs = fp8_block_cases.inputs()
    out = {'deepgemm': {'commit': a.deepgemm_commit, 'file': 'deep_gemm/utils/math.py'},
           'transformer_engine': {'commit': a.te_commit,
                                  'file': 'tests/pytorch/references/blockwise_quantizer_reference.py'},
           'torch': torch.__version__, 'devices': devices, 'cases': {}}
    agree = {}
    with tempfile.TemporaryDirectory() as d:
        for c in fp8_block_cases.cases():
            rows, cols, vals = inputs[c['input']]
            x_np = np.array(vals, dtype=np.float32).reshape(rows, cols)
            entry = {}
            for dev in devices:
                codes, scales = run_case(dg, te_ref, c, torch.from_numpy(x_np.copy()).to(dev))
                entry[dev] = {'codes': codes, 'scales': scales}
            out['cases'][c['name']] = entry
            if a.fp4lab:
                got = fp4lab_digests(a.fp4lab, c, x_np, d)
                agree[c['name']] = {dev: [got[0] == entry[dev]['codes'], got[1] == entry[dev]['scales']]
                                    for dev in devices}
    with open(a.out, 'w') as f:
        json.dump(out, f, indent=1, sort_keys=True)
    for name, v in agree.items():
        print(name, ' '.join('%s codes %s scales %s' % (dev, *v[dev]) for dev in devices))
    return 0


if __name__ == '__main__':
    sys.exit(main())
