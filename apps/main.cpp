// fp4lab: the command-line entry point. Subcommands live in cmd_*.cpp.
#include <cstdio>
#include <exception>

#include "apps/commands.hpp"
#include "core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"fp4lab " FP4LAB_VERSION
               " - bit-exact FP4/FP6/FP8 formats, block quantizers (MX, NVFP4), training recipes and a small trainer.\n"
               "Run `fp4lab COMMAND --help` for the options of one command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", FP4LAB_VERSION);
  fp4lab::register_format_commands(app);
  fp4lab::register_quantize_commands(app);
  fp4lab::register_recipe_commands(app);
  fp4lab::register_train_commands(app);
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks that print throughput figures (cast, quantize, linear, train, gemm, attention)");
  bench->require_subcommand(1);
  fp4lab::register_bench_cast(*bench);
  fp4lab::register_bench_quantize(*bench);
  fp4lab::register_bench_linear(*bench);
  fp4lab::register_bench_train(*bench);
  fp4lab::register_bench_gemm(*bench);
  fp4lab::register_bench_attention(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fp4lab::CommandExit& e) {
    return e.code;
  } catch (const fp4lab::Error& e) {
    std::fprintf(stderr, "fp4lab: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp4lab: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
