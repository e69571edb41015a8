// Random Hadamard Transform over 16-element chunks (see rht.hpp).
#include "sim/rht.hpp"

#include <string>

#include "core/error.hpp"

namespace fp4lab {

std::array<float, 16> rht_signs(uint64_t seed) {
  std::array<float, 16> s{};
  for (int i = 0; i < 16; ++i) s[size_t(i)] = rht_sign(seed, i);
  return s;
}

namespace {

template <bool Forward>
void apply(MatrixView<float> x, RhtAxis axis, uint64_t seed) {
  const int64_t len = axis == RhtAxis::rows ? x.cols : x.rows;
  if (len % 16 != 0) {
    throw Error("RHT: the tensor's " + std::string(axis == RhtAxis::rows ? "column count" : "row count") + " (" +
                std::to_string(len) + ") must be a multiple of 16 (the transform works on whole 16-element chunks)");
  }
  const std::array<float, 16> signs = rht_signs(seed);
  if (axis == RhtAxis::rows) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < x.rows; ++r) {
      float* row = x.data + r * x.stride;
      for (int64_t c = 0; c < x.cols; c += 16) {
        if constexpr (Forward) {
          rht16_forward(row + c, signs.data());
        } else {
          rht16_inverse(row + c, signs.data());
        }
      }
    }
  } else {
    const int64_t chunks = x.rows / 16;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) {
      float t[16];
      for (int64_t c = 0; c < x.cols; ++c) {
        for (int i = 0; i < 16; ++i) t[i] = x(k * 16 + i, c);
        if constexpr (Forward) {
          rht16_forward(t, signs.data());
        } else {
          rht16_inverse(t, signs.data());
        }
        for (int i = 0; i < 16; ++i) x(k * 16 + i, c) = t[i];
      }
    }
  }
}

}  // namespace

void rht_forward(MatrixView<float> x, RhtAxis axis, uint64_t seed) { apply<true>(x, axis, seed); }
void rht_inverse(MatrixView<float> x, RhtAxis axis, uint64_t seed) { apply<false>(x, axis, seed); }

}  // namespace fp4lab
