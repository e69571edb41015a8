"""Zero-tolerance checks for kernel tests in pytest.

assert_bitwise(candidate, reference) compares bit patterns, never values:
-0.0 differs from +0.0, and NaN matches NaN only with the same payload
(dequant arrays: any NaN matches any NaN, as ``fp4lab verify`` does, since a
kernel's NaN payload is not part of any contract here).

Either argument may be a QuantizeResult (its codes, scales and global scale
are compared, in that order, then its dequant), or an array (numpy, torch
CPU or CUDA, anything with __dlpack__) compared element by element. On a
mismatch one AssertionError message gives the number of mismatches, the
first differing index, the input value there (when the reference is a
QuantizeResult), and the expected and actual code and block scale.
"""
import numpy as _np

__all__ = ["assert_bitwise"]


def _host(a):
    if type(a).__module__.split(".")[0] == "torch" and hasattr(a, "data_ptr"):
        t = a.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        import torch
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(_np.uint16)
        return t.contiguous().numpy()
    if hasattr(a, "__dlpack__") and not isinstance(a, _np.ndarray):
        return _np.from_dlpack(a)
    return _np.asarray(a)


def _bits(a):
    a = _np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        return a.view({2: _np.uint16, 4: _np.uint32, 8: _np.uint64}[a.itemsize])
    return a


def _mismatches(exp, got, nan_equal=False):
    """Flat indices where the bit patterns differ (any NaN = any NaN with nan_equal)."""
    e, g = _bits(exp).reshape(-1), _bits(got).reshape(-1)
    diff = e != g
    if nan_equal and exp.dtype.kind == "f":
        diff &= ~(_np.isnan(exp.reshape(-1)) & _np.isnan(got.reshape(-1)))
    return _np.flatnonzero(diff)


def _fmt(v):
    v = _np.asarray(v)
    if v.dtype.kind == "f":
        return f"{float(v):.9g} (0x{int(_bits(v.reshape(1))[0]):0{v.itemsize * 2}X})"
    return f"0x{int(v):0{v.itemsize * 2}X}"


def _check_shape(name, exp, got):
    if exp.shape != got.shape or exp.dtype != got.dtype:
        raise AssertionError(f"{name}: expected {exp.dtype}{list(exp.shape)}, got {got.dtype}{list(got.shape)}")


def _scale_index(res, r, c):
    br, bc = res.spec["block"]
    if br == 0 and bc == 0:
        return (0, 0)
    if res.scale_row_offset is not None:  # grouped: the group's own scale rows
        return None
    return (r // br, c // bc)


def _is_result(x):
    return hasattr(x, "codes") and hasattr(x, "scales") and hasattr(x, "spec")


def _compare_results(cand, ref):
    x = _host(ref.input) if ref.input is not None else None
    codes_e, codes_g = _host(ref.codes), _host(cand.codes)
    _check_shape("codes", codes_e, codes_g)
    bad = _mismatches(codes_e, codes_g)
    sc_e, sc_g = _host(ref.scales), _host(cand.scales)
    _check_shape("scales", sc_e, sc_g)
    bad_s = _mismatches(sc_e, sc_g)
    if len(bad):
        i = int(bad[0])
        r, c = divmod(i, codes_e.shape[1]) if codes_e.ndim == 2 else (0, i)
        msg = [f"codes: {len(bad)} of {codes_e.size} element(s) differ; first at index ({r}, {c})"]
        if x is not None:
            msg.append(f"input {_fmt(x.reshape(-1)[i])}")
        msg.append(f"expected code {_fmt(codes_e.reshape(-1)[i])}, got {_fmt(codes_g.reshape(-1)[i])}")
        s = _scale_index(ref, r, c) if ref.scale_layout == "plain" else None
        if s is not None:
            msg.append(f"block scale {s}: expected {_fmt(sc_e[s])}, got {_fmt(sc_g[s])}")
        if len(bad_s):
            msg.append(f"({len(bad_s)} scale(s) differ too)")
        raise AssertionError("; ".join(msg))
    if len(bad_s):
        j = int(bad_s[0])
        idx = _np.unravel_index(j, sc_e.shape)
        raise AssertionError(f"scales: {len(bad_s)} of {sc_e.size} block scale(s) differ; first at {tuple(int(k) for k in idx)}: "
                             f"expected {_fmt(sc_e.reshape(-1)[j])}, got {_fmt(sc_g.reshape(-1)[j])} (every code agrees)")
    ge, gg = _host(ref.global_decode), _host(cand.global_decode)
    _check_shape("global scale", ge, gg)
    bad_g = _mismatches(ge, gg)
    if len(bad_g):
        j = int(bad_g[0])
        raise AssertionError(f"global scale: expected {_fmt(ge.reshape(-1)[j])}, got {_fmt(gg.reshape(-1)[j])}")
    _compare_arrays(_host(cand.dequant), _host(ref.dequant), "dequant", nan_equal=True)


def _compare_arrays(got, exp, name="array", nan_equal=False):
    _check_shape(name, exp, got)
    bad = _mismatches(exp, got, nan_equal)
    if len(bad):
        j = int(bad[0])
        idx = tuple(int(k) for k in _np.unravel_index(j, exp.shape))
        raise AssertionError(f"{name}: {len(bad)} of {exp.size} element(s) differ; first at index {idx}: "
                             f"expected {_fmt(exp.reshape(-1)[j])}, got {_fmt(got.reshape(-1)[j])}")


def assert_bitwise(candidate, reference):
    """Raises AssertionError unless candidate equals reference bit for bit (see the module's doc)."""
    if _is_result(reference):
        if not _is_result(candidate):
            raise AssertionError("reference is a QuantizeResult: the candidate must be one too "
                                 "(or compare arrays: assert_bitwise(codes, ref.codes))")
        return _compare_results(candidate, reference)
    return _compare_arrays(_host(candidate), _host(reference))
