// placeholder until the module lands
#include "apps/commands.hpp"
namespace fp4lab {
void register_train_commands(CLI::App&) {}
void register_bench_train(CLI::App&) {}
}  // namespace fp4lab
