// Block quantizer (sim/quantizer.hpp): JSON, hand-worked blocks, edge cases,
// partial blocks, SR unbiasedness and thread-count independence.
#include <doctest/doctest.h>
#include <omp.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "core/philox.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {
MatrixView<const float> view(const std::vector<float>& v, int64_t r, int64_t c) { return {v.data(), r, c}; }
QuantizerSpec spec_json(const char* s) { return parse_quantizer(s); }
std::vector<float> randn(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(g);
  return v;
}
}  // namespace

TEST_CASE("canned quantizers, JSON round trip, errors name the key") {
  for (const std::string& n : quantizer_names()) {
    QuantizerSpec q = quantizer_by_name(n);
    CHECK(quantizer_from_json(quantizer_to_json(q), n) == q);
    CHECK(parse_quantizer(quantizer_to_json(q).dump()) == q);
  }
  QuantizerSpec nv = quantizer_by_name("nvfp4");
  CHECK(nv.element == &float4_e2m1fn);
  CHECK(nv.scale == &ufloat8_e4m3);
  CHECK(nv.block_cols == 16);
  CHECK(nv.global_scale == GlobalScale::tensor_amax);
  CHECK(describe(nv) == "e2m1 [1,16] ue4m3 nv rn sat global");
  CHECK(describe(quantizer_by_name("mxfp8_e4m3")) == "e4m3 [1,32] e8m0 ocp rn sat");
  // A JSON object: missing keys take the defaults (mxfp4's).
  QuantizerSpec j = spec_json(R"({"element": "e4m3", "scale_rule": "ceil"})");
  CHECK(j.element == &float8_e4m3fn);
  CHECK(j.scale_rule == ScaleRule::ceil);
  CHECK(j.block_cols == 32);
  // Unknown key: the message names the path and the valid keys.
  try {
    quantizer_from_json(nlohmann::json::parse(R"({"elemnt": "e2m1"})"), "recipe.fwd_x");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("recipe.fwd_x.elemnt") != std::string::npos);
    CHECK(std::string(e.what()).find("element, scale, block") != std::string::npos);
  }
  CHECK_THROWS_AS(spec_json(R"({"scale": "ue4m3"})"), Error);               // ocp needs e8m0
  CHECK_THROWS_AS(spec_json(R"({"rht": true})"), Error);                    // rht needs [1,16]/[16,1]
  CHECK_THROWS_AS(spec_json(R"({"block": [0, 16]})"), Error);               // both or neither 0
  CHECK_THROWS_AS(spec_json(R"({"global_scale": "tensor_amax"})"), Error);  // only with nv
  CHECK_THROWS_AS(spec_json(R"({"element": "e8m0"})"), Error);              // not an element
  CHECK_THROWS_AS(parse_quantizer("mxfp5"), Error);
}

TEST_CASE("mxfp4 (ocp) hand-worked block") {
  // One block of 32: amax 5 -> floor(log2 5) = 2, e = 2 - 2 = 0, scale 1.
  // Elements: 5 -> between 4 and 6, tie -> even mantissa: 4 (code 6);  2.6 -> 3 (code 5);
  // -0.3 -> 0.5 (code 0x9; 0.3 is nearer 0.5 than 0); 0.25 -> tie between 0 and 0.5 -> 0 (even).
  std::vector<float> x(32, 0.0f);
  x[0] = 5.0f;
  x[1] = 2.6f;
  x[2] = -0.3f;
  x[3] = 0.25f;
  QuantizedTensor q = quantize(quantizer_by_name("mxfp4"), view(x, 1, 32));
  REQUIRE(q.scale_codes.size() == 1);
  CHECK(q.scale_codes[0] == 127);
  CHECK(q.scales[0] == 1.0f);
  CHECK(q.codes[0] == 0x6);
  CHECK(q.codes[1] == 0x5);
  CHECK(q.codes[2] == 0x9);
  CHECK(q.codes[3] == 0x0);
  CHECK(q.dequant[0] == 4.0f);
  CHECK(q.dequant[1] == 3.0f);
  CHECK(q.dequant[2] == -0.5f);
  // Scale 2^-3: amax 0.7 -> floor(log2 .7) = -1, e = -3. 0.7 * 8 = 5.6 -> 6 (code 7), dequant 0.75.
  std::vector<float> y(32, 0.0f);
  y[5] = -0.7f;
  QuantizedTensor r = quantize(quantizer_by_name("mxfp4"), view(y, 1, 32));
  CHECK(r.scale_codes[0] == 124);
  CHECK(r.codes[5] == 0xF);
  CHECK(r.dequant[5] == -0.75f);
}

TEST_CASE("MX edge cases: zero block, power of two, just under the next, E8M0 ends, NaN/Inf") {
  const QuantizerSpec ocp = quantizer_by_name("mxfp4");
  QuantizerSpec ceil = ocp;
  ceil.scale_rule = ScaleRule::ceil;
  std::vector<float> x(5 * 32, 0.5f);
  // block 0: all zero
  for (int i = 0; i < 32; ++i) x[size_t(i)] = 0.0f;
  // block 1: amax 4 = 2^2 exactly
  x[32] = 4.0f;
  // block 2: amax just under 8
  x[64] = std::nextafter(8.0f, 0.0f);
  // block 3: a NaN
  x[96 + 7] = NAN;
  // block 4: an Inf
  x[128 + 3] = -INFINITY;
  QuantizedTensor q = quantize(ocp, view(x, 1, 160));
  QuantizedTensor c = quantize(ceil, view(x, 1, 160));
  // zero block: scale code 0 (2^-127), all codes 0, dequant 0.
  CHECK(q.scale_codes[0] == 0);
  for (int i = 0; i < 32; ++i) CHECK(q.dequant[size_t(i)] == 0.0f);
  // 4 -> e = 0, exact; 0.5 exact too.
  CHECK(q.scale_codes[1] == 127);
  CHECK(q.dequant[32] == 4.0f);
  CHECK(q.dequant[33] == 0.5f);
  // 8^-: ocp e = 0 -> 7.9999995 clamps to 6 (truncation);  ceil e = 1 -> 3.99999 -> 4 -> 8.
  CHECK(q.scale_codes[2] == 127);
  CHECK(q.dequant[64] == 6.0f);
  CHECK(c.scale_codes[2] == 128);
  CHECK(c.dequant[64] == 8.0f);
  // NaN / Inf blocks: scale 0xFF, every element of the block dequantizes to NaN; others are fine.
  CHECK(q.scale_codes[3] == 0xFF);
  CHECK(q.scale_codes[4] == 0xFF);
  for (int i = 96; i < 160; ++i) CHECK(std::isnan(q.dequant[size_t(i)]));
  CHECK(std::isnan(q.scales[3]));
  // The statistics never claim exactness over NaN outputs (std::max dropped NaN).
  CHECK(std::isnan(quant_stats(q, view(x, 1, 160)).max_abs_error));
  // E8M0 bottom: a block of 2^-140 -> e clamped to -127, x * 2^127 = 2^-13 -> flushed; one underflow.
  std::vector<float> t(32, 0x1p-140f);
  QuantizedTensor u = quantize(ocp, view(t, 1, 32));
  CHECK(u.scale_codes[0] == 0);
  CHECK(u.dequant[0] == 0.0f);
  QuantStats us = quant_stats(u, view(t, 1, 32));
  CHECK(us.scale_underflows == 1);
  CHECK(us.flushed_to_zero == 1.0);
  // E8M0 top: FLT_MAX -> e = 125 (e2m1), FLT_MAX * 2^-125 = 7.99.. -> 6 -> 6 * 2^125.
  std::vector<float> m(32, FLT_MAX);
  QuantizedTensor mq = quantize(ocp, view(m, 1, 32));
  CHECK(mq.scale_codes[0] == 252);
  CHECK(mq.dequant[0] == 6.0f * 0x1p125f);
  QuantStats ms = quant_stats(mq, view(m, 1, 32));
  CHECK(ms.saturated == 1.0);
}

TEST_CASE("mxint8 and mxfp8 e5m2 quantize through the generic path") {
  // int8: amax 1.5 -> e = 0; 1.5 -> 96/64 (code 96); -0.01 -> round(-0.64) = -1 -> code 0xFF.
  std::vector<float> x(32, 0.0f);
  x[0] = 1.5f;
  x[1] = -0.01f;
  QuantizedTensor q = quantize(quantizer_by_name("mxint8"), view(x, 1, 32));
  CHECK(q.codes[0] == 96);
  CHECK(q.codes[1] == 0xFF);
  CHECK(q.dequant[1] == -1.0f / 64.0f);
  // e5m2 (emax 15): amax 1 -> e = -15; 0.3 * 2^15 = 9830.4 -> e5m2 neighbours 8192, 10240 -> 10240.
  std::vector<float> y(32, 0.0f);
  y[0] = 1.0f;
  y[1] = 0.3f;
  QuantizedTensor r = quantize(quantizer_by_name("mxfp8_e5m2"), view(y, 1, 32));
  CHECK(r.scale_codes[0] == 127 - 15);
  CHECK(r.dequant[1] == 10240.0f * 0x1p-15f);
}

TEST_CASE("nvfp4 hand-worked: two blocks, global scale 0.5") {
  // Tensor amax 5376 -> g_enc = 0.5, g_dec = 2 (see test_scale_rules).
  // Block 0 (amax 5376): s = 448; element unit = 448 * 2 = 896:
  //   5376/896 = 6 -> code 7;  -1000/896 = -1.116 -> -1 (0xA) -> -896;
  //   2000/896 = 2.23 -> 2 (4) -> 1792;  2500/896 = 2.79 -> 3 (5) -> 2688;  100/896 = 0.11 -> 0.
  // Block 1 (amax 10): s = 0.8125 (0x35); unit 1.625: 10 -> 6.15 -> 6 (7) -> 9.75;
  //   -3 -> -1.846 -> -2 (0xC) -> -3.25.
  std::vector<float> x(32, 0.0f);
  x[0] = 5376.0f;
  x[1] = -1000.0f;
  x[2] = 2000.0f;
  x[3] = 2500.0f;
  x[4] = 100.0f;
  x[16] = 10.0f;
  x[17] = -3.0f;
  QuantizedTensor q = quantize(quantizer_by_name("nvfp4"), view(x, 1, 32));
  CHECK(q.global_decode == 2.0f);
  REQUIRE(q.scale_codes.size() == 2);
  CHECK(q.scale_codes[0] == 0x7E);
  CHECK(q.scale_codes[1] == 0x35);
  CHECK(q.codes[0] == 0x7);
  CHECK(q.codes[1] == 0xA);
  CHECK(q.codes[2] == 0x4);
  CHECK(q.codes[3] == 0x5);
  CHECK(q.codes[4] == 0x0);
  CHECK(q.codes[16] == 0x7);
  CHECK(q.codes[17] == 0xC);
  CHECK(q.dequant[0] == 5376.0f);
  CHECK(q.dequant[1] == -896.0f);
  CHECK(q.dequant[2] == 1792.0f);
  CHECK(q.dequant[3] == 2688.0f);
  CHECK(q.dequant[4] == 0.0f);
  CHECK(q.dequant[16] == 9.75f);
  CHECK(q.dequant[17] == -3.25f);
}

TEST_CASE("NVFP4 underflow: tiny tensor survives with the global scale, collapses without (fp4-trainkit)") {
  std::vector<float> x = randn(64 * 64, 7, 1e-6f);  // gradient-like magnitudes
  auto xv = view(x, 64, 64);
  QuantizedTensor with = quantize(quantizer_by_name("nvfp4"), xv);
  QuantStats sw = quant_stats(with, xv);
  CHECK(sw.scale_underflows == 0);
  CHECK(sw.flushed_to_zero < 0.2);
  CHECK(sw.sqnr_db > 15.0);
  QuantizerSpec noglobal = quantizer_by_name("nvfp4");
  noglobal.global_scale = GlobalScale::none;
  noglobal.scale_rule = ScaleRule::nv_noglobal;
  QuantizedTensor without = quantize(noglobal, xv);
  QuantStats so = quant_stats(without, xv);
  CHECK(so.scale_underflows == 64 * 4);  // every block
  CHECK(so.flushed_to_zero == 1.0);      // the whole tensor collapses to zero
  // `nv` without the global scale: s_f = amax/6 rounds to UE4M3 zero as well.
  QuantizerSpec nvnone = quantizer_by_name("nvfp4");
  nvnone.global_scale = GlobalScale::none;
  QuantStats sn = quant_stats(quantize(nvnone, xv), xv);
  CHECK(sn.flushed_to_zero == 1.0);
}

TEST_CASE("NVFP4: all-zero tensor and a single huge outlier") {
  std::vector<float> z(4 * 32, 0.0f);
  QuantizedTensor q = quantize(quantizer_by_name("nvfp4"), view(z, 4, 32));
  CHECK(q.global_decode == 1.0f);  // g_enc = 1 for amax 0
  for (uint8_t c : q.scale_codes) CHECK(c == 0);
  for (float d : q.dequant) CHECK(d == 0.0f);
  QuantStats zs = quant_stats(q, view(z, 4, 32));
  CHECK(zs.scale_underflows == 0);
  CHECK(std::isinf(zs.sqnr_db));
  // One outlier 1e30, the rest ~N(0,1): g_enc = 2688/1e30; every other block's
  // s_f = amax * 2.7e-27 / 6 underflows UE4M3 -> those blocks flush to zero.
  std::vector<float> x = randn(4 * 32, 3);
  x[5] = 1e30f;
  QuantizedTensor o = quantize(quantizer_by_name("nvfp4"), view(x, 4, 32));
  QuantStats os = quant_stats(o, view(x, 4, 32));
  CHECK(os.scale_underflows == 7);
  CHECK(o.scale_codes[0] == 0x7E);
  CHECK(std::fabs(o.dequant[5] - 1e30f) < 1e30f * 1e-6f);
  for (int i = 16; i < 128; ++i) CHECK(o.dequant[size_t(i)] == 0.0f);
  // MX scales are per block: the outlier only costs its own block.
  QuantStats ms = quant_stats(quantize(quantizer_by_name("mxfp4"), view(x, 4, 32)), view(x, 4, 32));
  CHECK(ms.scale_underflows == 0);
}

TEST_CASE("partial edge blocks: amax over valid elements only, no padding in the results") {
  // 3 x 40 with [1,32]: 2 blocks per row, the second has 8 elements.
  std::vector<float> x(3 * 40, 0.1f);
  x[0] = 100.0f;  // row 0 block 0
  x[35] = 0.4f;   // row 0 block 1 (amax 0.4: e = -2 - 2 = -4)
  QuantizedTensor q = quantize(quantizer_by_name("mxfp4"), view(x, 3, 40));
  CHECK(q.scale_rows == 3);
  CHECK(q.scale_cols == 2);
  CHECK(q.codes.size() == 120);
  CHECK(q.dequant.size() == 120);
  CHECK(q.scale_codes[1] == 127 - 4);
  CHECK(q.dequant[35] == 0.375f);  // 0.4 * 16 = 6.4 -> 6 -> 6/16
  // [16,1] on 20 rows: the second block row has 4 rows.
  std::vector<float> y(20 * 3, 1.0f);
  y[17 * 3 + 1] = 3.0f;  // row 17, col 1: in block (1, 1)
  QuantizerSpec col = quantizer_by_name("nvfp4_col");
  QuantizedTensor c = quantize(col, view(y, 20, 3));
  CHECK(c.scale_rows == 2);
  CHECK(c.scale_cols == 3);
  // 2-D tiles on 17 x 17.
  std::vector<float> t = randn(17 * 17, 5);
  QuantizedTensor tq = quantize(quantizer_by_name("nvfp4_2d"), view(t, 17, 17));
  CHECK(tq.scale_rows == 2);
  CHECK(tq.scale_cols == 2);
  // A partial block quantizes exactly as the same values in a tensor of their own.
  std::vector<float> tail = {x[32], x[33], x[34], x[35], x[36], x[37], x[38], x[39]};
  QuantizedTensor alone = quantize(quantizer_by_name("mxfp4"), view(tail, 1, 8));
  for (int i = 0; i < 8; ++i) CHECK(alone.dequant[size_t(i)] == q.dequant[size_t(32 + i)]);
}

TEST_CASE("fake_quantize gives the same bits as quantize().dequant, with strides") {
  std::vector<float> x = randn(33 * 70, 11);
  for (const char* name : {"mxfp4", "mxfp8_e4m3", "mxint8", "nvfp4", "nvfp4_2d", "nvfp4_col", "fp8_e4m3_tensor"}) {
    QuantizedTensor q = quantize(quantizer_by_name(name), view(x, 33, 64 + 6));
    std::vector<float> y = x;
    fake_quantize(quantizer_by_name(name), MatrixView<float>(y.data(), 33, 70));
    for (size_t i = 0; i < y.size(); ++i) REQUIRE(float_bits(y[i]) == float_bits(q.dequant[i]));
  }
  // Strided view: a 10 x 32 window of a 10 x 40 buffer; the rest is untouched.
  std::vector<float> buf = randn(10 * 40, 12);
  std::vector<float> win(10 * 32);
  for (int r = 0; r < 10; ++r)
    for (int c = 0; c < 32; ++c) win[size_t(r * 32 + c)] = buf[size_t(r * 40 + c)];
  QuantizedTensor q = quantize(quantizer_by_name("mxfp4"), view(win, 10, 32));
  std::vector<float> b2 = buf;
  fake_quantize(quantizer_by_name("mxfp4"), MatrixView<float>(b2.data(), 10, 32, 40));
  for (int r = 0; r < 10; ++r) {
    for (int c = 0; c < 32; ++c) CHECK(b2[size_t(r * 40 + c)] == q.dequant[size_t(r * 32 + c)]);
    for (int c = 32; c < 40; ++c) CHECK(b2[size_t(r * 40 + c)] == buf[size_t(r * 40 + c)]);
  }
}

TEST_CASE("every rounding mode: quantize equals core's encode element by element") {
  // With scale 1 (every block's amax = the element's max) the element code must
  // be encode(element, x). 37 columns: a partial block, and rows whose Philox
  // words start mid-group (row r starts at linear index 37 r).
  struct Case {
    const char* name;
    const Format* f;
    float max;
  };
  for (const Case& c : {Case{"mxfp4", &float4_e2m1fn, 6.0f}, Case{"mxfp8_e4m3", &float8_e4m3fn, 448.0f},
                        Case{"mxfp8_e5m2", &float8_e5m2, 57344.0f}}) {
    const int64_t rows = 8, cols = 37;
    std::vector<float> x = randn(size_t(rows * cols), 21, c.max / 3.0f);
    for (auto& v : x) v = std::fmax(-c.max, std::fmin(c.max, v));
    for (int64_t r = 0; r < rows; ++r) x[size_t(r * cols)] = x[size_t(r * cols + 32)] = c.max;
    for (Round rd : {Round::rn, Round::rna, Round::rz, Round::rp, Round::rm, Round::rs}) {
      QuantizerSpec s = quantizer_by_name(c.name);
      s.round = rd;
      QuantizedTensor q = quantize(s, view(x, rows, cols), RandomStream{99, 3});
      for (size_t i = 0; i < x.size(); ++i) {
        const uint32_t rb = rd == Round::rs ? random_bits(99, 3, i) : 0u;
        INFO(c.name, " mode ", int(rd), " index ", i);
        REQUIRE(q.codes[i] == encode(*c.f, x[i], rd, Overflow::saturate, rb));
      }
    }
  }
}

TEST_CASE("SR ptx_x4: element (r, c) rounds with byte c % 4 of word r * ceil(cols / 4) + c / 4, Philox or given") {
  // Scale 1 as above; 37 columns: 10 words a row, the last a partial group of 1.
  struct Case {
    const char* name;
    const Format* f;
    float max;
  };
  for (const Case& c : {Case{"mxfp4", &float4_e2m1fn, 6.0f}, Case{"mxfp6_e2m3", &float6_e2m3fn, 7.5f},
                        Case{"mxfp6_e3m2", &float6_e3m2fn, 28.0f}, Case{"mxfp8_e4m3", &float8_e4m3fn, 448.0f},
                        Case{"mxfp8_e5m2", &float8_e5m2, 57344.0f}}) {
    CAPTURE(c.name);
    const int64_t rows = 8, cols = 37, per_row = 10;
    std::vector<float> x = randn(size_t(rows * cols), 23, c.max / 3.0f);
    for (auto& v : x) v = std::fmax(-c.max, std::fmin(c.max, v));
    for (int64_t r = 0; r < rows; ++r) x[size_t(r * cols)] = x[size_t(r * cols + 32)] = c.max;
    QuantizerSpec s = quantizer_by_name(c.name);
    s.round = Round::rs;
    s.sr_bits = SrBits::ptx_x4;
    const QuantizedTensor q = quantize(s, view(x, rows, cols), RandomStream{99, 3});
    std::vector<uint32_t> words(size_t(rows * per_row));
    for (size_t w = 0; w < words.size(); ++w) words[w] = random_bits(99, 3, w);
    RandomStream given{};
    given.words = words.data();
    const QuantizedTensor qg = quantize(s, view(x, rows, cols), given);
    CHECK(qg.codes == q.codes);
    int64_t differ_from_per_element = 0;
    QuantizerSpec pe = s;
    pe.sr_bits = SrBits::per_element;
    const QuantizedTensor qp = quantize(pe, view(x, rows, cols), RandomStream{99, 3});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = 0; col < cols; ++col) {
        const size_t i = size_t(r * cols + col);
        const uint32_t word = words[size_t(r * per_row + col / 4)];
        const uint32_t byte = (word >> (8 * (col % 4))) & 0xFFu;
        INFO("row ", r, " col ", col);
        REQUIRE(q.codes[i] == encode(*c.f, x[i], Round::rs, Overflow::saturate, byte, 8));
        differ_from_per_element += q.codes[i] != qp.codes[i];
      }
    CHECK(differ_from_per_element > 0);
    // Another word changes the codes: the words are really used.
    words[3] ^= 0x80808080u;
    CHECK(quantize(s, view(x, rows, cols), given).codes != q.codes);
  }
  // ptx_x4 needs a cvt.rs target; JSON round trip of the key.
  QuantizerSpec bad = quantizer_by_name("mxint8");
  bad.sr_bits = SrBits::ptx_x4;
  CHECK_THROWS_WITH_AS(validate(bad, "q"), doctest::Contains("ptx_x4"), Error);
  const QuantizerSpec j = spec_json(R"({"element": "e2m1", "round": "rs", "sr_bits": "ptx_x4"})");
  CHECK(j.sr_bits == SrBits::ptx_x4);
  CHECK(quantizer_from_json(quantizer_to_json(j), "t") == j);
  CHECK_THROWS_WITH_AS(spec_json(R"({"sr_bits": "ptx"})"), doctest::Contains("valid: per_element, ptx_x4"), Error);
}

TEST_CASE("SR: block quantization is unbiased") {
  // Every block: amax 6 (scale 1), other elements 1.3, between 1.0 and 1.5:
  // P(up) = 0.6, E = 1.3; per-element sd = 0.5 * sqrt(0.24) = 0.245.
  const int rows = 512;
  std::vector<float> x(size_t(rows * 32), 1.3f);
  for (int r = 0; r < rows; ++r) x[size_t(r * 32)] = 6.0f;
  QuantizerSpec s = quantizer_by_name("mxfp4");
  s.round = Round::rs;
  QuantizedTensor q = quantize(s, view(x, rows, 32), RandomStream{1234, 0});
  double sum = 0;
  int n = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 1; c < 32; ++c, ++n) sum += q.dequant[size_t(r * 32 + c)];
  const double mean = sum / n, sd_mean = 0.245 / std::sqrt(double(n));
  CHECK(std::fabs(mean - 1.3) < 4 * sd_mean);
  // NVFP4 with SR on random data: E[dq] = x per element, checked on the sum.
  std::vector<float> g = randn(256 * 64, 77);
  QuantizerSpec nv = quantizer_by_name("nvfp4");
  nv.round = Round::rs;
  double bias = 0, scale_sum = 0;
  const int reps = 16;
  for (int rep = 0; rep < reps; ++rep) {
    QuantizedTensor qq = quantize(nv, view(g, 256, 64), RandomStream{5, uint64_t(rep)});
    for (size_t i = 0; i < g.size(); ++i) bias += double(qq.dequant[i]) - g[i];
    scale_sum += 1;
  }
  // Per-element error is at most one quantum (<= 2 * amax_block/6 ~ 1), sd <= 0.5:
  // the mean error over 262144 samples has sd < 0.001.
  CHECK(std::fabs(bias / (double(g.size()) * reps)) < 0.004);
}

TEST_CASE("results do not depend on the OpenMP thread count") {
  std::vector<float> x = randn(97 * 130, 31);
  const int saved = omp_get_max_threads();
  for (const char* name : {"mxfp4", "nvfp4", "nvfp4_2d", "nvfp4_col", "fp8_e4m3_tensor"}) {
    QuantizerSpec s = quantizer_by_name(name);
    s.round = Round::rs;
    omp_set_num_threads(1);
    QuantizedTensor a = quantize(s, view(x, 97, 130), RandomStream{3, 4});
    omp_set_num_threads(2);
    QuantizedTensor b = quantize(s, view(x, 97, 130), RandomStream{3, 4});
    omp_set_num_threads(7);
    QuantizedTensor c = quantize(s, view(x, 97, 130), RandomStream{3, 4});
    CHECK(a.codes == b.codes);
    CHECK(a.codes == c.codes);
    CHECK(a.scale_codes == c.scale_codes);
    CHECK(std::memcmp(a.dequant.data(), c.dequant.data(), a.dequant.size() * 4) == 0);
  }
  omp_set_num_threads(saved);
}

TEST_CASE("fp8 per-tensor current scaling") {
  // amax 224 -> enc 2, dec 0.5: 224 -> 448 (0x7E); 1.1 -> 2.2 -> e4m3 2.25 (0x41) -> 1.125.
  std::vector<float> x = {224.0f, 1.1f, -0.0f, 3.0f};
  QuantizedTensor q = quantize(quantizer_by_name("fp8_e4m3_tensor"), view(x, 2, 2));
  CHECK(q.scale_codes.empty());
  REQUIRE(q.scales.size() == 1);
  CHECK(q.scales[0] == 0.5f);
  CHECK(q.codes[0] == 0x7E);
  CHECK(q.codes[1] == 0x41);
  CHECK(q.dequant[1] == 1.125f);
  CHECK(q.codes[2] == 0x80);  // -0 kept
}
