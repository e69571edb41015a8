#!/usr/bin/env python3
"""fp4lab's emulate quartet2_triton against Quartet II's own Triton forward round-to-nearest NVFP4 fake quantizer
(`rtn_1x16s_fp4_kernel` through `rtn_1x16s_fp4_kernel_wrapper(x, 1.0, 16, False)`: tensor-amax FP32 global
scale, 1x16 E4M3 block scales).

tests/data/quartet2_triton_oracle.json holds, per case of tests/cli/quartet2_triton_cases.py, the SHA-256 of the
float32 output the Triton kernel returned (row-major; Quartet II commit, torch / triton versions and the GPU in
the file), computed by scripts/quartet2_triton_oracle.py on the GPU machine. This test regenerates each input, runs
`fp4lab quantize --quantizer <json> IN.npy --dequant OUT.npy` and compares the SHA-256 of the dequantized bytes.
Until the oracle file exists the test prints SKIPPED and passes.

Usage: test_quartet2_triton.py FP4LAB_BINARY [ORACLE_JSON]   (Python stdlib only)
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dequant_oracle  # noqa: E402
import quartet2_triton_cases as qcases  # noqa: E402


def main():
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, '..', 'data', 'quartet2_triton_oracle.json')
    return dequant_oracle.compare(sys.argv[1], path, qcases, 'quartet2_triton', 'scripts/quartet2_triton_oracle.py', 'Quartet II Triton kernel', 'quartet2')


if __name__ == '__main__':
    sys.exit(main())
