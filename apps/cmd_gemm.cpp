// placeholder until the module lands
#include "apps/commands.hpp"
namespace fp4lab {
void register_bench_gemm(CLI::App&) {}
}  // namespace fp4lab
