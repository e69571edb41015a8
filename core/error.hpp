// The project's errors, by who has to act on them (docs/DESIGN.md, "The CLI
// contract"). `fp4lab` prints each as one line, "fp4lab: error: MESSAGE", and
// exits with the code in brackets:
//   Error             bad input [2]: arguments, config keys, input files. The message names the file, key or
//                     value at fault and, where there is a fixed set, what would be valid.
//   EnvironmentError  the environment failed [1]: disk full, read-only file system, permission denied, out of
//                     (host or GPU) memory, a peer rank gone or silent. The message names the path or resource
//                     and the OS's reason. Derived from Error, so code that adds context to an Error keeps it.
//   InternalError     a broken invariant, i.e. a bug [3]: thrown by FP4LAB_CHECK with file:line. Not an
//                     Error: no handler of bad input catches it.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace fp4lab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class EnvironmentError : public Error {
 public:
  using Error::Error;
};

class InternalError : public std::runtime_error {
 public:
  explicit InternalError(const std::string& what) : std::runtime_error(what) {}
};

// errno values that mean the environment failed, not the input (exit 1): EACCES, EPERM, EROFS, ENOSPC,
// EDQUOT, ENOMEM, EIO, EMFILE, ENFILE, EBUSY, ETXTBSY, EAGAIN, EFBIG, EINTR.
inline bool environment_errno(int e) {
  return e == EACCES || e == EPERM || e == EROFS || e == ENOSPC || e == EDQUOT || e == ENOMEM || e == EIO ||
         e == EMFILE || e == ENFILE || e == EBUSY || e == ETXTBSY || e == EAGAIN || e == EFBIG || e == EINTR;
}

// "MSG (OS reason)" as an EnvironmentError when errno value e is one of the
// environment's (environment_errno), else as an Error.
[[noreturn]] inline void throw_errno(const std::string& msg, int e) {
  const std::string full = msg + " (" + std::strerror(e) + ")";
  if (environment_errno(e)) throw EnvironmentError(full);
  throw Error(full);
}

// __FILE__ from the source root on ("train/run.cpp"). The build maps the root away already
// (-fmacro-prefix-map in CMakeLists.txt); this covers builds that do not.
constexpr std::string_view source_path(std::string_view file) {
  size_t at = std::string_view::npos;
  for (std::string_view root : {"/core/", "/sim/", "/recipes/", "/cuda/", "/train/", "/apps/", "/tests/", "/python/"})
    at = std::min(at, file.find(root));
  return at == std::string_view::npos ? file : file.substr(at + 1);
}

[[noreturn]] inline void internal_check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError("internal error at " + std::string(source_path(file)) + ":" + std::to_string(line) + ": " +
                      cond + (msg.empty() ? "" : " (" + msg + ")") + "; please report it");
}

// A JSON library message without its "[json.exception.parse_error.101] " tag,
// for errors that quote it: "parse error at line 1, column 5: syntax error ...".
inline std::string json_error_text(const char* what) {
  std::string s = what;
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t end = s.find("] ");
    if (end != std::string::npos) s.erase(0, end + 2);
  }
  return s;
}

}  // namespace fp4lab

// An internal invariant: throws fp4lab::InternalError naming file:line, the
// condition and MSG (a std::string expression, evaluated only on failure).
#define FP4LAB_CHECK(cond, msg)                                                     \
  do {                                                                              \
    if (!(cond)) ::fp4lab::internal_check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
