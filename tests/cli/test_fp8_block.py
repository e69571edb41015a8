#!/usr/bin/env python3
"""fp4lab's FP8 block-scaling rules against DeepGEMM's and TransformerEngine's own quantizers.

tests/data/fp8_block_oracle.json holds, per case of tests/cli/fp8_block_cases.py, the SHA-256 of the FP8 codes
and of the scales that DeepGEMM's per_token_cast_to_fp8 / per_block_cast_to_fp8 and TransformerEngine's
BlockwiseQuantizerReference returned (commits, torch version and devices in the file), computed by
scripts/fp8_block_oracle.py on the GPU machine. This test regenerates each input, runs `fp4lab quantize` with
the case's quantizer and compares hashes with the GPU's results (DeepGEMM's casts run on CUDA tensors; on
the CPU PyTorch divides amax by 448 where the GPU multiplies by fl(1/448), which the file shows for the
cases where the two differ).

Usage: test_fp8_block.py FP4LAB_BINARY   (Python stdlib only)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fp8_block_cases  # noqa: E402
import npyio  # noqa: E402


def main():
    fp4lab = sys.argv[1]
    oracle = json.load(open(os.path.join(HERE, '..', 'data', 'fp8_block_oracle.json')))
    inputs = fp8_block_cases.inputs()
    cases = fp8_block_cases.cases()
    if set(c['name'] for c in cases) != set(oracle['cases']):
        print('FAIL: the cases of fp8_block_cases.py and the oracle file differ; rerun scripts/fp8_block_oracle.py')
        return 1
    device = 'cuda' if 'cuda' in oracle['devices'] else 'cpu'
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        written = set()
        for c in cases:
            rows, cols, vals = inputs[c['input']]
            xp = os.path.join(d, c['input'] + '.npy')
            if c['input'] not in written:
                npyio.write_npy(xp, '<f4', (rows, cols), vals)
                written.add(c['input'])
            cp, sp = os.path.join(d, 'c.npy'), os.path.join(d, 's.npy')
            subprocess.run([fp4lab, 'quantize', '--quantizer', json.dumps(c['quantizer']), xp, '--dequant',
                            os.path.join(d, 'y.npy'), '--codes', cp, '--scales', sp], check=True,
                           stderr=subprocess.DEVNULL)
            codes = npyio.read_npy(cp)[2]
            descr, _, sb = npyio.read_npy(sp)
            if descr in ('|u1', '<u1'):
                scale_bits = [fp8_block_cases.e8m0_bits(v) for v in sb]
            else:
                scale_bits = list(struct.unpack('<%dI' % (len(sb) // 4), sb))
            want = oracle['cases'][c['name']][device]
            got = {'codes': fp8_block_cases.digest_bytes(codes), 'scales': fp8_block_cases.digest_f32(scale_bits)}
            for k in ('codes', 'scales'):
                if got[k] != want[k]:
                    print('FAIL %s: fp4lab\'s %s differ from %s (%s)' % (c['name'], k, c['source'], device))
                    bad += 1
    src = oracle['deepgemm']['commit'][:12], oracle['transformer_engine']['commit'][:12], oracle['torch']
    print('fp8 block: %d of %d cases bit-equal to DeepGEMM %s and TransformerEngine %s (torch %s, %s)' % (
        len(cases) - bad, len(cases), src[0], src[1], src[2], device))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
