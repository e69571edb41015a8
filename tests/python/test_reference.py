"""The Python package against independent oracles and against the CLI.

- decode: every code of every format <= 16 bits against a decoder written here
  from the bit-field definitions (docs/DESIGN.md section 2), not from fp4lab's;
- cast, round to nearest even: every representable value round-trips, and
  the midpoints between neighbours go to the even code (a construction from
  the decoded grid, not from the encoder);
- cast with torch's own float8 casts where this torch has them (torch >= 2.1);
- quantize, cast, decode: byte for byte what the `fp4lab` CLI writes for the
  same input, over every case of the golden suite (the binding adds nothing);
- golden/verify as functions, errors as ValueError with the CLI's message.
"""
import json
import math
import os
import pathlib
import subprocess

import numpy as np
import pytest

import fp4lab
from fp4lab.testing import assert_bitwise

FP4LAB = os.environ.get("FP4LAB_BIN", "")


def ref_decode(fmt, code):
    """A float from the bit fields of `fmt` (a dict of fp4lab.formats()), written from the definitions."""
    e_bits, m_bits, bias, signed = fmt["exponent_bits"], fmt["mantissa_bits"], fmt["bias"], fmt["signed"]
    name = fmt["name"]
    if fmt["integer"]:  # MXINT8: two's complement of 8 bits, value k / 2^bias
        k = code - 256 if code & 0x80 else code
        return k / 2.0 ** bias
    sign = -1.0 if signed and (code >> (e_bits + m_bits)) & 1 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    if name == "float8_e8m0fnu":
        return math.nan if code == 0xFF else 2.0 ** (e - bias)
    if name.endswith("fnuz") and code == 0x80:
        return math.nan
    if name in ("float8_e5m2", "bfloat16", "float16") and e == (1 << e_bits) - 1:
        return sign * math.inf if m == 0 else math.nan
    if name in ("float8_e4m3fn", "ufloat8_e4m3") and e == (1 << e_bits) - 1 and m == (1 << m_bits) - 1:
        return math.nan
    if e == 0:
        return sign * 2.0 ** (1 - bias) * (m / 2.0 ** m_bits)
    return sign * 2.0 ** (e - bias) * (1 + m / 2.0 ** m_bits)


SMALL = [f for f in fp4lab.formats() if f["bits"] <= 16]


@pytest.mark.parametrize("fmt", SMALL, ids=[f["name"] for f in SMALL])
def test_decode_every_code(fmt):
    n = 1 << fmt["bits"]
    codes = np.arange(n, dtype=np.uint16 if fmt["bits"] > 8 else np.uint8)
    got = fp4lab.decode(codes, fmt["name"])
    assert got.dtype == np.float32 and got.shape == codes.shape
    for c in range(n):
        exp = ref_decode(fmt, c)
        g = float(got[c])
        if math.isnan(exp):
            assert math.isnan(g), (fmt["name"], c)
        else:
            assert g == exp and math.copysign(1, g) == math.copysign(1, exp), (fmt["name"], hex(c), g, exp)


# (e8m0 has no mantissa: its ties follow ml_dtypes' carry rule, core/encode.hpp, checked in test_core.)
@pytest.mark.parametrize("fmt", [f for f in SMALL if f["bits"] <= 8 and not f["integer"] and f["mantissa_bits"]],
                         ids=lambda f: f["name"])
def test_cast_rn_round_trip_and_ties_to_even(fmt):
    n = 1 << fmt["bits"]
    codes = np.arange(n, dtype=np.uint8)
    vals = fp4lab.decode(codes, fmt["name"])
    finite = np.isfinite(vals)
    # Every finite code round-trips (the -0 / +0 and NaN codes aside).
    back = fp4lab.cast(vals[finite], fmt["name"])
    assert np.array_equal(fp4lab.decode(back, fmt["name"]), vals[finite])
    # Midpoints between neighbouring positive values round to the code with an even mantissa.
    pos = np.unique(vals[finite & (vals >= 0)].astype(np.float64))
    mids = (pos[:-1] + pos[1:]) / 2
    got = fp4lab.decode(fp4lab.cast(mids, fmt["name"]), fmt["name"]).astype(np.float64)
    even = []
    for lo, hi in zip(pos[:-1], pos[1:]):
        c_lo = int(fp4lab.cast(np.array([lo]), fmt["name"])[0])
        even.append(lo if c_lo % 2 == 0 else hi)
    assert np.array_equal(got, np.array(even)), fmt["name"]


def test_cast_matches_torch_float8():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip(f"torch {torch.__version__} has no float8 dtypes (>= 2.1 has)")
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(1 << 16) * np.exp2(rng.integers(-12, 10, 1 << 16))).astype(np.float32)
    for name, dt, maxv in (("float8_e4m3fn", torch.float8_e4m3fn, 448.0), ("float8_e5m2", torch.float8_e5m2, 57344.0)):
        xs = np.clip(x, -maxv, maxv)  # torch's cast does not saturate: compare inside the range
        ours = fp4lab.cast(xs, name)
        theirs = torch.from_numpy(xs).to(dt).view(torch.uint8).numpy()
        assert_bitwise(ours, theirs)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 64)
    r = fp4lab.quantize(x, "nvfp4")
    assert isinstance(r.dequant, torch.Tensor) and r.dequant.dtype == torch.float32
    n = fp4lab.quantize(x.numpy(), "nvfp4")
    assert_bitwise(r, n)
    assert np.shares_memory(fp4lab._host_array(x, "x")[0], x.numpy())  # read in place
    bf = x.to(torch.bfloat16)
    assert_bitwise(fp4lab.quantize(bf, "mxfp4").codes, fp4lab.quantize(bf.float(), "mxfp4").codes)


def test_quantize_result_fields():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    r = fp4lab.quantize(x, "nvfp4")
    assert r.codes.dtype == np.uint8 and r.codes.shape == (32, 64)
    assert r.scales.dtype == np.uint8 and r.scales.shape == (32, 4)
    assert r.global_scale is not None and r.amax == np.abs(x).max()
    assert fp4lab.quantize(x, "mxfp4").global_scale is None
    # dequant = decode(code) * scale * global (the definition, rebuilt here)
    el = fp4lab.decode(r.codes, "e2m1")
    sc = np.repeat(fp4lab.decode(r.scales, "ue4m3"), 16, axis=1)
    assert_bitwise(((el * sc).astype(np.float32) * np.float32(r.global_scale)).astype(np.float32), r.dequant)
    sw = fp4lab.quantize(x, "nvfp4", scale_layout="swizzled")
    assert sw.scales.dtype == np.uint8 and sw.scales.ndim == 1 and sw.scales.size == 128 * 4


def test_bad_input_is_value_error_with_cli_message():
    with pytest.raises(ValueError, match="rounding mode .bogus.; valid: rn"):
        fp4lab.cast(np.zeros(3, np.float32), "e2m1", round="bogus")
    with pytest.raises(ValueError, match="neither a canned name"):
        fp4lab.quantize(np.zeros((4, 4), np.float32), "not_a_quantizer")
    with pytest.raises(ValueError, match="2-D"):
        fp4lab.quantize(np.zeros(4, np.float32), "mxfp4")
    with pytest.raises(ValueError, match="float32"):
        fp4lab.quantize(np.zeros((4, 4), np.float64), "mxfp4")
    with pytest.raises(ValueError, match="rbits"):
        fp4lab.cast(np.zeros(3, np.float32), "e2m1", rbits=np.zeros(3, np.uint32))


def test_assert_bitwise_message():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    ref = fp4lab.quantize(x, "mxfp4")
    bad = fp4lab.quantize(x, "mxfp4")
    bad.codes = bad.codes.copy()
    bad.codes[3, 5] ^= 1
    bad.codes[7, 1] ^= 2
    with pytest.raises(AssertionError) as e:
        assert_bitwise(bad, ref)
    msg = str(e.value)
    assert "2 of 512" in msg and "(3, 5)" in msg and "input" in msg and "block scale (3, 0)" in msg, msg
    assert_bitwise(fp4lab.quantize(x, "mxfp4"), ref)


def test_recipes_and_gemm():
    names = fp4lab.recipes()
    assert "nvfp4" in names and "fp32" in names
    r = fp4lab.recipe("nvfp4")
    assert r["name"] == "nvfp4"
    rng = np.random.default_rng(5)
    a = rng.standard_normal((8, 64)).astype(np.float32)
    b = rng.standard_normal((4, 64)).astype(np.float32)
    y = fp4lab.gemm(a, b, qa="mxfp4", qb="mxfp4")
    exp = fp4lab.quantize(a, "mxfp4").dequant.astype(np.float64) @ fp4lab.quantize(b, "mxfp4").dequant.astype(np.float64).T
    assert np.allclose(y, exp, rtol=1e-5, atol=1e-5)


def run_cli(*args):
    if not FP4LAB:
        pytest.skip("FP4LAB_BIN (the fp4lab executable) is not set")
    subprocess.run([FP4LAB, *map(str, args)], check=True, capture_output=True)


def load_npy(p):
    return np.load(p, allow_pickle=False)


def test_golden_suite_byte_for_byte_with_the_cli(tmp_path):
    """Every case of the golden suite, quantized through Python, equals the suite the CLI wrote."""
    suite = tmp_path / "suite"
    assert fp4lab.golden(suite) is True
    manifest = json.loads((suite / "manifest.json").read_text())
    cases = manifest["cases"]
    assert len(cases) > 50
    checked = 0
    for c in cases:
        d = suite / c["name"]
        x = load_npy(d / "input.npy")
        rbits = load_npy(d / "rbits.npy") if (d / "rbits.npy").exists() else None
        r = fp4lab.quantize(x, json.dumps(c["quantizer"]), seed=c.get("seed", 0), stream=c.get("stream", 0),
                            rbits=rbits)
        codes = load_npy(d / "codes.npy")
        if codes.shape != r.codes.shape:  # FP4 packed two per byte in the suite
            packed = (r.codes[:, 0::2] & 0xF) | ((r.codes[:, 1::2] & 0xF) << 4) if r.codes.shape[1] % 2 == 0 else None
            assert packed is not None and packed.shape == codes.shape, c["name"]
            assert_bitwise(packed.astype(np.uint8), codes)
        else:
            assert_bitwise(r.codes, codes)
        assert_bitwise(r.scales, load_npy(d / "scales.npy"))
        deq = load_npy(d / "dequant.npy")
        assert np.array_equal(r.dequant.view(np.uint32), deq.view(np.uint32)) or \
            np.array_equal(np.isnan(r.dequant), np.isnan(deq)) and \
            np.array_equal(r.dequant[~np.isnan(deq)].view(np.uint32), deq[~np.isnan(deq)].view(np.uint32)), c["name"]
        checked += 1
    assert checked == len(cases)
    # and verify() as a function: the suite against itself passes, a damaged copy fails
    cand = tmp_path / "cand"
    cand.mkdir()
    first = cases[0]["name"]
    (cand / first).mkdir()
    for f in ("codes.npy", "scales.npy", "dequant.npy"):
        (cand / first / f).write_bytes((suite / first / f).read_bytes())
    assert fp4lab.verify(suite, cand, allow_missing=True) is True
    codes = load_npy(cand / first / "codes.npy")
    codes.reshape(-1)[0] ^= 1
    np.save(cand / first / "codes.npy", codes)
    assert fp4lab.verify(suite, cand, allow_missing=True) is False
    with pytest.raises(ValueError):
        fp4lab.verify(tmp_path / "missing", cand)


def test_cli_npy_byte_for_byte(tmp_path):
    """cast / decode / quantize through Python = the CLI's .npy outputs, for random inputs and SR."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((48, 64)) * 3).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for to, rnd in (("e2m1", "rn"), ("e4m3", "rs"), ("bf16", "rz"), ("e2m3", "rs")):
        run_cli("cast", "--to", to, "--round", rnd, "--seed", 9, tmp_path / "x.npy", tmp_path / "c.npy")
        c = fp4lab.cast(x, to, round=rnd, seed=9)
        assert_bitwise(c, load_npy(tmp_path / "c.npy"))
        run_cli("decode", "--from", to, tmp_path / "c.npy", tmp_path / "d.npy")
        assert_bitwise(fp4lab.decode(c, to), load_npy(tmp_path / "d.npy"))
    for q in ("nvfp4", "mxfp4", "nvfp4_2d", "mxfp8_e4m3", "nvfp4_col",
              '{"element": "e2m1", "scale": "ue4m3", "block": [1, 16], "scale_rule": "nv", '
              '"global_scale": "tensor_amax", "round": "rs", "rht": true, "rht_seed": 3}'):
        run_cli("quantize", "--quantizer", q, "--seed", 4, "--stream", 2, tmp_path / "x.npy", "--dequant",
                tmp_path / "dq.npy", "--codes", tmp_path / "codes.npy", "--scales", tmp_path / "s.npy")
        r = fp4lab.quantize(x, q, seed=4, stream=2)
        assert_bitwise(r.dequant, load_npy(tmp_path / "dq.npy"))
        assert_bitwise(r.codes, load_npy(tmp_path / "codes.npy"))
        assert_bitwise(r.scales, load_npy(tmp_path / "s.npy"))
