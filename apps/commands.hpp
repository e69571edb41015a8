// Each group of `fp4lab` subcommands registers itself on the CLI11 app, and
// the helpers every command shares (implemented in main.cpp).
//
// Failures: handlers throw fp4lab::Error for bad usage or input (exit 2) and
// RuntimeFailure when the environment fails (exit 1); main() prints either as
// one line, "fp4lab: error: MESSAGE", and maps the standard library's
// exceptions the same way (out of memory -> 1, filesystem -> 1 or 2, JSON -> 2).
// Handlers that must report a failed check (verify) throw CommandExit.
#pragma once

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "core/npy.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// Exit codes, as `fp4lab --help` lists them.
inline constexpr int exit_check_failed = 1;  // verify found a mismatch / missing case; or a RuntimeFailure
inline constexpr int exit_usage = 2;         // bad arguments, unreadable or invalid input files, bad JSON
inline constexpr int exit_internal = 3;      // a bug: an exception nobody foresaw

struct CommandExit {
  int code;
};

// A failure of the environment rather than of the input (core/error.hpp): out of
// memory, disk full, permission denied on an output. main() exits 1.
using RuntimeFailure = EnvironmentError;

// Handlers of SIGINT and SIGTERM that store the signal's number in the flag returned, for a command that
// stops cleanly between steps (train, sweep: train/run.hpp RunOptions::interrupt). A second signal ends the
// process at once (the handlers reset themselves). Commands that do not call this keep the defaults.
const volatile std::sig_atomic_t* install_interrupt_handlers();

// What the command is doing now ("reading x.npy", "quantizing x.npy"), for
// messages about failures that can happen anywhere ("out of memory while ...").
// Empty: main() names the subcommand.
void set_activity(std::string what);
const std::string& activity();

// NaN and Inf among n values.
struct NonFinite {
  int64_t nan = 0, pos_inf = 0, neg_inf = 0;
  int64_t inf() const { return pos_inf + neg_inf; }
  bool any() const { return nan + pos_inf + neg_inf > 0; }
};
NonFinite count_nonfinite(const float* x, size_t n);
NonFinite count_nonfinite(const double* x, size_t n);
// "1 NaN input(s), 2 Inf input(s)" (only the non-zero counts).
std::string nonfinite_str(const NonFinite& c);
// What encode(f, ., r, o) makes of the NaN / +Inf / -Inf inputs counted in c,
// e.g. "e2m1 has no NaN: encoded as +6 (0x7, saturated)".
std::string nonfinite_encoding(const Format& f, Round r, Overflow o, const NonFinite& c);

// nlohmann::json's what() without its "[json.exception.out_of_range.403] " prefix.
std::string json_message(const char* what);

// A set of output files written all or none. add() every output first: it
// checks that the file's directory exists (or, with make_dirs, that its
// nearest existing ancestor is a directory) and is writable, that the path is
// not a directory and not given twice; the write_* calls then write each file
// to "PATH.tmp.PID"; commit() renames them all into place. A failure before or
// during commit() removes the temporaries (and directories made for them) and
// leaves every old file as it was. Bad paths are fp4lab::Error (exit 2);
// permission, disk-full and other write failures RuntimeFailure (exit 1).
class OutputSet {
 public:
  OutputSet() = default;
  OutputSet(const OutputSet&) = delete;
  OutputSet& operator=(const OutputSet&) = delete;
  ~OutputSet();

  void add(const std::string& path, bool make_dirs = false);
  void write_npy(const std::string& path, DType dtype, const Shape& shape, const void* data);
  void write_text(const std::string& path, const std::string& text);
  void commit();
  size_t size() const { return files_.size(); }

 private:
  struct File {
    std::string path, tmp, key;  // key: absolute, normalized path
    bool make_dirs = false, written = false;
  };
  File& find(const std::string& path);
  void make_parent(const File& f);
  void discard() noexcept;
  std::vector<File> files_;
  std::vector<std::string> made_dirs_;  // in creation order
  bool committed_ = false;
};

// Text of a code or bit pattern ("0x%0*X", `digits` hex digits) and of a float
// with every digit that identifies it (%.9g), for reports and manifests.
std::string hex_bits(uint32_t v, int digits);
std::string fmt_float(float v);

// A quantized tensor's scales as one .npy of `out`: float32 [scale_rows,
// scale_cols] for float32 scales, else their uint8 codes.
bool scales_are_float(const QuantizerSpec& q);
void write_scales(OutputSet& out, const std::string& path, const QuantizedTensor& q);

// --sr-bits TEXT: the random-bit contract of stochastic rounding (core/sr.hpp);
// an unknown name is an error listing the valid ones.
SrBits sr_bits_option(const std::string& s);
// --rbits WORDS.npy: exactly `count` uint32 random words (C order, any shape),
// `layout` saying what they are for the error line (e.g. "[8, 10]: rows x
// words a row under ptx_x4").
std::vector<uint32_t> read_rbits(const std::string& path, uint64_t count, const std::string& layout);

// The whole command line: parses argv (argv[0] is the program's name), runs
// the subcommand and returns the process's exit code (the codes above;
// 128 + signal for an interrupted run). A failure is one line on stderr,
// "fp4lab: error: MESSAGE", or, when `failure` is given, its code and MESSAGE
// are stored there and nothing is printed (the Python package raises them).
// What the subcommand itself prints (tables, reports) goes to stdout.
struct CliFailure {
  int code = 0;
  std::string message;
};
int run_cli(int argc, char** argv, CliFailure* failure = nullptr);

void register_format_commands(CLI::App& app);    // formats, cast, decode        (cmd_formats.cpp)
void register_quantize_commands(CLI::App& app);  // quantize                     (cmd_quantize.cpp)
void register_sr_commands(CLI::App& app);        // sr-bias                      (cmd_sr.cpp)
void register_golden_commands(CLI::App& app);    // golden, verify               (cmd_golden.cpp)
void register_recipe_commands(CLI::App& app);    // recipes list|show|export     (cmd_recipes.cpp)
void register_train_commands(CLI::App& app);     // train, compare, sweep        (cmd_train.cpp)
void register_inspect_commands(CLI::App& app);   // inspect                      (cmd_inspect.cpp)
// `fp4lab bench <what>`: each module adds its benchmark to the bench command.
void register_bench_cast(CLI::App& bench);       // cmd_formats.cpp
void register_bench_quantize(CLI::App& bench);   // cmd_quantize.cpp
void register_bench_linear(CLI::App& bench);     // cmd_recipes.cpp
void register_bench_train(CLI::App& bench);      // cmd_train.cpp
void register_bench_gemm(CLI::App& bench);       // cmd_gemm.cpp (CUDA GEMMs; says so without CUDA)
void register_bench_attention(CLI::App& bench);  // cmd_attention.cpp (CUDA attention; says so without CUDA)
void register_bench_moe(CLI::App& bench);        // cmd_moe.cpp (MoE routing, gather, combine; cpu or cuda)

}  // namespace fp4lab
