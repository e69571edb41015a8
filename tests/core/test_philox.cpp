// Philox4x32-10 against Random123's published known-answer vectors
// (Random123 1.14, examples/kat_vectors, the three "philox4x32 10" lines:
// counter (4 words), key (2 words) -> output (4 words)), and the mapping of
// (seed, stream, index) onto counter and key documented in philox.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "core/philox.hpp"

using namespace fp4lab;

namespace {
struct Kat {
  uint32_t ctr[4], key[2], out[4];
};
constexpr Kat kats[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};
// Also usable in constant expressions (the CUDA backend relies on constexpr).
static_assert(philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 0).v[0] == 0x6627e8d5u);
static_assert(random_bits(0, 0, 3) == 0x9b00dbd8u);
}  // namespace

TEST_CASE("philox: Random123 known-answer vectors") {
  for (const Kat& k : kats) {
    const Philox4 r = philox4x32_10(Philox4{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) CHECK(r.v[i] == k.out[i]);
  }
}

TEST_CASE("philox: (seed, stream, index) -> (key, counter) mapping") {
  // key = (seed lo, seed hi); counter = (group lo, group hi, stream lo, stream hi).
  const Philox4 pi = philox_group(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  CHECK(pi.v[0] == 0xd16cfe09u);
  CHECK(pi.v[3] == 0x24126ea1u);
  const Philox4 ones = philox_group(~0ull, ~0ull, ~0ull);
  CHECK(ones.v[1] == 0x41c83b0eu);
  // random_bits(seed 0, stream 0, index 0..3) are the words of counter 0.
  for (uint64_t i = 0; i < 4; ++i) CHECK(random_bits(0, 0, i) == kats[0].out[i]);
  // index 4 starts the next group (counter word 0 = 1).
  CHECK(random_bits(0, 0, 4) == philox4x32_10(Philox4{{1, 0, 0, 0}}, 0, 0).v[0]);
  CHECK(random_bits(0, 0, (uint64_t(1) << 34) + 1) == philox4x32_10(Philox4{{0, 1, 0, 0}}, 0, 0).v[1]);
  CHECK(random_bits(0, 7, 0) == philox4x32_10(Philox4{{0, 0, 7, 0}}, 0, 0).v[0]);
  CHECK(random_bits(uint64_t(9) << 32, 0, 2) == philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 9).v[2]);
}

TEST_CASE("philox: bits look uniform (per-bit frequency, 5 sigma)") {
  const int n = 1 << 16;
  std::vector<int> ones(32, 0);
  for (int i = 0; i < n; ++i) {
    const uint32_t r = random_bits(42, 1, uint64_t(i));
    for (int b = 0; b < 32; ++b) ones[size_t(b)] += (r >> b) & 1u;
  }
  const double sigma = std::sqrt(n * 0.25);
  for (int b = 0; b < 32; ++b) CHECK(std::fabs(ones[size_t(b)] - n / 2.0) <= 5 * sigma);
  // Different streams and seeds give different words.
  CHECK(random_bits(42, 1, 0) != random_bits(42, 2, 0));
  CHECK(random_bits(42, 1, 0) != random_bits(43, 1, 0));
}

TEST_CASE("philox: philox_groups (vectorised where the CPU allows) equals the scalar rounds") {
  // Every count 0..40 (the 8-group vector body, the scalar tail, both), at
  // bases where the group's low word carries into its high word and where the
  // 64-bit group index wraps, under several keys and streams.
  MESSAGE("philox_groups path on this CPU: " << std::string(philox_groups_path()));
  std::vector<uint32_t> got(4 * 40), want(4 * 40);
  const uint64_t bases[] = {
      0, 1, 0xFFFFFFFFull - 12, 0xFFFFFFFFull, 0x1FFFFFFF7ull, 0x123456789ull, 0xFFFFFFFFFFFFFFFFull - 5};
  const uint64_t keys[][2] = {{0, 0}, {0x0123456789ABCDEFull, 0xFEDCBA9876543210ull}, {~0ull, ~0ull}};
  for (const auto& k : keys)
    for (uint64_t g0 : bases)
      for (uint64_t n = 0; n <= 40; ++n) {
        std::fill(got.begin(), got.end(), 0xDEADBEEFu);
        philox_groups(k[0], k[1], g0, n, got.data());
        philox_groups_scalar(k[0], k[1], g0, n, want.data());
        REQUIRE(std::equal(got.begin(), got.begin() + std::ptrdiff_t(4 * n), want.begin()));
        if (n < 40) REQUIRE(got[size_t(4 * n)] == 0xDEADBEEFu);  // nothing written past 4n words
      }
}

TEST_CASE("philox: philox_groups and random_words equal philox_group / random_bits") {
  std::vector<uint32_t> out(4 * 37), words(1000), scratch(4 * (1000 / 4 + 2));
  for (uint64_t g0 : {uint64_t(0), uint64_t(5), uint64_t(0xFFFFFFFFull - 3), uint64_t(0x123456789ull)}) {
    philox_groups(0x0123456789ABCDEFull, 0xFEDCBA9876543210ull, g0, 37, out.data());
    for (uint64_t g = 0; g < 37; ++g) {
      const Philox4 p = philox_group(0x0123456789ABCDEFull, 0xFEDCBA9876543210ull, g0 + g);
      for (int k = 0; k < 4; ++k) REQUIRE(out[size_t(4 * g + k)] == p.v[k]);
    }
  }
  for (uint64_t first : {uint64_t(0), uint64_t(1), uint64_t(2), uint64_t(3), uint64_t(4099)})
    for (uint64_t n : {uint64_t(1), uint64_t(3), uint64_t(999)}) {
      random_words(7, 9, first, n, words.data(), scratch.data());
      for (uint64_t i = 0; i < n; ++i) REQUIRE(words[size_t(i)] == random_bits(7, 9, first + i));
    }
}

TEST_CASE("philox: dropout_threshold = floor(p * 2^32), clamped") {
  CHECK(dropout_threshold(0.0f) == 0u);
  CHECK(dropout_threshold(-0.5f) == 0u);
  CHECK(dropout_threshold(0.5f) == 0x80000000u);
  CHECK(dropout_threshold(0.25f) == 0x40000000u);
  // 0.2f = 13421773 * 2^-26: times 2^32 = 858993472 exactly.
  CHECK(dropout_threshold(0.2f) == 858993472u);
  CHECK(dropout_threshold(1.0f) == 0xFFFFFFFFu);
  CHECK(dropout_threshold(2.0f) == 0xFFFFFFFFu);
  // The largest float below 1: 1 - 2^-24, times 2^32 = 2^32 - 2^8.
  CHECK(dropout_threshold(0x1.fffffep-1f) == 0xFFFFFF00u);
  static_assert(dropout_threshold(0.5f) == 0x80000000u);
}
