// The `fp4lab` executable: the command line of apps/cli.cpp (run_cli), its std::cerr lines written whole
// (apps/whole_line_stderr.hpp: ranks under mpirun share one stderr).
#include "apps/commands.hpp"
#include "apps/whole_line_stderr.hpp"

int main(int argc, char** argv) {
  fp4lab::WholeLineStderr whole_lines;
  return fp4lab::run_cli(argc, argv);
}
