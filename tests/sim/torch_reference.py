#!/usr/bin/env python3
"""Independent oracle for fp4lab's block quantizers (run on the device machine).

Re-implements, from the definitions and NOT from fp4lab's C++ code, three
quantizers with PyTorch + ml_dtypes, and compares codes, scales and dequantized
values bit for bit with `fp4lab quantize` on random tensors (including sizes
that are not multiples of the block):

  mxfp4       OCP MX v1.0: blocks of 32 along rows, shared exponent
              e = floor(log2(amax)) - 2 (emax of E2M1), clamped to [-127, 127]
              (amax 0 -> -127); elements RN(x / 2^e) in E2M1, saturating to +-6.
  mxfp8_ceil  MXFP8 E4M3 with round-to-infinity scale (Mishra et al. 2025):
              e = smallest integer with amax <= 448 * 2^e; elements RN(x / 2^e)
              in E4M3 (saturating to +-448).
  nvfp4       NVFP4 in TransformerEngine's FP32 operation order
              (transformer_engine/pytorch/custom_recipes/quantization_nvfp4.py
              and common/cast/nvfp4/core_nvfp4.cuh): g_enc = 2688 / amax_tensor
              (min FLT_MAX; 1 if amax is 0), g_dec = 1/g_enc, block scale
              s = e4m3(min(amax_b * (g_enc * fl(1/6)), 448)), e = min(1/(s * g_dec),
              FLT_MAX), code = e2m1(clamp(x * e, -6, 6)), dequant = (v * s) * g_dec.
  nvfp4_2d    the same with 16 x 16 tiles.

Element rounding uses ml_dtypes' float32 -> float4_e2m1fn / float8_e4m3fn
conversions (round to nearest even) as the independent encoder.

Usage: python3 tests/sim/torch_reference.py --fp4lab build/apps/fp4lab
Exit status 0 if everything matches bit for bit, 1 otherwise.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
import torch

FLT_MAX = np.float32(np.finfo(np.float32).max)


def e2m1_codes(y):
    """float32 array (already within [-6, 6]) -> E2M1 codes 0..15 (RN-even)."""
    return y.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF


def e2m1_values(codes):
    return codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def blocks_view(x, br, bc):
    """Pads x with zeros to whole blocks (zeros never change an amax) and returns
    (padded, nbr, nbc)."""
    r, c = x.shape
    nbr, nbc = -(-r // br), -(-c // bc)
    p = np.zeros((nbr * br, nbc * bc), dtype=np.float32)
    p[:r, :c] = x
    return p, nbr, nbc


def block_amax(x, br, bc):
    p, nbr, nbc = blocks_view(x, br, bc)
    return np.abs(p).reshape(nbr, br, nbc, bc).max(axis=(1, 3)).astype(np.float32)


def expand(s, br, bc, shape):
    return np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[: shape[0], : shape[1]]


def ref_mxfp4(x):
    amax = block_amax(x, 1, 32).astype(np.float64)
    with np.errstate(divide="ignore"):
        _, ex = np.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1): floor(log2 amax) = ex - 1 (exact)
    e = np.where(amax == 0, -127, ex - 1 - 2)
    e = np.clip(e, -127, 127).astype(np.int64)
    E = expand(e, 1, 32, x.shape)
    y = (x.astype(np.float64) * np.ldexp(1.0, -E)).astype(np.float32)  # exact here
    y = np.clip(y, -6.0, 6.0)
    codes = e2m1_codes(y)
    dq = (e2m1_values(codes).astype(np.float64) * np.ldexp(1.0, E)).astype(np.float32)
    return codes, (e + 127).astype(np.uint8), dq


def ref_mxfp8_ceil(x):
    amax = block_amax(x, 1, 32).astype(np.float64)
    e = np.full(amax.shape, -127, dtype=np.int64)
    nz = amax > 0
    # smallest e with amax <= 448 * 2^e, by exact float64 comparisons
    guess = np.ceil(np.log2(np.where(nz, amax, 1.0) / 448.0)).astype(np.int64)
    guess = np.where(amax > 448.0 * np.ldexp(1.0, guess), guess + 1, guess)
    guess = np.where(amax <= 448.0 * np.ldexp(1.0, guess - 1), guess - 1, guess)
    e = np.where(nz, guess, -127)
    e = np.clip(e, -127, 127)
    E = expand(e, 1, 32, x.shape)
    y = (x.astype(np.float64) * np.ldexp(1.0, -E)).astype(np.float32)
    y = np.clip(y, -448.0, 448.0)
    codes = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    dq = (codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * np.ldexp(1.0, E)).astype(np.float32)
    return codes, (e + 127).astype(np.uint8), dq


def ref_nvfp4(x, br, bc):
    f32 = torch.float32
    xt = torch.from_numpy(x)
    amax_t = xt.abs().max().to(f32)
    g_enc = torch.tensor(448.0 * 6.0, dtype=f32) / amax_t
    g_enc = torch.minimum(g_enc, torch.tensor(FLT_MAX, dtype=f32))
    if amax_t.item() == 0.0 or g_enc.item() == 0.0:
        g_enc = torch.tensor(1.0, dtype=f32)
    g_dec = torch.tensor(1.0, dtype=f32) / g_enc
    mult = g_enc * (torch.tensor(1.0, dtype=f32) / torch.tensor(6.0, dtype=f32))
    amax_b = torch.from_numpy(block_amax(x, br, bc))
    s_f = torch.minimum(amax_b * mult, torch.tensor(FLT_MAX, dtype=f32))
    s_f = torch.clamp(s_f, max=448.0)
    s8 = s_f.to(torch.float8_e4m3fn)
    s = s8.to(f32)
    enc = torch.minimum(torch.tensor(1.0, dtype=f32) / (s * g_dec), torch.tensor(FLT_MAX, dtype=f32))
    E = torch.from_numpy(expand(enc.numpy(), br, bc, x.shape))
    S = torch.from_numpy(expand(s.numpy(), br, bc, x.shape))
    y = torch.clamp(xt * E, -6.0, 6.0)
    codes = e2m1_codes(y.numpy())
    dq = (torch.from_numpy(e2m1_values(codes)) * S) * g_dec
    return codes, s8.view(torch.uint8).numpy(), dq.numpy()


QUANTIZERS = {
    "mxfp4": ("mxfp4", ref_mxfp4),
    "mxfp8_ceil": (json.dumps({"element": "e4m3", "scale": "e8m0", "block": [1, 32], "scale_rule": "ceil"}),
                   ref_mxfp8_ceil),
    "nvfp4": ("nvfp4", lambda x: ref_nvfp4(x, 1, 16)),
    "nvfp4_2d": ("nvfp4_2d", lambda x: ref_nvfp4(x, 16, 16)),
}


def inputs(rng):
    yield "normal_128x256", rng.standard_normal((128, 256)).astype(np.float32)
    yield "normal_37x75", (3 * rng.standard_normal((37, 75))).astype(np.float32)
    yield "normal_130x47", rng.standard_normal((130, 47)).astype(np.float32)
    logu = np.exp2(rng.uniform(-30, 30, (64, 96))) * np.where(rng.random((64, 96)) < 0.5, -1, 1)
    yield "logmag_64x96", logu.astype(np.float32)
    g = (1e-6 * rng.standard_normal((48, 80))).astype(np.float32)
    g[3, 5] = 0.5  # an outlier
    yield "tiny_outlier_48x80", g
    t = (rng.integers(-24, 25, (33, 64)) * 0.25).astype(np.float32)  # many exact ties
    t[:, 0] = 6.0
    t[5, :] = 0.0
    yield "ties_33x64", t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp4lab", required=True)
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    total_bad = 0
    with tempfile.TemporaryDirectory() as d:
        for iname, x in inputs(rng):
            xin = os.path.join(d, "x.npy")
            np.save(xin, x)
            for qname, (spec, ref) in QUANTIZERS.items():
                c_p, s_p, d_p = (os.path.join(d, n) for n in ("c.npy", "s.npy", "d.npy"))
                subprocess.run([args.fp4lab, "quantize", "--quantizer", spec, xin, "--dequant", d_p, "--codes", c_p,
                                "--scales", s_p], check=True)
                got_c, got_s, got_d = np.load(c_p), np.load(s_p), np.load(d_p)
                exp_c, exp_s, exp_d = ref(x)
                bad_c = int(np.count_nonzero(got_c != exp_c))
                bad_s = int(np.count_nonzero(got_s != exp_s)) if got_s.shape == exp_s.shape else -1
                bad_d = int(np.count_nonzero(got_d.view(np.uint32) != exp_d.astype(np.float32).view(np.uint32)))
                status = "MATCH" if bad_c == 0 and bad_s == 0 and bad_d == 0 else "MISMATCH"
                print(f"{qname:11s} {iname:20s} codes {got_c.size:6d} bad {bad_c:4d} | scales {got_s.size:5d} "
                      f"bad {bad_s:3d} | dequant bad {bad_d:4d}  {status}")
                if status != "MATCH":
                    total_bad += 1
                    idx = np.argwhere(got_c != exp_c)[:5]
                    for r, c in idx:
                        print(f"    codes[{r},{c}] x={x[r, c]!r} fp4lab={got_c[r, c]:#x} ref={exp_c[r, c]:#x}")
                    if bad_s > 0:
                        for r, c in np.argwhere(got_s != exp_s)[:5]:
                            print(f"    scales[{r},{c}] fp4lab={got_s[r, c]:#x} ref={exp_s[r, c]:#x}")
    print("RESULT:", "ALL MATCH (bit-exact)" if total_bad == 0 else f"{total_bad} case(s) differ")
    return 0 if total_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
