// Packing (sim/packing.hpp): nibble order, transpose, swizzled scales.
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "sim/packing.hpp"

using namespace fp4lab;

TEST_CASE("FP4 packing: low nibble = even index, odd rows padded") {
  const std::vector<uint8_t> codes = {1, 2, 3, 0xF, 0xE, 0x7};  // 2 rows x 3
  const auto p = pack_fp4(codes.data(), 2, 3);
  REQUIRE(p.size() == 4);
  CHECK(p[0] == 0x21);  // codes 1 (even, low), 2 (odd, high)
  CHECK(p[1] == 0x03);  // code 3, high nibble padding 0
  CHECK(p[2] == 0xEF);
  CHECK(p[3] == 0x07);
  CHECK(unpack_fp4(p.data(), 2, 3) == codes);
  // round trip on all 16 codes in every position
  std::vector<uint8_t> all(7 * 33);
  for (size_t i = 0; i < all.size(); ++i) all[i] = uint8_t((i * 7 + 3) % 16);
  CHECK(unpack_codes(float4_e2m1fn, pack_codes(float4_e2m1fn, all.data(), 7, 33).data(), 7, 33) == all);
  // FP8 stays one per byte
  CHECK(pack_codes(float8_e4m3fn, all.data(), 7, 33) == all);
  CHECK(packed_row_bytes(float4_e2m1fn, 33) == 17);
  CHECK(packed_row_bytes(float6_e2m3fn, 33) == 33);
}

TEST_CASE("nibble-packed transpose") {
  // [[1, 2], [3, 4], [5, 6]] -> transpose [[1, 3, 5], [2, 4, 6]] -> bytes [0x31, 0x05, 0x42, 0x06].
  const std::vector<uint8_t> codes = {1, 2, 3, 4, 5, 6};
  const auto t = pack_fp4_transposed(codes.data(), 3, 2);
  CHECK(t == std::vector<uint8_t>{0x31, 0x05, 0x42, 0x06});
}

TEST_CASE("swizzled scale layout: hand-checked index and round trips") {
  // R = 256, C = 8: scale (37, 6) -> tile (0, 1): 512 + 5*16 + 1*4 + 2 = 598.
  CHECK(swizzled_scale_offset(37, 6, 8) == 598);
  // (0,0) -> 0; (1,0) -> 16; (32,0) -> 4; (0,1) -> 1; (128,0) -> second tile row: 2 tiles * 512.
  CHECK(swizzled_scale_offset(0, 0, 8) == 0);
  CHECK(swizzled_scale_offset(1, 0, 8) == 16);
  CHECK(swizzled_scale_offset(32, 0, 8) == 4);
  CHECK(swizzled_scale_offset(0, 1, 8) == 1);
  CHECK(swizzled_scale_offset(128, 0, 8) == 1024);
  // Round trips, padded sizes, and the mapping is a bijection onto the padded buffer.
  for (auto [r, c] : {std::pair<int64_t, int64_t>{128, 4}, {200, 9}, {1, 1}, {300, 16}}) {
    std::vector<uint8_t> s(size_t(r * c));
    for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(1 + i % 251);
    const auto z = swizzle_scales(s.data(), r, c);
    CHECK(int64_t(z.size()) == ((r + 127) / 128 * 128) * ((c + 3) / 4 * 4));
    CHECK(unswizzle_scales(z.data(), r, c) == s);
    std::vector<int> hit(z.size(), 0);
    const int64_t rp = (r + 127) / 128 * 128, cp = (c + 3) / 4 * 4;
    for (int64_t i = 0; i < rp; ++i)
      for (int64_t j = 0; j < cp; ++j) hit[size_t(swizzled_scale_offset(i, j, c))]++;
    CHECK(std::all_of(hit.begin(), hit.end(), [](int h) { return h == 1; }));
  }
  // Same layout as TE's _recover_swizzled_scales: reshape (R/128, C/4, 32, 4, 4), permute (0,3,2,1,4).
  const int64_t R = 256, C = 8;
  std::vector<uint8_t> s(size_t(R * C));
  for (size_t i = 0; i < s.size(); ++i) s[i] = uint8_t(i % 256);
  const auto z = swizzle_scales(s.data(), R, C);
  for (int64_t a = 0; a < R / 128; ++a)
    for (int64_t b = 0; b < C / 4; ++b)
      for (int64_t x = 0; x < 32; ++x)
        for (int64_t y = 0; y < 4; ++y)
          for (int64_t w = 0; w < 4; ++w) {
            const int64_t lin = (((a * (C / 4) + b) * 32 + x) * 4 + y) * 4 + w;
            // permuted index (a, y, x, b, w) in the [R/128, 4, 32, C/4, 4] view of the [R, C] matrix
            const int64_t row = a * 128 + y * 32 + x, col = b * 4 + w;
            CHECK(z[size_t(lin)] == s[size_t(row * C + col)]);
          }
}
