// The project's exception. Every message names the input at fault (file, key,
// value) and, where there is a fixed set, what would be valid.
#pragma once

#include <stdexcept>
#include <string>

namespace fp4lab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

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
