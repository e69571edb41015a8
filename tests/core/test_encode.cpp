// encode(), encode_rn_f32() and the array helpers of cast.hpp.
//
// Oracles: hand-worked codes, and ref::Ref (ref_format.hpp), a brute-force
// encoder that rounds by searching the sorted values of each format's
// definition. The CUDA converters are a further oracle in test_cuda_oracle.cpp.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cast.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"
#include "tests/core/ref_format.hpp"

using namespace fp4lab;

namespace {

constexpr Round kModes[] = {Round::rn, Round::rna, Round::rz, Round::rp, Round::rm, Round::rs};
constexpr Overflow kPolicies[] = {Overflow::saturate, Overflow::nonsaturate};
constexpr auto S = Overflow::saturate;
constexpr auto N = Overflow::nonsaturate;

// PTX cvt.rs restated on values: with Q the target quantum around |x|, D the
// number of the input significand's bits below Q (u the input type's ulp at
// |x|, Q = u * 2^D), and f = (|x| - lo) / Q the discarded fraction, the
// magnitude rounds up iff f + (rbits mod 2^D) / 2^D >= 1; for D > 32 only the
// top 32 bits of f take part: floor(f * 2^32) + rbits >= 2^32.
template <class T>
bool rs_up_ref(const ref::Ref& R, T x, uint32_t rbits) {
  const double a = std::fabs(double(x));
  if (std::isnan(a) || std::isinf(a) || a == 0) return false;
  const auto [lo, hi] = R.bracket(a);
  if (lo == a || a >= hi) return false;  // exact, or beyond max (rs_up unused there)
  constexpr int man = std::is_same_v<T, float> ? 23 : 52;
  constexpr int min_e = std::is_same_v<T, float> ? -126 : -1022;
  const int e = std::max(std::ilogb(a), min_e);
  const double u = std::ldexp(1.0, e - man);
  const int D = std::ilogb((hi - lo) / u);
  const double f = (a - lo) / (hi - lo);
  if (D <= 32) {
    const double disc = std::ldexp(f, D);  // an integer
    return disc + double(uint64_t(rbits) & ((uint64_t(1) << D) - 1u)) >= std::ldexp(1.0, D);
  }
  return std::floor(std::ldexp(f, 32)) + double(rbits) >= 0x1p32;
}

// Inputs near every representable value: the value, the midpoints to its
// neighbours and the floats/doubles just either side of them, both signs.
std::vector<double> near_values(const ref::Ref& R, bool as_float) {
  std::vector<double> xs;
  auto add = [&](double v) {
    if (as_float) {
      const float f = float(v);
      for (float g : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e30f)}) {
        xs.push_back(g);
        xs.push_back(-g);
      }
    } else {
      for (double g : {v, std::nextafter(v, 0.0), std::nextafter(v, 1e300)}) {
        xs.push_back(g);
        xs.push_back(-g);
      }
    }
  };
  for (size_t i = 0; i < R.pos.size(); ++i) {
    add(R.pos[i].v);
    const double next = i + 1 < R.pos.size() ? R.pos[i + 1].v : R.over;
    add((R.pos[i].v + next) / 2);
  }
  add(R.over);
  add(R.over * 1.5);
  add(R.pos[1].v / 2);  // half the smallest subnormal / step
  add(R.pos[1].v / 4);
  return xs;
}

std::string fmt_code(uint32_t c) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%X", c);
  return b;
}

}  // namespace

TEST_CASE("encode: hand-worked codes") {
  struct Case {
    const Format* f;
    double x;
    Round r;
    Overflow o;
    uint32_t want;
  } cases[] = {
      // e2m1 ties: 0.25 lies between 0 (code 0) and 0.5 (code 1).
      {&float4_e2m1fn, 0.25, Round::rn, S, 0x0},
      {&float4_e2m1fn, 0.25, Round::rna, S, 0x1},
      {&float4_e2m1fn, 0.25, Round::rz, S, 0x0},
      {&float4_e2m1fn, 0.25, Round::rp, S, 0x1},
      {&float4_e2m1fn, 0.25, Round::rm, S, 0x0},
      {&float4_e2m1fn, -0.25, Round::rn, S, 0x8},  // -0
      {&float4_e2m1fn, -0.25, Round::rna, S, 0x9},
      {&float4_e2m1fn, -0.25, Round::rp, S, 0x8},
      {&float4_e2m1fn, -0.25, Round::rm, S, 0x9},
      // 2.5 between 2 (0x4, even) and 3 (0x5); 3.5 between 3 (odd) and 4 (0x6).
      {&float4_e2m1fn, 2.5, Round::rn, S, 0x4},
      {&float4_e2m1fn, 3.5, Round::rn, S, 0x6},
      {&float4_e2m1fn, 2.5, Round::rna, S, 0x5},
      {&float4_e2m1fn, 5.0, Round::rn, S, 0x6},  // tie between 4 (0x6, mantissa 0) and 6 (0x7, mantissa 1)
      // 7 = 6 + half ulp: tie between 6 (0x7, odd) and 8 (beyond max) -> rounds up -> saturates (no Inf/NaN).
      {&float4_e2m1fn, 7.0, Round::rn, N, 0x7},
      {&float4_e2m1fn, -100.0, Round::rn, N, 0xF},
      {&float4_e2m1fn, 0.3, Round::rn, S, 0x1},
      {&float4_e2m1fn, 0.3, Round::rz, S, 0x0},
      // e4m3fn: max 448 (0x7E, mantissa 110). 464 = 448 + half ulp ties to even -> 448.
      {&float8_e4m3fn, 464.0, Round::rn, N, 0x7E},
      {&float8_e4m3fn, 464.0, Round::rna, N, 0x7F},
      {&float8_e4m3fn, 464.0, Round::rna, S, 0x7E},
      {&float8_e4m3fn, -464.0, Round::rna, N, 0xFF},
      {&float8_e4m3fn, 456.0, Round::rp, N, 0x7F},
      {&float8_e4m3fn, 456.0, Round::rz, N, 0x7E},
      {&float8_e4m3fn, -456.0, Round::rp, N, 0xFE},
      {&float8_e4m3fn, -456.0, Round::rm, N, 0xFF},
      {&float8_e4m3fn, 432.0, Round::rn, S, 0x7E},  // 416 (0x7D) / 448 (0x7E) tie -> even
      {&float8_e4m3fn, 432.0, Round::rz, S, 0x7D},
      {&float8_e4m3fn, 480.0, Round::rn, N, 0x7F},
      {&float8_e4m3fn, 480.0, Round::rn, S, 0x7E},
      {&float8_e4m3fn, 0.3, Round::rn, S, 0x2A},
      // smallest subnormal 2^-9 (0x01) and half of it.
      {&float8_e4m3fn, 0x1p-9, Round::rn, S, 0x01},
      {&float8_e4m3fn, 0x1p-10, Round::rn, S, 0x00},
      {&float8_e4m3fn, 0x1p-10, Round::rna, S, 0x01},
      {&float8_e4m3fn, 0x1p-10, Round::rz, S, 0x00},
      {&float8_e4m3fn, 0x1p-10, Round::rp, S, 0x01},
      {&float8_e4m3fn, 0x1p-10, Round::rm, S, 0x00},
      {&float8_e4m3fn, -0x1p-10, Round::rm, S, 0x81},
      {&float8_e4m3fn, -0x1p-10, Round::rn, S, 0x80},
      {&float8_e4m3fn, 0x1.8p-9, Round::rn, S, 0x02},  // 1.5 steps -> 2 (even)
      {&float8_e4m3fn, 0x1p-11, Round::rp, S, 0x01},
      // e5m2: max 57344 (0x7B, odd mantissa); 61440 ties up -> Inf.
      {&float8_e5m2, 61440.0, Round::rn, N, 0x7C},
      {&float8_e5m2, 61440.0, Round::rn, S, 0x7B},
      {&float8_e5m2, -61440.0, Round::rn, N, 0xFC},
      {&float8_e5m2, -61440.0, Round::rp, N, 0xFB},
      {&float8_e5m2, -61440.0, Round::rm, N, 0xFC},
      {&float8_e5m2, 59392.0, Round::rn, N, 0x7B},  // below the tie
      {&float8_e5m2, 0x1p-17, Round::rn, S, 0x00},  // half of 2^-16, tie to even 0
      {&float8_e5m2, 0x1.8p-17, Round::rn, S, 0x01},
      // fnuz: no -0, NaN = 0x80, max 240 / 57344.
      {&float8_e4m3fnuz, -0x1p-12, Round::rn, S, 0x00},
      {&float8_e4m3fnuz, 248.0, Round::rn, N, 0x80},  // 240 (0x7F, odd) + half ulp: ties up -> overflow -> NaN
      {&float8_e4m3fnuz, 248.0, Round::rn, S, 0x7F},
      {&float8_e4m3fnuz, 248.0, Round::rz, N, 0x7F},
      {&float8_e4m3fnuz, 1000.0, Round::rn, N, 0x80},
      {&float8_e4m3fnuz, -1000.0, Round::rn, N, 0x80},
      {&float8_e4m3fnuz, -1000.0, Round::rn, S, 0xFF},
      {&float8_e5m2fnuz, 1e6, Round::rn, N, 0x80},
      // e8m0: powers of two; 1.5 ties up (PyTorch's convention); no zero.
      {&float8_e8m0fnu, 1.0, Round::rn, S, 0x7F},
      {&float8_e8m0fnu, 1.5, Round::rn, S, 0x80},
      {&float8_e8m0fnu, 1.4, Round::rn, S, 0x7F},
      {&float8_e8m0fnu, 1.5, Round::rz, S, 0x7F},
      {&float8_e8m0fnu, 1.1, Round::rp, S, 0x80},
      {&float8_e8m0fnu, 0.0, Round::rn, S, 0x00},
      {&float8_e8m0fnu, -1.0, Round::rn, S, 0xFF},
      {&float8_e8m0fnu, 0x1p-127, Round::rn, S, 0x00},
      {&float8_e8m0fnu, 0x1p-130, Round::rn, S, 0x00},
      {&float8_e8m0fnu, 0x1p127, Round::rn, S, 0xFE},
      // ue4m3: unsigned, negative -> NaN.
      {&ufloat8_e4m3, -1.0, Round::rn, S, 0x7F},
      {&ufloat8_e4m3, 448.0, Round::rn, S, 0x7E},
      {&ufloat8_e4m3, 1000.0, Round::rn, N, 0x7F},
      // MXINT8: k/64, symmetric saturation at +-127/64, ties to even k.
      {&int8_mx, 1.0, Round::rn, S, 0x40},
      {&int8_mx, -1.0, Round::rn, S, 0xC0},
      {&int8_mx, 1.5 / 64, Round::rn, S, 0x02},
      {&int8_mx, 2.5 / 64, Round::rn, S, 0x02},
      {&int8_mx, -2.5 / 64, Round::rna, S, 0xFD},
      {&int8_mx, 5.0, Round::rn, N, 0x7F},
      {&int8_mx, -5.0, Round::rn, N, 0x81},
      {&int8_mx, -2.0, Round::rn, S, 0x81},
      // bf16 / f16
      {&bfloat16, 1.0 + 0x1p-8, Round::rn, S, 0x3F80},  // tie -> even
      {&bfloat16, 1.0 + 0x1p-8 + 0x1p-30, Round::rn, S, 0x3F81},
      {&bfloat16, 1.0 + 0x1p-8, Round::rna, S, 0x3F81},
      {&float16, 65520.0, Round::rn, N, 0x7C00},  // 65504 + half ulp, odd -> Inf
      {&float16, 65520.0, Round::rn, S, 0x7BFF},
      {&float16, 0x1p-25, Round::rn, S, 0x0000},
      {&float16, 0x1p-25, Round::rp, S, 0x0001},
  };
  for (const Case& c : cases) {
    INFO(c.f->name, " x=", c.x, " round=", round_name(c.r), " ", overflow_name(c.o));
    CHECK(fmt_code(encode(*c.f, c.x, c.r, c.o)) == fmt_code(c.want));
    if (double(float(c.x)) == c.x) CHECK(fmt_code(encode(*c.f, float(c.x), c.r, c.o)) == fmt_code(c.want));
  }
}

TEST_CASE("encode: -0, NaN and +-Inf in every format, mode and policy") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const ref::Spec& s : ref::specs()) {
    const ref::Ref R(s);
    for (Round r : kModes)
      for (Overflow o : kPolicies) {
        INFO(s.f->name, " ", round_name(r), " ", overflow_name(o));
        CHECK(encode(*s.f, 0.0f, r, o, 0xFFFFFFFFu) == 0u);
        CHECK(encode(*s.f, -0.0f, r, o, 0xFFFFFFFFu) == R.encode(-0.0, r, o));
        CHECK(encode(*s.f, -0.0, r, o) == R.encode(-0.0, r, o));
        CHECK(encode(*s.f, nan, r, o) == R.encode(double(nan), r, o));
        CHECK(encode(*s.f, -nan, r, o) == R.encode(double(nan), r, o));
        CHECK(encode(*s.f, double(nan), r, o) == R.encode(double(nan), r, o));
        CHECK(encode(*s.f, inf, r, o) == R.encode(double(inf), r, o));
        CHECK(encode(*s.f, -inf, r, o) == R.encode(-double(inf), r, o));
        CHECK(encode(*s.f, -double(inf), r, o) == R.encode(-double(inf), r, o));
      }
  }
  // The reference's conventions, spelled out for the main formats.
  CHECK(encode(float8_e4m3fn, -0.0f, Round::rn, S) == 0x80);
  CHECK(encode(float8_e4m3fnuz, -0.0f, Round::rn, S) == 0x00);
  CHECK(encode(float4_e2m1fn, -0.0f, Round::rn, S) == 0x8);
  CHECK(encode(bfloat16, -0.0f, Round::rn, S) == 0x8000);
  CHECK(encode(float8_e4m3fn, nan, Round::rn, S) == 0x7F);
  CHECK(encode(float8_e5m2, -nan, Round::rn, S) == 0x7F);
  CHECK(encode(float8_e5m2fnuz, nan, Round::rn, S) == 0x80);
  CHECK(encode(float8_e8m0fnu, nan, Round::rn, S) == 0xFF);
  CHECK(encode(float4_e2m1fn, nan, Round::rn, S) == 0x7);
  CHECK(encode(int8_mx, nan, Round::rn, S) == 0x7F);
  CHECK(encode(float8_e4m3fn, inf, Round::rn, S) == 0x7E);
  CHECK(encode(float8_e4m3fn, -inf, Round::rn, N) == 0xFF);
  CHECK(encode(float8_e5m2, -inf, Round::rz, N) == 0xFC);
  CHECK(encode(float8_e5m2, -inf, Round::rz, S) == 0xFB);
  CHECK(encode(float4_e2m1fn, -inf, Round::rn, N) == 0xF);
  CHECK(encode(float8_e8m0fnu, inf, Round::rn, S) == 0xFE);
  CHECK(encode(float8_e8m0fnu, inf, Round::rn, N) == 0xFF);
}

TEST_CASE("encode: every code re-encodes to itself under every mode and policy (float and double)") {
  for (const ref::Spec& s : ref::specs()) {
    INFO(s.f->name);
    int64_t bad = 0;
    for (uint32_t c = 0; c < s.count(); ++c) {
      const float v = decode(*s.f, c);
      if (std::isnan(v)) {
        for (Round r : kModes) bad += !is_nan_code(*s.f, encode(*s.f, v, r, N));
        continue;
      }
      // The code MXINT8 never produces (-2.0) saturates to -127/64.
      const uint32_t want = (s.kind == ref::Kind::int8 && c == 0x80) ? 0x81u : c;
      for (Round r : kModes) {
        for (Overflow o : kPolicies) {
          uint32_t w = want;
          // Inf codes survive only without saturation.
          if (std::isinf(v) && o == S) w = (c & s.f->sign_bit()) | s.f->max_magnitude_code();
          const uint32_t rb = uint32_t(c * 2654435761u);
          const uint32_t got_f = encode(*s.f, v, r, o, rb);
          const uint32_t got_d = encode(*s.f, double(v), r, o, rb);
          if (got_f != w || got_d != w) {
            if (bad < 5)
              MESSAGE("code ", fmt_code(c), " ", round_name(r), " ", overflow_name(o), " -> ", fmt_code(got_f), "/",
                      fmt_code(got_d));
            ++bad;
          }
        }
      }
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("encode: agrees with the brute-force reference near every value, every mode and policy") {
  std::mt19937_64 rng(7);
  for (const ref::Spec& s : ref::specs()) {
    const ref::Ref R(s);
    // Float inputs: near every value, all bfloat16 patterns, random patterns.
    std::vector<float> xf;
    for (double v : near_values(R, true)) xf.push_back(float(v));
    for (uint32_t b = 0; b < 65536; b += (s.bits() > 8 ? 1 : 3)) xf.push_back(bits_float(b << 16));
    for (int i = 0; i < 20000; ++i) xf.push_back(bits_float(uint32_t(rng())));
    // Double inputs that are not floats: near every value and midpoint.
    const std::vector<double> xd = near_values(R, false);
    int64_t bad = 0;
    for (Round r : kModes)
      for (Overflow o : kPolicies) {
        for (float x : xf) {
          const uint32_t rb = uint32_t(rng());
          const uint32_t want = R.encode(double(x), r, o, r == Round::rs && rs_up_ref(R, x, rb));
          const uint32_t got = encode(*s.f, x, r, o, rb);
          if (got != want) {
            if (bad < 8)
              MESSAGE(s.f->name, " float x=", double(x), " ", round_name(r), " ", overflow_name(o), " want ",
                      fmt_code(want), " got ", fmt_code(got));
            ++bad;
          }
        }
        for (double x : xd) {
          const uint32_t rb = uint32_t(rng());
          const uint32_t want = R.encode(x, r, o, r == Round::rs && rs_up_ref(R, x, rb));
          const uint32_t got = encode(*s.f, x, r, o, rb);
          if (got != want) {
            if (bad < 8)
              MESSAGE(s.f->name, " double x=", x, " ", round_name(r), " ", overflow_name(o), " want ", fmt_code(want),
                      " got ", fmt_code(got));
            ++bad;
          }
        }
      }
    CHECK_MESSAGE(bad == 0, s.f->name);
  }
}

TEST_CASE("encode: float64 input is rounded once (no double rounding through float32)") {
  // 2.5 + 2^-30 lies above the e2m1 tie 2.5: the exact value rounds to 3, but
  // rounding first to float32 gives exactly 2.5, which ties to 2.
  const double x = 2.5 + 0x1p-30;
  REQUIRE(double(float(x)) == 2.5);
  CHECK(encode(float4_e2m1fn, x, Round::rn, S) == 0x5);
  CHECK(encode(float4_e2m1fn, float(x), Round::rn, S) == 0x4);
  // bf16: 1 + 2^-8 + 2^-40 is above the tie; float32 would drop the 2^-40.
  const double y = 1.0 + 0x1p-8 + 0x1p-40;
  REQUIRE(double(float(y)) == 1.0 + 0x1p-8);
  CHECK(encode(bfloat16, y, Round::rn, S) == 0x3F81);
  CHECK(encode(bfloat16, float(y), Round::rn, S) == 0x3F80);
  // rz/rp on a double just above a value: no rounding to float first.
  const double z = 448.0 + 0x1p-40;
  CHECK(encode(float8_e4m3fn, z, Round::rp, N) == 0x7F);  // above max: rp overflows
  CHECK(encode(float8_e4m3fn, float(z), Round::rp, N) == 0x7E);
  // Below the smallest float32 subnormal: still rounds correctly in bf16/e8m0.
  CHECK(encode(bfloat16, 0x1p-160, Round::rp, S) == 0x0001);
  CHECK(encode(bfloat16, 0x1p-160, Round::rn, S) == 0x0000);
  CHECK(encode(float8_e8m0fnu, 0x1p200, Round::rn, N) == 0xFF);
  CHECK(encode(float8_e8m0fnu, 0x1p200, Round::rz, S) == 0xFE);
}

namespace {
template <const Format& F>
int64_t fast_path_mismatches(const std::vector<float>& xs) {
  int64_t bad = 0;
  for (Overflow o : kPolicies)
    for (float x : xs) {
      const uint32_t a = encode_rn_f32<F>(x, o), b = encode(F, x, Round::rn, o);
      if (a != b) {
        if (bad < 5)
          MESSAGE(F.name, " x bits ", fmt_code(float_bits(x)), " fast ", fmt_code(a), " generic ", fmt_code(b));
        ++bad;
      }
    }
  return bad;
}
}  // namespace

TEST_CASE("encode_rn_f32 equals encode(rn) on a sampled sweep of float32 bit patterns") {
  std::vector<float> xs;
  // Every 1021st pattern (4.2M patterns covering every exponent and sign),
  // every bfloat16 pattern, and patterns next to them.
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 1021) xs.push_back(bits_float(uint32_t(b)));
  for (uint32_t b = 0; b < 65536; ++b)
    for (uint32_t d : {0u, 1u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) xs.push_back(bits_float((b << 16) + d));
  CHECK(fast_path_mismatches<float4_e2m1fn>(xs) == 0);
  CHECK(fast_path_mismatches<float6_e2m3fn>(xs) == 0);
  CHECK(fast_path_mismatches<float6_e3m2fn>(xs) == 0);
  CHECK(fast_path_mismatches<float8_e4m3fn>(xs) == 0);
  CHECK(fast_path_mismatches<float8_e5m2>(xs) == 0);
  CHECK(fast_path_mismatches<float8_e4m3fnuz>(xs) == 0);
  CHECK(fast_path_mismatches<float8_e5m2fnuz>(xs) == 0);
  CHECK(fast_path_mismatches<bfloat16>(xs) == 0);
  CHECK(fast_path_mismatches<float16>(xs) == 0);
}

TEST_CASE("e2m1 rn by float rounding: every float32 of |x| in [2^-10, 16), both signs, equals encode(rn)") {
  // Every pattern where E2M1 has a code boundary (0.25 .. 5) and a margin
  // around it; the sweep above covers the other exponents. Also checks the
  // magnitude helper the GPU kernels call directly.
  int64_t bad = 0;
  for (uint32_t b = uint32_t(127 - 10) << 23; b < uint32_t(127 + 4) << 23; ++b)
    for (uint32_t s : {0u, 0x80000000u}) {
      const float x = bits_float(b | s);
      const uint32_t want = encode(float4_e2m1fn, x, Round::rn, Overflow::saturate);
      const uint32_t mag = e2m1_rn_magnitude_biased(bits_float(b)) - kE2m1MagnitudeBase;
      if (encode_rn_f32<float4_e2m1fn>(x, Overflow::saturate) != want || (want & 7u) != mag) {
        if (bad < 5) MESSAGE("x bits ", fmt_code(b | s), " want ", fmt_code(want), " magnitude ", mag);
        ++bad;
      }
    }
  CHECK(bad == 0);
  // Saturation, Inf, 0 and the ties, by hand.
  CHECK(e2m1_rn_magnitude_biased(0.0f) - kE2m1MagnitudeBase == 0);
  CHECK(e2m1_rn_magnitude_biased(0.25f) - kE2m1MagnitudeBase == 0);
  CHECK(e2m1_rn_magnitude_biased(2.5f) - kE2m1MagnitudeBase == 4);
  CHECK(e2m1_rn_magnitude_biased(5.0f) - kE2m1MagnitudeBase == 6);
  CHECK(e2m1_rn_magnitude_biased(1e30f) - kE2m1MagnitudeBase == 7);
  CHECK(e2m1_rn_magnitude_biased(inf_f()) - kE2m1MagnitudeBase == 7);
  CHECK(encode_rn_f32<float4_e2m1fn>(-quiet_nan_f(), Overflow::saturate) == 7);
}

namespace {
// encode_rn_f32<F> against encode() on every float32 pattern (both signs) with
// a biased exponent in [lo, hi), under both overflow policies.
template <const Format& F>
int64_t rn_range_mismatches(int lo, int hi) {
  int64_t bad = 0;
  for (uint32_t b = uint32_t(lo) << 23; b < uint32_t(hi) << 23; ++b)
    for (uint32_t s : {0u, 0x80000000u})
      for (Overflow o : kPolicies) {
        const float x = bits_float(b | s);
        const uint32_t got = encode_rn_f32<F>(x, o), want = encode(F, x, Round::rn, o);
        if (got != want) {
          if (bad < 5)
            MESSAGE(F.name, " x bits ", fmt_code(b | s), " fast ", fmt_code(got), " generic ", fmt_code(want));
          ++bad;
        }
      }
  return bad;
}
}  // namespace

TEST_CASE("encode_rn_f32 (FP8 by one float rounding): every float32 around the subnormal and overflow edges") {
  // E4M3: below, across and above the subnormal range (2^-12 .. 2^-4) and the
  // overflow region (256 .. 1024); E5M2 likewise (2^-19 .. 2^-12, 2^15 .. 2^18).
  CHECK(rn_range_mismatches<float8_e4m3fn>(127 - 12, 127 - 4) == 0);
  CHECK(rn_range_mismatches<float8_e4m3fn>(127 + 8, 127 + 10) == 0);
  CHECK(rn_range_mismatches<float8_e5m2>(127 - 19, 127 - 12) == 0);
  CHECK(rn_range_mismatches<float8_e5m2>(127 + 15, 127 + 18) == 0);
}

namespace {
// encode_rs_f32 against the generic encoder, each input with `words` random words
// (plus the edge words 0, 1, 0x7FFFFFFF, 0x80000000 and 0xFFFFFFFF).
template <const Format& F, int W = 32>
int64_t rs_fast_path_mismatches(const std::vector<float>& xs, int words) {
  int64_t bad = 0;
  std::mt19937 rng(1234);
  for (Overflow o : kPolicies)
    for (float x : xs) {
      uint32_t ws[8] = {0u, 1u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu};
      for (int k = 5; k < 5 + words && k < 8; ++k) ws[k] = rng();
      for (int k = 0; k < 5 + words && k < 8; ++k) {
        const uint32_t a = encode_rs_f32<F, W>(x, ws[k], o), b = encode(F, x, Round::rs, o, ws[k], W);
        if (a != b) {
          if (bad < 5)
            MESSAGE(F.name, " x bits ", fmt_code(float_bits(x)), " rbits ", fmt_code(ws[k]), " fast ", fmt_code(a),
                    " generic ", fmt_code(b));
          ++bad;
        }
      }
    }
  return bad;
}
}  // namespace

TEST_CASE("encode_rs_f32 equals encode(rs) on bfloat16 patterns and sampled float32, many random words") {
  std::vector<float> xs;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 65521) xs.push_back(bits_float(uint32_t(b)));
  for (uint32_t b = 0; b < 65536; ++b)
    for (uint32_t d : {0u, 1u, 0x8000u, 0xFFFFu}) xs.push_back(bits_float((b << 16) + d));
  CHECK(rs_fast_path_mismatches<float4_e2m1fn>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float6_e2m3fn>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float6_e3m2fn>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float8_e4m3fn>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float8_e5m2>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float8_e4m3fnuz>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float8_e5m2fnuz>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<bfloat16>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float16>(xs, 3) == 0);
  // The PTX contract's widths (core/sr.hpp): 8 bits for the x4 formats, 13 / 16 for f16 / bf16.
  CHECK(rs_fast_path_mismatches<float4_e2m1fn, 8>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float6_e2m3fn, 8>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float6_e3m2fn, 8>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float8_e4m3fn, 8>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float8_e5m2, 8>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<float16, 13>(xs, 3) == 0);
  CHECK(rs_fast_path_mismatches<bfloat16, 16>(xs, 3) == 0);
}

TEST_CASE("shl_clamped / shr_clamped: PTX's saturating shift counts") {
  for (uint32_t n = 0; n < 40; ++n) {
    CAPTURE(n);
    CHECK(shl_clamped(0x80000001u, n) == (n >= 32 ? 0u : 0x80000001u << n));
    CHECK(shr_clamped(0x80000001u, n) == (n >= 32 ? 0u : 0x80000001u >> n));
  }
  CHECK(shl_clamped(0xFFFFFFFFu, 0u - 3u) == 0u);  // a negative count, converted
  CHECK(shr_clamped(0xFFFFFFFFu, 0x80000000u) == 0u);
}

TEST_CASE("E2M1: the folded SR encode and the SR and rn value forms against the generic encoder") {
  // Every exponent field, both signs, sampled significands (every one for the
  // exponents where SR's discarded-bit count d crosses 32, 23 and the normal
  // range: fields 116-118, 125-127), SR with edge and random words.
  std::mt19937 rng(77);
  int64_t bad_code = 0, bad_value = 0, bad_rn_value = 0, n = 0;
  for (uint32_t e = 0; e < 255; ++e) {
    const bool all = (e >= 116 && e <= 118) || (e >= 125 && e <= 127);
    const uint32_t step = all ? 1u : 2039u;
    for (uint32_t m = 0; m < (1u << 23); m += step)
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t yb = sign | (e << 23) | m;
        const float y = bits_float(yb);
        const uint32_t want_rn = float_bits(float(decode(float4_e2m1fn, encode(float4_e2m1fn, y, Round::rn, S))));
        if (e2m1_rn_value_bits(yb) != want_rn && bad_rn_value++ < 5)
          MESSAGE("e2m1_rn_value_bits: y ", fmt_code(yb), " got ", fmt_code(e2m1_rn_value_bits(yb)), " want ",
                  fmt_code(want_rn));
        uint32_t ws[6] = {0u, 0xFFFFFFFFu, 0x80000000u, 0x7FFFFFFFu, uint32_t(rng()), uint32_t(rng())};
        const int nw = all ? 3 : 6;
        for (int k = 0; k < nw; ++k) {
          const uint32_t w = all ? ws[3 + k] : ws[k];
          const uint32_t want = encode(float4_e2m1fn, y, Round::rs, S, w);
          const uint32_t got = encode_rs_f32<float4_e2m1fn>(y, w, S);
          const uint32_t value = e2m1_rs_value_bits(yb, w);
          const uint32_t want_value = float_bits(float(decode(float4_e2m1fn, want)));
          ++n;
          if (got != want && bad_code++ < 5)
            MESSAGE("encode_rs_f32: y ", fmt_code(yb), " rbits ", fmt_code(w), " got ", fmt_code(got), " want ",
                    fmt_code(want));
          if (value != want_value && bad_value++ < 5)
            MESSAGE("e2m1_rs_value_bits: y ", fmt_code(yb), " rbits ", fmt_code(w), " got ", fmt_code(value), " want ",
                    fmt_code(want_value));
        }
      }
  }
  // Inf: saturates to 6 with its sign, under both policies.
  for (uint32_t w : {0u, 0xFFFFFFFFu}) {
    CHECK(e2m1_rs_value_bits(0x7F800000u, w) == float_bits(6.0f));
    CHECK(e2m1_rs_value_bits(0xFF800000u, w) == float_bits(-6.0f));
    CHECK(encode_rs_f32<float4_e2m1fn>(-inf_f(), w, N) == encode(float4_e2m1fn, -inf_f(), Round::rs, N, w));
  }
  CHECK(n > 50000000);
  CHECK(bad_code == 0);
  CHECK(bad_value == 0);
  CHECK(bad_rn_value == 0);
  CHECK(e2m1_rn_value_bits(0xFF800000u) == float_bits(-6.0f));
}

namespace {
// rn_sat_value_bits<F> against the generic encoder and decoder: every exponent
// field, both signs, sampled significands (every one in the fields around F's
// subnormal / normal boundary and its largest binade), plus Inf.
template <const Format& F>
int64_t rn_sat_value_mismatches() {
  int64_t bad = 0;
  const int emin_field = F.min_exponent() + 127, emax_field = emax(F) + 127;
  for (uint32_t e = 0; e < 255; ++e) {
    const bool all = std::abs(int(e) - emin_field) <= 1 || std::abs(int(e) - emax_field) <= 1 ||
                     int(e) == emin_field - F.man_bits - 1;
    for (uint32_t m = 0; m < (1u << 23); m += all ? 1u : 1021u)
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t yb = sign | (e << 23) | m;
        const uint32_t want = float_bits(float(decode(F, encode(F, bits_float(yb), Round::rn, Overflow::saturate))));
        if (rn_sat_value_bits<F>(yb) != want && bad++ < 5)
          MESSAGE(F.name, ": y ", fmt_code(yb), " got ", fmt_code(rn_sat_value_bits<F>(yb)), " want ", fmt_code(want));
      }
  }
  for (uint32_t yb : {0x7F800000u, 0xFF800000u}) {
    const uint32_t want = float_bits(float(decode(F, encode(F, bits_float(yb), Round::rn, Overflow::saturate))));
    if (rn_sat_value_bits<F>(yb) != want) ++bad;
  }
  return bad;
}
}  // namespace

TEST_CASE("FP8 / FP6: the rn value form (saturating) against the generic encoder") {
  CHECK(rn_sat_value_mismatches<float8_e4m3fn>() == 0);
  CHECK(rn_sat_value_mismatches<float8_e5m2>() == 0);
  CHECK(rn_sat_value_mismatches<float6_e2m3fn>() == 0);
  CHECK(rn_sat_value_mismatches<float6_e3m2fn>() == 0);
  // Spot values: 460 and Inf saturate to 448 (E4M3), -0 keeps its sign, the
  // smallest subnormal's half ties to zero, three halves to two quanta.
  CHECK(rn_sat_value_bits<float8_e4m3fn>(float_bits(460.0f)) == float_bits(448.0f));
  CHECK(rn_sat_value_bits<float8_e4m3fn>(0xFF800000u) == float_bits(-448.0f));
  CHECK(rn_sat_value_bits<float8_e4m3fn>(0x80000000u) == 0x80000000u);
  CHECK(rn_sat_value_bits<float8_e4m3fn>(float_bits(0x1p-10f)) == 0u);
  CHECK(rn_sat_value_bits<float8_e4m3fn>(float_bits(0x3p-10f)) == float_bits(0x1p-8f));
  CHECK(rn_sat_value_bits<float8_e5m2>(float_bits(1e9f)) == float_bits(57344.0f));
}

TEST_CASE("stochastic rounding: exact codes for given random bits") {
  // e4m3fn, x = 2^-10 = half the smallest subnormal 2^-9: as a float32 its
  // significand is 2^23, and D = 24 bits fall below the quantum 2^-9; the
  // discarded value is 2^23 (one half). It rounds up iff 2^23 + (r mod 2^24) >= 2^24,
  // i.e. iff bit 23 of r is set; bits above 23 are ignored.
  CHECK(encode(float8_e4m3fn, 0x1p-10f, Round::rs, S, 0x00800000u) == 0x01);
  CHECK(encode(float8_e4m3fn, 0x1p-10f, Round::rs, S, 0x007FFFFFu) == 0x00);
  CHECK(encode(float8_e4m3fn, 0x1p-10f, Round::rs, S, 0xFF7FFFFFu) == 0x00);
  CHECK(encode(float8_e4m3fn, -0x1p-10f, Round::rs, S, 0x00FFFFFFu) == 0x81);
  // e2m1, x = 2.75 between 2 and 3 (quantum 1 in [2,4)): float32 2.75 =
  // 1.011b * 2^1, D = 22 discarded bits holding 0.75 * 2^22 = 0x300000.
  // Rounds up iff (r mod 2^22) >= 2^22 - 0x300000 = 0x100000.
  CHECK(encode(float4_e2m1fn, 2.75f, Round::rs, S, 0x000FFFFFu) == 0x4);
  CHECK(encode(float4_e2m1fn, 2.75f, Round::rs, S, 0x00100000u) == 0x5);
  CHECK(encode(float4_e2m1fn, 2.75f, Round::rs, S, 0xFFD00000u) == 0x5);
  CHECK(encode(float4_e2m1fn, 2.75f, Round::rs, S, 0xFFCFFFFFu) == 0x4);
  CHECK(encode(float4_e2m1fn, 2.75f, Round::rs, S, 0xFFC00000u) == 0x4);
  // e2m1 at max: 6.5 rounds to 6 or "8" which saturates; never NaN (none).
  CHECK(encode(float4_e2m1fn, 6.5f, Round::rs, N, 0xFFFFFFFFu) == 0x7);
  // e5m2 above max: rounding up overflows to Inf without saturation.
  CHECK(encode(float8_e5m2, 60000.0f, Round::rs, N, 0xFFFFFFFFu) == 0x7C);
  CHECK(encode(float8_e5m2, 60000.0f, Round::rs, N, 0u) == 0x7B);
  // Exactly representable values never move, whatever the bits.
  CHECK(encode(float4_e2m1fn, 3.0f, Round::rs, S, 0xFFFFFFFFu) == 0x5);
  // Double input with D > 32: only the top 32 discarded bits take part.
  // x = 2 + 0.5 + 2^-40 in e2m1: D = 52 - 1 = 51 bits, top 32 bits of the
  // fraction 0.5 + 2^-41 are 0x80000000 (2^-41 is below them).
  CHECK(encode(float4_e2m1fn, 2.5 + 0x1p-40, Round::rs, S, 0x7FFFFFFFu) == 0x4);
  CHECK(encode(float4_e2m1fn, 2.5 + 0x1p-40, Round::rs, S, 0x80000000u) == 0x5);
}

TEST_CASE("stochastic rounding is unbiased: E[q(x)] = x within 5 sigma of the binomial") {
  struct Case {
    const Format* f;
    float x;
  } cases[] = {{&float4_e2m1fn, 0.3f},   {&float4_e2m1fn, 2.7f},  {&float4_e2m1fn, -5.1f}, {&float8_e4m3fn, 0.1234f},
               {&float8_e4m3fn, 300.7f}, {&float8_e4m3fn, 3e-3f}, {&float8_e5m2, 1.1f},    {&bfloat16, 1.0f + 0x1p-10f},
               {&float6_e3m2fn, -0.2f},  {&int8_mx, 0.01f}};
  const size_t n = 1 << 18;
  for (const Case& c : cases) {
    INFO(c.f->name, " x=", double(c.x));
    std::vector<float> x(n, c.x);
    std::vector<uint8_t> c8(n);
    std::vector<uint16_t> c16(n);
    CastOptions opt;
    opt.round = Round::rs;
    opt.seed = 12345;
    opt.stream = 3;
    std::vector<float> q(n);
    if (code_bytes(*c.f) == 1) {
      encode_array(*c.f, x.data(), c8.data(), n, opt);
      decode_array(*c.f, c8.data(), q.data(), n);
    } else {
      encode_array(*c.f, x.data(), c16.data(), n, opt);
      decode_array(*c.f, c16.data(), q.data(), n);
    }
    // Neighbouring values from the definition (independent of the encoder).
    const ref::Spec* sp = nullptr;
    for (const auto& s : ref::specs())
      if (s.f == c.f) sp = &s;
    const ref::Ref R(*sp);
    const auto [lo, hi] = R.bracket(std::fabs(double(c.x)));
    const double p = (std::fabs(double(c.x)) - lo) / (hi - lo);
    REQUIRE(p > 0.0);
    REQUIRE(p < 1.0);
    int64_t ups = 0, others = 0;
    for (float v : q) {
      const double m = std::fabs(double(v));
      if (m == hi)
        ++ups;
      else if (m != lo)
        ++others;
    }
    CHECK(others == 0);
    const double sigma = std::sqrt(double(n) * p * (1 - p));
    CHECK(std::fabs(double(ups) - double(n) * p) <= 5 * sigma);
    double mean = 0;
    for (float v : q) mean += v;
    mean /= double(n);
    CHECK(std::fabs(mean - double(c.x)) <= 5 * sigma / double(n) * (hi - lo));
  }
}

TEST_CASE("array helpers: same bits on 1 and many threads; index_offset; decode_array") {
  const size_t n = 100003;  // not a multiple of the block size (16384)
  std::mt19937_64 rng(99);
  std::vector<float> x(n);
  std::vector<double> xd(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = bits_float(uint32_t(rng()));
    xd[i] = std::ldexp(double(int64_t(rng() >> 11)) / 0x1p53, int(rng() % 40) - 20);
  }
  const int saved = omp_get_max_threads();
  for (const Format* f : {&float4_e2m1fn, &float8_e4m3fn, &float8_e8m0fnu, &int8_mx, &bfloat16})
    for (Round r : kModes) {
      INFO(f->name, " ", round_name(r));
      CastOptions opt;
      opt.round = r;
      opt.seed = 0xDEADBEEF12345678ull;
      opt.stream = 5;
      std::vector<uint16_t> a16(n), b16(n);
      std::vector<uint8_t> a8(n), b8(n);
      auto run = [&](int threads, std::vector<uint8_t>& c8, std::vector<uint16_t>& c16, bool dbl) {
        omp_set_num_threads(threads);
        if (code_bytes(*f) == 1)
          dbl ? encode_array(*f, xd.data(), c8.data(), n, opt) : encode_array(*f, x.data(), c8.data(), n, opt);
        else
          dbl ? encode_array(*f, xd.data(), c16.data(), n, opt) : encode_array(*f, x.data(), c16.data(), n, opt);
      };
      for (bool dbl : {false, true}) {
        run(1, a8, a16, dbl);
        run(7, b8, b16, dbl);
        CHECK(a8 == b8);
        CHECK(a16 == b16);
        // Element-wise: the helper equals the scalar encoder with the bits
        // random_bits(seed, stream, i).
        int64_t bad = 0;
        for (size_t i = 0; i < n; i += 7) {
          const uint32_t rb = random_bits(opt.seed, opt.stream, i);
          const uint32_t want = dbl ? encode(*f, xd[i], r, opt.overflow, rb) : encode(*f, x[i], r, opt.overflow, rb);
          bad += (code_bytes(*f) == 1 ? a8[i] : a16[i]) != want;
        }
        CHECK(bad == 0);
      }
      // Splitting an array in two with index_offset gives the same codes.
      if (code_bytes(*f) == 1) {
        std::vector<uint8_t> parts(n);
        const size_t k = 12345;
        encode_array(*f, x.data(), parts.data(), k, opt);
        CastOptions opt2 = opt;
        opt2.index_offset = k;
        encode_array(*f, x.data() + k, parts.data() + k, n - k, opt2);
        run(2, a8, a16, false);
        CHECK(parts == a8);
      }
    }
  omp_set_num_threads(saved);

  // decode_array equals decode() per element.
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[size_t(i)] = uint8_t(i);
  std::vector<float> out(256);
  decode_array(float8_e5m2, codes.data(), out.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const float w = decode(float8_e5m2, uint32_t(i));
    CHECK((std::isnan(w) ? std::isnan(out[size_t(i)]) : out[size_t(i)] == w));
  }
  CHECK(first_invalid_code(float4_e2m1fn, codes.data(), 256) == 16);
  CHECK(first_invalid_code(float8_e4m3fn, codes.data(), 256) == 256);
  // Wrong code type for the format: an error naming the format.
  std::vector<uint16_t> c16(4);
  CHECK_THROWS_AS(encode_array(float8_e4m3fn, x.data(), c16.data(), 4, {}), Error);
  CHECK_THROWS_AS(encode_array(bfloat16, x.data(), codes.data(), 4, {}), Error);
  CHECK_THROWS_AS(encode_array(float32, x.data(), codes.data(), 4, {}), Error);
}

TEST_CASE("rounding and overflow names") {
  CHECK(parse_round("rn") == Round::rn);
  CHECK(parse_round("stochastic") == Round::rs);
  CHECK(parse_round("toward_zero") == Round::rz);
  CHECK(parse_overflow("saturate") == Overflow::saturate);
  CHECK(parse_overflow("nonsaturate") == Overflow::nonsaturate);
  for (Round r : kModes) CHECK(parse_round(round_name(r)) == r);
  CHECK_THROWS_AS(parse_round("nearest_odd"), Error);
  CHECK_THROWS_AS(parse_overflow("clip"), Error);
}
