#!/usr/bin/env python3
"""fp4lab's emulate tetrajet2_triton against TetraJet-v2's own Triton baseline NVFP4 fake quantizer
(`_E2M1_DoubleScale_fake_quantize_fused_kernel`, round to nearest, 1x128 FP32 outer and 1x16 E4M3 inner scales).

tests/data/tetrajet2_oracle.json holds, per case of tests/cli/tetrajet2_cases.py, the SHA-256 of the float32
output the Triton kernel returned (row-major; TetraJet commit, torch / triton versions and the GPU in the file),
computed by scripts/tetrajet2_oracle.py on the GPU machine. This test regenerates each input, runs
`fp4lab quantize --quantizer <json> IN.npy --dequant OUT.npy` and compares the SHA-256 of the dequantized bytes.
Until the oracle file exists the test prints SKIPPED and passes.

Usage: test_tetrajet2.py FP4LAB_BINARY [ORACLE_JSON]   (Python stdlib only)
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dequant_oracle  # noqa: E402
import tetrajet2_cases  # noqa: E402


def main():
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, '..', 'data', 'tetrajet2_oracle.json')
    return dequant_oracle.compare(sys.argv[1], path, tetrajet2_cases, 'tetrajet2', 'scripts/tetrajet2_oracle.py', 'TetraJet-v2 Triton kernel', 'tetrajet')


if __name__ == '__main__':
    sys.exit(main())
