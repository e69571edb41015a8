// Backend::round_bf16_codes and sum_bf16_codes (distributed.reduce "bf16"'s element rules, train/bf16_codes.hpp)
// on any backend, against an oracle written here, not core's codec: the BF16 rounding as integer work on the
// float's bits (round to nearest even: (u + 0x7FFF + ((u >> 16) & 1)) >> 16, which carries into the exponent
// and on to Inf; every NaN gives 0x7FFF), and the FP32 sum in rank order (a NaN sum 0x7FFF0000). Shared by the
// cpu backend's test (cpu/test_bf16_codes.cpp) and the cuda backend's (cuda/test_reduce_bf16_cuda.cpp).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"
#include "train/backend.hpp"

namespace fp4lab::train::test {

// The oracle's BF16 code of the float with bits u.
inline uint16_t oracle_bf16_code(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// The oracle's sum of element i over `rows` rows of k codes (row r at r k): s = c_0, s = s + c_r in rank order.
inline uint32_t oracle_bf16_sum(const std::vector<uint16_t>& codes, int64_t rows, int64_t k, int64_t i) {
  float s = bits_float(uint32_t(codes[size_t(i)]) << 16);
  for (int64_t r = 1; r < rows; ++r) s += bits_float(uint32_t(codes[size_t(r * k + i)]) << 16);
  return std::isnan(s) ? 0x7FFF0000u : float_bits(s);
}

// Inputs for the rounding: every upper half h (so every exponent, both signs, subnormals, -0, +-Inf, NaN of
// both signs, quiet and signalling) with the low halves 0 (exact), 0x7FFF (below the tie), 0x8000 (the tie:
// down to an even h, up from an odd one; 0x7F7F8000 rounds up to Inf), 0x8001 (above it) and 0xFFFF
// (up: 0x7F7FFFFF, FLT_MAX, to Inf); then random bit patterns.
inline std::vector<uint32_t> bf16_code_inputs() {
  std::vector<uint32_t> u;
  for (uint32_t h = 0; h < 0x10000u; ++h)
    for (uint32_t lo : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) u.push_back(h << 16 | lo);
  for (uint64_t i = 0; i < 65536; ++i) u.push_back(random_bits(0xB16C0DE, 0, i));
  return u;
}

// The codes of a byte tensor of be's memory holding n of them.
inline std::vector<uint16_t> download_codes(Backend& be, const Tensor& codes, int64_t n) {
  std::vector<float> h(size_t(codes.size()));
  be.download(codes, h.data());
  std::vector<uint16_t> c(static_cast<size_t>(n));
  std::memcpy(c.data(), h.data(), size_t(n) * 2);
  return c;
}

// round_bf16_codes on bf16_code_inputs (whole, and an odd-sized prefix into a buffer of exactly its bytes'
// floats): every code the oracle's.
inline void check_round_bf16_codes(Backend& be) {
  const std::vector<uint32_t> u = bf16_code_inputs();
  std::vector<float> x(u.size());
  for (size_t i = 0; i < u.size(); ++i) x[i] = bits_float(u[i]);
  for (int64_t n : {int64_t(u.size()), int64_t(1001)}) {
    CAPTURE(n);
    Tensor t = be.empty(1, int64_t(u.size()));
    be.upload(x.data(), t);
    const Tensor in = view_of(t.data, 1, n);
    Tensor codes = empty_bytes(be, 2 * n);
    be.round_bf16_codes(in, codes);
    const std::vector<uint16_t> got = download_codes(be, codes, n);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      if (got[size_t(i)] != oracle_bf16_code(u[size_t(i)])) {
        if (++wrong <= 5) {
          CAPTURE(i);
          CHECK(got[size_t(i)] == oracle_bf16_code(u[size_t(i)]));
        }
      }
    CHECK(wrong == 0);
  }
  // A buffer too small is refused in one line.
  Tensor x3 = be.zeros(1, 3), small = empty_bytes(be, 4);
  CHECK_THROWS_AS(be.round_bf16_codes(x3, small), Error);
}

// Codes for the sum: fixed elements first (-0 + -0, Inf + -Inf, BF16's largest finite overflowing, subnormals
// exactly, a NaN code in the last row, and 1 + 2^-24 + 2^-24 ..., which the rank order rounds back to 1 while
// any other order gives 1 + 2^-23 from 3 rows on), then random codes of every kind.
inline std::vector<uint16_t> bf16_sum_codes(int64_t rows, int64_t k) {
  std::vector<uint16_t> c(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const uint32_t w = random_bits(0x5E11, uint64_t(r), uint64_t(i));
      uint16_t v = uint16_t(w);
      if (w >> 16 & 1) v = uint16_t((v & 0x803Fu) | 0x3F00u);  // |v| around 1: sums that round
      const uint16_t fixed[] = {0x8000u,
                                r == 0 ? uint16_t(0x7F80u) : uint16_t(0xFF80u),
                                0x7F7Fu,
                                0x0001u,
                                r == rows - 1 ? uint16_t(0x7FFFu) : uint16_t(0x3F80u),
                                r == 0 ? uint16_t(0x3F80u) : uint16_t(0x3380u)};
      if (i < int64_t(std::size(fixed))) v = fixed[size_t(i)];
      c[size_t(r * k + i)] = v;
    }
  return c;
}

// sum_bf16_codes of 1, 2, 3 and 5 rows of an odd count of codes: every sum the oracle's, bit for bit.
inline void check_sum_bf16_codes(Backend& be) {
  const int64_t k = 1001;
  for (int64_t rows : {1, 2, 3, 5}) {
    CAPTURE(rows);
    const std::vector<uint16_t> c = bf16_sum_codes(rows, k);
    Tensor codes = empty_bytes(be, 2 * rows * k);
    std::vector<float> h(size_t(codes.size()), 0.0f);
    std::memcpy(h.data(), c.data(), c.size() * 2);
    be.upload(h.data(), codes);
    Tensor out = be.empty(1, k);
    be.sum_bf16_codes(codes, rows, out);
    std::vector<float> got(static_cast<size_t>(k));
    be.download(out, got.data());
    int64_t wrong = 0;
    for (int64_t i = 0; i < k; ++i)
      if (float_bits(got[size_t(i)]) != oracle_bf16_sum(c, rows, k, i)) {
        if (++wrong <= 5) {
          CAPTURE(i);
          CHECK(float_bits(got[size_t(i)]) == oracle_bf16_sum(c, rows, k, i));
        }
      }
    CHECK(wrong == 0);
    // The fixed elements' expected values, stated.
    CHECK(float_bits(got[0]) == 0x80000000u);                                     // -0 + -0 + ...
    CHECK(float_bits(got[1]) == (rows == 1 ? 0x7F800000u : 0x7FFF0000u));        // Inf + -Inf: NaN
    CHECK(float_bits(got[2]) == (rows == 1 ? 0x7F7F0000u : 0x7F800000u));        // overflow to Inf
    CHECK(float_bits(got[3]) == uint32_t(0x00010000u * rows));                    // exact subnormal sums
    CHECK(float_bits(got[4]) == 0x7FFF0000u);                                     // a NaN code
    CHECK(float_bits(got[5]) == 0x3F800000u);                                     // rank order
  }
  Tensor out = be.empty(1, 3), small = empty_bytes(be, 8);
  CHECK_THROWS_AS(be.sum_bf16_codes(small, 2, out), Error);
  CHECK_THROWS_AS(be.sum_bf16_codes(small, 0, out), Error);
}

}  // namespace fp4lab::train::test
