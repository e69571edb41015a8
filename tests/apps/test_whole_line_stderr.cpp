// apps/whole_line_stderr.hpp: std::cerr's text reaches fd 2 only as whole lines (one write each), so ranks sharing
// mpirun's stderr cannot cut into each other's lines. Fd 2 is pointed at a non-blocking pipe and read between the
// pieces of a line.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <iostream>
#include <string>

#include "apps/whole_line_stderr.hpp"

namespace {

// Everything the pipe holds now (the read end is non-blocking).
std::string drain(int fd) {
  std::string s;
  char b[256];
  for (;;) {
    const ssize_t n = ::read(fd, b, sizeof b);
    if (n <= 0) return s;
    s.append(b, size_t(n));
  }
}

// Fd 2 -> a pipe for the test's life; std::cerr's own buffer is left as it was.
struct CapturedStderr {
  int p[2] = {-1, -1};
  int saved = -1;
  CapturedStderr() {
    REQUIRE(::pipe(p) == 0);
    REQUIRE(::fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);
    saved = ::dup(STDERR_FILENO);
    REQUIRE(::dup2(p[1], STDERR_FILENO) == STDERR_FILENO);
  }
  ~CapturedStderr() {
    ::dup2(saved, STDERR_FILENO);
    ::close(saved);
    ::close(p[0]);
    ::close(p[1]);
  }
  std::string read() { return drain(p[0]); }
};

}  // namespace

TEST_CASE("WholeLineStderr: nothing of a line leaves before its newline, then the line leaves whole") {
  CapturedStderr cap;
  std::streambuf* before = std::cerr.rdbuf();
  {
    fp4lab::WholeLineStderr whole;
    CHECK(std::cerr.rdbuf() != before);
    std::cerr << "fp4lab train: " << "faults" << " (gpt), recipe " << 7;
    std::cerr.flush();  // std::cerr is unit-buffered: every << flushes; a flush alone must not cut the line
    CHECK(cap.read() == "");
    std::cerr << ", 2 ranks (mpi)\n" << "resuming run at step ";
    CHECK(cap.read() == "fp4lab train: faults (gpt), recipe 7, 2 ranks (mpi)\n");
    std::cerr << 3 << "/10\n" << "a\nb\n" << "tail";
    CHECK(cap.read() == "resuming run at step 3/10\na\nb\n");
  }  // the guard ends: the unfinished text is written, std::cerr gets its own buffer back
  CHECK(cap.read() == "tail");
  CHECK(std::cerr.rdbuf() == before);
}

TEST_CASE("WholeLineStderr: a terminal progress bar (a flushed text starting with '\\r') leaves at the flush") {
  CapturedStderr cap;
  fp4lab::WholeLineStderr whole;
  std::cerr << "\r\033[K[###...] 3/10" << std::flush;
  CHECK(cap.read() == "\r\033[K[###...] 3/10");
  std::cerr << "\r\033[K" << "eval loss 1.5\n";
  CHECK(cap.read() == "\r\033[Keval loss 1.5\n");
}
