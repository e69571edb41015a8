#!/usr/bin/env python3
"""Compare `fp4lab cast` (round to nearest even, both overflow policies) with
ml_dtypes for every format ml_dtypes has.

Usage: mldtypes_oracle.py PATH/TO/fp4lab [WORKDIR]
Inputs: all 65,536 bfloat16 bit patterns (as float32), 1M random float32 bit
patterns and 1M values log-uniform in [2^-24, 2^20] with random signs.
Prints, per format and policy: exact code agreement, agreement when any two
NaN codes count as equal, and the disagreements grouped by input class
(NaN input, +-Inf input, |x| beyond the format's max finite, other) with
examples. Needs numpy and ml_dtypes (present on the device machine).
"""
import os
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np

FORMATS = [
    # (fp4lab name, ml_dtypes type, code bits)
    ("float4_e2m1fn", ml_dtypes.float4_e2m1fn, 4),
    ("float6_e2m3fn", ml_dtypes.float6_e2m3fn, 6),
    ("float6_e3m2fn", ml_dtypes.float6_e3m2fn, 6),
    ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, 8),
    ("float8_e5m2", ml_dtypes.float8_e5m2, 8),
    ("float8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz, 8),
    ("float8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz, 8),
    ("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, 8),
    ("bfloat16", ml_dtypes.bfloat16, 16),
    ("float16", np.float16, 16),
]


def inputs():
    rng = np.random.default_rng(2026)
    a = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32)
    b = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    c = np.exp2(rng.uniform(-24, 20, size=1_000_000)).astype(np.float32)
    c *= np.where(rng.integers(0, 2, size=c.size) == 1, -1, 1).astype(np.float32)
    return np.concatenate([a, b, c]).astype(np.float32)


def ml_codes(x, t, bits):
    y = x.astype(t)
    codes = y.view(np.uint16 if bits == 16 else np.uint8).astype(np.uint32)
    return codes, y


def main():
    fp4lab = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
    os.makedirs(work, exist_ok=True)
    x = inputs()
    xin = os.path.join(work, "x.npy")
    np.save(xin, x)
    print(f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}; {x.size} float32 inputs "
          "(65536 bf16 patterns + 1M random bit patterns + 1M log-uniform values)")
    with np.errstate(all="ignore"):
        for name, t, bits in FORMATS:
            ml, mlv = ml_codes(x, t, bits)
            mlv32 = mlv.astype(np.float32)
            maxf = float(ml_dtypes.finfo(t).max) if t is not np.float16 else 65504.0
            for policy in ("saturate", "nonsaturate"):
                out = os.path.join(work, f"{name}_{policy}.npy")
                subprocess.run([fp4lab, "cast", "--to", name, "--round", "rn", "--overflow", policy, xin, out], check=True)
                ours = np.load(out).astype(np.uint32)
                # Our codes decoded through ml_dtypes (same bit layout).
                ours_v = ours.astype(np.uint16 if bits == 16 else np.uint8).view(t).astype(np.float32)
                exact = ours == ml
                nan_eq = exact | (np.isnan(ours_v) & np.isnan(mlv32))
                print(f"\n{name:16s} {policy:11s}: exact code agreement {exact.sum()}/{x.size}; "
                      f"with all NaN codes equal {nan_eq.sum()}/{x.size}")
                bad = ~nan_eq
                classes = {
                    "NaN input": np.isnan(x),
                    "+-Inf input": np.isinf(x),
                    "|x| > max finite": np.isfinite(x) & (np.abs(x) > maxf),
                }
                other = ~(classes["NaN input"] | classes["+-Inf input"] | classes["|x| > max finite"])
                classes["other (in range)"] = other
                for cname, m in classes.items():
                    k = bad & m
                    if k.sum() == 0:
                        continue
                    idx = np.flatnonzero(k)[:3]
                    ex = "; ".join(f"x={x[i]!r} (0x{x[i:i+1].view(np.uint32)[0]:08X}) ours=0x{ours[i]:X} ({ours_v[i]!r}) "
                                   f"ml=0x{ml[i]:X} ({mlv32[i]!r})" for i in idx)
                    print(f"   {cname:18s}: {k.sum()} differ, e.g. {ex}")
                nan_only = exact.size - exact.sum() - bad.sum()
                if nan_only:
                    i = np.flatnonzero(~exact & nan_eq)[0]
                    print(f"   {nan_only} differ only in which NaN code, e.g. x={x[i]!r} ours=0x{ours[i]:X} ml=0x{ml[i]:X}")


if __name__ == "__main__":
    main()
