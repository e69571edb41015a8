// Grouped quantization (sim/grouped.hpp) against independent constructions:
// each group's rows copied into a fresh contiguous buffer and quantized alone
// with quantize(); the grouped swizzled scale layout against sim's dense
// swizzle_scales() per group and against the tile formula of sim/packing.hpp
// written out here.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "sim/grouped.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

std::vector<float> randn(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}

int64_t sum_of(const std::vector<int64_t>& s) {
  int64_t t = 0;
  for (int64_t n : s) t += n;
  return t;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Bit-exact, except that any NaN equals any NaN.
bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b); }

// Bitwise comparison of n floats at a and b; the first difference in `why`.
bool same_floats(const float* a, const float* b, size_t n, std::string& why) {
  for (size_t i = 0; i < n; ++i)
    if (!same_float(a[i], b[i])) {
      why = "index " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
      return false;
    }
  return true;
}

bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n, std::string& why) {
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) {
      why = "byte " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
      return false;
    }
  return true;
}

// The quantizers under test: every canned block layout the grouped GEMMs see,
// SR under both random-bit contracts, and the wgrad operand with RHT (+ SR).
struct NamedSpec {
  std::string name;
  QuantizerSpec q;
};
std::vector<NamedSpec> specs_under_test() {
  std::vector<NamedSpec> s;
  for (const char* n : {"nvfp4", "nvfp4_2d", "nvfp4_col", "mxfp4", "mxfp8_e4m3", "nvfp4_row_scaled", "nvfp4_4over6"})
    s.push_back({n, quantizer_by_name(n)});
  s.push_back({"mx col [32,1]", parse_quantizer(R"({"element":"e2m1","scale":"e8m0","block":[32,1]})")});
  s.push_back({"mxfp8 col [32,1]", parse_quantizer(R"({"element":"e4m3","scale":"e8m0","block":[32,1]})")});
  for (const char* base : {"nvfp4", "nvfp4_col", "mxfp4"})
    for (SrBits b : {SrBits::per_element, SrBits::ptx_x4}) {
      QuantizerSpec q = quantizer_by_name(base);
      q.round = Round::rs;
      q.sr_bits = b;
      s.push_back({std::string(base) + " rs " + sr_bits_name(b), q});
    }
  QuantizerSpec w = quantizer_by_name("nvfp4_col");  // TE's wgrad operand: [16,1] + RHT
  w.rht = true;
  w.rht_seed = 0x5eed;
  s.push_back({"nvfp4_col rht", w});
  w.round = Round::rs;
  s.push_back({"nvfp4_col rht rs", w});
  QuantizerSpec r = quantizer_by_name("nvfp4");
  r.rht = true;
  r.rht_seed = 3;
  s.push_back({"nvfp4 rht", r});
  return s;
}

// The per-group streams, built by hand (group g: {seed, stream0 + g}).
std::vector<RandomStream> hand_streams(uint64_t seed, uint64_t stream0, size_t groups) {
  std::vector<RandomStream> s;
  for (size_t g = 0; g < groups; ++g) s.push_back(RandomStream{seed, stream0 + g, nullptr});
  return s;
}

// Checks `got` group by group against quantize() of a fresh contiguous copy
// of each group's rows. x is [rows, cols] with row stride `stride`.
void check_against_copies(const std::string& label, const QuantizerSpec& q, const std::vector<float>& x,
                          int64_t cols, int64_t stride, const std::vector<int64_t>& sizes,
                          const std::vector<RandomStream>& streams, const GroupedQuantizedTensor& got) {
  INFO(label);
  const int64_t rows = sum_of(sizes);
  const int64_t scale_cols = (cols + q.block_cols - 1) / q.block_cols;
  REQUIRE(got.rows == rows);
  REQUIRE(got.cols == cols);
  REQUIRE(got.group_rows == sizes);
  REQUIRE(got.scale_cols == scale_cols);
  REQUIRE(got.codes.size() == size_t(rows * cols));
  REQUIRE(got.dequant.size() == size_t(rows * cols));
  REQUIRE(got.global_decode.size() == sizes.size());
  REQUIRE(got.scale_row_offset.size() == sizes.size() + 1);
  CHECK(got.scale_row_offset[0] == 0);
  int64_t row = 0, srow = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    INFO("group " << g << " of " << sizes.size() << ", " << sizes[g] << " rows at row " << row);
    const int64_t n = sizes[g];
    const int64_t sr = (n + q.block_rows - 1) / q.block_rows;  // the group's own scale rows
    CHECK(got.scale_row_offset[g] == srow);
    CHECK(got.scale_row_offset[g + 1] == srow + sr);
    if (n == 0) {
      CHECK(bits_of(got.global_decode[g]) == bits_of(1.0f));
      continue;
    }
    std::vector<float> copy(size_t(n * cols));  // a fresh buffer, row by row
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < cols; ++c) copy[size_t(r * cols + c)] = x[size_t((row + r) * stride + c)];
    const RandomStream rs = streams.empty() ? RandomStream{} : streams[g];
    const QuantizedTensor ref = quantize(q, MatrixView<const float>(copy.data(), n, cols), rs);
    REQUIRE(ref.scale_rows == sr);
    REQUIRE(ref.scale_cols == scale_cols);
    std::string why;
    CHECK_MESSAGE(same_bytes(got.codes.data() + row * cols, ref.codes.data(), ref.codes.size(), why), "codes " << why);
    CHECK_MESSAGE(same_floats(got.dequant.data() + row * cols, ref.dequant.data(), ref.dequant.size(), why),
                  "dequant " << why);
    REQUIRE(ref.scales.size() == size_t(sr * scale_cols));
    CHECK_MESSAGE(same_floats(got.scales.data() + srow * scale_cols, ref.scales.data(), ref.scales.size(), why),
                  "scales " << why);
    if (!ref.scale_codes.empty()) {
      REQUIRE(got.scale_codes.size() >= size_t((srow + sr) * scale_cols));
      CHECK_MESSAGE(
          same_bytes(got.scale_codes.data() + srow * scale_cols, ref.scale_codes.data(), ref.scale_codes.size(), why),
          "scale codes " << why);
    }
    CHECK(same_float(got.global_decode[g], ref.global_decode));
    row += n;
    srow += sr;
  }
  CHECK(got.scales.size() == size_t(srow * scale_cols));
  CHECK(got.scale_codes.size() == (q.scale == &float32 ? size_t(0) : size_t(srow * scale_cols)));
}

// x [rows, cols] in a buffer of row stride cols + pad (pad > 0 puts junk, NaN
// included, between the rows: the implementation must honour the stride).
struct Input {
  std::vector<float> buf;
  int64_t stride;
};
Input make_input(int64_t rows, int64_t cols, int64_t pad, uint32_t seed) {
  Input in{std::vector<float>(size_t(rows * (cols + pad)), NAN), cols + pad};
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_real_distribution<float> e(-6.0f, 6.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float sigma = std::exp2(std::round(e(g)));  // rows of very different magnitude
    for (int64_t c = 0; c < cols; ++c) in.buf[size_t(r * in.stride + c)] = d(g) * sigma;
  }
  return in;
}

GroupedQuantizedTensor run_grouped(const QuantizerSpec& q, const Input& in, int64_t cols,
                                   const std::vector<int64_t>& sizes, const std::vector<RandomStream>& streams) {
  return quantize_grouped(q, MatrixView<const float>(in.buf.data(), sum_of(sizes), cols, in.stride), sizes, streams);
}

}  // namespace

TEST_CASE("grouped: each group equals quantize() of a copy of its rows, every canned layout, SR and RHT") {
  const std::vector<std::vector<int64_t>> size_lists = {
      {0, 1, 17, 0, 130, 5},          // empty first and in the middle, 1 row, not multiples of 16 / 128
      {0, 0, 3, 16, 0, 0, 0, 33, 1},  // several consecutive empties
      {1, 1, 1, 1},                   // 1-row groups
      {40, 0, 0},                     // empties at the end
      {0, 0, 40},
      {31},                           // one group = the whole tensor
  };
  for (const NamedSpec& s : specs_under_test())
    for (const int64_t cols : {int64_t(70), int64_t(48)})
      for (size_t k = 0; k < size_lists.size(); ++k) {
        const std::vector<int64_t>& sizes = size_lists[k];
        const int64_t rows = sum_of(sizes);
        const Input in = make_input(rows, cols, k % 2 ? 3 : 0, uint32_t(100 + k));
        const std::vector<RandomStream> streams = hand_streams(11 + k, 1000 * k, sizes.size());
        const std::string label = s.name + ", cols " + std::to_string(cols) + ", size list " + std::to_string(k);
        check_against_copies(label, s.q, in.buf, cols, in.stride, sizes, streams,
                             run_grouped(s.q, in, cols, sizes, streams));
        // No streams: every group draws from RandomStream{}.
        if (s.q.round == Round::rs)
          check_against_copies(label + " (no streams)", s.q, in.buf, cols, in.stride, sizes, {},
                               run_grouped(s.q, in, cols, sizes, {}));
      }
}

TEST_CASE("grouped: one group equal to the whole tensor is plain quantize()") {
  for (const NamedSpec& s : specs_under_test()) {
    INFO(s.name);
    const int64_t rows = 45, cols = 37;
    const std::vector<float> x = randn(rows * cols, 9, 3.0f);
    const RandomStream rs{5, 77, nullptr};
    const QuantizedTensor plain = quantize(s.q, MatrixView<const float>(x.data(), rows, cols), rs);
    const std::vector<int64_t> sizes{rows};
    const std::vector<RandomStream> streams{rs};
    const GroupedQuantizedTensor g = quantize_grouped(s.q, MatrixView<const float>(x.data(), rows, cols), sizes, streams);
    std::string why;
    CHECK(g.codes == plain.codes);
    CHECK(g.scale_codes == plain.scale_codes);
    CHECK_MESSAGE(same_floats(g.scales.data(), plain.scales.data(), plain.scales.size(), why), why);
    CHECK(g.scales.size() == plain.scales.size());
    CHECK_MESSAGE(same_floats(g.dequant.data(), plain.dequant.data(), plain.dequant.size(), why), why);
    REQUIRE(g.global_decode.size() == 1);
    CHECK(same_float(g.global_decode[0], plain.global_decode));
    CHECK(g.scale_row_offset == std::vector<int64_t>{0, plain.scale_rows});
    CHECK(g.scale_cols == plain.scale_cols);
  }
}

TEST_CASE("grouped: zero rows (no groups, or only empty groups)") {
  const QuantizerSpec q = quantizer_by_name("nvfp4");
  for (const std::vector<int64_t>& sizes : {std::vector<int64_t>{}, std::vector<int64_t>{0}, std::vector<int64_t>{0, 0, 0}}) {
    INFO(sizes.size() << " groups");
    const GroupedQuantizedTensor g = quantize_grouped(q, MatrixView<const float>(nullptr, 0, 32), sizes);
    CHECK(g.rows == 0);
    CHECK(g.cols == 32);
    CHECK(g.codes.empty());
    CHECK(g.dequant.empty());
    CHECK(g.scales.empty());
    CHECK(g.scale_codes.empty());
    CHECK(g.scale_cols == 2);
    CHECK(g.global_decode == std::vector<float>(sizes.size(), 1.0f));
    CHECK(g.scale_row_offset == std::vector<int64_t>(sizes.size() + 1, 0));
    CHECK(swizzle_scales_grouped(nullptr, sizes, 2).empty());
    CHECK(swizzled_group_offsets(sizes, 2) == std::vector<int64_t>(sizes.size() + 1, 0));
  }
}

TEST_CASE("grouped: NaN in one group under nvfp4 poisons that group only") {
  const QuantizerSpec q = quantizer_by_name("nvfp4");
  const std::vector<int64_t> sizes{5, 0, 7, 4};
  const int64_t cols = 32;
  std::vector<float> x = randn(16 * cols, 4);
  x[size_t(6 * cols + 3)] = NAN;  // group 2
  const GroupedQuantizedTensor g = quantize_grouped(q, MatrixView<const float>(x.data(), 16, cols), sizes);
  check_against_copies("nan", q, x, cols, cols, sizes, {}, g);
  for (int64_t i = 0; i < 16 * cols; ++i) {
    const bool in_group2 = i >= 5 * cols && i < 12 * cols;
    CHECK(std::isnan(g.dequant[size_t(i)]) == in_group2);
  }
}

TEST_CASE("grouped: the global scale is the group's own (nvfp4: scaling one group by 2^k)") {
  const QuantizerSpec q = quantizer_by_name("nvfp4");
  const std::vector<int64_t> sizes{20, 30, 0, 25};
  const int64_t rows = 75, cols = 48, lo = 20, hi = 50;  // group 1 is rows [20, 50)
  const std::vector<float> x = randn(rows * cols, 21);
  const GroupedQuantizedTensor a = quantize_grouped(q, MatrixView<const float>(x.data(), rows, cols), sizes);
  for (const int k : {5, -4, 1}) {
    INFO("k = " << k);
    std::vector<float> y = x;
    for (int64_t i = lo * cols; i < hi * cols; ++i) y[size_t(i)] = std::ldexp(y[size_t(i)], k);
    const GroupedQuantizedTensor b = quantize_grouped(q, MatrixView<const float>(y.data(), rows, cols), sizes);
    // Other groups: nothing changes.
    for (int64_t i = 0; i < rows * cols; ++i) {
      if (i >= lo * cols && i < hi * cols) continue;
      CHECK(a.codes[size_t(i)] == b.codes[size_t(i)]);
      CHECK(bits_of(a.dequant[size_t(i)]) == bits_of(b.dequant[size_t(i)]));
    }
    const int64_t sc = a.scale_cols;
    for (size_t g : {size_t(0), size_t(3)})
      for (int64_t i = a.scale_row_offset[g] * sc; i < a.scale_row_offset[g + 1] * sc; ++i)
        CHECK(a.scale_codes[size_t(i)] == b.scale_codes[size_t(i)]);
    CHECK(bits_of(a.global_decode[0]) == bits_of(b.global_decode[0]));
    CHECK(bits_of(a.global_decode[3]) == bits_of(b.global_decode[3]));
    // Group 1: the same element and block-scale codes; only its global scale moves, by exactly 2^k.
    for (int64_t i = lo * cols; i < hi * cols; ++i) {
      CHECK(a.codes[size_t(i)] == b.codes[size_t(i)]);
      CHECK(bits_of(std::ldexp(a.dequant[size_t(i)], k)) == bits_of(b.dequant[size_t(i)]));
    }
    for (int64_t i = a.scale_row_offset[1] * sc; i < a.scale_row_offset[2] * sc; ++i)
      CHECK(a.scale_codes[size_t(i)] == b.scale_codes[size_t(i)]);
    CHECK(bits_of(std::ldexp(a.global_decode[1], k)) == bits_of(b.global_decode[1]));
  }
  // Contrast: with one tensor-wide global scale, the 2^5 on group 1 does move the other rows' codes.
  std::vector<float> y = x;
  for (int64_t i = lo * cols; i < hi * cols; ++i) y[size_t(i)] = std::ldexp(y[size_t(i)], 5);
  const QuantizedTensor pa = quantize(q, MatrixView<const float>(x.data(), rows, cols));
  const QuantizedTensor pb = quantize(q, MatrixView<const float>(y.data(), rows, cols));
  bool other_rows_moved = false;
  for (int64_t i = 0; i < lo * cols; ++i) other_rows_moved = other_rows_moved || pa.codes[size_t(i)] != pb.codes[size_t(i)];
  for (int64_t r = 0; r < lo; ++r)
    for (int64_t c = 0; c < pa.scale_cols; ++c)
      other_rows_moved = other_rows_moved || pa.scale_codes[size_t(r * pa.scale_cols + c)] !=
                                                 pb.scale_codes[size_t(r * pa.scale_cols + c)];
  CHECK(other_rows_moved);
}

TEST_CASE("grouped: random sizes, shapes, strides, data and specs (property, fixed seeds)") {
  const std::vector<NamedSpec> specs = specs_under_test();
  std::mt19937 g(20240607);
  for (int trial = 0; trial < 300; ++trial) {
    const NamedSpec& s = specs[g() % specs.size()];
    const size_t groups = g() % 8;  // 0 groups included
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < groups; ++i) sizes.push_back(g() % 3 == 0 ? 0 : int64_t(g() % 50));
    const int64_t cols = 1 + int64_t(g() % 80), pad = g() % 2 ? int64_t(g() % 5) : 0;
    const Input in = make_input(sum_of(sizes), cols, pad, g());
    const std::vector<RandomStream> streams = hand_streams(g(), g(), sizes.size());
    const std::string label = "trial " + std::to_string(trial) + ": " + s.name + ", " + std::to_string(groups) +
                              " groups, cols " + std::to_string(cols) + ", pad " + std::to_string(pad);
    check_against_copies(label, s.q, in.buf, cols, in.stride, sizes, streams,
                         run_grouped(s.q, in, cols, sizes, streams));
  }
}

TEST_CASE("grouped: consecutive_streams is {seed, stream + g}") {
  const std::vector<RandomStream> s = consecutive_streams(42, 7, 4);
  REQUIRE(s.size() == 4);
  for (size_t g = 0; g < 4; ++g) {
    CHECK(s[g].seed == 42);
    CHECK(s[g].stream == 7 + g);
    CHECK(s[g].words == nullptr);
  }
  CHECK(consecutive_streams(1, 2, 0).empty());
}

TEST_CASE("grouped: SR words given per group (rs.words) come from the group's own stream") {
  QuantizerSpec q = quantizer_by_name("nvfp4");
  q.round = Round::rs;
  q.sr_bits = SrBits::ptx_x4;
  const std::vector<int64_t> sizes{3, 0, 5};
  const int64_t cols = 20, per_row = 5;  // ceil(20 / 4) words a row under ptx_x4
  const std::vector<float> x = randn(8 * cols, 8);
  std::mt19937 g(3);
  std::vector<uint32_t> words(size_t(8 * per_row));
  for (auto& w : words) w = g();
  const std::vector<RandomStream> streams{{0, 0, words.data()}, {0, 0, nullptr}, {0, 0, words.data() + 3 * per_row}};
  check_against_copies("words", q, x, cols, cols, sizes, streams,
                       quantize_grouped(q, MatrixView<const float>(x.data(), 8, cols), sizes, streams));
}

TEST_CASE("grouped: a 3-D expert weight [E, N, K] as E groups of N rows (nvfp4_2d) = each expert alone") {
  const int64_t E = 4, N = 24, K = 64;  // N not a multiple of 16: each expert ends in a partial tile
  for (const char* name : {"nvfp4_2d", "nvfp4", "mxfp4"}) {
    INFO(name);
    const QuantizerSpec q = quantizer_by_name(name);
    // The experts first, each its own buffer (different magnitudes), then stacked.
    std::vector<std::vector<float>> experts;
    for (int64_t e = 0; e < E; ++e) experts.push_back(randn(N * K, uint32_t(50 + e), std::exp2(float(3 * e - 4))));
    std::vector<float> w;
    for (const auto& ex : experts) w.insert(w.end(), ex.begin(), ex.end());
    const std::vector<int64_t> sizes(size_t(E), N);
    const GroupedQuantizedTensor g = quantize_grouped(q, MatrixView<const float>(w.data(), E * N, K), sizes);
    const int64_t tr = (N + q.block_rows - 1) / q.block_rows, tc = (K + q.block_cols - 1) / q.block_cols;
    REQUIRE(g.scale_codes.size() == size_t(E * tr * tc));
    for (int64_t e = 0; e < E; ++e) {
      INFO("expert " << e);
      const QuantizedTensor ref = quantize(q, MatrixView<const float>(experts[size_t(e)].data(), N, K));
      CHECK(std::vector<uint8_t>(g.codes.begin() + e * N * K, g.codes.begin() + (e + 1) * N * K) == ref.codes);
      CHECK(std::vector<uint8_t>(g.scale_codes.begin() + e * tr * tc, g.scale_codes.begin() + (e + 1) * tr * tc) ==
            ref.scale_codes);
      std::string why;
      CHECK_MESSAGE(same_floats(g.dequant.data() + e * N * K, ref.dequant.data(), size_t(N * K), why), why);
      CHECK(bits_of(g.global_decode[size_t(e)]) == bits_of(ref.global_decode));
      CHECK(g.scale_row_offset[size_t(e)] == e * tr);
    }
  }
}

TEST_CASE("grouped: check_group_sizes and the other errors name the fault") {
  auto message = [](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  auto has = [](const std::string& m, const char* s) {
    INFO(m);
    CHECK(m.find(s) != std::string::npos);
  };
  CHECK_NOTHROW(check_group_sizes("x", std::vector<int64_t>{0, 3, 0, 2}, 5));
  CHECK_NOTHROW(check_group_sizes("x", std::vector<int64_t>{}, 0));
  std::string m = message([] { check_group_sizes("sizes.npy", std::vector<int64_t>{3, -2, 4}, 5); });
  has(m, "sizes.npy");
  has(m, "group 1 has -2 rows");
  has(m, ">= 0");
  m = message([] { check_group_sizes("sizes.npy", std::vector<int64_t>{3, 0, 4}, 6); });
  has(m, "sizes.npy");
  has(m, "sum to 7");
  has(m, "6 rows");
  m = message([] { check_group_sizes("sizes.npy", std::vector<int64_t>{}, 6); });
  has(m, "sum to 0");
  // A sum that wraps past 2^63 - 1 (and here would wrap back onto the row count) is caught.
  m = message([] { check_group_sizes("sizes.npy", std::vector<int64_t>{INT64_MAX, INT64_MAX, 3}, 1); });
  has(m, "sizes.npy");
  has(m, "2^63 - 1");

  const QuantizerSpec q = quantizer_by_name("nvfp4");
  const std::vector<float> x(6 * 16, 1.0f);
  const MatrixView<const float> xv(x.data(), 6, 16);
  const std::vector<int64_t> sizes{2, 0, 4};
  m = message([&] { quantize_grouped(q, xv, sizes, consecutive_streams(1, 0, 2)); });
  has(m, "2 random streams for 3 groups");
  m = message([&] { quantize_grouped(q, xv, std::vector<int64_t>{2, 5}); });
  has(m, "sum to 7");
  m = message([&] { quantize_grouped(q, xv, std::vector<int64_t>{7, -1}); });
  has(m, "group 1 has -1 rows");
  m = message([&] { quantize_grouped(quantizer_by_name("fp8_e4m3_tensor"), xv, sizes); });
  has(m, "per-tensor");
  m = message([] { swizzle_scales_grouped(nullptr, std::vector<int64_t>{1, -1}, 4); });
  has(m, "group 1 has -1");
}

TEST_CASE("grouped swizzle: per group sim's dense swizzle, concatenated; offsets, padding, hand example") {
  // Group sizes (scale rows) {0, 130, 1, 0, 128, 3}, C = 6 scale columns (padded to 8):
  // padded group sizes 0, 256*8 = 2048, 128*8 = 1024, 0, 128*8 = 1024, 128*8 = 1024.
  const std::vector<int64_t> sizes{0, 130, 1, 0, 128, 3};
  const int64_t C = 6, R = sum_of(sizes);
  CHECK(swizzled_group_offsets(sizes, C) == std::vector<int64_t>{0, 0, 2048, 3072, 3072, 4096, 5120});
  std::mt19937 g(77);
  std::vector<uint8_t> sc(size_t(R * C));
  for (auto& b : sc) b = uint8_t(1 + g() % 255);  // never 0: any 0 in the output is padding
  const std::vector<uint8_t> got = swizzle_scales_grouped(sc.data(), sizes, C);
  REQUIRE(got.size() == 5120);

  // 1. sim's dense swizzle of each group's rows alone, concatenated (an empty group: zero bytes).
  std::vector<uint8_t> want;
  int64_t row = 0;
  for (int64_t n : sizes) {
    if (n > 0) {
      const std::vector<uint8_t> one = swizzle_scales(sc.data() + row * C, n, C);
      want.insert(want.end(), one.begin(), one.end());
    }
    row += n;
  }
  CHECK(got == want);

  // 2. The tile formula of sim/packing.hpp written out: every scale at its place, every other byte 0.
  const int64_t off[] = {0, 0, 2048, 3072, 3072, 4096, 5120};
  std::vector<int> placed(got.size(), 0);
  row = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int64_t i = 0; i < sizes[k]; ++i)
      for (int64_t j = 0; j < C; ++j) {
        const int64_t at = off[k] + ((i / 128) * (8 / 4) + j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + j % 4;
        REQUIRE(at < off[k + 1]);
        ++placed[size_t(at)];
        CHECK(got[size_t(at)] == sc[size_t((row + i) * C + j)]);
      }
    row += sizes[k];
  }
  int64_t padding = 0;
  for (size_t b = 0; b < got.size(); ++b) {
    CHECK(placed[b] <= 1);
    if (placed[b] == 0) {
      ++padding;
      CHECK(got[b] == 0);
    }
  }
  CHECK(padding == 5120 - R * C);

  // 3. By hand: group 4 (offset 3072) scale (i = 37, j = 5), i.e. scale row 130 + 1 + 37 = 168 of the stack,
  //    lies in tile (37/128 = 0, 5/4 = 1) = tile 0 * 2 + 1 = 1 -> 512 bytes; inside the tile
  //    (37 % 32 = 5) * 16 + (37 / 32 = 1) * 4 + (5 % 4 = 1) = 80 + 4 + 1 = 85: byte 3072 + 512 + 85 = 3669.
  CHECK(got[3669] == sc[size_t(168 * C + 5)]);
  //    Group 1's scale (i = 129, j = 0): tile (1, 0) -> (1 * 2 + 0) * 512 = 1024, + (129 % 32 = 1) * 16 = 16 -> 1040.
  CHECK(got[1040] == sc[size_t(129 * C + 0)]);
  //    Group 2 (one row, offset 2048): row 0 of its own padded block, scale (0, 3) at 2048 + 3 = 2051.
  CHECK(got[2051] == sc[size_t(130 * C + 3)]);
}

TEST_CASE("grouped swizzle of an nvfp4 grouped quantization = dense swizzle of each group's own quantize()") {
  const QuantizerSpec q = quantizer_by_name("nvfp4");
  const std::vector<int64_t> sizes{0, 3, 17, 0, 12, 130};
  const int64_t rows = sum_of(sizes), cols = 80;  // 5 scale columns, padded to 8
  const std::vector<float> x = randn(rows * cols, 12);
  const GroupedQuantizedTensor g = quantize_grouped(q, MatrixView<const float>(x.data(), rows, cols), sizes);
  const std::vector<uint8_t> got = swizzle_scales_grouped(g.scale_codes.data(), sizes, g.scale_cols);
  std::vector<uint8_t> want;
  int64_t row = 0;
  for (int64_t n : sizes) {
    if (n > 0) {
      std::vector<float> copy(x.begin() + row * cols, x.begin() + (row + n) * cols);
      const QuantizedTensor t = quantize(q, MatrixView<const float>(copy.data(), n, cols));
      const std::vector<uint8_t> one = swizzle_scales(t.scale_codes.data(), n, t.scale_cols);
      want.insert(want.end(), one.begin(), one.end());
    }
    row += n;
  }
  CHECK(got == want);
  CHECK(int64_t(got.size()) == (128 + 128 + 128 + 256) * 8);
}
