// train/process.hpp: child processes without a shell (exit statuses, a missing
// program, arguments passed verbatim, stdout captured, stderr to a file, the
// working directory), the private temporary directory, and the escaping of
// untrusted text for gnuplot scripts and the terminal.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "train/process.hpp"
#include "core/error.hpp"

using namespace fp4lab::train;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

ProcessOptions capture() {
  ProcessOptions o;
  o.capture_stdout = true;
  return o;
}

}  // namespace

TEST_CASE("run_process: exit statuses, signals, and a program that is not found") {
  CHECK(run_process({"true"}).status == 0);
  CHECK(run_process({"false"}).status == 1);
  CHECK(run_process({"sh", "-c", "exit 42"}).status == 42);
  CHECK(run_process({"sh", "-c", "kill -KILL $$"}).status == 128 + 9);
  // Not found: on PATH, and as a path; a different exception from a failing program.
  CHECK_THROWS_AS(run_process({"fp4lab-no-such-program-3f9a"}), ProgramNotFound);
  CHECK_THROWS_AS(run_process({"/nonexistent-dir-3f9a/prog"}), ProgramNotFound);
  try {
    run_process({"fp4lab-no-such-program-3f9a"});
  } catch (const ProgramNotFound& e) {
    CHECK(std::string(e.what()).find("fp4lab-no-such-program-3f9a") != std::string::npos);
  }
  // A directory is not a program: an error, but not "not found".
  try {
    run_process({"/"});
    FAIL("running / did not throw");
  } catch (const ProgramNotFound&) {
    FAIL("running / reported as not found");
  } catch (const fp4lab::Error&) {
  }
}

TEST_CASE("run_process: arguments reach the program verbatim (no shell)") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_process_args";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string marker = (tmp / "ran").string();
  // Everything a shell would act on: spaces, quotes, newlines, substitutions, separators, globs.
  const std::vector<std::string> args = {"a b",
                                         "it's",
                                         "say \"hi\"",
                                         "line1\nline2",
                                         "back\\slash",
                                         "$(touch " + marker + ")",
                                         "`touch " + marker + "`",
                                         "; touch " + marker,
                                         "*",
                                         "",
                                         "$HOME"};
  std::vector<std::string> argv = {"printf", "[%s]"};
  argv.insert(argv.end(), args.begin(), args.end());
  const ProcessResult r = run_process(argv, capture());
  std::string want;
  for (const auto& a : args) want += "[" + a + "]";
  CHECK(r.status == 0);
  CHECK(r.out == want);
  CHECK_FALSE(r.truncated);
  CHECK_FALSE(fs::exists(marker));
  // An argument with a NUL byte cannot be passed verbatim: an error, nothing runs.
  CHECK_THROWS_AS(run_process({"printf", std::string("a\0b", 3)}), fp4lab::Error);
  fs::remove_all(tmp);
}

TEST_CASE("run_process: stdout captured or dropped, stderr to a file, stdin empty, working directory") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_process_io";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  // Not captured: nothing comes back (and nothing reaches our stdout: it went to /dev/null).
  CHECK(run_process({"echo", "hello"}).out.empty());
  CHECK(run_process({"echo", "hello"}, capture()).out == "hello\n");
  // Larger than a pipe's buffer: read while the child writes, all of it.
  const ProcessResult big = run_process({"head", "-c", "300000", "/dev/zero"}, capture());
  CHECK(big.out.size() == 300000);
  ProcessOptions small = capture();
  small.max_stdout = 1000;
  const ProcessResult cut = run_process({"head", "-c", "300000", "/dev/zero"}, small);
  CHECK(cut.status == 0);
  CHECK(cut.out.size() == 1000);
  CHECK(cut.truncated);
  // stdin is /dev/null: cat ends at once with nothing.
  CHECK(run_process({"cat"}, capture()).out.empty());

  ProcessOptions err = capture();
  err.stderr_path = tmp / "err.txt";
  const ProcessResult e = run_process({"sh", "-c", "echo out; echo oops >&2; exit 3"}, err);
  CHECK(e.status == 3);
  CHECK(e.out == "out\n");
  CHECK(slurp(tmp / "err.txt") == "oops\n");
  // A stderr file that cannot be opened is an error about that file, not a missing program.
  ProcessOptions bad;
  bad.stderr_path = tmp / "no-such-dir" / "err.txt";
  try {
    run_process({"true"}, bad);
    FAIL("no error for an unopenable stderr file");
  } catch (const ProgramNotFound&) {
    FAIL("an unopenable stderr file reported as a missing program");
  } catch (const fp4lab::Error& x) {
    CHECK(std::string(x.what()).find("no-such-dir") != std::string::npos);
  }

  ProcessOptions in_dir = capture();
  in_dir.cwd = tmp;
  CHECK(run_process({"pwd", "-P"}, in_dir).out == fs::canonical(tmp).string() + "\n");
  in_dir.cwd = tmp / "missing";
  CHECK_THROWS_AS(run_process({"true"}, in_dir), fp4lab::Error);
  fs::remove_all(tmp);
}

TEST_CASE("TempDir: a fresh private directory, removed with its contents") {
  fs::path kept;
  {
    const TempDir a("fp4lab_test_tmp_"), b("fp4lab_test_tmp_");
    kept = a.path();
    CHECK(a.path() != b.path());
    CHECK(fs::is_directory(a.path()));
    CHECK(a.path().filename().string().rfind("fp4lab_test_tmp_", 0) == 0);
    struct stat st;
    REQUIRE(::stat(a.path().c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);
    std::ofstream(a.path() / "f.dat") << "x";
  }
  CHECK_FALSE(fs::exists(kept));
}

TEST_CASE("gnuplot_string: only printable ASCII without quotes, escapes, substitutions, macros") {
  CHECK(gnuplot_string("nvfp4 (run_a, 3 runs: mean)") == "'nvfp4 (run_a, 3 runs: mean)'");
  CHECK(gnuplot_string("a'b\"c\\d`e@f$g") == "'a?b?c?d?e?f?g'");
  CHECK(gnuplot_string("x\nsystem(\"touch p\")\n#") == "'x?system(?touch p?)?#'");
  CHECK(gnuplot_string(std::string("t\tu\rv\x1bw\x7f")) == "'t?u?v?w?'");
  CHECK(gnuplot_string("\xc3\xbc\xe2\x82\xac") == "'?" "?'");  // one '?' per UTF-8 character (u-umlaut, euro)
  CHECK(gnuplot_string("\xff\x80") == "'?" "?'");  // bytes that are not UTF-8
  CHECK(gnuplot_string("") == "''");
  // Whatever the input, the literal's inside holds no quote and nothing but 0x20..0x7e.
  std::string all;
  for (int c = 0; c < 256; ++c) all += char(c);
  const std::string q = gnuplot_string(all);
  REQUIRE(q.size() >= 2);
  const std::string inner = q.substr(1, q.size() - 2);
  for (char c : inner) {
    CHECK(c >= 0x20);
    CHECK(c < 0x7f);
    CHECK(std::string("'\"\\`@$").find(c) == std::string::npos);
  }
}

TEST_CASE("terminal_text: control characters and non-UTF-8 bytes escaped, UTF-8 kept") {
  CHECK(terminal_text("fp32") == "fp32");
  CHECK(terminal_text("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m");
  CHECK(terminal_text("a\nb\rc\td") == "a\\x0ab\\x0dc\\x09d");
  CHECK(terminal_text(std::string("nul\0x", 5)) == "nul\\x00x");
  CHECK(terminal_text("\x7f") == "\\x7f");
  CHECK(terminal_text("r\xc3\xa9sum\xc3\xa9") == "r\xc3\xa9sum\xc3\xa9");  // é stays
  CHECK(terminal_text("\xc2\x9b" "31m") == "\\u{009b}31m");                // C1 CSI
  CHECK(terminal_text("\xe2\x80\xae" "abc") == "\\u{202e}abc");            // right-to-left override
  CHECK(terminal_text("\xe2\x81\xa6" "x") == "\\u{2066}x");                // left-to-right isolate
  CHECK(terminal_text("\xff\xfe") == "\\xff\\xfe");                        // not UTF-8
  CHECK(terminal_text("\xc3") == "\\xc3");                                 // truncated sequence
  CHECK(terminal_text("\xc0\xaf") == "\\xc0\\xaf");                        // overlong '/'
  CHECK(terminal_text("\xed\xa0\x80") == "\\xed\\xa0\\x80");               // a surrogate
  CHECK(terminal_text("\xf0\x9f\x99\x82") == "\xf0\x9f\x99\x82");          // 4-byte UTF-8 stays
}
