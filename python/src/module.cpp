// PYBIND11_MODULE(_C): the parts of module.hpp, and the one translation of
// fp4lab's exceptions into Python's.
#include <pybind11/pybind11.h>

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <new>
#include <stdexcept>

#include "core/error.hpp"
#include "python/src/module.hpp"

namespace py = pybind11;

namespace {
// FP4LAB_BACKTRACE=1: a fatal signal prints the native stack (for a crash that
// Python's faulthandler can only place at the calling line).
extern "C" void print_native_stack(int signo) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(signo, SIG_DFL);
  raise(signo);
}
}  // namespace

PYBIND11_MODULE(_C, m) {
  if (const char* b = std::getenv("FP4LAB_BACKTRACE"); b && *b == '1') {
    signal(SIGSEGV, print_native_stack);
    signal(SIGABRT, print_native_stack);
  }
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
  fp4lab::python::bind_activations(m);
}
