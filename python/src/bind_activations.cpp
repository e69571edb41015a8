// fp4lab._C.cpu_backend_op: one of the CPU backend's ops (train/backend.hpp)
// under an activation precision (precision.activations, "fp32" | "bf16";
// docs/DESIGN.md "BF16 activations"), over float32 numpy arrays, so that
// tests can hold the ops against other implementations (PyTorch's BF16 ops:
// tests/python/test_bf16_activations_torch.py). A test hook, not an API of
// the package: inputs must be C-contiguous float32 (int32 targets), they are
// not converted; results are new float32 arrays (the loss: float64).
//   "gelu"          x, dy [rows, cols]                     -> y, dx
//   "layernorm"     x, dy [N, C], gamma [C], beta [C]?     -> y, dx, dgamma, dbeta (eps)
//   "cross_entropy" logits [N, V], targets int32 [N]       -> loss [1] (float64), dlogits
//   "linear"        x [B, in], w [out, in], b [out]?, dy [B, out] -> y, dx, dw, db (recipe: a canned name;
//                   "fp32": none)
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "python/src/module.hpp"
#include "recipes/recipe.hpp"
#include "train/backend.hpp"
#include "train/config.hpp"

namespace py = pybind11;

namespace {

using fp4lab::Error;
using fp4lab::train::Backend;
using fp4lab::train::Tensor;

bool has(const py::dict& a, const char* name) { return a.contains(name) && !a[name].is_none(); }

// arrays[name] as a [rows, cols] tensor on be (a 1-D array is one row).
Tensor input(Backend& be, const py::dict& arrays, const char* name) {
  if (!has(arrays, name)) throw Error(std::string("cpu_backend_op: missing array '") + name + "'");
  const py::array a = arrays[name].cast<py::array>();
  if (a.dtype().kind() != 'f' || a.itemsize() != 4 || !(a.flags() & py::array::c_style) || a.ndim() < 1 || a.ndim() > 2)
    throw Error(std::string("cpu_backend_op: '") + name + "' must be a C-contiguous 1-D or 2-D float32 array");
  const int64_t rows = a.ndim() == 2 ? a.shape(0) : 1, cols = a.ndim() == 2 ? a.shape(1) : a.shape(0);
  Tensor t = be.empty(rows, cols);
  be.upload(static_cast<const float*>(a.data()), t);
  return t;
}
py::array_t<float> output(Backend& be, const Tensor& t) {
  py::array_t<float> a({py::ssize_t(t.rows), py::ssize_t(t.cols)});
  be.download(t, a.mutable_data());
  return a;
}

py::dict run_op(const std::string& op, const std::string& activations, const py::dict& arrays,
                const std::string& recipe, double eps) {
  auto be = fp4lab::train::make_cpu_backend(1);
  be->set_activations(fp4lab::train::parse_activation_precision("activations", activations));
  py::dict out;
  if (op == "gelu") {
    Tensor x = input(*be, arrays, "x"), dy = input(*be, arrays, "dy");
    Tensor y = be->empty(x.rows, x.cols), dx = be->empty(x.rows, x.cols);
    be->gelu_forward(x, y);
    be->gelu_backward(x, dy, dx);
    out["y"] = output(*be, y), out["dx"] = output(*be, dx);
  } else if (op == "layernorm") {
    Tensor x = input(*be, arrays, "x"), dy = input(*be, arrays, "dy"), g = input(*be, arrays, "gamma");
    const bool beta = has(arrays, "beta");
    Tensor b = beta ? input(*be, arrays, "beta") : Tensor{};
    Tensor y = be->empty(x.rows, x.cols), mean = be->empty(1, x.rows), rstd = be->empty(1, x.rows);
    be->layernorm_forward(x, g.data, beta ? b.data : nullptr, float(eps), y, mean, rstd);
    Tensor dx = be->empty(x.rows, x.cols), dg = be->zeros(1, x.cols), db = be->zeros(1, x.cols);
    be->layernorm_backward(dy, x, g.data, mean, rstd, dx, dg.data, beta ? db.data : nullptr);
    out["y"] = output(*be, y), out["dx"] = output(*be, dx), out["dgamma"] = output(*be, dg);
    out["dbeta"] = output(*be, db);
  } else if (op == "cross_entropy") {
    Tensor l = input(*be, arrays, "logits");
    if (!has(arrays, "targets")) throw Error("cpu_backend_op: missing array 'targets'");
    const py::array t = arrays["targets"].cast<py::array>();
    if (t.dtype().kind() != 'i' || t.itemsize() != 4 || !(t.flags() & py::array::c_style) || t.size() != l.rows)
      throw Error("cpu_backend_op: 'targets' must be a C-contiguous int32 array of logits' rows");
    Tensor dl = be->empty(l.rows, l.cols);
    py::array_t<double> loss(1);
    loss.mutable_data()[0] = be->cross_entropy(l, static_cast<const int32_t*>(t.data()), &dl, nullptr);
    out["loss"] = loss, out["dlogits"] = output(*be, dl);
  } else if (op == "linear") {
    Tensor x = input(*be, arrays, "x"), w = input(*be, arrays, "w"), dy = input(*be, arrays, "dy");
    const bool bias = has(arrays, "b");
    Tensor b = bias ? input(*be, arrays, "b") : Tensor{};
    const std::optional<fp4lab::Recipe> r =
        recipe == "fp32" ? std::nullopt : std::optional<fp4lab::Recipe>(fp4lab::recipe_by_name(recipe));
    const fp4lab::LinearContext ctx{r ? &*r : nullptr, 1, 0, 0, "linear"};
    Tensor y, dx, dw = be->zeros(w.rows, w.cols), db = be->zeros(1, w.rows);
    std::unique_ptr<fp4lab::train::LinearState> st;
    be->linear_forward(ctx, x, w, bias ? b.data : nullptr, y, st);
    be->linear_backward(ctx, *st, w, dy, dx, dw, bias ? db.data : nullptr);
    out["y"] = output(*be, y), out["dx"] = output(*be, dx), out["dw"] = output(*be, dw);
    out["db"] = output(*be, db);
  } else {
    throw Error("cpu_backend_op: op '" + op + "' is not valid; valid: gelu, layernorm, cross_entropy, linear");
  }
  return out;
}

}  // namespace

namespace fp4lab::python {

void bind_activations(py::module_& m) {
  m.def("cpu_backend_op", &run_op, py::arg("op"), py::arg("activations"), py::arg("arrays"), py::arg("recipe") = "fp32",
        py::arg("eps") = 1e-5,
        "One CPU backend op under an activation precision (a test hook; python/src/bind_activations.cpp).");
}

}  // namespace fp4lab::python
