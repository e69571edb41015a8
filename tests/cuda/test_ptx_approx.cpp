// core/ptx_approx.hpp's host model of rcp.approx.ftz.f32 against the instruction on this GPU: every mantissa
// of [1, 2), every exponent of 4096 mantissas, the special classes, and 2^24 random bit patterns. (The model's
// table came from an H200; scripts/ptx_approx_probe.cu checks all 2^32 inputs.) Part of test_cuda.
#include <doctest/doctest.h>

#include <cstdint>
#include <ios>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/ptx_approx.hpp"
#include "cuda/encode_device.hpp"

using namespace fp4lab;

TEST_CASE("rcp.approx.ftz.f32: the host model equals the GPU's instruction") {
  std::vector<uint32_t> x;
  for (uint32_t m = 0; m < (1u << 23); ++m) x.push_back(0x3F800000u | m);
  std::mt19937 g(31);
  for (int k = 0; k < 4096; ++k) {
    const uint32_t m = g() & 0x7FFFFFu;
    for (uint32_t e = 0; e < 256; ++e) x.push_back((e << 23) | m | (k % 2 ? 0x80000000u : 0u));
  }
  for (int k = 0; k < (1 << 24); ++k) x.push_back(g());
  for (uint32_t b : {0u, 0x80000000u, 1u, 0x807FFFFFu, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F7FFFFFu, 0x00800000u,
                     0x7E800000u, 0x7F000000u, 0x7E800001u})
    x.push_back(b);
  const std::vector<uint32_t> got = test::rcp_approx_ftz_on_gpu(x);
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t want = float_bits(rcp_approx_ftz_model(bits_float(x[i])));
    const bool both_nan = (got[i] & 0x7FFFFFFFu) > 0x7F800000u && (want & 0x7FFFFFFFu) > 0x7F800000u;
    if (got[i] != want && !both_nan && bad++ < 8)
      MESSAGE("x " << std::hex << x[i] << ": GPU " << got[i] << ", model " << want);
  }
  MESSAGE(x.size() << " inputs compared");
  CHECK(bad == 0);
}

TEST_CASE("div.approx.ftz.f32 and div.full.f32: the host models equal the GPU's instructions") {
  std::mt19937 g(37);
  std::vector<uint32_t> a, b;
  for (int k = 0; k < (1 << 22); ++k) {  // full-range bit patterns, and pairs in the quantizers' binades
    uint32_t x = g(), y = g();
    if (k % 2) {
      x = (x & 0x807FFFFFu) | ((100u + (x >> 23) % 56u) << 23);
      y = (y & 0x807FFFFFu) | ((100u + (y >> 23) % 56u) << 23);
    }
    a.push_back(x);
    b.push_back(y);
  }
  for (uint32_t y : {0u, 0x80000000u, 1u, 0x007FFFFFu, 0x00800000u, 0x7E800000u, 0x7E800001u, 0x7F7FFFFFu, 0x7F800000u,
                     0x7FC00000u, 0x3F800000u})
    for (uint32_t x : {0u, 0x3F800000u, 0x00000001u, 0x7F7FFFFFu, 0x7F800000u, 0xC0400000u}) {
      a.push_back(x);
      b.push_back(y);
    }
  for (bool full : {false, true}) {
    const std::vector<uint32_t> got = test::div_on_gpu(a, b, full);
    int64_t bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const float fa = bits_float(a[i]), fb = bits_float(b[i]);
      const uint32_t want = float_bits(full ? div_full(fa, fb) : div_approx_ftz(fa, fb));
      const bool both_nan = (got[i] & 0x7FFFFFFFu) > 0x7F800000u && (want & 0x7FFFFFFFu) > 0x7F800000u;
      if (got[i] != want && !both_nan && bad++ < 8)
        MESSAGE((full ? "div.full " : "div.approx.ftz ")
                << std::hex << a[i] << " / " << b[i] << ": GPU " << got[i] << ", model " << want);
    }
    INFO((full ? "div.full" : "div.approx.ftz"));
    CHECK(bad == 0);
  }
}
