// TransformerEngine's NVFP4 options (schemes/te_nvfp4/rule.hpp): scale_select
// four_over_six and global_scale row_amax against an independent construction
// written here from TE's formulas (quantize_4over6_nvfp4.cuh, core_nvfp4.cuh,
// quantize_transpose_nvfp4.cuh, dequantize_nvfp4.cuh: scalar loops, float
// operations in TE's order, TE's reference's threshold tables for E2M1 and a
// float64 RNE for E4M3, none of core/'s codecs), hand-worked blocks and the
// keys' JSON and validation.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "schemes/te_nvfp4/rule.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

MatrixView<const float> view(const std::vector<float>& v, int64_t r, int64_t c) { return {v.data(), r, c}; }

// ---- the independent construction ----------------------------------------------

// E2M1 RNE with saturation, TE's reference cast_to_fp4x2 thresholds.
float ref_e2m1(float v) {
  const float a = std::fabs(v);
  float m;
  if (a <= 0.25f) m = 0.0f;
  else if (a < 0.75f) m = 0.5f;
  else if (a <= 1.25f) m = 1.0f;
  else if (a < 1.75f) m = 1.5f;
  else if (a <= 2.5f) m = 2.0f;
  else if (a < 3.5f) m = 3.0f;
  else if (a <= 5.0f) m = 4.0f;
  else m = 6.0f;
  return std::signbit(v) ? -m : m;
}

// E4M3 RNE with saturation at 448 of v >= 0 (or NaN), in float64.
float ref_e4m3(float v) {
  if (std::isnan(v)) return v;
  if (v >= 448.0f) return 448.0f;
  if (v == 0.0f) return 0.0f;
  int ex = 0;
  std::frexp(double(v), &ex);               // v = m 2^ex, m in [0.5, 1)
  const int e = std::max(ex - 1, -6);       // binade, the subnormal one below 2^-6
  const double quantum = std::ldexp(1.0, e - 3);
  const double r = std::nearbyint(double(v) / quantum) * quantum;  // ties to even
  return float(std::min(r, 448.0));
}

// compute_global_encode_scaling_factor_FP4<M>.
float ref_senc(float amax, float M) {
  float s = (M * 6.0f) / amax;
  s = std::fmin(s, FLT_MAX);
  if (amax == 0.0f || s == 0.0f) s = 1.0f;
  return s;
}

enum RefMode { kMae, kMse, kMaeFp16, kMseFp16 };

struct RefBlock {
  float sf = 0, inv = 0;
  bool map4 = false;
  float err4 = 0, err6 = 0;
};

// One 4/6 block: lines[l] the elements of line l in order; tile: the 16x16 tree.
RefBlock ref_4over6(const std::vector<std::vector<float>>& lines, bool tile, float gamax, float M, RefMode mode) {
  float bamax = 0.0f;
  for (const auto& l : lines)
    for (float v : l) bamax = std::fmax(bamax, std::fabs(v));
  const float S = ref_senc(gamax, M);
  const float base = bamax / 6.0f * S;
  const float sf4 = ref_e4m3(std::fmin(base * 1.5f, 448.0f));
  const float sf6 = ref_e4m3(std::fmin(base, 448.0f));
  const float Sdec = 1.0f / S;
  const float inv4 = std::fmin(1.0f / (sf4 * Sdec), FLT_MAX);
  const float inv6 = std::fmin(1.0f / (sf6 * Sdec), FLT_MAX);
  auto err = [&](float x, float inv, float sf) {
    const float q = ref_e2m1(x * inv);
    float diff;
    if (mode == kMaeFp16 || mode == kMseFp16) {
      diff = q * sf - x * S;
    } else {
      const float val = ((q * sf) * gamax) / (6.0f * M);
      diff = val - x;
    }
    return (mode == kMse || mode == kMseFp16) ? diff * diff : std::fabs(diff);
  };
  float r4[16] = {}, r6[16] = {};
  for (size_t l = 0; l < lines.size(); ++l)
    for (float x : lines[l]) {
      r4[l] = r4[l] + err(x, inv4, sf4);
      r6[l] = r6[l] + err(x, inv6, sf6);
    }
  auto tree = [](const float* r) {
    float a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = r[i] + r[i + 8];
    for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; ++i) c[i] = b[i] + b[i + 2];
    return c[0] + c[1];
  };
  RefBlock b;
  b.err4 = tile ? tree(r4) : r4[0];
  b.err6 = tile ? tree(r6) : r6[0];
  b.map4 = b.err4 < b.err6;
  b.sf = b.map4 ? sf4 : sf6;
  b.inv = b.map4 ? inv4 : inv6;
  return b;
}

// Row-scaled NVFP4 (standard selection) of one block: the nv order with the row's amax.
RefBlock ref_row_scaled(const std::vector<float>& blk, float row_amax) {
  float bamax = 0.0f;
  for (float v : blk) bamax = std::fmax(bamax, std::fabs(v));
  float S = std::fmin(2688.0f / row_amax, FLT_MAX);
  if (row_amax == 0.0f || S == 0.0f) S = 1.0f;
  RefBlock b;
  b.sf = ref_e4m3(std::fmin(bamax * (S * (1.0f / 6.0f)), FLT_MAX));
  b.inv = std::fmin(1.0f / (b.sf * (1.0f / S)), FLT_MAX);
  return b;
}

// The whole tensor by the reference: element values, block scales (decoded),
// dequantization (TE's dequantize_fp4_kernel) and map-to-4 picks.
struct RefTensor {
  std::vector<float> q, dq, sf, final_scale;
  std::vector<char> map4;
};
RefTensor ref_quantize(const QuantizerSpec& s, const std::vector<float>& x, int64_t rows, int64_t cols) {
  const int64_t br = s.block_rows, bc = s.block_cols;
  const int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
  const bool fos = s.scale_select == ScaleSelect::four_over_six, row = s.global_scale == GlobalScale::row_amax;
  const float M = float(s.e4m3_max);
  const RefMode mode = RefMode(int(s.select_error));
  float tamax = 0.0f;
  for (float v : x) tamax = std::fmax(tamax, std::fabs(v));
  RefTensor t;
  t.q.assign(x.size(), 0.0f);
  t.dq.assign(x.size(), 0.0f);
  t.sf.assign(size_t(nbr * nbc), 0.0f);
  t.final_scale.assign(size_t(nbr * nbc), 0.0f);
  t.map4.assign(size_t(nbr * nbc), 0);
  for (int64_t bi = 0; bi < nbr; ++bi) {
    for (int64_t bj = 0; bj < nbc; ++bj) {
      const int64_t r0 = bi * br, c0 = bj * bc, r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      float ga = tamax;
      if (row) {
        ga = 0.0f;
        for (int64_t c = 0; c < cols; ++c) ga = std::fmax(ga, std::fabs(x[size_t(r0 * cols + c)]));
      }
      std::vector<std::vector<float>> lines;
      if (bc == 1) {  // [16,1]: one line down the column
        lines.emplace_back();
        for (int64_t r = r0; r < r1; ++r) lines[0].push_back(x[size_t(r * cols + c0)]);
      } else {  // rows as lines
        for (int64_t r = r0; r < r1; ++r) {
          lines.emplace_back();
          for (int64_t c = c0; c < c1; ++c) lines.back().push_back(x[size_t(r * cols + c)]);
        }
      }
      const RefBlock b = fos ? ref_4over6(lines, br == 16 && bc == 16, ga, M, mode) : ref_row_scaled(lines[0], ga);
      const size_t si = size_t(bi * nbc + bj);
      t.sf[si] = b.sf;
      t.map4[si] = b.map4;
      const float final_scale = b.sf * ga * (1.0f / (6.0f * M));  // dequantize_fp4_kernel, left to right
      t.final_scale[si] = final_scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const size_t i = size_t(r * cols + c);
          t.q[i] = ref_e2m1(x[i] * b.inv);
          t.dq[i] = t.q[i] * final_scale;
        }
    }
  }
  return t;
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Compares quantize(s, x) with the reference: element values, scale values,
// final scales, dequant (bit for bit, NaN-aware); counts the reference's
// map-to-4 picks into *map4 and blocks into *blocks.
int mismatches(const QuantizerSpec& s, const std::vector<float>& x, int64_t rows, int64_t cols, int* map4 = nullptr,
               int* blocks = nullptr) {
  const QuantizedTensor q = quantize(s, view(x, rows, cols));
  const RefTensor r = ref_quantize(s, x, rows, cols);
  int bad = 0;
  REQUIRE(q.scale_codes.size() == r.sf.size());
  CHECK(q.global_decode == 1.0f);
  for (size_t i = 0; i < r.sf.size(); ++i) {
    bad += !same_float(decode(*s.scale, q.scale_codes[i]), r.sf[i]);
    bad += !same_float(q.scales[i], r.final_scale[i]);
    if (map4) *map4 += r.map4[i];
  }
  if (blocks) *blocks += int(r.sf.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = decode(float4_e2m1fn, q.codes[i]);
    bad += !(v == r.q[i] && (std::signbit(v) == std::signbit(r.q[i]) || r.q[i] != 0.0f || std::isnan(x[i])));
    bad += !same_float(q.dequant[i], r.dq[i]);
  }
  return bad;
}

std::vector<float> varied(int64_t n, uint32_t seed, int exp_range = 6) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-exp_range, exp_range);
  std::vector<float> v(static_cast<size_t>(n));
  float s = 1.0f;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 5 == 0) s = std::ldexp(1.0f, e(g));
    v[i] = d(g) * s;
  }
  return v;
}

QuantizerSpec fos(int br, int bc, SelectError m, int e4m3_max) {
  QuantizerSpec q = quantizer_by_name("nvfp4_4over6");
  q.block_rows = br;
  q.block_cols = bc;
  q.select_error = m;
  q.e4m3_max = e4m3_max;
  return q;
}

std::string error_of(const char* json) {
  try {
    parse_quantizer(json);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
bool contains(const std::string& s, const char* t) { return s.find(t) != std::string::npos; }

}  // namespace

TEST_CASE("nvfp4 options: canned quantizers, JSON keys, describe, validation errors name the key") {
  const QuantizerSpec a = quantizer_by_name("nvfp4_4over6");
  CHECK(a.scale_select == ScaleSelect::four_over_six);
  CHECK(a.select_error == SelectError::mae);
  CHECK(a.e4m3_max == 256);
  CHECK(a.block_rows == 1);
  CHECK(a.block_cols == 16);
  CHECK(a.global_scale == GlobalScale::tensor_amax);
  CHECK(describe(a) == "e2m1 [1,16] ue4m3 nv rn sat global four_over_six mae e4m3_max 256");
  const QuantizerSpec t = quantizer_by_name("nvfp4_2d_4over6");
  CHECK(t.block_rows == 16);
  CHECK(t.block_cols == 16);
  CHECK(t.scale_select == ScaleSelect::four_over_six);
  const QuantizerSpec r = quantizer_by_name("nvfp4_row_scaled");
  CHECK(r.global_scale == GlobalScale::row_amax);
  CHECK(r.scale_select == ScaleSelect::max);
  CHECK(describe(r) == "e2m1 [1,16] ue4m3 nv rn sat row_amax");
  // Every key written, and back.
  for (const QuantizerSpec& q : {a, t, r}) {
    const nlohmann::json j = quantizer_to_json(q);
    CHECK(j.contains("scale_select"));
    CHECK(j.contains("select_error"));
    CHECK(j.contains("e4m3_max"));
    CHECK(quantizer_from_json(j, "t") == q);
  }
  CHECK(quantizer_to_json(a)["scale_select"] == "four_over_six");
  CHECK(quantizer_to_json(a)["e4m3_max"] == 256);
  CHECK(quantizer_to_json(r)["global_scale"] == "row_amax");
  CHECK(quantizer_to_json(quantizer_by_name("nvfp4"))["scale_select"] == "max");
  // JSON: every value of the new keys.
  const char* base = R"({"element": "e2m1", "scale": "ue4m3", "block": [16,1], "scale_rule": "nv",
                         "global_scale": "tensor_amax", "scale_select": "four_over_six", "select_error": ")";
  for (const char* m : {"mae", "mse", "mae_fp16", "mse_fp16"}) {
    const QuantizerSpec q = parse_quantizer(std::string(base) + m + R"(", "e4m3_max": 448})");
    CHECK(select_error_name(q.select_error) == m);
    CHECK(q.e4m3_max == 448);
    CHECK(q.block_rows == 16);
  }
  // One clear error naming the key and the valid values.
  const std::string nv = R"("element": "e2m1", "scale": "ue4m3", "block": [1,16], "scale_rule": "nv", )";
  auto err = [&](const std::string& rest) { return error_of(("{" + nv + rest + "}").c_str()); };
  std::string e = err(R"("global_scale": "tensor_amax", "scale_select": "4/6")");
  CHECK(contains(e, "quantizer.scale_select"));
  CHECK(contains(e, "valid: max, four_over_six"));
  e = err(R"("global_scale": "tensor_amax", "scale_select": "four_over_six", "select_error": "l1")");
  CHECK(contains(e, "quantizer.select_error"));
  CHECK(contains(e, "valid: mae, mse, mae_fp16, mse_fp16"));
  e = err(R"("global_scale": "tensor_amax", "scale_select": "four_over_six", "e4m3_max": 300)");
  CHECK(contains(e, "quantizer.e4m3_max"));
  CHECK(contains(e, "448 or 256"));
  e = err(R"("global_scale": "per_row")");
  CHECK(contains(e, "valid: none, tensor_amax, row_amax"));
  e = err(R"("global_scale": "tensor_amax", "scale_select": "four_over_six", "rht": true)");
  CHECK(contains(e, "rht must be false"));
  e = err(R"("global_scale": "tensor_amax", "scale_select": "four_over_six", "round": "rs")");
  CHECK(contains(e, "round must not be 'rs'"));
  e = err(R"("global_scale": "tensor_amax", "scale_select": "four_over_six", "round": "rz")");
  CHECK(contains(e, "round must be 'rn'"));
  e = err(R"("global_scale": "none", "scale_select": "four_over_six")");
  CHECK(contains(e, "global_scale must be 'tensor_amax' or 'row_amax'"));
  e = err(R"("global_scale": "row_amax", "round": "rs")");
  CHECK(contains(e, "global_scale 'row_amax'"));
  CHECK(contains(e, "round must not be 'rs'"));
  e = error_of(R"({"element": "e2m1", "scale": "ue4m3", "block": [16,16], "scale_rule": "nv",
                   "global_scale": "row_amax"})");
  CHECK(contains(e, "block must be [1,16], got [16,16]"));
  e = error_of(R"({"element": "e2m1", "scale": "ue4m3", "block": [1,32], "scale_rule": "nv",
                   "global_scale": "tensor_amax", "scale_select": "four_over_six"})");
  CHECK(contains(e, "block must be [1,16], [16,1] or [16,16]"));
  e = error_of(R"({"element": "e4m3", "scale": "ue4m3", "block": [1,16], "scale_rule": "nv",
                   "global_scale": "row_amax"})");
  CHECK(contains(e, "element must be e2m1"));
  e = error_of(R"({"scale_select": "four_over_six"})");  // mxfp4's defaults otherwise
  CHECK(contains(e, "scale_rule must be 'nv', got 'ocp'"));
  e = err(R"("global_scale": "tensor_amax", "select_error": "mse")");
  CHECK(contains(e, "select_error 'mse' applies to scale_select 'four_over_six' only"));
  e = err(R"("global_scale": "tensor_amax", "e4m3_max": 256)");
  CHECK(contains(e, "e4m3_max 256 applies to scale_select 'four_over_six' only"));
  e = error_of(R"({"element": "e2m1", "scale": "e8m0", "global_scale": "row_amax"})");
  CHECK(contains(e, "scale_rule must be 'nv'"));
  CHECK_NOTHROW(parse_quantizer(std::string("{") + nv +
                                R"("global_scale": "row_amax", "scale_select": "four_over_six"})"));
}

TEST_CASE("four_over_six equals the independent TE construction: blocks, error measures, E4M3_MAX, partial blocks") {
  const int shapes[][2] = {{1, 16}, {16, 1}, {16, 16}};
  const int64_t sizes[][2] = {{32, 64}, {37, 53}, {5, 200}, {48, 16}, {1, 7}};
  int cases = 0, bad = 0, map4 = 0, blocks = 0;
  uint32_t seed = 1;
  for (const auto& sh : shapes)
    for (SelectError m : {SelectError::mae, SelectError::mse, SelectError::mae_fp16, SelectError::mse_fp16})
      for (int M : {448, 256})
        for (const auto& sz : sizes) {
          const QuantizerSpec q = fos(sh[0], sh[1], m, M);
          const std::vector<float> x = varied(sz[0] * sz[1], seed++);
          CAPTURE(describe(q));
          CAPTURE(sz[0]);
          CAPTURE(sz[1]);
          const int b = mismatches(q, x, sz[0], sz[1], &map4, &blocks);
          CHECK(b == 0);
          bad += b;
          ++cases;
        }
  MESSAGE(cases << " tensors, " << blocks << " blocks, " << map4 << " chose map-to-4");
  CHECK(bad == 0);
  // Both candidates are taken, often.
  CHECK(map4 > blocks / 10);
  CHECK(map4 < blocks - blocks / 10);
}

TEST_CASE("four_over_six hand-worked: map-to-4 wins, a tie takes map-to-6") {
  // E4M3_MAX 256, tensor amax 6: S_enc = 1536 / 6 = 256, base = (6 / 6) * 256 = 256:
  // sf6 = 256 (0x78), inv6 = 1; sf4 = 384 (0x7C), inv4 = fl(1 / 1.5).
  // Block {6, 4.5 x 15}: map-to-6 codes 6 (6) and 4 (4.5 ties to even 4): MAE
  // 15 * 0.5 = 7.5; map-to-4: 6 / 1.5 = 4 (val 4 * 384 * 6 / 1536 = 6) and 4.5
  // / 1.5 = 3 (val 4.5): error 0. Map-to-4, codes 0x6 and 0x5.
  for (SelectError m : {SelectError::mae, SelectError::mse, SelectError::mae_fp16, SelectError::mse_fp16}) {
    std::vector<float> x(16, 4.5f);
    x[0] = 6.0f;
    const QuantizedTensor q = quantize(fos(1, 16, m, 256), view(x, 1, 16));
    CHECK(q.scale_codes[0] == 0x7C);
    CHECK(q.codes[0] == 0x6);
    for (int i = 1; i < 16; ++i) CHECK(q.codes[size_t(i)] == 0x5);
    const float final_scale = (384.0f * 6.0f) * (1.0f / 1536.0f);
    CHECK(q.scales[0] == final_scale);
    CHECK(q.dequant[0] == 4.0f * final_scale);
    CHECK(q.dequant[1] == 3.0f * final_scale);
    CHECK(std::fabs(q.dequant[1] - 4.5f) < 1e-6f);
    CHECK(mismatches(fos(1, 16, m, 256), x, 1, 16) == 0);
  }
  // Block {6, 3, 0 ...}: both candidates exact (3 = 2 * 1.5 on the map-to-4
  // grid), errors 0 and 0: the tie takes map-to-6 (scale 256, 0x78).
  std::vector<float> y(16, 0.0f);
  y[0] = 6.0f;
  y[1] = -3.0f;
  const QuantizedTensor t = quantize(fos(1, 16, SelectError::mae, 256), view(y, 1, 16));
  CHECK(t.scale_codes[0] == 0x78);
  CHECK(t.codes[0] == 0x7);
  CHECK(t.codes[1] == 0xD);
  CHECK(t.dequant[1] == -3.0f * ((256.0f * 6.0f) * (1.0f / 1536.0f)));
  // Divide, then multiply: block amax a = 0x3F57FFFF (0.84374994) under S_enc
  // 256 gives base = fl(a / 6) * 256 = 35.9999962 (the nv rule's order, a *
  // fl(256 * fl(1/6)), gives 36). sf6 = 36 either way, but 1.5 * base =
  // 53.9999943 rounds to sf4 = 52 (0x65), where 54 would tie to 56 (0x66).
  // With 15 elements at 0.609375 = 3 * 52 / 256 map-to-4 wins.
  std::vector<float> d(32, 0.609375f);
  for (int i = 0; i < 16; ++i) d[size_t(i)] = i == 0 ? 6.0f : 0.0f;
  d[16] = bits_float(0x3F57FFFFu);
  const QuantizedTensor dq = quantize(fos(1, 16, SelectError::mae, 256), view(d, 1, 32));
  CHECK(dq.scale_codes[1] == 0x65);
  CHECK(dq.codes[17] == 0x5);
  CHECK(mismatches(fos(1, 16, SelectError::mae, 256), d, 1, 32) == 0);
}

TEST_CASE("four_over_six edge blocks: all zero, global amax 0, sf 0, Inf, the 448 clamp") {
  const QuantizerSpec q256 = fos(1, 16, SelectError::mae, 256), q448 = fos(1, 16, SelectError::mae, 448);
  // An all-zero block beside a non-zero one: scale 0 (tie -> map-to-6), codes 0, dequant 0.
  std::vector<float> x(32, 0.0f);
  x[0] = 6.0f;
  QuantizedTensor q = quantize(q256, view(x, 1, 32));
  CHECK(q.scale_codes[1] == 0);
  for (int i = 16; i < 32; ++i) CHECK(q.dequant[size_t(i)] == 0.0f);
  CHECK(quant_stats(q, view(x, 1, 32)).scale_underflows == 0);
  // Global amax 0: S_enc = 1, every scale 0, every value 0.
  std::vector<float> z(3 * 32, 0.0f);
  z[5] = -0.0f;
  for (const QuantizerSpec& s : {q256, q448, fos(16, 16, SelectError::mse, 256), quantizer_by_name("nvfp4_row_scaled")}) {
    const QuantizedTensor zq = quantize(s, view(z, 3, 32));
    for (uint8_t c : zq.scale_codes) CHECK(c == 0);
    for (float d : zq.dequant) CHECK(d == 0.0f);
    for (float sc : zq.scales) CHECK(sc == 0.0f);
    CHECK(mismatches(s, z, 3, 32) == 0);
  }
  // sf 0 in both candidates: block amax 1e-6 under a tensor amax of 6 (E4M3_MAX
  // 256): base = 4.3e-5 and 6.4e-5, below half of E4M3's 2^-9. inv = FLT_MAX,
  // x * FLT_MAX saturates to 6 (code 0x7) in both; both errors are |x| summed:
  // a tie, map-to-6 with scale 0, dequant 6 * 0 = 0; a scale underflow.
  std::vector<float> s(32, 1e-6f);
  s[0] = 6.0f;
  for (int i = 1; i < 16; ++i) s[size_t(i)] = 0.0f;
  q = quantize(q256, view(s, 1, 32));
  CHECK(q.scale_codes[1] == 0);
  for (int i = 16; i < 32; ++i) {
    CHECK(q.codes[size_t(i)] == 0x7);
    CHECK(q.dequant[size_t(i)] == 0.0f);
  }
  CHECK(quant_stats(q, view(s, 1, 32)).scale_underflows == 1);
  CHECK(mismatches(q256, s, 1, 32) == 0);
  // sf6 0 but sf4 not: amax 2e-5 gives base = 8.3e-4 (< 2^-10: sf6 = 0) and
  // 1.25e-3 (sf4 = 2^-9, code 0x01): map-to-6 flushes (error 16 * 2e-5),
  // map-to-4 keeps 2e-5 * 2^17 = 2.62 -> 3 (val 2.29e-5): map-to-4 wins.
  for (int i = 16; i < 32; ++i) s[size_t(i)] = 2e-5f;
  q = quantize(q256, view(s, 1, 32));
  CHECK(q.scale_codes[1] == 0x01);
  CHECK(q.codes[16] == 0x5);
  CHECK(quant_stats(q, view(s, 1, 32)).scale_underflows == 0);
  CHECK(mismatches(q256, s, 1, 32) == 0);
  // The 448 bound: the block holding the tensor amax has base = 448, so sf4 =
  // min(672, 448) = sf6 = 448: identical candidates, a tie, map-to-6 (0x7E).
  // With 256 the same block has sf4 = 384, sf6 = 256 and can choose.
  std::vector<float> c = varied(4 * 64, 99);
  c[10] = 1000.0f;
  q = quantize(q448, view(c, 4, 64));
  CHECK(q.scale_codes[0] == 0x7E);
  CHECK(mismatches(q448, c, 4, 64) == 0);
  // Blocks with base > 448 / 1.5 have sf4 clamped to 448 as well.
  c[70] = 800.0f;  // row 1, block 0: base = 800 / 6 * 2.688 = 358.4: sf6 = 352, sf4 = 448
  CHECK(mismatches(q448, c, 4, 64) == 0);
  // Inf: tensor amax Inf -> S_enc = 1; the Inf block's candidates both clamp to
  // 448 (a tie; the Inf element's error is NaN in both); Inf saturates to 6;
  // TE's dequantization scale 448 * Inf * c is Inf (and 0 * Inf NaN).
  std::vector<float> f = varied(2 * 32, 5);
  f[3] = INFINITY;
  f[40] = -INFINITY;
  for (const QuantizerSpec& sp : {q256, q448, fos(1, 16, SelectError::mse_fp16, 256)}) {
    q = quantize(sp, view(f, 2, 32));
    CHECK(q.scale_codes[0] == 0x7E);
    CHECK(q.codes[3] == 0x7);
    CHECK(q.codes[40] == 0xF);
    CHECK(std::isinf(q.dequant[3]));
    CHECK(mismatches(sp, f, 2, 32) == 0);
  }
}

TEST_CASE("four_over_six 16x16: TE's tree order over the rows decides, not a sequential 256-element sum") {
  // Tiles whose two candidates have the same total error in exact arithmetic:
  // pairs of elements (m - d, a + d) around a map-to-4 point m between the
  // map-to-6 points a and b give errors (d, |m - a| - d) and (|m - a| - d, d),
  // spread over different rows, so that only the order of the FP32 sums
  // decides. Tensor amax 6 (E4M3_MAX 256): S_enc 256, sf6 256, sf4 384.
  const QuantizerSpec q = fos(16, 16, SelectError::mae, 256);
  std::mt19937 g(7);
  std::uniform_real_distribution<float> u(0.01f, 0.24f);
  std::uniform_int_distribution<int> fam(0, 2);
  int differ = 0, tiles = 0;
  for (int it = 0; it < 64; ++it) {
    std::vector<float> x(256, 0.0f);
    std::vector<int> perm(256);
    for (int i = 0; i < 256; ++i) perm[size_t(i)] = i;
    std::shuffle(perm.begin() + 1, perm.end(), g);
    x[0] = 6.0f;
    int k = 1;
    for (int p = 0; p < 127; ++p) {
      const float d = u(g);
      const int f = fam(g);
      const float a = f == 0 ? 0.75f - d : f == 1 ? 2.25f - d : 4.5f - 2 * d;
      const float b = f == 0 ? 0.5f + d : f == 1 ? 2.0f + d : 4.0f + 2 * d;
      x[size_t(perm[size_t(k++)])] = a;
      x[size_t(perm[size_t(k++)])] = b;
    }
    // The reference's tree pick, and the pick a sequential row-major sum would make.
    std::vector<std::vector<float>> lines(16);
    for (int r = 0; r < 16; ++r) lines[size_t(r)].assign(x.begin() + r * 16, x.begin() + r * 16 + 16);
    const RefBlock tree = ref_4over6(lines, true, 6.0f, 256.0f, kMae);
    const RefBlock flat = ref_4over6({x}, false, 6.0f, 256.0f, kMae);
    differ += tree.map4 != flat.map4;
    ++tiles;
    const QuantizedTensor t = quantize(q, view(x, 16, 16));
    CHECK(t.scale_codes[0] == (tree.map4 ? 0x7C : 0x78));
    CHECK(mismatches(q, x, 16, 16) == 0);
  }
  MESSAGE(differ << " of " << tiles << " tiles pick differently under a sequential sum");
  CHECK(differ >= 4);
}

TEST_CASE("row_amax: each row quantized as a 1-row tensor with tensor_amax; TE's dequantization per row") {
  const QuantizerSpec rs = quantizer_by_name("nvfp4_row_scaled"), nv = quantizer_by_name("nvfp4");
  const int64_t sizes[][2] = {{9, 64}, {37, 53}, {1, 16}, {4, 7}};
  uint32_t seed = 40;
  for (const auto& sz : sizes) {
    const int64_t rows = sz[0], cols = sz[1];
    std::vector<float> x = varied(rows * cols, seed++, 20);  // rows of very different amax
    if (rows > 2)
      for (int64_t c = 0; c < cols; ++c) x[size_t(2 * cols + c)] = 0.0f;  // a zero row
    CAPTURE(rows);
    CAPTURE(cols);
    const QuantizedTensor q = quantize(rs, view(x, rows, cols));
    CHECK(q.global_decode == 1.0f);
    const int64_t nbc = (cols + 15) / 16;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row(x.begin() + r * cols, x.begin() + (r + 1) * cols);
      const QuantizedTensor one = quantize(nv, view(row, 1, cols));
      float amax = 0.0f;
      for (float v : row) amax = std::fmax(amax, std::fabs(v));
      for (int64_t c = 0; c < cols; ++c) CHECK(q.codes[size_t(r * cols + c)] == one.codes[size_t(c)]);
      for (int64_t j = 0; j < nbc; ++j) {
        CHECK(q.scale_codes[size_t(r * nbc + j)] == one.scale_codes[size_t(j)]);
        const float final_scale = decode(ufloat8_e4m3, one.scale_codes[size_t(j)]) * amax * (1.0f / 2688.0f);
        CHECK(q.scales[size_t(r * nbc + j)] == final_scale);
        for (int64_t c = j * 16; c < std::min(cols, j * 16 + 16); ++c)
          CHECK(q.dequant[size_t(r * cols + c)] == decode(float4_e2m1fn, one.codes[size_t(c)]) * final_scale);
      }
    }
    CHECK(mismatches(rs, x, rows, cols) == 0);
    // The per-row scale changes the result where rows differ (not the tensor's amax).
    if (rows > 3) CHECK(q.scale_codes != quantize(nv, view(x, rows, cols)).scale_codes);
  }
  // Non-rn rounding modes stay available (TE: rn only; rs is refused).
  QuantizerSpec rz = rs;
  rz.round = Round::rz;
  const std::vector<float> y = varied(6 * 48, 3);
  const QuantizedTensor a = quantize(rz, view(y, 6, 48)), b = quantize(rs, view(y, 6, 48));
  CHECK(a.scale_codes == b.scale_codes);
}

TEST_CASE("row_amax with four_over_six: each row's amax behind both candidates") {
  QuantizerSpec q = quantizer_by_name("nvfp4_4over6");
  q.global_scale = GlobalScale::row_amax;
  uint32_t seed = 70;
  for (SelectError m : {SelectError::mae, SelectError::mse_fp16})
    for (int M : {448, 256}) {
      q.select_error = m;
      q.e4m3_max = M;
      const std::vector<float> x = varied(11 * 80, seed++, 15);
      CHECK(mismatches(q, x, 11, 80) == 0);
      // Row r alone, as a 1-row tensor with the tensor's amax: the same bits.
      QuantizerSpec t = q;
      t.global_scale = GlobalScale::tensor_amax;
      const QuantizedTensor all = quantize(q, view(x, 11, 80));
      for (int64_t r = 0; r < 11; ++r) {
        const std::vector<float> row(x.begin() + r * 80, x.begin() + (r + 1) * 80);
        const QuantizedTensor one = quantize(t, view(row, 1, 80));
        for (int j = 0; j < 5; ++j) CHECK(all.scale_codes[size_t(r * 5 + j)] == one.scale_codes[size_t(j)]);
        for (int c = 0; c < 80; ++c) CHECK(all.dequant[size_t(r * 80 + c)] == one.dequant[size_t(c)]);
      }
    }
}

TEST_CASE("nvfp4 options: fake_quantize equals quantize's dequant; no dependence on the thread count") {
  const QuantizerSpec specs[] = {quantizer_by_name("nvfp4_4over6"), quantizer_by_name("nvfp4_2d_4over6"),
                                 quantizer_by_name("nvfp4_row_scaled"), fos(16, 1, SelectError::mse, 448)};
  const std::vector<float> x = varied(50 * 72, 11);
  for (const QuantizerSpec& s : specs) {
    CAPTURE(describe(s));
    const QuantizedTensor q = quantize(s, view(x, 50, 72));
    std::vector<float> f = x;
    fake_quantize(s, MatrixView<float>(f.data(), 50, 72));
    CHECK(std::memcmp(f.data(), q.dequant.data(), f.size() * 4) == 0);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const QuantizedTensor one = quantize(s, view(x, 50, 72));
    omp_set_num_threads(saved);
    CHECK(one.scale_codes == q.scale_codes);
    CHECK(std::memcmp(one.dequant.data(), q.dequant.data(), f.size() * 4) == 0);
  }
}
