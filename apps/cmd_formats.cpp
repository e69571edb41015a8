// placeholder until the module lands
#include "apps/commands.hpp"
namespace fp4lab {
void register_format_commands(CLI::App&) {}
void register_bench_cast(CLI::App&) {}
}  // namespace fp4lab
