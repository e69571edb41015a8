"""fp4lab.torch (python/fp4lab/torch.py) against independent oracles.

Oracle: every GEMM operand made from its source by fp4lab.quantize (the
`fp4lab quantize` command's path, not the trainer's layer: sim's quantizer, the SR
stream written out here as 0xA<<60 | layer<<44 | step<<3 | operand, the wgrad
RHT as the quantizer-level `rht` option, double quantization as two calls),
the three GEMMs in float64; fp4lab.torch's y, dx, dW must lie within the FP32
accumulation bound 2 (K+2) 2^-24 sum|a b| of them, db equal the float64 column
sums rounded once. (Bit equality with the trainer's own layer called directly
is tests/train/test_linear_function.cpp.) Also: SR reproducible per (seed,
step) and different under another seed; the step counter; bf16 inputs;
convert(); argument errors. The CUDA cases: test_cuda_torch_linear.py.
"""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
fp4lab = pytest.importorskip("fp4lab")
if not hasattr(fp4lab, "_C") or not hasattr(fp4lab._C, "LinearFunction"):
    pytest.skip("fp4lab._C.LinearFunction not built", allow_module_level=True)
import fp4lab.torch as ft  # noqa: E402

from torch import nn  # noqa: E402

OPS = ["fwd_x", "fwd_w", "dgrad_grad_y", "dgrad_w", "wgrad_grad_y", "wgrad_x"]
RECIPES = ["fp32", "mx_baseline", "tetrajet", "nvfp4", "fp4tk_tetrajet", "nvfp4_fwd_mxfp8_bwd"]
ROWS, IN, OUT = 40, 48, 24  # partial blocks (32, 16) and a partial RHT chunk along rows
SEED, LAYER, STEP = 99, 5, 11


def stream(layer, op, step):
    return (0xA << 60) | (layer << 44) | (step << 3) | OPS.index(op)


def data(seed=0):
    g = np.random.default_rng(seed)
    x = g.standard_normal((ROWS, IN)).astype(np.float32)
    w = (0.1 * g.standard_normal((OUT, IN))).astype(np.float32)
    b = g.standard_normal(OUT).astype(np.float32)
    dy = (1e-3 * g.standard_normal((ROWS, OUT))).astype(np.float32)
    return x, w, b, dy


def run_torch(recipe, x, w, b, dy, device="cpu", seed=SEED, step=STEP, dtype=torch.float32):
    xt = torch.tensor(x, device=device, dtype=dtype, requires_grad=True)
    wt = torch.tensor(w, device=device, dtype=dtype, requires_grad=True)
    bt = torch.tensor(b, device=device, dtype=dtype, requires_grad=True)
    y = ft.linear(xt, wt, bt, recipe=recipe, name="blocks.0.fc", layer_id=LAYER, seed=seed, step=step)
    y.backward(torch.tensor(dy, device=device, dtype=dtype))
    f = lambda t: t.detach().float().cpu().numpy()  # noqa: E731
    return f(y), f(xt.grad), f(wt.grad), f(bt.grad)


def quantize(spec, m, seed, strm):
    return np.asarray(fp4lab.quantize(np.ascontiguousarray(m, dtype=np.float32), spec, seed=seed, stream=strm).dequant)


def bf16_rne(m):
    u = np.ascontiguousarray(m, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def oracle_operand(r, op, src, seed=SEED, layer=LAYER, step=STEP):
    """The plan of recipes/linear_plan.hpp for operand op, made with fp4lab.quantize."""
    m = src
    dq = r["double_quantization"]
    if dq and op == "dgrad_w" and r["fwd_w"]:
        m = quantize(r["fwd_w"], m, seed, stream(layer, "fwd_w", step))
    if dq is True and op == "wgrad_x" and r["fwd_x"]:  # "weights": W only
        m = quantize(r["fwd_x"], m, seed, stream(layer, "fwd_x", step))
    spec = r[op]
    rht = r["wgrad_rht"] and op in ("wgrad_grad_y", "wgrad_x")
    if spec is None:
        assert not rht, "the oracle has no RHT without a quantizer"
        return bf16_rne(m) if r["high_precision"] == "bf16" else m
    if rht:  # the quantizer-level RHT along its [16,1] block axis: Q(R m), in the transformed domain
        spec = dict(spec, rht=True, rht_seed=r["rht_seed"])
    return quantize(spec, m, seed, stream(layer, op, step))


def within(got, a, b, extra=None):
    """got vs a @ b in float64, within the FP32 accumulation bound."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = a64 @ b64
    bound = 2 * (a.shape[1] + 2) * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64))
    if extra is not None:
        ref = ref + extra
    bound = bound + 2 * 2.0 ** -24 * np.abs(ref) + 1e-30
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= bound), f"{np.sum(err > bound)} elements outside the bound; max excess {np.max(err - bound)}"


def check_against_oracle(recipe, outs, x, w, b, dy):
    r = json.loads(fp4lab._C.recipe_json(recipe))
    y, dx, dw, db = outs
    ox, ow = oracle_operand(r, "fwd_x", x), oracle_operand(r, "fwd_w", w)
    quantized = r["fwd_x"] is not None
    within(y, ox, ow.T, b.astype(np.float64) if (r["forward_bias"] or not quantized) else None)
    within(dx, oracle_operand(r, "dgrad_grad_y", dy), oracle_operand(r, "dgrad_w", w))
    within(dw, oracle_operand(r, "wgrad_grad_y", dy).T, oracle_operand(r, "wgrad_x", x))
    assert np.array_equal(db, dy.astype(np.float64).sum(axis=0).astype(np.float32))


@pytest.mark.parametrize("recipe", RECIPES)
def test_cpu_matches_quantize_oracle(recipe):
    x, w, b, dy = data()
    check_against_oracle(recipe, run_torch(recipe, x, w, b, dy), x, w, b, dy)


@pytest.mark.parametrize("recipe", ["nvfp4", "tetrajet"])
def test_sr_reproducible_per_seed_and_step(recipe, device="cpu"):
    x, w, b, dy = data(1)
    a = run_torch(recipe, x, w, b, dy, device)
    again = run_torch(recipe, x, w, b, dy, device)
    for u, v in zip(a, again):
        assert np.array_equal(u.view(np.uint32), v.view(np.uint32))
    other_seed = run_torch(recipe, x, w, b, dy, device, seed=SEED + 1)
    other_step = run_torch(recipe, x, w, b, dy, device, step=STEP + 1)
    assert np.array_equal(a[0], other_seed[0])  # the forward rounds to nearest
    assert not np.array_equal(a[2], other_seed[2])  # SR on the gradients
    assert not np.array_equal(a[2], other_step[2])


def test_module_step_counter_and_eval():
    torch.manual_seed(0)
    m = ft.Linear(IN, OUT, recipe="nvfp4", name="fc", layer_id=3, seed=7)
    x = torch.randn(2, 5, IN)  # leading dims flattened to 10 tokens
    for expected in range(3):
        assert m.step == expected
        m(x).sum().backward()
    assert m.step == 3
    with torch.no_grad():
        y_eval = m(x)
    m.eval()
    y_eval2 = m(x)
    assert m.step == 3 and y_eval.shape == (2, 5, OUT)
    assert torch.equal(y_eval, y_eval2.detach())
    # The module at step s is the functional layer at step s.
    m.train()
    m.step = 1
    xr = x.clone().requires_grad_(True)
    y = m(xr)
    yf = ft.linear(x, m.weight, m.bias, recipe="nvfp4", name="fc", layer_id=3, seed=7, step=1)
    assert torch.equal(y, yf)
    ft.set_step(nn.Sequential(m), 42)
    assert m.step == 42


def test_deepcopy_and_pickle_keep_the_layer():
    import copy
    import pickle
    torch.manual_seed(0)
    m = ft.Linear(IN, OUT, recipe="tetrajet", name="fc", layer_id=2, seed=5)
    m.step = 4
    x = torch.randn(6, IN)
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert (other.recipe, other.name, other.layer_id, other.seed, other.step) == ("tetrajet", "fc", 2, 5, 4)
        assert torch.equal(other(x), m(x))
        m.step = 4


def test_bf16_inputs_cast_to_fp32_and_back():
    x, w, b, dy = data(2)
    to_bf = lambda a: bf16_rne(a)  # noqa: E731  (values exact in bf16)
    xb, wb, bb, dyb = map(to_bf, (x, w, b, dy))
    ref = run_torch("mx_baseline", xb, wb, bb, dyb)
    got = run_torch("mx_baseline", xb, wb, bb, dyb, dtype=torch.bfloat16)
    for r_, g_ in zip(ref, got):
        assert np.array_equal(bf16_rne(r_), g_)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([nn.ModuleDict({"q_proj": nn.Linear(16, 16), "ln": nn.LayerNorm(16),
                                                    "down_proj": nn.Linear(16, 16, bias=False)})])
        self.head = nn.Linear(16, 4)


def test_convert_swaps_expected_modules():
    torch.manual_seed(0)
    model = Block()
    before = {n: (m.weight, m.bias) for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    ft.convert(model, "nvfp4", keep_high_precision=["patch_embed", "he*"], seed=3)
    got = {n: (m.layer_id, m.name, m.seed) for n, m in ft.quantized_layers(model)}
    assert got == {"blocks.0.q_proj": (1, "blocks.0.q_proj", 3), "blocks.0.down_proj": (2, "blocks.0.down_proj", 3)}
    assert type(model.patch_embed) is nn.Linear and type(model.head) is nn.Linear
    for n, (wt, bt) in before.items():  # parameters shared, not copied
        mod = model.get_submodule(n)
        assert mod.weight is wt and mod.bias is bt
    with pytest.raises(ValueError, match="already"):
        ft.convert(model, "nvfp4")
    with pytest.raises(ValueError):
        ft.convert(Block(), "no_such_recipe")
    # keep_high_precision of the recipe itself (nvfp4: *head*) applies to converted layers by name
    full = ft.convert(Block(), "nvfp4")
    assert not full.head.quantized and full.blocks[0].q_proj.quantized


def test_argument_errors():
    w = torch.randn(OUT, IN)
    with pytest.raises(ValueError, match="in_features"):
        ft.linear(torch.randn(3, IN + 1), w, recipe="fp32")
    with pytest.raises(ValueError, match="dtype"):
        ft.linear(torch.randn(3, IN, dtype=torch.float64), w, recipe="fp32")
    with pytest.raises(ValueError):
        ft.linear(torch.randn(3, IN), w, recipe="no_such_recipe")
    with pytest.raises(ValueError):
        ft.Linear(4, 4, recipe={"extends": "nvfp4", "no_such_key": 1})
    # non-contiguous inputs are made contiguous (a transposed view gives the same result)
    x = torch.randn(IN, 3).t()
    assert torch.equal(ft.linear(x, w, recipe="mx_baseline"), ft.linear(x.contiguous(), w, recipe="mx_baseline"))
