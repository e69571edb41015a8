// _C.run_cli(args): fp4lab's whole command line in this process (apps/cli.cpp
// run_cli), for the package's golden() and verify(). Returns (exit code,
// failure message); the command's own report goes to the process's stdout.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "python/src/module.hpp"

namespace py = pybind11;

namespace fp4lab::python {

void bind_cli(py::module_& m) {
  m.def(
      "run_cli",
      [](const std::vector<std::string>& args) {
        std::vector<std::string> owned = {"fp4lab"};
        owned.insert(owned.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& s : owned) argv.push_back(s.data());
        argv.push_back(nullptr);
        CliFailure failure;
        int code;
        {
          py::gil_scoped_release release;
          code = run_cli(int(owned.size()), argv.data(), &failure);
        }
        std::fflush(stdout);
        return py::make_tuple(code, failure.message);
      },
      py::arg("args"), "Runs `fp4lab ARGS...` in this process: (exit code, failure message or '').");
}

}  // namespace fp4lab::python
