// std::cerr's text reaches file descriptor 2 a whole line per write(2).
//
// Why: under mpirun every rank's stderr is a pipe that mpirun copies to its own stderr as the bytes arrive. A line
// that the code builds with several `<<` leaves as several writes, and another rank's line can land between them
// ("fp4lab train: faults (gptfp4lab: error: rank 1's ..."). One write of at most PIPE_BUF bytes arrives whole.
//
// Holding: text up to its last '\n' is written at once; the rest waits for its newline. A flush writes a pending
// text that begins with '\r' (a terminal's progress bar redraws its line without a newline). Whatever is pending
// when the guard ends is written then. stdio (fprintf(stderr, ...)) is not routed through here: fail() prints its
// line with one fprintf, which glibc writes in one call on the unbuffered stderr.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <streambuf>
#include <string>

namespace fp4lab {

class WholeLineStderr : public std::streambuf {
 public:
  WholeLineStderr() : saved_(std::cerr.rdbuf(this)) {}
  ~WholeLineStderr() override {
    write_out(pending_.size());
    std::cerr.rdbuf(saved_);
  }
  WholeLineStderr(const WholeLineStderr&) = delete;
  WholeLineStderr& operator=(const WholeLineStderr&) = delete;

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    const char ch = traits_type::to_char_type(c);
    xsputn(&ch, 1);
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    pending_.append(s, size_t(n));
    const size_t last = pending_.rfind('\n');
    if (last != std::string::npos) write_out(last + 1);
    return n;
  }
  int sync() override {
    if (!pending_.empty() && pending_.front() == '\r') write_out(pending_.size());
    return 0;
  }

 private:
  // Writes pending_'s first n bytes (retrying a write cut short or interrupted) and drops them.
  void write_out(size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(STDERR_FILENO, pending_.data() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;  // stderr gone: nothing better to do with the text
      done += size_t(w);
    }
    pending_.erase(0, n);
  }

  std::streambuf* saved_;
  std::string pending_;
};

}  // namespace fp4lab
