#!/usr/bin/env python3
"""ctest's entry to the Python tests: runs pytest on the given files with the
package of the build tree (PYTHONPATH set by tests/CMakeLists.txt).
--gpu: the CUDA tests, which exit 77 (ctest: SKIPPED) without a GPU, so that
they are never reported as passed on a machine that could not run them.
Without pytest (Debian: python3-pytest; scripts/setup.sh installs it) it exits
77 too, saying so."""
import sys

args = sys.argv[1:]
gpu = "--gpu" in args
args = [a for a in args if a != "--gpu"]
try:
    import pytest
except ImportError:
    print("run_pytest: pytest is not installed for", sys.executable, "(apt-get install python3-pytest)")
    sys.exit(77)
if gpu:
    import fp4lab
    if not fp4lab.cuda_available():
        print("run_pytest: no CUDA backend or no GPU: the CUDA tests are skipped")
        sys.exit(77)
    try:
        import torch
        if not torch.cuda.is_available():
            print("run_pytest: torch sees no GPU: the CUDA tests are skipped")
            sys.exit(77)
    except ImportError:
        print("run_pytest: torch is not installed: the CUDA tests are skipped")
        sys.exit(77)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *args]))
