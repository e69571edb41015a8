// Child processes without a shell, the private temporary directory their
// files live in, and the escaping of untrusted text handed on. The one place
// fp4lab starts another program (gnuplot for `compare` and `sr-bias --plot`,
// python3 for `bench train`'s PyTorch rows): the program and its arguments
// reach execvp verbatim, so no byte of a path, run name or recipe can become
// shell syntax, and gnuplot gets scripts of constants, numbers and
// gnuplot_string literals only (docs/DESIGN.md, "CLI contract").
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace fp4lab::train {

// The program (argv[0]) is not on PATH, or a path given with a '/' does not
// exist (execvp's ENOENT). Callers that can do without the program catch this
// one to say so ("gnuplot not found (apt-get install gnuplot-nox); no plot
// drawn"); it is an EnvironmentError (exit 1) where nobody does.
class ProgramNotFound : public EnvironmentError {
 public:
  using EnvironmentError::EnvironmentError;
};

struct ProcessOptions {
  bool capture_stdout = false;             // collect the child's standard output into ProcessResult::out;
                                           // false: it goes to /dev/null
  std::filesystem::path stderr_path;       // the child's standard error goes to this file (created or truncated,
                                           // mode 0600); empty: to /dev/null
  std::filesystem::path cwd;               // the child's working directory; empty: ours
  size_t max_stdout = size_t(64) << 20;    // capture_stdout: at most this many bytes are kept, the rest is read
                                           // and dropped (ProcessResult::truncated)
};

struct ProcessResult {
  int status = 0;          // the exit status 0..255; 128 + N when the child was killed by signal N (as a shell
                           // reports it)
  std::string out;         // its standard output, if captured; else empty
  bool truncated = false;  // out holds only the first max_stdout bytes
};

// Runs argv[0] (searched on PATH unless it holds a '/') with arguments argv[1..]
// passed verbatim (no shell: spaces, quotes, newlines, '$' and ';' are plain
// bytes), standard input /dev/null, the environment inherited, and waits for it.
// A child that runs and fails is a ProcessResult with status != 0, not an
// exception. Throws: ProgramNotFound when argv[0] cannot be found; Error (or
// EnvironmentError where the OS's reason is the environment's, e.g. EACCES on a
// program that is not executable, EMFILE, ENOMEM) naming the program and the OS
// reason when it cannot be started or stderr_path cannot be opened; Error when
// an argument holds a NUL byte (it could not be passed verbatim). argv must not
// be empty (InternalError).
ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& opt = {});

// A fresh directory only this user can read (mode 0700, a random name made by
// mkdtemp under the system temporary directory: $TMPDIR, else /tmp), removed
// with its contents when the object goes. For a child's input and output files,
// which then get fixed names chosen by the caller (curve_0.dat, plot.png), so
// no user data names a file another program reads. Throws EnvironmentError (or
// Error) with the OS reason if it cannot be made.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix);  // prefix: the name's start, e.g. "fp4lab_compare_"
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// gnuplot (which must be on PATH) runs `script`, written to dir/plot.gp, with
// dir as its working directory: the script names its data and output files by
// fixed relative names the caller chose (curve_0.dat, plot.png), so no path
// ($TMPDIR, a run directory, --plot) appears in it. Throws ProgramNotFound
// without gnuplot, Error("gnuplot failed: MESSAGE") with its error output (one
// line, terminal_text, shortened) when it exits non-zero.
void run_gnuplot(const std::string& script, const std::filesystem::path& dir);

// s as a single-quoted gnuplot string literal holding only printable ASCII
// other than ' " \ ` @ $ (quotes, escapes, command substitution, macros and
// data blocks); every other byte, and each multi-byte UTF-8 character, becomes
// '?'. Such a literal cannot end early or expand: a title from a run archive
// stays text.
std::string gnuplot_string(const std::string& s);

// s made safe to print on a terminal, as one line: control characters (C0,
// DEL, C1 such as U+009B CSI), bidirectional overrides/isolates (U+202A-U+202E,
// U+2066-U+2069) and bytes that are not UTF-8 become \xNN (\u{XXXX} for the
// code points); other UTF-8 is kept. For names and values from run archives in
// tables and error messages: an escape sequence in a recipe cannot reach the
// terminal, a newline in a directory name cannot split an error line.
std::string terminal_text(const std::string& s);

}  // namespace fp4lab::train
