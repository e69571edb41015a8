// The Backend contract's shapes (train/backend.hpp) on the CUDA backend: a
// mismatch is a bug of the caller (FP4LAB_CHECK: InternalError with
// file:line, exit 3), as in the CPU backend.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "train/backend.hpp"

namespace fp4lab::train {

inline void check_shape(const char* fn, const char* what, const Tensor& t, int64_t rows, int64_t cols) {
  FP4LAB_CHECK(t.rows == rows && t.cols == cols,
               std::string("cuda backend ") + fn + ": " + what + " is [" + std::to_string(t.rows) + ", " +
                   std::to_string(t.cols) + "], expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
}
inline void check_size(const char* fn, const char* what, const Tensor& t, int64_t n) {
  FP4LAB_CHECK(t.size() == n, std::string("cuda backend ") + fn + ": " + what + " holds " + std::to_string(t.size()) +
                                  " floats, expected " + std::to_string(n));
}

}  // namespace fp4lab::train
