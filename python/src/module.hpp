// The extension module fp4lab._C: each python/src/bind_<part>.cpp adds its part
// (module.cpp calls them all). The public API is the pure-Python package
// (python/fp4lab/__init__.py), which checks and converts arrays and calls
// these; _C's functions take numpy arrays (C-contiguous, of the documented
// dtype) or raw device pointers, never do a conversion that changes a value,
// and release the GIL while they compute.
//
// Errors: fp4lab::Error (bad input) is raised as ValueError with the CLI's
// message, fp4lab::EnvironmentError and fp4lab::InternalError as
// RuntimeError (module.cpp's translator).
#pragma once

#include <pybind11/pybind11.h>

namespace fp4lab::python {

void bind_reference(pybind11::module_& m);  // formats, cast, decode, quantize, gemm, recipes (bind_reference.cpp)
void bind_cli(pybind11::module_& m);        // run_cli: golden, verify and every other command (bind_cli.cpp)
void bind_cuda(pybind11::module_& m);       // quantize on CUDA device memory (bind_cuda.cpp)
void bind_linear(pybind11::module_& m);     // the trainer's linear layer for fp4lab.torch (bind_linear.cpp)
void bind_activations(pybind11::module_& m);  // CPU ops by activations precision, a test hook (bind_activations.cpp)

}  // namespace fp4lab::python
