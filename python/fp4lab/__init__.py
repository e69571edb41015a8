"""fp4lab from Python: the bit-exact reference of FP4/FP6/FP8 formats, block
quantizers (MX, NVFP4, RHT, stochastic rounding with the hardware's random-bit
contracts) and recipes, as the `fp4lab` command has them (the same C++ code,
through the extension module fp4lab._C).

Arrays: numpy arrays, torch tensors and any object with ``__dlpack__``. CPU
arrays that are C-contiguous and of the dtype a function takes are read in
place (no copy); results come back as numpy arrays, or as torch tensors (CPU
tensors sharing the numpy result's memory) when the input is a torch tensor.
A torch CUDA tensor given to :func:`quantize` runs fp4lab's CUDA kernels on
that tensor's device and current stream, without a host copy; its results
are CUDA tensors on the same device.

Errors: bad input raises ValueError with the message the CLI prints; a
failure of the environment (out of memory, no CUDA backend) RuntimeError.

Format names: ml_dtypes' (``float4_e2m1fn``, ``float8_e4m3fn``, ...) or
fp4lab's short ones (``e2m1``, ``e4m3``, ``ue4m3``, ``e8m0``, ``bf16``, ...).
Quantizers: a canned name (``nvfp4``, ``mxfp4``, ...), a dict or a JSON
string, as ``fp4lab quantize --quantizer`` takes (docs/DESIGN.md section 3).
"""
import json as _json

import numpy as _np

from . import _C

__version__ = _C.__version__
__all__ = ["formats", "cast", "decode", "quantize", "QuantizeResult", "gemm", "recipes", "recipe",
           "quantizers", "golden", "verify", "cuda_available"]

ROUNDS = ("rn", "rna", "rz", "rp", "rm", "rs")
OVERFLOWS = ("saturate", "nonsaturate")


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr")


def _host_array(x, what):
    """(numpy array, was_torch): x as a numpy array without a copy where possible.
    torch CPU tensors share memory (.numpy()); bfloat16 tensors become their exact
    float32 values; other __dlpack__ objects go through numpy.from_dlpack."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{what}: a {x.device.type} tensor; this function runs on the CPU (pass x.cpu())")
        t = x.detach()
        if t.dtype == _torch().bfloat16:
            t = t.float()  # exact: every bfloat16 is a float32
        return _np.asarray(t.numpy()), True
    if isinstance(x, _np.ndarray):
        return x, False
    if hasattr(x, "__dlpack__"):
        return _np.from_dlpack(x), False
    return _np.asarray(x), False


def _contiguous(a):
    return a if a.flags.c_contiguous else _np.ascontiguousarray(a)


def _back(a, as_torch):
    if as_torch and isinstance(a, _np.ndarray):
        return _torch().from_numpy(a)
    return a


def _quantizer_text(q):
    if isinstance(q, dict):
        return _json.dumps(q)
    if isinstance(q, str):
        return q
    raise ValueError(f"quantizer: a canned name, a dict or a JSON string, got {type(q).__name__}")


def formats():
    """Every format: a list of dicts (name, short_name, bits, exponent_bits,
    mantissa_bits, bias, max, min_normal, min_subnormal, has_inf, has_nan, ...)."""
    return _C.formats()


def quantizers():
    """The canned quantizer names (``nvfp4``, ``mxfp4``, ...)."""
    return list(_C.quantizer_names())


def cuda_available():
    """True when fp4lab was built with its CUDA backend and a GPU is visible."""
    return bool(_C.cuda_available())


def cast(x, to, *, round="rn", overflow="saturate", seed=0, sr_bits="per_element", rbits=None):
    """The codes of x in format `to` (uint8; uint16 for bfloat16/float16), x's shape.

    x: float32 or float64 values (a float64 is rounded once, directly to `to`).
    round: rn | rna | rz | rp | rm | rs (stochastic: random bits from
    Philox4x32-10 keyed by `seed`, or the given `rbits`).
    sr_bits: per_element (32 random bits an element) | ptx_x4 (PTX cvt.rs: one
    word per 4 elements of the last axis). rbits: uint32 words replacing Philox's.
    """
    a, was_torch = _host_array(x, "cast: x")
    words = None if rbits is None else _contiguous(_host_array(rbits, "cast: rbits")[0])
    out = _C.cast(_contiguous(a), to, round, overflow, int(seed), sr_bits, words)
    return _back(out, was_torch)


def decode(codes, from_):
    """The exact float32 values of `codes` (uint8, or uint16 for 16-bit formats) of format `from_`."""
    a, was_torch = _host_array(codes, "decode: codes")
    return _back(_C.decode(_contiguous(a), from_), was_torch)


class QuantizeResult:
    """What :func:`quantize` returns.

    dequant        float32, x's shape: decode(code) * scale * global_decode
    codes          uint8 element codes, one per element, x's shape
    scales         the block scales as ``fp4lab quantize --scales`` writes them:
                   uint8 scale codes, or float32 for float32 scales; with
                   scale_layout="swizzled" the 1-D uint8 swizzled layout of
                   Blackwell's block-scaled GEMMs
    scale_values   float32 decoded block scales [scale_rows, scale_cols]
    global_scale   NVFP4's per-tensor decode scale (float; a float32 array of one
                   per group with groups) or None where the scheme has none
    amax           max |x| of what the codes see (RHT-transformed with rht); NaN if x has NaN
    spec           the quantizer as a dict (every key, defaults filled in)
    input          x itself (for the messages of fp4lab.testing.assert_bitwise)
    """

    __slots__ = ("dequant", "codes", "scales", "spec", "input", "scale_layout", "scale_row_offset", "_amax",
                 "_amax_fn", "_scale_values", "_scale_values_fn", "_global_decode", "_global_decode_fn")

    def __init__(self, **kw):
        self._amax = self._amax_fn = self._scale_values = self._scale_values_fn = None
        self._global_decode = self._global_decode_fn = None
        for k, v in kw.items():
            setattr(self, k, v)

    # Fields a CUDA result computes on first use (a call on a small tensor
    # allocates only what every caller needs: codes, scales, dequant and, with
    # a global scale, its decode scale).
    @property
    def amax(self):
        if self._amax is None and self._amax_fn is not None:
            self._amax = self._amax_fn()
        return self._amax

    @property
    def scale_values(self):
        if self._scale_values is None and self._scale_values_fn is not None:
            self._scale_values = self._scale_values_fn()
        return self._scale_values

    @property
    def global_decode(self):
        if self._global_decode is None and self._global_decode_fn is not None:
            self._global_decode = self._global_decode_fn()
        return self._global_decode

    @property
    def global_scale(self):
        if self.spec.get("global_scale") != "tensor_amax":
            return None
        g = self.global_decode
        if self.scale_row_offset is not None:
            return g
        return float(g[0])

    @property
    def block(self):
        return tuple(self.spec["block"])

    def __repr__(self):
        shape = tuple(self.codes.shape)
        return f"QuantizeResult({_C.quantizer_json(_json.dumps(self.spec))}, shape={shape})"


def _spec_dict(text):
    return _json.loads(_C.quantizer_json(text))


def quantize(x, quantizer, *, seed=0, stream=0, rbits=None, groups=None, scale_layout="plain", packed=False,
             dequant=True):
    """Block quantization of a 2-D float32 x [rows, cols] (bfloat16 torch tensors: their exact values).

    quantizer: canned name, dict or JSON string (docs/DESIGN.md section 3).
    seed, stream: the Philox key and stream of stochastic rounding (the CLI's
    --seed/--stream). rbits: uint32 random words replacing Philox's (CPU only).
    groups: rows per group (1-D int64), each group quantized alone (MoE experts;
    CPU only). scale_layout: "plain" or "swizzled" (Blackwell's GEMM scale layout).
    packed: 4-bit codes two a byte, [rows, ceil(cols/2)], low nibble = even
    column (torch's float4_e2m1fn_x2 and TransformerEngine's layout).
    dequant: False skips the dequantized output (result.dequant is None).
    A torch CUDA tensor runs on its device and current stream (no host copy).
    Returns a :class:`QuantizeResult`.
    """
    if scale_layout not in ("plain", "swizzled"):
        raise ValueError(f"scale_layout='{scale_layout}': valid: plain, swizzled")
    text = quantizer if type(quantizer) is str else _quantizer_text(quantizer)
    if getattr(x, "is_cuda", False):  # a torch CUDA tensor (numpy arrays have no is_cuda)
        if rbits is not None or groups is not None:
            raise ValueError("quantize: rbits and groups run on the CPU only; pass x.cpu()")
        return _quantize_cuda(x, text, int(seed), int(stream), scale_layout, packed, dequant)
    a, was_torch = _host_array(x, "quantize: x")
    words = None if rbits is None else _contiguous(_host_array(rbits, "quantize: rbits")[0])
    sizes = None if groups is None else _np.ascontiguousarray(_host_array(groups, "quantize: groups")[0], dtype=_np.int64)
    d = _C.quantize(_contiguous(a), text, int(seed), int(stream), words, sizes, scale_layout == "swizzled")
    if packed:
        _check_packable(d["spec"])
        d["codes"] = _C.pack_fp4(d["codes"])
    b = lambda v: _back(v, was_torch)
    return QuantizeResult(dequant=b(d["dequant"]) if dequant else None, codes=b(d["codes"]),
                          scales=b(d["swizzled"] if scale_layout == "swizzled" else d["scales"]),
                          _scale_values=b(d["scale_values"]), _global_decode=b(d["global_decode"]),
                          spec=_json.loads(d["spec"]), input=x, scale_layout=scale_layout,
                          scale_row_offset=d.get("scale_row_offset"), _amax=d["amax"])


def _check_packable(spec_text_or_dict):
    spec = spec_text_or_dict if isinstance(spec_text_or_dict, dict) else _json.loads(spec_text_or_dict)
    if spec["element"] not in ("e2m1", "float4_e2m1fn"):
        raise ValueError(f"packed=True: two codes a byte is for 4-bit elements; the element is {spec['element']}")


def _scale_grid(spec, rows, cols):
    br, bc = spec["block"]
    if br == 0 and bc == 0:
        return 1, 1
    return -(-rows // br), -(-cols // bc)


_PLAN_CACHE = {}


def _current_stream(torch, index):
    """The current stream of device `index` as a cudaStream_t integer (torch's
    raw accessor where it has one: a Stream object costs ~4 us a call)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def _quantize_cuda(x, text, seed, stream, scale_layout, packed, want_dequant):
    """fp4lab.quantize of a torch CUDA tensor: outputs allocated by torch on x's
    device, the kernels launched on the current stream (cuda/quantize.hpp)."""
    torch = _torch()
    key = (text, packed, tuple(x.shape), x.dtype)
    plan = _PLAN_CACHE.get(key)
    if plan is None:  # what depends only on the quantizer, the shape and the dtype, worked out once
        if x.dim() != 2:
            raise ValueError(f"quantize: x: needs a 2-D tensor [rows, cols], got {x.dim()} dimension(s)")
        if x.dtype != torch.float32 and x.dtype != torch.bfloat16:
            raise ValueError(f"quantize: x: needs float32 or bfloat16 values, got {x.dtype}")
        spec = _spec_dict(text)
        if packed:
            _check_packable(spec)
        rows, cols = x.shape
        float_scales = spec["scale"] in ("f32", "float32")
        plan = _PLAN_CACHE[key] = (spec, rows, cols, (rows, (cols + 1) // 2 if packed else cols),
                                   _scale_grid(spec, rows, cols), torch.float32 if float_scales else torch.uint8,
                                   float_scales, spec.get("global_scale") == "tensor_amax",
                                   "f32" if x.dtype == torch.float32 else "bf16")
    spec, rows, cols, code_shape, scale_shape, scale_dtype, float_scales, has_global, in_type = plan
    if not x.is_contiguous():
        x = x.contiguous()
    dev = x.device
    codes = torch.empty(code_shape, dtype=torch.uint8, device=dev)
    scale_codes = torch.empty(scale_shape, dtype=scale_dtype, device=dev)
    dq = torch.empty((rows, cols), dtype=torch.float32, device=dev) if want_dequant else None
    g = torch.empty((1,), dtype=torch.float32, device=dev) if has_global else None
    args = (text, x.data_ptr(), in_type, rows, cols, seed, stream, codes.data_ptr(),
            0 if float_scales else scale_codes.data_ptr(), scale_codes.data_ptr() if float_scales else 0,
            dq.data_ptr() if want_dequant else 0, g.data_ptr() if has_global else 0, packed)
    if dev.index == torch.cuda.current_device():
        _C.quantize_device(*args, _current_stream(torch, dev.index))
    else:
        with torch.cuda.device(dev):
            _C.quantize_device(*args, _current_stream(torch, dev.index))
    scales = scale_codes
    if scale_layout == "swizzled":  # the layout is built on the host from the scale codes (one small copy)
        host = quantize(x.float().cpu(), text, seed=seed, stream=stream, scale_layout="swizzled", dequant=False)
        scales = host.scales.to(dev)

    def amax():
        if spec.get("rht"):
            return float(_C.domain_amax(_np.ascontiguousarray(x.float().cpu().numpy()), text))
        return float(x.detach().abs().max().float().item()) if x.numel() else 0.0

    def scale_values():  # decoded block scales: the scale codes decoded on the host (a small copy)
        if float_scales:
            return scale_codes
        return torch.from_numpy(_C.decode(scale_codes.cpu().numpy(), spec["scale"])).to(dev)

    def global_decode():
        return g if has_global else torch.ones((1,), dtype=torch.float32, device=dev)

    return QuantizeResult(dequant=dq, codes=codes, scales=scales, spec=spec, input=x, scale_layout=scale_layout,
                          scale_row_offset=None, _amax_fn=amax, _scale_values_fn=scale_values,
                          _global_decode_fn=global_decode)


def gemm(a, b, *, qa=None, qb=None, seed=0, stream_a=0, stream_b=1):
    """The quantized GEMM simulation y = dq(a) dq(b)^T in FP32 (sim/gemm.hpp,
    accumulation model fp32_eigen): a [m, k], b [n, k], both quantized along k
    with qa and qb (give both or neither; neither: a plain FP32 GEMM)."""
    av, ta = _host_array(a, "gemm: a")
    bv, _ = _host_array(b, "gemm: b")
    y = _C.gemm(_contiguous(av), "" if qa is None else _quantizer_text(qa), _contiguous(bv),
                "" if qb is None else _quantizer_text(qb), int(seed), int(stream_a), int(seed), int(stream_b))
    return _back(y, ta)


def recipes():
    """The canned recipe names (``fp4lab recipes list``)."""
    return list(_C.recipe_names())


def recipe(name):
    """A recipe as a dict (``fp4lab recipes export``'s form): a canned name, a JSON file or a JSON string."""
    return _json.loads(_C.recipe_json(name if isinstance(name, str) else _json.dumps(name)))


def _cli(args):
    code, message = _C.run_cli([str(a) for a in args])
    if code == 0:
        return True
    if code == 2:
        raise ValueError(message)
    if code == 1 and not message:
        return False  # verify: a mismatch or a missing case (its report is on stdout)
    raise RuntimeError(message or f"fp4lab {args[0]} exited {code}")


def golden(out, *, seed=None):
    """Writes the golden-vector suite (``fp4lab golden --out OUT``): one directory per case."""
    args = ["golden", "--out", str(out)]
    if seed is not None:
        args += ["--seed", str(int(seed))]
    return _cli(args)


def verify(suite, candidate, *, allow_missing=False, failures_only=False, max_report=None):
    """Checks a candidate's outputs against a golden suite bit for bit (``fp4lab verify``).
    Returns True when every case matches, False otherwise (the report is printed);
    raises ValueError for an unreadable suite or candidate directory."""
    args = ["verify", str(suite), str(candidate)]
    if allow_missing:
        args.append("--allow-missing")
    if failures_only:
        args.append("--failures-only")
    if max_report is not None:
        args += ["--max-report", str(int(max_report))]
    return _cli(args)


def cli(*args):
    """Runs any ``fp4lab`` command in this process (``fp4lab.cli("formats")``):
    True on success, False for a failed check; raises as the other functions do."""
    return _cli(args)


from . import testing  # noqa: E402  (fp4lab.testing.assert_bitwise)
