// Rows for the dispatch cast's compact row codec (train/mx_rows.hpp), shared by its CPU and CUDA tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace fp4lab::train::test {

// Rows that exercise the codec: normal values of varied scales, a row of zeros (and -0), values at and
// near E4M3's max times a power of two, FP32's largest values, the E4M3 and FP32 subnormal ranges, NaN
// and +-Inf in one block of a row.
inline std::vector<float> mx_hard_rows(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      switch (r % 8) {
        case 0: row[c] = nd(rng) * std::ldexp(1.0f, int(nd(rng) * 8)); break;
        case 1: row[c] = c % 3 == 0 ? -0.0f : 0.0f; break;
        case 2:
          row[c] = (c % 2 ? -448.0f : 448.0f) * std::ldexp(1.0f, int(r % 5) - 2) * (1.0f - 0.01f * (c % 4));
          break;
        case 3: row[c] = nd(rng) * 1e38f; break;
        case 4: row[c] = nd(rng) * std::ldexp(1.0f, -130 - int(c % 12)); break;  // FP32 subnormals
        case 5: row[c] = nd(rng) * std::ldexp(1.0f, -9); break;                  // E4M3's subnormal range
        case 6: row[c] = nd(rng); break;
        default: row[c] = nd(rng) * 3.0f;
      }
    }
    if (r % 8 == 7 && cols > 0) {
      row[0] = std::numeric_limits<float>::quiet_NaN();
      row[cols - 1] = (r / 8) % 2 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    }
  }
  return x;
}

}  // namespace fp4lab::train::test
