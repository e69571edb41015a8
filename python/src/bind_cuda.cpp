// Quantization of CUDA device memory for Python (torch CUDA tensors): the
// package allocates the outputs with torch on the input's device and passes
// raw device pointers and the current stream; this calls cuda/quantize.hpp's
// quantize_device on that stream, with no host copy and no synchronisation.
// The bits are quantize_device's, i.e. the CPU reference's (cuda/README.md).
//
// Without the CUDA backend (FP4LAB_WITH_CUDA undefined) cuda_available() is
// False and quantize_device raises RuntimeError saying so.
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "python/src/module.hpp"
#include "sim/quantizer.hpp"
#ifdef FP4LAB_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/quantize.hpp"
#endif

namespace py = pybind11;

namespace fp4lab::python {

#ifdef FP4LAB_WITH_CUDA
namespace {

// One workspace per (device, stream): quantize_device's scratch is reused in
// stream order, so two streams must not share one.
cuda::QuantWorkspace& workspace(int device, uintptr_t stream) {
  static std::map<std::pair<int, uintptr_t>, std::unique_ptr<cuda::QuantWorkspace>> spaces;
  auto& w = spaces[{device, stream}];
  if (!w) w = std::make_unique<cuda::QuantWorkspace>();
  return *w;
}

// Parsed specs, by their text: a call on a small tensor must not parse JSON.
const QuantizerSpec& spec_of(const std::string& text) {
  static std::map<std::string, QuantizerSpec> specs;
  auto it = specs.find(text);
  if (it == specs.end()) it = specs.emplace(text, parse_quantizer(text)).first;
  return it->second;
}

}  // namespace
#endif

void bind_cuda(py::module_& m) {
#ifdef FP4LAB_WITH_CUDA
  m.def("cuda_available", [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  });
  // x: device pointer to [rows, cols] float32 ("f32") or bfloat16 ("bf16");
  // outputs: device pointers (0 = not written): codes uint8 [rows*cols],
  // scale_codes uint8 / scales float32 [scale_rows*scale_cols], dequant
  // float32 [rows*cols], global_decode float32 [1]. `cuda_stream`: the
  // cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream).
  m.def(
      "quantize_device",
      [](const std::string& quantizer, uintptr_t x, const std::string& dtype, int64_t rows, int64_t cols,
         uint64_t seed, uint64_t stream, uintptr_t codes, uintptr_t scale_codes, uintptr_t scales,
         uintptr_t dequant, uintptr_t global_decode, uintptr_t cuda_stream) {
        const QuantizerSpec& q = spec_of(quantizer);
        if (dtype != "f32" && dtype != "bf16") throw Error("quantize: device input must be float32 or bfloat16, got " + dtype);
        cuda::QuantOutputs out;
        out.codes = reinterpret_cast<uint8_t*>(codes);
        out.scale_codes = reinterpret_cast<uint8_t*>(scale_codes);
        out.scales = reinterpret_cast<float*>(scales);
        out.dequant = reinterpret_cast<float*>(dequant);
        out.global_decode = reinterpret_cast<float*>(global_decode);
        int device = 0;
        cudaGetDevice(&device);
        cuda::QuantWorkspace& ws = workspace(device, cuda_stream);  // under the GIL: the map is not locked
        py::gil_scoped_release release;
        cuda::quantize_device(q, reinterpret_cast<const void*>(x),
                              dtype == "f32" ? cuda::InputType::f32 : cuda::InputType::bf16, rows, cols,
                              RandomStream{seed, stream}, out, ws,
                              reinterpret_cast<cudaStream_t>(cuda_stream));
      },
      py::arg("quantizer"), py::arg("x"), py::arg("dtype"), py::arg("rows"), py::arg("cols"), py::arg("seed"),
      py::arg("stream"), py::arg("codes"), py::arg("scale_codes"), py::arg("scales"), py::arg("dequant"),
      py::arg("global_decode"), py::arg("cuda_stream"));
#else
  m.def("cuda_available", [] { return false; });
  m.def("quantize_device", [](py::args, py::kwargs) -> void {
    throw EnvironmentError("fp4lab was built without its CUDA backend (-DFP4LAB_CUDA=ON builds it)");
  });
#endif
}

}  // namespace fp4lab::python
