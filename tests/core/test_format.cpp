// Format descriptors and decode(): every code of every format against the
// format's definition (ref_format.hpp) and the specs' published value tables.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/format.hpp"
#include "tests/core/ref_format.hpp"

using namespace fp4lab;

namespace {
bool same_value(double want, float got) {
  if (std::isnan(want)) return std::isnan(got);
  return double(got) == want && std::signbit(double(got)) == std::signbit(want);
}
}  // namespace

TEST_CASE("format: e2m1 codes decode to the OCP MX v1.0 value table") {
  // OCP MX v1.0 table 5 (FP4 E2M1): positive codes 0..7.
  const double table[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  for (uint32_t c = 0; c < 8; ++c) {
    CHECK(decode(float4_e2m1fn, c) == table[c]);
    CHECK(decode(float4_e2m1fn, c | 8u) == -table[c]);
  }
  CHECK(std::signbit(decode(float4_e2m1fn, 8u)));  // code 0x8 is -0
}

TEST_CASE("format: FP6 and FP8 published limits") {
  // OCP MX v1.0 table 4/5 and the OCP FP8 spec; fnuz values as ml_dtypes.finfo.
  struct Lim {
    const Format* f;
    double max, min_normal, min_sub;
  } lims[] = {
      {&float4_e2m1fn, 6.0, 1.0, 0.5},
      {&float6_e2m3fn, 7.5, 1.0, 0.125},
      {&float6_e3m2fn, 28.0, 0.25, 0.0625},
      {&float8_e4m3fn, 448.0, 0x1p-6, 0x1p-9},
      {&float8_e5m2, 57344.0, 0x1p-14, 0x1p-16},
      {&float8_e4m3fnuz, 240.0, 0x1p-7, 0x1p-10},
      {&float8_e5m2fnuz, 57344.0, 0x1p-15, 0x1p-17},
      {&ufloat8_e4m3, 448.0, 0x1p-6, 0x1p-9},
      {&bfloat16, 0x1.fep127, 0x1p-126, 0x1p-133},
      {&float16, 65504.0, 0x1p-14, 0x1p-24},
      {&float32, 0x1.fffffep127, 0x1p-126, 0x1p-149},
  };
  for (const Lim& l : lims) {
    INFO(l.f->name);
    CHECK(double(max_finite(*l.f)) == l.max);
    CHECK(double(min_normal(*l.f)) == l.min_normal);
    CHECK(double(min_subnormal(*l.f)) == l.min_sub);
  }
  CHECK(double(max_finite(float8_e8m0fnu)) == 0x1p127);
  CHECK(double(min_normal(float8_e8m0fnu)) == 0x1p-127);
  CHECK(double(max_finite(int8_mx)) == 127.0 / 64);
  // Spot values from the specs.
  CHECK(decode(float8_e4m3fn, 0x7E) == 448.0f);
  CHECK(decode(float8_e4m3fn, 0x38) == 1.0f);
  CHECK(decode(float8_e5m2, 0x3C) == 1.0f);
  CHECK(decode(float8_e4m3fnuz, 0x40) == 1.0f);
  CHECK(decode(float8_e5m2fnuz, 0x40) == 1.0f);
  CHECK(decode(float8_e8m0fnu, 0x7F) == 1.0f);
  CHECK(decode(bfloat16, 0x3F80) == 1.0f);
  CHECK(decode(float16, 0x3C00) == 1.0f);
  CHECK(decode(int8_mx, 0x40) == 1.0f);
  CHECK(decode(int8_mx, 0x80) == -2.0f);
  CHECK(decode(int8_mx, 0xFF) == -1.0f / 64);
}

TEST_CASE("format: every code of every format decodes to its defined value (exhaustive)") {
  for (const ref::Spec& s : ref::specs()) {
    INFO(s.f->name);
    REQUIRE(s.f->bits() == s.bits());
    REQUIRE(s.f->code_count() == s.count());
    int64_t bad = 0, nans = 0, infs = 0;
    for (uint32_t c = 0; c < s.count(); ++c) {
      const double want = ref::value(s, c);
      const float got = decode(*s.f, c);
      if (!same_value(want, got)) {
        if (bad < 5) MESSAGE("code ", c, " want ", want, " got ", got);
        ++bad;
      }
      CHECK(is_nan_code(*s.f, c) == std::isnan(want));
      nans += std::isnan(want);
      infs += std::isinf(want);
      // Bits above the format's width are ignored.
      if (s.bits() < 16) CHECK(same_value(want, decode(*s.f, c | s.count())));
    }
    CHECK(bad == 0);
    // NaN/Inf counts from the definitions.
    switch (s.kind) {
      case ref::Kind::ieee:
        CHECK(nans == 2 * ((1 << s.m) - 1));
        CHECK(infs == 2);
        break;
      case ref::Kind::fn:
        CHECK(nans == (s.is_signed ? 2 : 1));
        CHECK(infs == 0);
        break;
      case ref::Kind::fnuz:
      case ref::Kind::e8m0:
        CHECK(nans == 1);
        CHECK(infs == 0);
        break;
      default:
        CHECK(nans == 0);
        CHECK(infs == 0);
        break;
    }
    // Derived limits agree with the definition's extreme codes.
    const auto pos = ref::positive_values(s);
    CHECK(double(max_finite(*s.f)) == pos.back().v);
    CHECK(s.f->max_magnitude_code() == pos.back().code);
    if (s.f->has_nan()) CHECK(s.f->nan_code() == uint32_t(ref::canonical_nan(s)));
    CHECK(s.f->has_inf() == (s.kind == ref::Kind::ieee));
  }
}

namespace {
// decode_f32<F> over every code (and with bits above the width set) against
// the definition (ref_format.hpp) and, bit for bit, against decode().
template <const Format& F>
void check_decode_f32() {
  INFO(F.name);
  const ref::Spec* spec = nullptr;
  for (const ref::Spec& s : ref::specs())
    if (s.f == &F) spec = &s;
  REQUIRE(spec != nullptr);
  int64_t bad = 0;
  for (uint32_t c = 0; c < spec->count(); ++c) {
    const float got = decode_f32<F>(c);
    const bool ok = same_value(ref::value(*spec, c), got) && float_bits(got) == float_bits(decode(F, c)) &&
                    float_bits(decode_f32<F>(c | spec->count())) == float_bits(got);
    if (!ok && bad++ < 5) MESSAGE("code ", c, " got ", got, " decode() ", decode(F, c));
  }
  CHECK(bad == 0);
}
static_assert(decode_f32<float4_e2m1fn>(0x1) == 0.5f && decode_f32<float4_e2m1fn>(0xF) == -6.0f);
static_assert(decode_f32<float8_e4m3fn>(0x01) == 0x1p-9f && decode_f32<float8_e5m2>(0x7C) == inf_f());
}  // namespace

TEST_CASE("format: decode_f32<F> equals decode() and the definition on every code") {
  check_decode_f32<float4_e2m1fn>();
  check_decode_f32<float6_e2m3fn>();
  check_decode_f32<float6_e3m2fn>();
  check_decode_f32<float8_e4m3fn>();
  check_decode_f32<float8_e5m2>();
  check_decode_f32<float8_e4m3fnuz>();
  check_decode_f32<float8_e5m2fnuz>();
  check_decode_f32<ufloat8_e4m3>();
  check_decode_f32<bfloat16>();
  check_decode_f32<float16>();
}

TEST_CASE("format: float32 descriptor decodes float32 bit patterns") {
  const uint32_t pats[] = {0u,          0x80000000u, 1u,          0x00800000u, 0x3F800000u,
                           0x7F7FFFFFu, 0xFF7FFFFFu, 0x7F800000u, 0xC0490FDBu};
  for (uint32_t p : pats) {
    float want;
    std::memcpy(&want, &p, 4);
    CHECK(same_value(double(want), decode(float32, p)));
  }
  CHECK(std::isnan(decode(float32, 0x7FC00000u)));
  CHECK(float32.code_mask() == 0xFFFFFFFFu);
}

TEST_CASE("format: names and aliases") {
  CHECK(&format_by_name("float4_e2m1fn") == &float4_e2m1fn);
  CHECK(&format_by_name("e2m1") == &float4_e2m1fn);
  CHECK(&format_by_name("e4m3") == &float8_e4m3fn);
  CHECK(&format_by_name("ue4m3") == &ufloat8_e4m3);
  CHECK(&format_by_name("e8m0") == &float8_e8m0fnu);
  CHECK(&format_by_name("bf16") == &bfloat16);
  CHECK(&format_by_name("mxint8") == &int8_mx);
  for (const Format* f : all_formats) CHECK(&format_by_name(f->name) == f);
  try {
    format_by_name("e9m9");
    FAIL("no exception");
  } catch (const Error& e) {
    const std::string w = e.what();
    CHECK(w.find("e9m9") != std::string::npos);
    CHECK(w.find("float8_e4m3fn") != std::string::npos);
  }
}
