#!/usr/bin/env python3
"""`cast` and `quantize` under --sr-bits ptx_x4 with --rbits, against an oracle
written here from TransformerEngine's reading of cvt.rs.e2m1x4 (PR #3281,
stochastic_round_fp4_e2m1): element k of a group of 4 uses byte k of its word,
t = |x| + (r / 256) * step(|x|) in exact rational arithmetic, truncated to the
E2M1 grid, saturating at 6. Also per_element with given words (the 32-bit
rule: the low D bits of the word added to the D discarded bits). Python stdlib
only. Usage: test_sr_words.py FP4LAB"""
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from fractions import Fraction

from npyio import read_u8, write_npy

FP4LAB = os.path.abspath(sys.argv[1])
fails = 0


def check(cond, msg):
    global fails
    if not cond:
        fails += 1
        print("FAIL: " + msg)


def run(*args):
    p = subprocess.run([FP4LAB, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


GRID = [Fraction(v) for v in ('0', '0.5', '1', '1.5', '2', '3', '4', '6')]


def e2m1_sr8(x, r8):
    """TE's e2m1 SR with an 8-bit random value, exactly."""
    a = abs(Fraction(x))
    step = Fraction(2) if a >= 4 else Fraction(1) if a >= 2 else Fraction(1, 2)
    t = a + Fraction(r8, 256) * step
    code = max(i for i, g in enumerate(GRID) if g <= t) if t < 6 else 7
    return code | (8 if x < 0 or (x == 0 and str(x).startswith('-')) else 0)


def e2m1_sr32(x, w):
    """fp4lab's per-element rule: the low D bits of w added to the D discarded bits of |x|."""
    a = abs(Fraction(x))
    if a >= 6:
        return 7 | (8 if x < 0 else 0)
    step = Fraction(2) if a >= 4 else Fraction(1) if a >= 2 else Fraction(1, 2)
    lo = (a // step) * step
    # |x| is a float32: its significand has 24 bits; D = bits of it below the quantum.
    m = struct.unpack('<I', struct.pack('<f', float(a)))[0]
    exp = (m >> 23) & 0xFF
    quantum_exp = {Fraction(1, 2): -1, Fraction(1): 0, Fraction(2): 1}[step]
    lsb_exp = (exp - 127 - 23) if exp else -149
    D = quantum_exp - lsb_exp
    disc = (a - lo) / Fraction(2) ** lsb_exp  # integer: the discarded bits
    up = disc + (w % (1 << D) if D <= 32 else w) >= (1 << D) if D <= 32 else (disc >> (D - 32)) + w >= (1 << 32)
    q = lo + step if up else lo
    code = GRID.index(q) if q <= 6 else 7
    return code | (8 if x < 0 else 0)


def f32(v):
    return struct.unpack('<f', struct.pack('<f', v))[0]


def main():
    rng = random.Random(2026)
    with tempfile.TemporaryDirectory() as T:
        rows, cols = 6, 13  # 4 words a row, the last a partial group of one
        xs = [f32(rng.uniform(-6.5, 6.5)) for _ in range(rows * cols)]
        # Residuals at and around multiples of 1/256 of a step, and far below it.
        edges = [0.5 + 0.5 * 255 / 256, 2 + 1 / 256, 2 + 1 / 512, 4 + 2 * 3 / 256, 1e-3, -0.25 - 1e-4, 5.99, 6.5]
        for i, v in enumerate(edges):
            xs[7 * i] = f32(v)
        x = os.path.join(T, 'x.npy')
        write_npy(x, '<f4', [rows, cols], xs)
        per_row = (cols + 3) // 4
        words = [rng.getrandbits(32) for _ in range(rows * per_row)]
        w = os.path.join(T, 'w.npy')
        write_npy(w, '<u4', [rows, per_row], words)
        c = os.path.join(T, 'c.npy')
        rc, _, err = run('cast', '--to', 'e2m1', '--round', 'rs', '--sr-bits', 'ptx_x4', '--rbits', w, x, c)
        check(rc == 0, f"cast ptx_x4 --rbits: exit {rc}: {err}")
        if rc == 0:
            got = read_u8(c)
            bad = 0
            for r in range(rows):
                for col in range(cols):
                    word = words[r * per_row + col // 4]
                    want = e2m1_sr8(xs[r * cols + col], (word >> (8 * (col % 4))) & 0xFF)
                    bad += got[r * cols + col] != want
            check(bad == 0, f"cast ptx_x4: {bad} of {rows * cols} codes differ from TE's rule")
        # Every byte value on one element: exhaustive over the random byte.
        one = os.path.join(T, 'one.npy')
        for v in (0.3, 2.5 + 1 / 1024, -4.75):
            write_npy(one, '<f4', [1, 1], [f32(v)])
            for r8 in range(256):
                write_npy(w, '<u4', [1, 1], [r8 | (rng.getrandbits(24) << 8)])
                rc, _, err = run('cast', '--to', 'e2m1', '--round', 'rs', '--sr-bits', 'ptx_x4', '--rbits', w, one, c)
                if rc != 0 or read_u8(c)[0] != e2m1_sr8(f32(v), r8):
                    check(False, f"cast ptx_x4 x={v} byte {r8}: exit {rc} {err}")
                    break
        # per_element with given words: one word per element, the 32-bit rule.
        words32 = [rng.getrandbits(32) for _ in range(rows * cols)]
        write_npy(w, '<u4', [rows, cols], words32)
        rc, _, err = run('cast', '--to', 'e2m1', '--round', 'rs', '--rbits', w, x, c)
        check(rc == 0, f"cast per_element --rbits: exit {rc}: {err}")
        if rc == 0:
            got = read_u8(c)
            bad = sum(got[i] != e2m1_sr32(xs[i], words32[i]) for i in range(rows * cols))
            check(bad == 0, f"cast per_element --rbits: {bad} codes differ from the 32-bit rule")
        # quantize: MX [1,32] E8M0 scales (powers of two, exact): codes = SR of x * 2^-e.
        write_npy(w, '<u4', [rows, per_row], words)
        dq, codes, scales = (os.path.join(T, n) for n in ('dq.npy', 'codes.npy', 's.npy'))
        rc, _, err = run('quantize', '--quantizer', '{"element":"e2m1","round":"rs","sr_bits":"ptx_x4"}', x,
                         '--dequant', dq, '--codes', codes, '--scales', scales, '--rbits', w)
        check(rc == 0, f"quantize ptx_x4 --rbits: exit {rc}: {err}")
        if rc == 0:
            got, sc = read_u8(codes), read_u8(scales)
            bad = 0
            for r in range(rows):
                for col in range(cols):
                    word = words[r * per_row + col // 4]
                    y = Fraction(xs[r * cols + col]) / Fraction(2) ** (sc[r * ((cols + 31) // 32) + col // 32] - 127)
                    bad += got[r * cols + col] != e2m1_sr8(float(y), (word >> (8 * (col % 4))) & 0xFF)
            check(bad == 0, f"quantize ptx_x4: {bad} codes differ from TE's rule")
        # A golden suite's rbits.npy reproduces its codes through quantize --rbits (Philox there, given words here).
        g = os.path.join(T, 'g')
        rc, _, err = run('golden', '--out', g)
        check(rc == 0, f"golden: exit {rc}: {err}")
        if rc == 0:
            cases = {k['name']: k for k in json.load(open(os.path.join(g, 'manifest.json')))['cases']}
            for name in ('nvfp4_rs_ptx__odd', 'mxfp4_rs__odd', 'mxfp8_e4m3_rs_ptx__odd'):
                case = cases.get(name)
                check(case is not None and case.get('rbits') == 'rbits.npy', f"golden: {name} has no rbits.npy")
                if case is None:
                    continue
                d = os.path.join(g, name)
                rc, _, err = run('quantize', '--quantizer', json.dumps(case['quantizer']), os.path.join(d, 'input.npy'),
                                 '--dequant', dq, '--codes', codes, '--rbits', os.path.join(d, 'rbits.npy'),
                                 '--seed', '999')
                check(rc == 0 and read_u8(codes) == read_u8(os.path.join(d, 'codes.npy')),
                      f"golden {name}: quantize --rbits does not reproduce codes.npy: {rc} {err}")
        # verify with a candidate's own words: a "kernel" (fp4lab quantize with other words) passes against
        # the suite only when its rbits.npy is given; words for a non-SR case fail that case.
        if rc == 0:
            cand = os.path.join(T, 'cand')
            name = 'nvfp4_rs_ptx__odd'
            case = cases[name]
            d = os.path.join(g, name)
            cd = os.path.join(cand, name)
            os.makedirs(cd)
            rows_, cols_ = case['shape']
            per = (cols_ + 3) // 4
            kw = [rng.getrandbits(32) for _ in range(rows_ * per)]
            write_npy(os.path.join(T, 'kw.npy'), '<u4', [rows_, per], kw)
            rc2, _, err = run('quantize', '--quantizer', json.dumps(case['quantizer']), os.path.join(d, 'input.npy'),
                              '--dequant', os.path.join(cd, 'dequant.npy'), '--codes', os.path.join(cd, 'codes.npy'),
                              '--scales', os.path.join(cd, 'scales.npy'), '--rbits', os.path.join(T, 'kw.npy'))
            check(rc2 == 0, f"candidate quantize: {rc2} {err}")
            rc2, out, _ = run('verify', g, cand, '--allow-missing', '--failures-only')
            check(rc2 == 1 and f"FAIL {name}" in out, f"verify without the candidate's words: exit {rc2}")
            shutil.copy(os.path.join(T, 'kw.npy'), os.path.join(cd, 'rbits.npy'))
            rc2, out, _ = run('verify', g, cand, '--allow-missing')
            check(rc2 == 0 and f"ok   {name}" in out and "random words" in out,
                  f"verify with the candidate's words: exit {rc2}: {out[-300:]}")
            nd = os.path.join(cand, 'nvfp4__odd')
            os.makedirs(nd)
            shutil.copy(os.path.join(T, 'kw.npy'), os.path.join(nd, 'rbits.npy'))
            rc2, out, _ = run('verify', g, cand, '--allow-missing', '--failures-only')
            check(rc2 == 1 and "FAIL nvfp4__odd" in out and "does not round stochastically" in out,
                  f"verify words for a non-SR case: exit {rc2}: {out[-300:]}")
        # Errors: wrong word count, wrong dtype, a contract without rs, ptx_x4 for int8.
        write_npy(w, '<u4', [rows, per_row + 1], [0] * (rows * (per_row + 1)))
        rc, _, err = run('cast', '--to', 'e2m1', '--round', 'rs', '--sr-bits', 'ptx_x4', '--rbits', w, x, c)
        check(rc == 2 and 'expected 24' in err and '4 words a row' in err, f"rbits count: {rc} {err}")
        write_npy(w, '|u1', [rows, per_row], [0] * (rows * per_row))
        rc, _, err = run('cast', '--to', 'e2m1', '--round', 'rs', '--sr-bits', 'ptx_x4', '--rbits', w, x, c)
        check(rc == 2 and 'uint32' in err, f"rbits dtype: {rc} {err}")
        rc, _, err = run('cast', '--to', 'e2m1', '--sr-bits', 'ptx_x4', x, c)
        check(rc == 2 and '--round rs only' in err, f"sr-bits without rs: {rc} {err}")
        rc, _, err = run('quantize', '--quantizer', '{"element":"int8","round":"rs"}', '--sr-bits', 'ptx_x4', x,
                         '--dequant', dq)
        check(rc == 2 and 'ptx_x4' in err, f"int8 ptx_x4: {rc} {err}")
        rc, _, err = run('cast', '--to', 'e2m1', '--round', 'rs', '--sr-bits', 'ptx', x, c)
        check(rc == 2 and 'valid: per_element, ptx_x4' in err, f"unknown contract: {rc} {err}")
    # sr-bias: the measured moments equal the analytic ones (8 bits: p = floor(256 f) / 256; 32 bits: p = f).
    with tempfile.TemporaryDirectory() as T:
        csv = os.path.join(T, 'sr.csv')
        rc, out, err = run('sr-bias', '--format', 'e4m3', '--points', '6', '--csv', csv)
        check(rc == 0, f"sr-bias: exit {rc}: {err}")
        if rc == 0:
            rows = [list(map(float, l.split(','))) for l in open(csv).read().splitlines()[1:]]
            check(len(rows) >= 8, f"sr-bias: {len(rows)} rows")
            for f, b32, v32, b8, v8 in rows:
                p8 = math.floor(256 * f) / 256
                check(abs(b32) < 1e-9 and abs(v32 - f * (1 - f)) < 1e-6 * max(f, 1e-9) + 1e-12,
                      f"sr-bias 32-bit at f={f}: bias {b32} var {v32}")
                check(abs(b8 - (p8 - f)) < 1e-9 and abs(v8 - p8 * (1 - p8)) < 1e-9, f"sr-bias 8-bit at f={f}: {b8} {v8}")
        rc, _, err = run('sr-bias', '--format', 'int8')
        check(rc == 2 and 'e2m1, e2m3' in err, f"sr-bias int8: {rc} {err}")
    if fails:
        print(f"test_sr_words: {fails} failed check(s)")
        return 1
    print("test_sr_words: ok")
    return 0


sys.exit(main())
