// PYBIND11_MODULE(_C): the parts of module.hpp, and the one translation of
// fp4lab's exceptions into Python's.
#include <pybind11/pybind11.h>

#include <new>
#include <stdexcept>

#include "core/error.hpp"
#include "python/src/module.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "fp4lab's C++ core (use the fp4lab package, not this module)";
  m.attr("__version__") = FP4LAB_VERSION;
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const fp4lab::EnvironmentError& e) {  // before Error: it derives from it
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const fp4lab::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const fp4lab::InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, (std::string("fp4lab internal error: ") + e.what()).c_str());
    }
  });
  fp4lab::python::bind_reference(m);
  fp4lab::python::bind_cli(m);
  fp4lab::python::bind_cuda(m);
  fp4lab::python::bind_linear(m);
}
