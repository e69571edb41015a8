// fp4lab's command line as a function (run_cli, commands.hpp): the `fp4lab`
// executable (main.cpp) and the Python package (python/: golden, verify) call
// it. Subcommands live in cmd_*.cpp; the helpers they share (commands.hpp:
// OutputSet, activity, NaN/Inf counts) are here, with the one place that turns
// every failure into one line and an exit code.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

#include "apps/commands.hpp"
#include "core/error.hpp"
#include "train/run.hpp"

namespace fp4lab {

namespace fs = std::filesystem;

// ---- activity ----------------------------------------------------------------------

namespace {
std::string g_activity;
}

void set_activity(std::string what) { g_activity = std::move(what); }
const std::string& activity() { return g_activity; }

// ---- signals -----------------------------------------------------------------------

namespace {
volatile std::sig_atomic_t g_interrupt = 0;
extern "C" void on_interrupt(int signo) { g_interrupt = signo; }
}  // namespace

const volatile std::sig_atomic_t* install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;  // a second signal: the default action, at once
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return &g_interrupt;
}

// ---- NaN / Inf counts --------------------------------------------------------------

namespace {
template <class T>
NonFinite count_nonfinite_t(const T* x, size_t n) {
  NonFinite c;
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) continue;
    if (std::isnan(x[i]))
      ++c.nan;
    else if (x[i] > 0)
      ++c.pos_inf;
    else
      ++c.neg_inf;
  }
  return c;
}
}  // namespace

NonFinite count_nonfinite(const float* x, size_t n) { return count_nonfinite_t(x, n); }
NonFinite count_nonfinite(const double* x, size_t n) { return count_nonfinite_t(x, n); }

std::string nonfinite_str(const NonFinite& c) {
  std::string s;
  if (c.nan) s += std::to_string(c.nan) + " NaN input(s)";
  if (c.inf()) s += (s.empty() ? "" : ", ") + std::to_string(c.inf()) + " Inf input(s)";
  return s;
}

namespace {
std::string code_hex(const Format& f, uint32_t c) {
  char b[16];
  std::snprintf(b, sizeof b, f.bits() > 8 ? "0x%04X" : f.bits() > 4 ? "0x%02X" : "0x%X", c);
  return b;
}
// "+6 (0x7, saturated)", "NaN (0x7F)", "+Inf (0x7C)"
std::string code_outcome(const Format& f, uint32_t c) {
  const float v = decode(f, c);
  if (std::isnan(v)) return "NaN (" + code_hex(f, c) + ")";
  if (std::isinf(v)) return std::string(v > 0 ? "+Inf" : "-Inf") + " (" + code_hex(f, c) + ")";
  char b[32];
  std::snprintf(b, sizeof b, "%+.9g", double(v));
  return std::string(b) + " (" + code_hex(f, c) + ", saturated)";
}
}  // namespace

std::string nonfinite_encoding(const Format& f, Round r, Overflow o, const NonFinite& c) {
  const std::string name(short_format_name(f));
  std::string s;
  if (c.nan) {
    const uint32_t code = encode(f, std::nanf(""), r, o);
    s = f.has_nan() ? "NaN encoded as " + code_outcome(f, code)
                    : name + " has no NaN: encoded as " + code_outcome(f, code);
  }
  if (c.inf()) {
    std::string inf = f.has_inf() ? "" : name + " has no Inf: ";
    if (c.pos_inf) inf += "+Inf encoded as " + code_outcome(f, encode(f, INFINITY, r, o));
    if (c.neg_inf)
      inf += std::string(c.pos_inf ? ", " : "") + "-Inf encoded as " + code_outcome(f, encode(f, -INFINITY, r, o));
    if (f.has_inf() && o == Overflow::saturate) inf += " (overflow policy saturate; nonsaturate keeps Inf)";
    s += (s.empty() ? "" : "; ") + inf;
  }
  return s;
}

std::string json_message(const char* what) {
  std::string s = what;
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t e = s.find("] ");
    if (e != std::string::npos) s = s.substr(e + 2);
  }
  return s;
}

// ---- OutputSet ---------------------------------------------------------------------

namespace {

fs::path parent_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? fs::path(".") : p;
}

// Removes "<path>.tmp.<pid>" files that a killed writer of `path` left: those whose process no longer
// exists (kill(pid, 0) fails with ESRCH), so a write still under way in another process is left alone.
void remove_dead_temporaries(const std::string& path) {
  const fs::path p(path);
  const std::string head = p.filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(parent_of(path), ec), e; !ec && it != e; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= head.size() || n.compare(0, head.size(), head) != 0) continue;
    const std::string pid = n.substr(head.size());
    if (pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(pid_t(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    if (it->is_regular_file(rm)) fs::remove(it->path(), rm);
  }
}

}  // namespace

OutputSet::~OutputSet() {
  if (!committed_) discard();
}

void OutputSet::add(const std::string& path, bool make_dirs) {
  if (path.empty()) throw Error("an output path is empty");
  std::error_code ec;
  const std::string key = fs::absolute(path, ec).lexically_normal().string();
  for (const File& f : files_)
    if (f.key == key) throw Error(path + ": given as two outputs (" + f.path + " and " + path + ")");
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) throw Error(path + ": cannot open for writing: it is a directory");
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw Error(path + ": cannot open for writing: not a regular file (outputs are replaced by a rename)");
  fs::path dir = parent_of(path);
  while (make_dirs && !fs::exists(fs::status(dir, ec))) {
    const fs::path up = parent_of(dir.string());
    if (up == dir) break;
    dir = up;
  }
  const fs::file_status ds = fs::status(dir, ec);
  if (!fs::exists(ds)) throw Error(path + ": cannot open for writing: directory " + dir.string() + " does not exist");
  if (!fs::is_directory(ds)) throw Error(path + ": cannot open for writing: " + dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw_errno(path + ": cannot open for writing: directory " + dir.string() + " is not writable", errno);
  remove_dead_temporaries(path);
  files_.push_back({path, path + ".tmp." + std::to_string(::getpid()), key, make_dirs, false});
}

OutputSet::File& OutputSet::find(const std::string& path) {
  for (File& f : files_)
    if (f.path == path) return f;
  FP4LAB_CHECK(false, "OutputSet: " + path + " was not added");
  std::abort();
}

void OutputSet::make_parent(const File& f) {
  if (!f.make_dirs) return;
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path d = parent_of(f.path); !fs::exists(fs::status(d, ec));) {
    missing.push_back(d);
    const fs::path up = parent_of(d.string());
    if (up == d) break;
    d = up;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0777) != 0 && errno != EEXIST)
      throw_errno(f.path + ": cannot create directory " + it->string(), errno);
    made_dirs_.push_back(it->string());
  }
}

void OutputSet::write_npy(const std::string& path, DType dtype, const Shape& shape, const void* data) {
  File& f = find(path);
  make_parent(f);
  errno = 0;
  try {
    fp4lab::write_npy(f.tmp, dtype, shape, data);
  } catch (const Error&) {
    const int e = errno ? errno : EIO;
    throw_errno(path + ": cannot write", e);
  }
  f.written = true;
}

void OutputSet::write_text(const std::string& path, const std::string& text) {
  File& f = find(path);
  make_parent(f);
  errno = 0;
  bool ok;
  {
    std::ofstream out(f.tmp, std::ios::binary | std::ios::trunc);
    f.written = bool(out);
    out << text;
    out.flush();
    ok = bool(out);
  }
  if (!ok) throw_errno(path + ": cannot write", errno ? errno : EIO);
}

void OutputSet::commit() {
  const std::string pid = std::to_string(::getpid());
  // Hard links keep the old files until every new one is in place.
  std::vector<std::string> backups(files_.size());
  for (size_t i = 0; i < files_.size(); ++i) {
    const std::string b = files_[i].path + ".old." + pid;
    if (::link(files_[i].path.c_str(), b.c_str()) == 0) backups[i] = b;
  }
  auto drop_backups = [&] {
    for (const std::string& b : backups)
      if (!b.empty()) std::remove(b.c_str());
  };
  for (size_t i = 0; i < files_.size(); ++i) {
    if (std::rename(files_[i].tmp.c_str(), files_[i].path.c_str()) == 0) {
      files_[i].written = false;
      continue;
    }
    const int e = errno;
    for (size_t j = 0; j < i; ++j) {  // put the old files back
      if (!backups[j].empty())
        std::rename(backups[j].c_str(), files_[j].path.c_str());
      else
        std::remove(files_[j].path.c_str());
    }
    drop_backups();
    throw_errno(files_[i].path + ": cannot move the new file into place; no output was changed", e);
  }
  drop_backups();
  committed_ = true;
}

void OutputSet::discard() noexcept {
  std::error_code ec;
  for (const File& f : files_)
    if (f.written) fs::remove(f.tmp, ec);
  for (auto it = made_dirs_.rbegin(); it != made_dirs_.rend(); ++it) fs::remove(*it, ec);  // only if empty
}

// ---- report and output helpers shared by the commands (commands.hpp) ----------------

std::string hex_bits(uint32_t v, int digits) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%0*X", digits, v);
  return b;
}

std::string fmt_float(float v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", double(v));
  return b;
}

SrBits sr_bits_option(const std::string& s) {
  const std::optional<SrBits> b = parse_sr_bits(s);
  if (!b) throw Error("--sr-bits '" + s + "' is unknown; valid: " + sr_bits_names);
  return *b;
}

std::vector<uint32_t> read_rbits(const std::string& path, uint64_t count, const std::string& layout) {
  set_activity("reading " + path);
  const NpyArray a = read_npy(path);
  if (a.dtype != DType::uint32)
    throw Error(path + ": --rbits needs uint32 random words (numpy dtype '<u4'), got " + dtype_name(a.dtype));
  const uint64_t n = uint64_t(shape_numel(a.shape));
  if (n != count)
    throw Error(path + ": --rbits holds " + std::to_string(n) + " words (shape " + shape_str(a.shape) + "), expected " +
                std::to_string(count) + " (" + layout + ")");
  std::vector<uint32_t> w(static_cast<size_t>(n));
  if (n) std::memcpy(w.data(), a.bytes.data(), size_t(n) * sizeof(uint32_t));
  return w;
}

bool scales_are_float(const QuantizerSpec& q) { return q.scale == &float32; }

void write_scales(OutputSet& out, const std::string& path, const QuantizedTensor& q) {
  const Shape shape = {q.scale_rows, q.scale_cols};
  if (scales_are_float(q.spec)) {
    out.write_npy(path, DType::float32, shape, q.scales.data());
  } else {
    out.write_npy(path, DType::uint8, shape, q.scale_codes.data());
  }
}

}  // namespace fp4lab

namespace {

constexpr const char* exit_codes_footer =
    "Exit codes: 0 success; 1 a failed check (verify: a mismatch, a missing case, an unreadable candidate file)\n"
    "or a failure of the environment (out of memory, host or GPU; disk full; a read-only file system; permission\n"
    "denied; a run directory in use; a silent data-parallel peer); 2 bad usage or input (arguments, unreadable or\n"
    "invalid input files, bad JSON, damaged run files, an output directory that does not exist); 3 an internal\n"
    "error (a bug; file:line named); 130/143 a run stopped by SIGINT/SIGTERM after writing its checkpoint.\n"
    "Every error is one line on stderr: `fp4lab: error: MESSAGE`.";

// "fp4lab quantize", "fp4lab bench cast": the subcommands parsed so far.
std::string command_path(const CLI::App& app) {
  std::string s = "fp4lab";
  const CLI::App* a = &app;
  for (;;) {
    const auto subs = a->get_subcommands();
    if (subs.empty()) break;
    a = subs.front();
    s += " " + a->get_name();
  }
  return s;
}

std::string doing(const CLI::App& app) {
  return fp4lab::activity().empty() ? "running `" + command_path(app) + "`" : fp4lab::activity();
}

// Where run_cli's failure line goes: stderr, or the caller's CliFailure.
fp4lab::CliFailure* g_failure = nullptr;

// Prints "fp4lab: <kind>: MESSAGE" as one line (or hands MESSAGE to the
// caller) and returns `code`.
int fail(int code, std::string msg, const char* kind = "error") {
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  if (g_failure) {
    g_failure->code = code;
    g_failure->message = std::move(msg);
    return code;
  }
  std::fprintf(stderr, "fp4lab: %s: %s\n", kind, msg.c_str());
  return code;
}

// "filesystem error: cannot create directories: Not a directory [/a/b]" -> "PATH: cannot create directories: ..."
std::string fs_message(const std::filesystem::filesystem_error& e) {
  std::string s = e.what();
  const std::string prefix = "filesystem error: ";
  if (s.rfind(prefix, 0) == 0) s = s.substr(prefix.size());
  const size_t b = s.find(" [");
  if (b != std::string::npos) s = s.substr(0, b);
  return e.path1().empty() ? s : e.path1().string() + ": " + s;
}

}  // namespace

namespace fp4lab {

int run_cli(int argc, char** argv, CliFailure* failure) {
  struct Restore {
    ~Restore() { g_failure = nullptr; }
  } restore;
  g_failure = failure;
  set_activity("");
  CLI::App app{"fp4lab " FP4LAB_VERSION
               " - bit-exact FP4/FP6/FP8 formats, block quantizers (MX, NVFP4), training recipes and a small trainer.\n"
               "Run `fp4lab COMMAND --help` for the options of one command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", FP4LAB_VERSION);
  app.footer(exit_codes_footer);
  fp4lab::register_format_commands(app);
  fp4lab::register_sr_commands(app);
  fp4lab::register_quantize_commands(app);
  fp4lab::register_golden_commands(app);
  fp4lab::register_recipe_commands(app);
  fp4lab::register_train_commands(app);
  fp4lab::register_inspect_commands(app);
  CLI::App* bench = app.add_subcommand(
      "bench",
      "Benchmarks that print throughput figures (cast, quantize, linear, train, gemm, grouped-gemm, attention)");
  bench->require_subcommand(1);
  fp4lab::register_bench_cast(*bench);
  fp4lab::register_bench_quantize(*bench);
  fp4lab::register_bench_linear(*bench);
  fp4lab::register_bench_train(*bench);
  fp4lab::register_bench_gemm(*bench);
  fp4lab::register_bench_attention(*bench);
  fp4lab::register_bench_moe(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    return fail(fp4lab::exit_usage, std::string(e.what()) + " (see `" + command_path(app) + " --help`)");
  } catch (const fp4lab::CommandExit& e) {
    return e.code;
  } catch (const fp4lab::train::InterruptedError& e) {
    return fail(128 + e.signo, e.what());
  } catch (const fp4lab::InternalError& e) {
    return fail(fp4lab::exit_internal, e.what());
  } catch (const fp4lab::EnvironmentError& e) {
    return fail(fp4lab::exit_check_failed, e.what());
  } catch (const fp4lab::Error& e) {
    return fail(fp4lab::exit_usage, e.what());
  } catch (const std::bad_alloc&) {
    return fail(fp4lab::exit_check_failed, "out of memory while " + doing(app));
  } catch (const std::length_error&) {
    return fail(fp4lab::exit_check_failed, "out of memory while " + doing(app) + " (a size beyond any memory)");
  } catch (const std::filesystem::filesystem_error& e) {
    const int code = fp4lab::exit_usage - (fp4lab::environment_errno(e.code().value()) ? 1 : 0);
    return fail(code, fs_message(e));
  } catch (const nlohmann::json::exception& e) {
    return fail(fp4lab::exit_usage, "invalid JSON while " + doing(app) + ": " + fp4lab::json_message(e.what()));
  } catch (const std::system_error& e) {
    return fail(fp4lab::exit_check_failed, doing(app) + " failed: " + e.code().message());
  } catch (const std::exception& e) {
    return fail(fp4lab::exit_internal, e.what(), "internal error");
  } catch (...) {
    return fail(fp4lab::exit_internal, "an unknown exception", "internal error");
  }
  return 0;
}

}  // namespace fp4lab
