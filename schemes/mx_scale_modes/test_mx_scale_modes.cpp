// torchao's MX scale modes and TE's MXFP8 rule (schemes/mx_scale_modes/scalar.hpp) against a construction
// from a different path: float64 logarithms by frexp/ldexp (no bit fields), over every exponent and a dense
// sweep of float32 amax patterns, for every element format torchao takes; the claim FLOOR == fp4lab's ocp
// rule; and the pipeline's use of the byte (scales, codes, the NaN block, TE's NaN-free amax).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/bits.hpp"
#include "schemes/mx_scale_modes/scalar.hpp"
#include "sim/quantizer.hpp"
#include "sim/scale_rules.hpp"

using namespace fp4lab;

namespace {

const Format* const kElems[] = {&float4_e2m1fn, &float6_e2m3fn, &float6_e3m2fn, &float8_e4m3fn, &float8_e5m2};

// floor(log2 a) and ceil(log2 a) of a finite a > 0, by frexp (a = m 2^k, m in [0.5, 1)).
int floor_log2(double a) {
  int k = 0;
  std::frexp(a, &k);
  return k - 1;
}
int ceil_log2(double a) {
  int k = 0;
  const double m = std::frexp(a, &k);
  return m == 0.5 ? k - 1 : k;
}
uint32_t clamp_byte(int e) { return uint32_t((e < -127 ? -127 : (e > 128 ? 128 : e)) + 127); }

// torchao's modes as their documentation states them, on the value: the largest power of two <= amax (an
// FP32 subnormal amax counts as 2^-127: torchao reads the exponent field), minus emax.
uint32_t oracle_torchao(MxScaleMode m, float amax, const Format& f) {
  if (!std::isfinite(amax)) return 255;
  const int emax_f = floor_log2(double(max_finite(f)));
  const bool sub = amax < 0x1p-126f;
  if (m == MxScaleMode::torchao_floor) return clamp_byte((amax == 0 || sub ? -127 : floor_log2(amax)) - emax_f);
  if (m == MxScaleMode::torchao_ceil) {
    if (amax == 0) return clamp_byte(-127 - emax_f);
    return clamp_byte((sub ? -126 : ceil_log2(amax)) - emax_f);
  }
  if (m == MxScaleMode::torchao_even) {
    if (amax == 0 || sub) return clamp_byte(-127 - emax_f);  // rounding a subnormal stays at or below 2^-126
    // amax rounded to 1 + mbits significant bits, halves up (in magnitude).
    int k = 0;
    const double mant = std::frexp(double(amax), &k);  // [0.5, 1)
    const double sig = std::floor(std::ldexp(mant, f.man_bits + 1) + 0.5);
    const double r = std::ldexp(sig, k - f.man_bits - 1);
    if (r >= 0x1p128) return 255;  // rounded up past FLT_MAX: not finite
    return clamp_byte(floor_log2(r) - emax_f);
  }
  // RCEIL: the smallest byte b with 2^(b - 127) >= d, d = fl(amax * fl(1 / max)).
  const float d = amax * float(1.0 / double(max_finite(f)));
  if (std::isnan(d)) return 255;
  if (std::isinf(d)) return m == MxScaleMode::te_mxfp8 ? 254 : 255;
  if (d <= 0x1p-127f) return 0;
  const int e = ceil_log2(d);
  if (m == MxScaleMode::te_mxfp8) return uint32_t(e + 127 > 254 ? 254 : e + 127);
  return uint32_t(e + 127);
}

std::vector<uint32_t> amax_patterns() {
  std::vector<uint32_t> v;
  for (uint32_t e = 0; e < 255; ++e)
    for (uint32_t m : {0u, 1u, 2u, 0x1FFFFFu, 0x200000u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x5FFFFFu, 0x600000u,
                       0x6FFFFFu, 0x700000u, 0x77FFFFu, 0x780000u, 0x7BFFFFu, 0x7C0000u, 0x7FFFFEu, 0x7FFFFFu})
      v.push_back((e << 23) | m);
  for (uint32_t a = 0; a < 0x7F800000u; a += 0x1FFu) v.push_back(a);  // every 511th pattern
  return v;
}

}  // namespace

TEST_CASE("mx scale modes: torchao FLOOR / CEIL / EVEN / RCEIL and TE's MXFP8 byte against float64 logarithms") {
  const std::vector<uint32_t> pats = amax_patterns();
  for (const Format* f : kElems)
    for (MxScaleMode m : {MxScaleMode::torchao_floor, MxScaleMode::torchao_ceil, MxScaleMode::torchao_even,
                          MxScaleMode::torchao_rceil, MxScaleMode::te_mxfp8}) {
      if (m == MxScaleMode::te_mxfp8 && f->bits() != 8) continue;
      int64_t bad = 0;
      uint32_t first = 0;
      for (uint32_t a : pats)
        if (mx_mode_biased(m, a, *f) != oracle_torchao(m, bits_float(a), *f) && bad++ == 0) first = a;
      INFO(f->name, " mode ", int(m), " first amax bits ", first);
      CHECK(bad == 0);
    }
}

TEST_CASE("mx scale modes: non-finite amax, and FLOOR equals fp4lab's ocp rule") {
  for (const Format* f : kElems) {
    for (MxScaleMode m : {MxScaleMode::torchao_floor, MxScaleMode::torchao_ceil, MxScaleMode::torchao_even,
                          MxScaleMode::torchao_rceil}) {
      CHECK(mx_mode_biased(m, 0x7F800000u, *f) == 255u);  // Inf: NaN scale (torchao's no-saturation E8M0)
      CHECK(mx_mode_biased(m, 0x7FC00000u, *f) == 255u);
    }
    if (f->bits() == 8) {
      CHECK(mx_mode_biased(MxScaleMode::te_mxfp8, 0x7F800000u, *f) == 254u);  // satfinite
      CHECK(mx_mode_biased(MxScaleMode::te_mxfp8, 0x7FC00000u, *f) == 255u);
    }
    // FLOOR is OCP MX v1.0's rule: the same byte as fp4lab's ocp for every amax pattern sampled.
    int64_t bad = 0;
    for (uint32_t a = 0; a <= 0x7FC00000u; a += 0x7Fu) {
      const MxScale o = mx_scale_ocp(a, *f);
      bad += mx_mode_biased(MxScaleMode::torchao_floor, a, *f) != o.code();
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("mx scale modes: the quantizer's scales, codes and NaN blocks") {
  // One [1,32] block per row, amax 480 in e4m3: FLOOR 2^0 (480 saturates to 448), CEIL 2^1, RCEIL 2^1
  // (480 / 448 > 1), EVEN 2^0 (480 = 1.875 * 2^8 keeps its 3 mantissa bits: no rounding up to 2^9).
  std::vector<float> x(4 * 32, 1.0f);
  for (int r = 0; r < 4; ++r) x[size_t(r * 32)] = 480.0f;
  x[size_t(3 * 32 + 5)] = NAN;
  const MatrixView<const float> v(x.data(), 4, 32);
  const std::pair<const char*, int> expect[] = {
      {"torchao_floor", 127}, {"torchao_ceil", 128}, {"torchao_even", 127}, {"torchao_rceil", 128}, {"te_mxfp8", 128}};
  for (const auto& [rule, code] : expect) {
    QuantizerSpec q = quantizer_by_name("mxfp8_e4m3");
    q.scale_rule = parse_scale_rule(rule);
    const QuantizedTensor t = quantize(q, v);
    INFO(rule);
    CHECK(int(t.scale_codes[0]) == code);
    CHECK(t.scales[0] == std::ldexp(1.0f, code - 127));
    CHECK(t.dequant[0] == (code == 127 ? 448.0f : 480.0f));
    // Row 3 holds a NaN: torchao's block is NaN (byte 255); TE's amax leaves it out, only the NaN is NaN.
    if (q.scale_rule == ScaleRule::te_mxfp8) {
      CHECK(int(t.scale_codes[3]) == code);
      CHECK(std::isnan(t.dequant[size_t(3 * 32 + 5)]));
      CHECK(t.dequant[size_t(3 * 32 + 1)] == 1.0f);
    } else {
      CHECK(int(t.scale_codes[3]) == 255);
      CHECK(std::isnan(t.dequant[size_t(3 * 32 + 1)]));
    }
  }
}

TEST_CASE("mx scale modes: the spec's checks") {
  QuantizerSpec q = quantizer_by_name("mxint8");
  q.scale_rule = ScaleRule::torchao_floor;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("e2m1, e2m3, e3m2, e4m3 or e5m2"), std::exception);
  q = quantizer_by_name("mxfp4");
  q.scale_rule = ScaleRule::te_mxfp8;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("e4m3 or e5m2"), std::exception);
  q = quantizer_by_name("nvfp4");
  q.global_scale = GlobalScale::none;
  q.scale_rule = ScaleRule::torchao_rceil;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("scale must be e8m0"), std::exception);
}
