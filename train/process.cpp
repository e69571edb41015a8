#include "train/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

extern char** environ;

namespace fp4lab::train {

namespace fs = std::filesystem;

namespace {

// A file descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

// posix_spawn's file actions and attributes, destroyed when they go out of scope.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
};

// The posix_spawn* call `what` returned error number e (they return it, not errno).
void check_spawn_call(int e, const std::string& prog, const char* what) {
  if (e != 0) throw_errno("cannot run " + prog + ": " + what + " failed", e);
}

int open_or_throw(const fs::path& p, int flags, const std::string& why) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC, 0600);
  if (fd < 0) throw_errno("cannot open " + p.string() + " " + why, errno);
  return fd;
}

}  // namespace

ProcessResult run_process(const std::vector<std::string>& argv, const ProcessOptions& opt) {
  FP4LAB_CHECK(!argv.empty(), "run_process needs a program");
  const std::string& prog = argv[0];
  for (const std::string& a : argv)
    if (a.find('\0') != std::string::npos)
      throw Error("cannot run " + prog + ": an argument holds a NUL byte, which no program can be given");

  // Every descriptor the child gets is opened here, so a failure names its file and
  // posix_spawnp's own error can only be about the program (ENOENT: not found).
  Fd in(open_or_throw("/dev/null", O_RDONLY, "as the standard input of " + prog));
  Fd err(opt.stderr_path.empty() ? open_or_throw("/dev/null", O_WRONLY, "as the error output of " + prog)
                                 : open_or_throw(opt.stderr_path, O_WRONLY | O_CREAT | O_TRUNC,
                                                 "for the error output of " + prog));
  Fd out_r, out_w;
  if (opt.capture_stdout) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw_errno("cannot run " + prog + ": no pipe for its output", errno);
    out_r.fd = p[0];
    out_w.fd = p[1];
  } else {
    out_w.fd = open_or_throw("/dev/null", O_WRONLY, "as the standard output of " + prog);
  }

  SpawnSetup s;
  // dup2 onto 0/1/2 clears close-on-exec there; every other descriptor of ours is
  // O_CLOEXEC (the ones above) and stays out of the child.
  check_spawn_call(posix_spawn_file_actions_adddup2(&s.actions, in.fd, STDIN_FILENO), prog, "dup2");
  check_spawn_call(posix_spawn_file_actions_adddup2(&s.actions, out_w.fd, STDOUT_FILENO), prog, "dup2");
  check_spawn_call(posix_spawn_file_actions_adddup2(&s.actions, err.fd, STDERR_FILENO), prog, "dup2");
  if (!opt.cwd.empty()) {
    // Checked here so that a bad directory is named as such, not taken for a missing program.
    struct stat st;
    if (::stat(opt.cwd.c_str(), &st) != 0) throw_errno("cannot run " + prog + " in " + opt.cwd.string(), errno);
    check_spawn_call(posix_spawn_file_actions_addchdir_np(&s.actions, opt.cwd.c_str()), prog, "chdir");
  }
  // The child starts with every signal at its default action and none blocked,
  // whatever this process ignores or blocks (e.g. SIGPIPE).
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  check_spawn_call(posix_spawnattr_setsigdefault(&s.attr, &all), prog, "setsigdefault");
  check_spawn_call(posix_spawnattr_setsigmask(&s.attr, &none), prog, "setsigmask");
  check_spawn_call(posix_spawnattr_setflags(&s.attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK), prog,
                   "setflags");

  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, prog.c_str(), &s.actions, &s.attr, args.data(), environ);
  if (rc == ENOENT)
    throw ProgramNotFound(prog + ": program not found" +
                          (prog.find('/') == std::string::npos ? " on PATH" : std::string()));
  if (rc != 0) throw_errno("cannot run " + prog, rc);
  out_w.reset();  // the child holds the write end now; EOF comes when it exits
  in.reset();
  err.reset();

  ProcessResult r;
  if (opt.capture_stdout) {
    char buf[65536];
    while (true) {
      const ssize_t n = ::read(out_r.fd, buf, sizeof buf);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        ::kill(pid, SIGKILL);  // the child is not left running unread
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        throw_errno("cannot read the output of " + prog, e);
      }
      const size_t keep = std::min(size_t(n), opt.max_stdout - r.out.size());
      r.out.append(buf, keep);
      r.truncated |= keep < size_t(n);
    }
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) throw_errno("cannot wait for " + prog, errno);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 255;
  return r;
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (fs::temp_directory_path() / (prefix + "XXXXXX")).string();
  if (!::mkdtemp(tmpl.data())) throw_errno("cannot make a temporary directory " + tmpl, errno);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;  // best effort: a destructor cannot report, and the directory is private
  fs::remove_all(path_, ec);
}

void run_gnuplot(const std::string& script, const fs::path& dir) {
  {
    std::ofstream f(dir / "plot.gp", std::ios::binary | std::ios::trunc);
    f << script;
    f.flush();
    if (!f) throw_errno("cannot write " + (dir / "plot.gp").string(), errno);
  }
  ProcessOptions o;
  o.stderr_path = dir / "gnuplot.err";
  o.cwd = dir;
  const ProcessResult r = run_process({"gnuplot", "plot.gp"}, o);
  if (r.status == 0) return;
  std::ifstream e(dir / "gnuplot.err", std::ios::binary);
  std::string msg((std::istreambuf_iterator<char>(e)), std::istreambuf_iterator<char>());
  // One line: its lines joined by spaces (gnuplot points at the column on a line of its own).
  for (char& c : msg)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  msg.erase(std::unique(msg.begin(), msg.end(), [](char a, char b) { return a == ' ' && b == ' '; }), msg.end());
  while (!msg.empty() && msg.back() == ' ') msg.pop_back();
  if (msg.size() > 400) msg = msg.substr(0, 400) + " ...";
  throw Error("gnuplot failed (exit status " + std::to_string(r.status) +
              "): " + (msg.empty() ? std::string("no message") : terminal_text(msg)));
}

std::string gnuplot_string(const std::string& s) {
  std::string o = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      // One '?' per UTF-8 character: a lead byte and up to the continuation bytes it announces.
      o += '?';
      int more = (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 0;
      for (; more > 0 && i + 1 < s.size() && (static_cast<unsigned char>(s[i + 1]) & 0xC0) == 0x80; --more) ++i;
      continue;
    }
    const bool ok = c >= 0x20 && c < 0x7F && c != '\'' && c != '"' && c != '\\' && c != '`' && c != '@' && c != '$';
    o += ok ? char(c) : '?';
  }
  return o + "'";
}

namespace {

// The UTF-8 sequence at s[i]: its code point and length; length 0 if it is not
// well-formed (a stray continuation byte, a truncated or overlong sequence, a
// surrogate, beyond U+10FFFF).
std::pair<uint32_t, size_t> utf8_at(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return {0, 0};
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1Fu : n == 3 ? c & 0x0Fu : c & 0x07u;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (d & 0x3Fu);
  }
  static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_of[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, n};
}

}  // namespace

std::string terminal_text(const std::string& s) {
  std::string o;
  char b[16];
  for (size_t i = 0; i < s.size();) {
    const auto [cp, n] = utf8_at(s, i);
    if (n == 0) {
      std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned char>(s[i]));
      o += b, ++i;
      continue;
    }
    if (cp < 0x20 || cp == 0x7F) {
      std::snprintf(b, sizeof b, "\\x%02x", unsigned(cp));
      o += b;
    } else if ((cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069)) {
      std::snprintf(b, sizeof b, "\\u{%04x}", unsigned(cp));
      o += b;
    } else {
      o.append(s, i, n);
    }
    i += n;
  }
  return o;
}

}  // namespace fp4lab::train
