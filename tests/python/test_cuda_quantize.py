"""fp4lab.quantize on torch CUDA tensors: fp4lab's CUDA kernels on the tensor's
device and current stream, bit for bit the CPU reference (ctest:
test_python_cuda, SKIPPED without a GPU; test_python leaves this file to it)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fp4lab  # noqa: E402
from fp4lab.testing import assert_bitwise  # noqa: E402

if not (fp4lab.cuda_available() and torch.cuda.is_available()):
    pytest.skip("no CUDA backend or no GPU", allow_module_level=True)

QUANTIZERS = ["nvfp4", "mxfp4", "mxfp8_e4m3", "mxfp6_e2m3", "nvfp4_2d", "nvfp4_col", "fp8_e4m3_tensor",
              '{"element": "e2m1", "scale": "ue4m3", "block": [1, 16], "scale_rule": "nv", '
              '"global_scale": "tensor_amax", "round": "rs"}',
              '{"element": "e2m1", "scale": "ue4m3", "block": [1, 16], "scale_rule": "nv", '
              '"global_scale": "tensor_amax", "rht": true, "rht_seed": 5}',
              '{"element": "e2m1", "scale": "e8m0", "block": [1, 32], "scale_rule": "ocp", "round": "rs", '
              '"sr_bits": "ptx_x4"}']


@pytest.mark.parametrize("q", QUANTIZERS)
@pytest.mark.parametrize("shape", [(256, 512), (80, 96), (17, 48)])
def test_cuda_equals_cpu(q, shape):
    g = torch.Generator().manual_seed(hash((q, shape)) % 1000)
    x = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape, generator=g).float())
    ref = fp4lab.quantize(x.numpy(), q, seed=3, stream=7)
    got = fp4lab.quantize(x.cuda(), q, seed=3, stream=7)
    assert got.codes.is_cuda and got.dequant.device == torch.device("cuda", torch.cuda.current_device())
    assert_bitwise(got, ref)
    assert got.amax == pytest.approx(ref.amax, rel=0, abs=0)


def test_bfloat16_input_and_side_stream():
    x = torch.randn(128, 256).to(torch.bfloat16)
    ref = fp4lab.quantize(x.float().numpy(), "nvfp4")
    s = torch.cuda.Stream()
    xc = x.cuda()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = fp4lab.quantize(xc, "nvfp4")
    s.synchronize()
    assert_bitwise(got, ref)


def test_swizzled_scales_on_cuda():
    x = torch.randn(128, 64)
    ref = fp4lab.quantize(x.numpy(), "nvfp4", scale_layout="swizzled")
    got = fp4lab.quantize(x.cuda(), "nvfp4", scale_layout="swizzled")
    assert_bitwise(got.scales, ref.scales)


def test_cuda_only_what_runs_there():
    with pytest.raises(ValueError, match="CPU only"):
        fp4lab.quantize(torch.randn(16, 32).cuda(), "mxfp4", groups=np.array([16]))
    with pytest.raises(ValueError, match="2-D"):
        fp4lab.quantize(torch.randn(16).cuda(), "mxfp4")
