// placeholder until the module lands
#include "apps/commands.hpp"
namespace fp4lab {
void register_quantize_commands(CLI::App&) {}
void register_bench_quantize(CLI::App&) {}
}  // namespace fp4lab
