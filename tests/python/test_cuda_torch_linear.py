"""fp4lab.torch on CUDA tensors (ctest: test_python_cuda, SKIPPED without a GPU):
the layer's y, dx, dW within FP32 accumulation error of the float64 GEMMs of the
operands fp4lab.quantize makes on the CPU (the CUDA layer's operands are the
CPU's bit for bit, train/cuda/linear.hpp, so only summation order may differ),
db equal to the CPU layer's (<= 256 rows), SR reproducible run to run and
seed-dependent, the same bits under a side stream, a bf16 module on 3-D input.
Shared helpers: test_torch_linear.py."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import test_torch_linear as base  # noqa: E402
from test_torch_linear import ft  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


@pytest.mark.parametrize("recipe", base.RECIPES)
def test_cuda_matches_quantize_oracle_and_cpu(recipe):
    x, w, b, dy = base.data()
    outs = base.run_torch(recipe, x, w, b, dy, "cuda")
    base.check_against_oracle(recipe, outs, x, w, b, dy)
    # db: column sums in float64 in fixed blocks of 256 rows: the CPU's bits for <= 256 rows
    assert np.array_equal(outs[3], base.run_torch(recipe, x, w, b, dy, "cpu")[3])


@pytest.mark.parametrize("recipe", ["nvfp4", "tetrajet"])
def test_cuda_sr_reproducible_per_seed_and_step(recipe):
    base.test_sr_reproducible_per_seed_and_step(recipe, "cuda")


def test_cuda_side_stream_same_bits():
    x, w, b, dy = base.data(3)
    ref = base.run_torch("nvfp4", x, w, b, dy, "cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        got = base.run_torch("nvfp4", x, w, b, dy, "cuda")
    torch.cuda.synchronize()
    for r_, g_ in zip(ref, got):
        assert np.array_equal(r_.view(np.uint32), g_.view(np.uint32))


def test_cuda_module_bf16_and_3d():
    torch.manual_seed(0)
    m = ft.Linear(base.IN, base.OUT, recipe="nvfp4", name="fc", layer_id=1, seed=2).cuda().to(torch.bfloat16)
    x = torch.randn(2, 7, base.IN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = m(x)
    y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and y.shape == (2, 7, base.OUT)
    assert x.grad.dtype == torch.bfloat16 and m.weight.grad.dtype == torch.bfloat16
    assert torch.isfinite(m.weight.grad.float()).all()
    assert m.step == 1


def test_cuda_converted_model_trains():
    torch.manual_seed(0)
    model = ft.convert(base.Block(), "nvfp4", seed=1).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(32, 8, device="cuda")
    first = None
    for _ in range(20):
        h = model.blocks[0]["down_proj"](torch.relu(model.blocks[0]["q_proj"](model.patch_embed(x))))
        loss = model.head(h).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < first
