// fp4lab._C.LinearFunction: the trainer's quantized linear layer over caller
// memory (train/linear_function.hpp) for fp4lab.torch (python/fp4lab/torch.py).
// Tensors cross as raw addresses (torch's data_ptr() ints) plus shapes, so this
// module does not depend on libtorch; fp4lab/torch.py checks dtype (float32),
// contiguity and device before any call, and the pointers must stay valid
// for the call (and W unchanged until backward). Host pointers for backend
// "cpu", device pointers for "cuda" (legacy default stream: see the header).
// The GIL is released while the layer computes; fp4lab::Error becomes
// ValueError (module.cpp's translator).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "python/src/module.hpp"
#include "recipes/linear_plan.hpp"
#include "recipes/recipe.hpp"
#include "train/linear_function.hpp"

namespace py = pybind11;

namespace {

using fp4lab::train::LinearFunction;
using fp4lab::train::LinearFunctionOptions;
using fp4lab::train::LinearFunctionSaved;

template <class T>
const T* cptr(uintptr_t p) {
  return reinterpret_cast<const T*>(p);
}
template <class T>
T* mptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// The saved state as a Python object (opaque; keeps its layer alive).
struct PySaved {
  std::shared_ptr<LinearFunctionSaved> s;
};

}  // namespace

namespace fp4lab::python {

void bind_linear(py::module_& m) {
  py::class_<PySaved>(m, "LinearSaved", "What a LinearFunction forward keeps for its backward (opaque).");

  py::class_<LinearFunction, std::shared_ptr<LinearFunction>>(m, "LinearFunction", R"doc(
The trainer's quantized linear layer y = x W^T + b over caller memory
(train/linear_function.hpp). Arguments of forward/backward are addresses
(torch's data_ptr()) of float32 row-major contiguous arrays: x [rows, in],
W [out, in], b [out] (0: none), y [rows, out], dy [rows, out], dx [rows, in]
(0: not needed), dW [out, in], db [out] (0: none). backend "cpu": host
memory; "cuda": device memory, work queued on the legacy default stream,
calls return without synchronising. SR of operand op draws from the trainer's
stream (seed, 0xA<<60 | layer_id<<44 | step<<3 | op). backward WRITES dx,
dW, db.)doc")
      .def(py::init([](const std::string& backend, const std::string& recipe, const std::string& layer_name,
                       uint64_t layer_id, uint64_t seed, int threads) {
             return std::make_shared<LinearFunction>(
                 LinearFunctionOptions{backend, recipe, layer_name, layer_id, seed, threads});
           }),
           py::arg("backend"), py::arg("recipe"), py::arg("layer_name") = "", py::arg("layer_id") = 0,
           py::arg("seed") = 0, py::arg("threads") = 0)
      .def(
          "forward",
          [](LinearFunction& f, uint64_t step, uintptr_t x, int64_t rows, int64_t in, uintptr_t w, int64_t out,
             uintptr_t b, uintptr_t y, bool backward) -> py::object {
            std::shared_ptr<LinearFunctionSaved> s;
            {
              py::gil_scoped_release nogil;
              s = f.forward(step, cptr<float>(x), rows, in, cptr<float>(w), out, b ? cptr<float>(b) : nullptr,
                            mptr<float>(y), backward);
            }
            if (!s) return py::none();
            return py::cast(PySaved{std::move(s)});
          },
          py::arg("step"), py::arg("x"), py::arg("rows"), py::arg("in_features"), py::arg("w"),
          py::arg("out_features"), py::arg("b"), py::arg("y"), py::arg("backward") = true,
          "y = x W^T + b; returns a LinearSaved (None when backward is False: an evaluation forward).")
      .def(
          "backward",
          [](LinearFunction& f, const PySaved& s, uintptr_t w, uintptr_t dy, uintptr_t dx, uintptr_t dw,
             uintptr_t db) {
            py::gil_scoped_release nogil;
            f.backward(*s.s, cptr<float>(w), cptr<float>(dy), dx ? mptr<float>(dx) : nullptr, mptr<float>(dw),
                       db ? mptr<float>(db) : nullptr);
          },
          py::arg("saved"), py::arg("w"), py::arg("dy"), py::arg("dx"), py::arg("dw"), py::arg("db"),
          "Writes dx (0: skipped), dW and db (0: skipped) of the forward that returned `saved`.")
      .def(
          "synchronize",
          [](LinearFunction& f) {
            py::gil_scoped_release nogil;
            f.synchronize();
          },
          "Waits for the backend's queued work (cuda); a no-op on the CPU.")
      .def_property_readonly("quantized", &LinearFunction::quantized,
                             "True when this layer's GEMMs are quantized (not kept in high precision).")
      .def_property_readonly("recipe_name", [](const LinearFunction& f) { return f.recipe().name; })
      .def_property_readonly("recipe_json",
                             [](const LinearFunction& f) { return fp4lab::recipe_to_json(f.recipe()).dump(); })
      .def_property_readonly("backend", [](const LinearFunction& f) { return f.options().backend; })
      .def_property_readonly("layer_name", [](const LinearFunction& f) { return f.options().layer_name; })
      .def_property_readonly("layer_id", [](const LinearFunction& f) { return f.options().layer_id; })
      .def_property_readonly("seed", [](const LinearFunction& f) { return f.options().seed; });

  m.def(
      "linear_stream_id",
      [](uint64_t layer_id, const std::string& operand, uint64_t step) {
        return fp4lab::stream_id(layer_id, fp4lab::operand_by_name(operand), step);
      },
      py::arg("layer_id"), py::arg("operand"), py::arg("step"),
      "The Philox stream of a linear layer's operand at a step (recipes/linear_plan.hpp stream_id).");
}

}  // namespace fp4lab::python
