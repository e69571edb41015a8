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

}  // namespace fp4lab
