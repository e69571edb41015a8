// placeholder until the module lands
#include "apps/commands.hpp"
namespace fp4lab {
void register_recipe_commands(CLI::App&) {}
void register_bench_linear(CLI::App&) {}
}  // namespace fp4lab
