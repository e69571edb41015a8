// Each group of `fp4lab` subcommands registers itself on the CLI11 app.
// Handlers throw fp4lab::Error on bad input; main() prints it as one line
// ("fp4lab: error: ...") and exits 2. Handlers that must report a failed
// check (verify) throw CommandExit with their exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace fp4lab {

struct CommandExit {
  int code;
};

void register_format_commands(CLI::App& app);    // formats, cast, decode        (cmd_formats.cpp)
void register_quantize_commands(CLI::App& app);  // quantize, golden, verify     (cmd_quantize.cpp)
void register_recipe_commands(CLI::App& app);    // recipes list|show|export     (cmd_recipes.cpp)
void register_train_commands(CLI::App& app);     // train, compare, sweep        (cmd_train.cpp)
// `fp4lab bench <what>`: each module adds its benchmark to the bench command.
void register_bench_cast(CLI::App& bench);       // cmd_formats.cpp
void register_bench_quantize(CLI::App& bench);   // cmd_quantize.cpp
void register_bench_linear(CLI::App& bench);     // cmd_recipes.cpp
void register_bench_train(CLI::App& bench);      // cmd_train.cpp
void register_bench_gemm(CLI::App& bench);       // cmd_gemm.cpp (CUDA GEMMs; says so without CUDA)
void register_bench_attention(CLI::App& bench);  // cmd_attention.cpp (CUDA attention; says so without CUDA)

}  // namespace fp4lab
