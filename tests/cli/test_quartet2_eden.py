#!/usr/bin/env python3
"""fp4lab's emulate quartet2_eden_triton against Quartet II's own Triton backward MS-EDEN quantizer
(`eden_1x16s_fp4_kernel` of src/models/quantization/schemes/quartet_2.py: optional 128-point rotation, tensor-amax
FP32 global scale, 1x16 E4M3 block scales, per-128 EDEN correction, stochastically rounded scales, bf16 output).

tests/data/quartet2_eden_oracle.json holds, per case of tests/cli/quartet2_eden_cases.py, the SHA-256 of the bf16
output the Triton kernel returned (its bit patterns as little-endian uint16, row-major; Quartet II commit, torch /
triton versions and the GPU in the file), computed by scripts/quartet2_eden_oracle.py on the GPU machine. This test
regenerates each input, runs `fp4lab quantize IN.npy --quantizer <json> --dequant OUT.npy --seed <seed> --stream 0`,
rounds the float32 dequant to bf16 (nearest even) and compares the SHA-256 of those bf16 bytes
(tests/cli/dequant_oracle.py's comparison, output bf16; the case's seeds and quantizer must be the oracle's).
Until the oracle file exists the test prints SKIPPED and passes.

Usage: test_quartet2_eden.py FP4LAB_BINARY [ORACLE_JSON]   (Python stdlib only)
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dequant_oracle  # noqa: E402
import quartet2_eden_cases as qcases  # noqa: E402


def main():
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, '..', 'data', 'quartet2_eden_oracle.json')
    return dequant_oracle.compare(sys.argv[1], path, qcases, 'quartet2_eden_triton', 'scripts/quartet2_eden_oracle.py',
                                  'Quartet II EDEN Triton kernel', 'quartet2', output='bf16',
                                  checked=('seed', 'rht_seed', 'quantizer'))


if __name__ == '__main__':
    sys.exit(main())
