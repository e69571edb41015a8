// The GPU's forms of core/encode.hpp's codecs against the host's: the FP-pipe
// e2m1_rs_magnitude<8> (e2m1_rs8_magnitude_fp, device only) equals the
// integer form on every BF16 pattern x every random byte, and on sampled
// float32 x random bytes (a GPU is needed).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "cuda/encode_device.hpp"

using namespace fp4lab;

namespace {
int64_t mismatches(const std::vector<uint32_t>& a, const std::vector<uint32_t>& r) {
  const std::vector<uint32_t> gpu = test::e2m1_rs8_magnitudes_on_gpu(a, r);
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const uint32_t m = e2m1_rs_magnitude<8>(a[i], r[i]);
    const uint32_t want = m < 7u ? m : 7u;
    if (gpu[i] != want && bad++ < 5)
      std::printf("  e2m1_rs8: a %08X byte %u: gpu %u host %u\n", a[i], r[i] & 0xFFu, gpu[i], want);
  }
  return bad;
}
}  // namespace

TEST_CASE("GPU e2m1_rs_magnitude<8> (FP pipe) equals the integer form: every BF16 pattern x 256 bytes") {
  std::vector<uint32_t> a, r;
  a.reserve(size_t(65536) * 256);
  r.reserve(size_t(65536) * 256);
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t bits = b << 16;
    if (std::isnan(bits_float(bits))) continue;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      a.push_back(bits);
      r.push_back(byte | (byte * 0x01010100u));  // the other bytes must not matter
    }
  }
  CHECK(mismatches(a, r) == 0);
}

TEST_CASE("GPU e2m1_rs_magnitude<8> equals the integer form: sampled float32 (every exponent) x random bytes") {
  std::mt19937 rng(8);
  std::vector<uint32_t> a, r;
  for (uint32_t e = 0; e < 255; ++e)
    for (int k = 0; k < 65536; ++k) {
      a.push_back((uint32_t(rng()) & 0x807FFFFFu) | (e << 23));
      r.push_back(uint32_t(rng()));
    }
  // Residuals right at and around multiples of 1/256 of a step in every E2M1 cell.
  for (float lo : {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f})
    for (int m = 0; m < 256; ++m)
      for (int d = -2; d <= 2; ++d) {
        const float step = lo < 2 ? 0.5f : lo < 4 ? 1.0f : 2.0f;
        const uint32_t at = float_bits(lo + step * float(m) / 256.0f);
        if (std::isnan(bits_float(at + uint32_t(d)))) continue;
        for (uint32_t byte : {0u, 1u, uint32_t(255 - m), uint32_t(256 - m) & 0xFFu, 255u}) {
          a.push_back(at + uint32_t(d));
          r.push_back(byte);
        }
      }
  CHECK(mismatches(a, r) == 0);
}
