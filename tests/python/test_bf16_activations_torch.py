"""precision.activations "bf16" (docs/DESIGN.md, "BF16 activations") against PyTorch's BF16 ops on the CPU,
the semantics' reference: torch.autocast(device_type="cpu", dtype=torch.bfloat16) and BF16 tensors.

Through fp4lab._C.cpu_backend_op (python/src/bind_activations.cpp), a CPU backend op in each mode.
What must agree, and how closely:
- Every output the semantics rounds is BF16-representable (bit for bit: its low 16 bits are zero).
- GELU on BF16 inputs: bit for bit torch's FP32 -> BF16 cast of fp4lab's FP32 GELU (one RNE); against torch's
  FP32 formula rounded once (what torch's own BF16 GELU is on AVX512 CPUs, checked where it holds), within 1
  BF16 ulp, bit for bit on >= 99% (y) / 95% (dx): the FP32 formulas differ (torch's 0.5 x (1 + erf(x / sqrt 2)) cancels in the
  negative tail, fp4lab's erf_f32 form does not), and where they differ fp4lab's is as close to float64's.
- LayerNorm (autocast's FP32 list; its consumer linear rounds the output): y = r(torch's FP32 output) within
  1 BF16 ulp, bit for bit on >= 99.9% (FP32 mean/variance summation orders differ); dx (FP32 in both) within
  1e-5 relative.
- Cross-entropy of BF16 logits (FP32 softmax; the logits' gradient through the cast back to BF16): dlogits
  within 1 BF16 ulp, bit for bit on >= 99.9%; the loss within 1e-6 relative (fp4lab sums in float64).
- A linear layer under autocast (BF16 x, W, b; FP32 accumulation; BF16 y and gradients, dW and db widened
  into the FP32 .grad) against fp4lab's bf16 recipe with bf16 activations: y, dx, dW, db within 1 BF16 ulp,
  bit for bit on >= 99%: the GEMMs' FP32 accumulation order differs (oneDNN's blocking against fp4lab's
  tiles), by about K 2^-24 relative, before the one rounding. The same against torch's FP32 matmuls of the
  BF16 operands rounded once, on every CPU; autocast itself only where its GEMMs accumulate in FP32 (not
  torch 1.13's AVX2 backward kernels: skipped there, saying so).
A whole-model comparison (a GPT step under autocast) is not bit for bit for the same reason, compounded over
layers and through the softmax: tests/train/test_activations.cpp and tests/cli/test_bf16_activations.py check
the model-level behaviour (loss and gradients close to fp32's) instead.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
fp4lab = pytest.importorskip("fp4lab")
if not hasattr(fp4lab._C, "cpu_backend_op"):
    pytest.skip("fp4lab._C.cpu_backend_op not built", allow_module_level=True)
F = torch.nn.functional


def op(name, activations="bf16", recipe="fp32", **arrays):
    return fp4lab._C.cpu_backend_op(name, activations, arrays, recipe=recipe)


def bf16_values(rng, *shape, scale=1.0):
    """float32 values that are exactly BF16 (torch's BF16 tensor of them holds the same values)."""
    x = torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32))
    return x.to(torch.bfloat16).float().numpy()


def key(a):
    """BF16 values (as float32 or bfloat16) -> ordered integers: one BF16 ulp apart = 1 apart."""
    t = torch.as_tensor(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
    assert t.dtype in (torch.float32, torch.bfloat16)
    b = t.to(torch.bfloat16).view(torch.int16).numpy().astype(np.int64)
    return np.where(b < 0, -(b & 0x7FFF), b)


def is_bf16(a):
    return np.all((np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) & 0xFFFF) == 0)


def check_ulps(name, ours, theirs, min_equal):
    assert is_bf16(ours), f"{name}: not BF16 values"
    d = np.abs(key(ours) - key(theirs))
    equal = float(np.mean(d == 0))
    assert d.max() <= 1, f"{name}: {d.max()} BF16 ulps apart at {np.unravel_index(d.argmax(), d.shape)}"
    assert equal >= min_equal, f"{name}: only {equal:.5f} bit for bit"


def gelu_torch_fp32_rounded(x, dy):
    """torch's FP32 GELU formula and its gradient on BF16 values, each rounded once to BF16 (RNE)."""
    x32 = torch.from_numpy(x).requires_grad_()
    y32 = F.gelu(x32)
    y32.backward(torch.from_numpy(dy))
    return y32.detach().to(torch.bfloat16), x32.grad.to(torch.bfloat16)


def cpu_capability():
    return next((l.split(":")[1].strip() for l in torch.__config__.show().splitlines() if "CPU capability" in l), "?")


def test_gelu_matches_torch_fp32_formula_rounded_once():
    rng = np.random.default_rng(1)
    x, dy = bf16_values(rng, 64, 1024, scale=3.0), bf16_values(rng, 64, 1024)
    ours, ours32 = op("gelu", x=x, dy=dy), op("gelu", "fp32", x=x, dy=dy)
    # The semantics, bit for bit: one RNE (torch's FP32 -> BF16 cast) of fp4lab's FP32 formula.
    assert np.array_equal(key(ours["y"]), key(torch.from_numpy(ours32["y"])))
    assert np.array_equal(key(ours["dx"]), key(torch.from_numpy(ours32["dx"])))
    # The values against torch's FP32 formula rounded once: the two FP32 formulas differ by a few FP32 ulps (erf
    # implementations), and by up to ~2^-24 |x| absolute where 1 + erf(x / sqrt 2) cancels (x < -3, both),
    # which can be many BF16 ulps of a tiny output. So: within 1 BF16 ulp or that absolute error, and mostly
    # bit for bit.
    ty, tdx = gelu_torch_fp32_rounded(x, dy)
    for name, o, t, lim in (("y", ours["y"], ty, 0.99), ("dx", ours["dx"], tdx, 0.95)):
        d = np.abs(key(o) - key(t))
        far = (d > 1) & (np.abs(o - t.float().numpy()) > 2 ** -22 * np.maximum(1, np.abs(x)))
        assert not far.any(), f"gelu {name}: more than 1 BF16 ulp (and 2^-22 |x|) apart at {np.argwhere(far)[:3]}"
        assert np.mean(d == 0) >= lim, f"gelu {name}: only {np.mean(d == 0):.5f} bit for bit"


def test_torch_bf16_gelu_is_its_fp32_formula_rounded_once():
    # The premise that makes torch's BF16 GELU the same reference: true of torch's AVX512 CPU kernels; torch
    # 1.13's AVX2 kernels compute BF16 GELU otherwise (seen on an AMD EPYC, 2026-12-03): skipped there.
    rng = np.random.default_rng(1)
    x, dy = bf16_values(rng, 64, 1024, scale=3.0), bf16_values(rng, 64, 1024)
    xt = torch.from_numpy(x).to(torch.bfloat16)
    ty, _ = gelu_torch_fp32_rounded(x, dy)
    if not torch.equal(F.gelu(xt), ty):
        pytest.skip(f"torch {torch.__version__}'s BF16 GELU on this CPU ({cpu_capability()}) is not its FP32 "
                    "formula rounded once; the other GELU test compares against that formula directly")


def test_layernorm_rounds_torch_fp32_output():
    rng = np.random.default_rng(2)
    N, C = 300, 256
    x = (rng.standard_normal((N, C)) * 2 + 0.3).astype(np.float32)
    g = (rng.standard_normal(C) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(C).astype(np.float32)
    dy = bf16_values(rng, N, C)
    ours = op("layernorm", x=x, dy=dy, gamma=g, beta=b)
    xt = torch.from_numpy(x).requires_grad_()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        y = F.layer_norm(xt, (C,), torch.from_numpy(g), torch.from_numpy(b), 1e-5)
    assert y.dtype == torch.float32  # autocast: layer_norm runs and returns FP32
    y.backward(torch.from_numpy(dy))
    check_ulps("layernorm y", ours["y"], y.detach(), 0.999)
    ref = xt.grad.numpy()
    assert np.max(np.abs(ours["dx"] - ref)) <= 1e-5 * (1 + np.max(np.abs(ref)))
    # fp32 mode writes the unrounded output
    assert not is_bf16(op("layernorm", "fp32", x=x, dy=dy, gamma=g, beta=b)["y"])


def test_cross_entropy_grad_matches_torch():
    rng = np.random.default_rng(3)
    N, V = 256, 65
    logits = bf16_values(rng, N, V, scale=2.0)
    t = rng.integers(0, V, N).astype(np.int32)
    ours = op("cross_entropy", logits=logits, targets=t)
    lt = torch.from_numpy(logits).to(torch.bfloat16).requires_grad_()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(lt.float(), torch.from_numpy(t).long())
    loss.backward()
    assert lt.grad.dtype == torch.bfloat16
    check_ulps("dlogits", ours["dlogits"], lt.grad, 0.999)
    assert abs(ours["loss"][0] - loss.item()) <= 1e-6 * abs(loss.item())


def linear_case(bias):
    rng = np.random.default_rng(4)
    B, IN, OUT = 96, 128, 80
    x = rng.standard_normal((B, IN)).astype(np.float32)
    w = (rng.standard_normal((OUT, IN)) * 0.1).astype(np.float32)
    b = rng.standard_normal(OUT).astype(np.float32)
    dy = bf16_values(rng, B, OUT)
    arrays = dict(x=x, w=w, dy=dy)
    if bias:
        arrays["b"] = b
    return arrays, op("linear", recipe="bf16", **arrays)


def fp32_accumulated(arrays):
    """Autocast's semantics built from FP32 ops: BF16 roundings of x, W, b (and the BF16 dy), FP32 GEMMs
    (torch's FP32 matmul), each result rounded once to BF16 (dW and db: the FP32 sums rounded, as autocast's
    BF16 gradients widened into the FP32 .grad)."""
    r = lambda a: torch.from_numpy(a).to(torch.bfloat16).float()
    x, w, dy = r(arrays["x"]), r(arrays["w"]), torch.from_numpy(arrays["dy"])
    y = x @ w.T
    if "b" in arrays:
        y = y + r(arrays["b"])
    out = {"y": y, "dx": dy @ w, "dw": dy.T @ x}
    if "b" in arrays:
        out["db"] = dy.sum(0)
    return {k: v.to(torch.bfloat16) for k, v in out.items()}


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_fp32_accumulation_rounded_once(bias):
    arrays, ours = linear_case(bias)
    ref = fp32_accumulated(arrays)
    for name in ref:
        check_ulps(f"linear {name}", ours[name], ref[name], 0.99)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch_autocast(bias):
    arrays, ours = linear_case(bias)
    xt, wt = torch.from_numpy(arrays["x"]).requires_grad_(), torch.from_numpy(arrays["w"]).requires_grad_()
    bt = torch.from_numpy(arrays["b"]).requires_grad_() if bias else None
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        y = F.linear(xt, wt, bt)
    assert y.dtype == torch.bfloat16
    y.backward(torch.from_numpy(arrays["dy"]).to(torch.bfloat16))
    theirs = {"y": y.detach(), "dx": xt.grad, "dw": wt.grad}  # FP32 .grad of FP32 leaves: BF16 values widened
    if bias:
        theirs["db"] = bt.grad
    # Autocast is this reference where its BF16 GEMMs accumulate in FP32 (oneDNN's AVX512 kernels); torch 1.13's
    # AVX2 backward GEMMs do not (dx off by 0.018 at 0.012 on an AMD EPYC, 2026-12-03): skipped there, the
    # FP32-accumulation test above stands for it.
    ref = fp32_accumulated(arrays)
    off = [n for n in theirs if np.abs(key(theirs[n]) - key(ref[n])).max() > 1]
    if off:
        pytest.skip(f"torch {torch.__version__}'s autocast on this CPU ({cpu_capability()}) does not accumulate "
                    f"its BF16 GEMMs in FP32 ({', '.join(off)} more than 1 BF16 ulp from FP32 accumulation)")
    for name in theirs:
        check_ulps(f"linear {name}", ours[name], theirs[name], 0.99)


def test_fp32_mode_is_not_rounded_and_bad_mode_refused():
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((4, 33)).astype(np.float32), rng.standard_normal((4, 33)).astype(np.float32)
    assert not is_bf16(op("gelu", "fp32", x=x, dy=dy)["y"])
    with pytest.raises(ValueError, match='activations: "fp16" is not valid; valid: fp32, bf16'):
        op("gelu", "fp16", x=x, dy=dy)
