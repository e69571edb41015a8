// Independent reference for the core tests: each format's values written from
// its definition (OCP MX v1.0, IEEE 754, the fnuz/e8m0 conventions), and a
// brute-force reference encoder that rounds by searching the sorted list of
// representable values. Nothing here calls fp4lab's Format methods, decode()
// or encode(): the tests compare the library against this.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/encode.hpp"
#include "core/format.hpp"

namespace ref {

enum class Kind { none, ieee, fn, fnuz, e8m0, int8 };

// Field widths as the specs state them (the lead's table restated, not read
// from fp4lab::Format).
struct Spec {
  const fp4lab::Format* f;
  int e, m, bias;
  bool is_signed;
  Kind kind;
  int bits() const { return kind == Kind::int8 ? 8 : int(is_signed) + e + m; }
  uint32_t count() const { return 1u << bits(); }
};

inline const std::vector<Spec>& specs() {
  using namespace fp4lab;
  static const std::vector<Spec> s = {
      {&float4_e2m1fn, 2, 1, 1, true, Kind::none},    {&float6_e2m3fn, 2, 3, 1, true, Kind::none},
      {&float6_e3m2fn, 3, 2, 3, true, Kind::none},    {&float8_e4m3fn, 4, 3, 7, true, Kind::fn},
      {&float8_e5m2, 5, 2, 15, true, Kind::ieee},     {&float8_e4m3fnuz, 4, 3, 8, true, Kind::fnuz},
      {&float8_e5m2fnuz, 5, 2, 16, true, Kind::fnuz}, {&float8_e8m0fnu, 8, 0, 127, false, Kind::e8m0},
      {&ufloat8_e4m3, 4, 3, 7, false, Kind::fn},      {&int8_mx, 0, 7, 6, true, Kind::int8},
      {&bfloat16, 8, 7, 127, true, Kind::ieee},       {&float16, 5, 10, 15, true, Kind::ieee},
  };
  return s;
}

inline double nan() { return std::numeric_limits<double>::quiet_NaN(); }
inline double inf() { return std::numeric_limits<double>::infinity(); }

// Value of a code from the format's definition, in double.
inline double value(const Spec& s, uint32_t code) {
  if (s.kind == Kind::int8) return double(int8_t(uint8_t(code))) / 64.0;
  const uint32_t sign_bit = s.is_signed ? 1u << (s.e + s.m) : 0u;
  const bool neg = (code & sign_bit) != 0;
  const uint32_t mag = code & ((1u << (s.e + s.m)) - 1u);
  const uint32_t E = mag >> s.m, M = mag & ((1u << s.m) - 1u);
  const uint32_t Emax = (1u << s.e) - 1u;
  switch (s.kind) {
    case Kind::ieee:
      if (E == Emax) return M == 0 ? (neg ? -inf() : inf()) : nan();
      break;
    case Kind::fn:
      if (E == Emax && M == (1u << s.m) - 1u) return nan();
      break;
    case Kind::fnuz:
      if (code == sign_bit) return nan();
      break;
    case Kind::e8m0:
      if (code == 0xFF) return nan();
      return std::ldexp(1.0, int(code) - 127);
    default: break;
  }
  double v =
      E == 0 ? std::ldexp(double(M), 1 - s.bias - s.m) : std::ldexp(double((1u << s.m) + M), int(E) - s.bias - s.m);
  return neg ? -v : v;
}

// The canonical NaN code fp4lab writes (format.hpp's convention), or -1 for
// formats without NaN.
inline int64_t canonical_nan(const Spec& s) {
  switch (s.kind) {
    case Kind::ieee:
    case Kind::fn: return (1u << (s.e + s.m)) - 1u;
    case Kind::fnuz: return 1u << (s.e + s.m);
    case Kind::e8m0: return 0xFF;
    default: return -1;
  }
}

struct Entry {
  double v;
  uint32_t code;
};

// Sorted non-negative finite values with their codes (+0 first).
inline std::vector<Entry> positive_values(const Spec& s) {
  std::vector<Entry> out;
  for (uint32_t c = 0; c < s.count(); ++c) {
    const double v = value(s, c);
    if (std::isnan(v) || std::isinf(v) || v < 0 || (v == 0 && std::signbit(v))) continue;
    if (s.kind == Kind::int8 && c >= 0x80) continue;
    out.push_back({v, c});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.v < b.v; });
  return out;
}

// Code of -v for a positive-value code.
inline uint32_t negate(const Spec& s, uint32_t code) {
  if (s.kind == Kind::int8) return (256u - code) & 0xFFu;
  if (s.kind == Kind::fnuz && code == 0) return 0;
  return code | (1u << (s.e + s.m));
}

// Brute-force encoder: nearest representable values below and above |x|, the
// rounding rule applied to them, overflow per encode.hpp's documented policy.
// For rs, `updiscard` says whether the stochastic rule rounds up (computed by
// the caller from the random bits).
struct Ref {
  Spec s;
  std::vector<Entry> pos;
  double over;  // the first value beyond max in an unbounded exponent range
  explicit Ref(const Spec& sp) : s(sp), pos(positive_values(sp)) {
    const double max = pos.back().v;
    if (s.kind == Kind::int8)
      over = max + 1.0 / 64;
    else if (s.kind == Kind::e8m0)
      over = 2 * max;
    else
      over = max + std::ldexp(1.0, int(std::floor(std::log2(max))) - s.m);
  }
  // Nearest values below (or equal) and above a non-negative finite |x|
  // (`over` above max).
  std::pair<double, double> bracket(double a) const {
    auto it = std::upper_bound(pos.begin(), pos.end(), a, [](double v, const Entry& e) { return v < e.v; });
    if (it == pos.begin()) return {0.0, it->v};  // e8m0 below 2^-127 (no zero)
    return {(it - 1)->v, it == pos.end() ? over : it->v};
  }
  uint32_t max_code(bool neg) const { return neg ? negate(s, pos.back().code) : pos.back().code; }

  uint32_t overflow(bool neg, fp4lab::Overflow o) const {
    if (o == fp4lab::Overflow::saturate || s.kind == Kind::none || s.kind == Kind::int8) return max_code(neg);
    if (s.kind == Kind::ieee) return ((1u << s.e) - 1u) << s.m | (neg ? 1u << (s.e + s.m) : 0u);
    if (s.kind == Kind::fn) return uint32_t(canonical_nan(s)) | (neg ? 1u << (s.e + s.m) : 0u);
    return uint32_t(canonical_nan(s));
  }

  // x: the exact input (float inputs are passed exactly as doubles; double
  // inputs must be exactly x). rs_up: rounding decision for rs.
  uint32_t encode(double x, fp4lab::Round r, fp4lab::Overflow o, bool rs_up = false) const {
    using fp4lab::Round;
    if (std::isnan(x)) return canonical_nan(s) >= 0 ? uint32_t(canonical_nan(s)) : max_code(false);
    const bool neg_in = std::signbit(x);
    if (!s.is_signed && neg_in && x != 0) return uint32_t(canonical_nan(s));
    const bool neg = neg_in && s.is_signed;
    const double a = std::fabs(x);
    auto with_sign = [&](uint32_t mag_code) {
      if (!neg) return mag_code;
      if (mag_code == 0) return (s.kind == Kind::fnuz || s.kind == Kind::int8) ? 0u : negate(s, 0);
      return negate(s, mag_code);
    };
    if (std::isinf(a)) return overflow(neg, o);
    if (s.kind == Kind::e8m0 && a < pos.front().v) return 0u;
    // lo = largest value <= a, hi = smallest value > a (or `over`).
    auto it = std::upper_bound(pos.begin(), pos.end(), a, [](double v, const Entry& e) { return v < e.v; });
    const Entry lo = *(it - 1);
    if (lo.v == a) return with_sign(lo.code);
    const bool hi_over = it == pos.end();
    const double hv = hi_over ? over : it->v;
    const uint32_t hcode = hi_over ? lo.code + 1 : it->code;  // parity of the virtual next code
    bool up;
    if (a >= over) {
      // beyond the first unrepresentable value: away-from-zero modes overflow
      up = true;
      if (r == Round::rz || (r == Round::rp && neg) || (r == Round::rm && !neg)) up = false;
    } else {
      const double dl = a - lo.v, dh = hv - a;
      switch (r) {
        // Ties go to the even code; e8m0 has no mantissa and follows PyTorch's
        // float8_e8m0fnu (the implied mantissa bit is the LSB, so ties round up).
        case Round::rn: up = dh < dl || (dh == dl && (s.kind == Kind::e8m0 || (hcode & 1u) == 0)); break;
        case Round::rna: up = dh <= dl; break;
        case Round::rz: up = false; break;
        case Round::rp: up = !neg; break;
        case Round::rm: up = neg; break;
        default: up = rs_up; break;
      }
    }
    if (!up) return with_sign(lo.code);
    if (hi_over || a >= over) return overflow(neg, o);
    return with_sign(hcode);
  }
};

// The reference of one of specs()' formats (built once), and its round-to-nearest-even saturating encoder,
// decoder and rounding (for the schemes' tests, which state their constructions in these terms).
inline const Ref& ref_of(const fp4lab::Format& f) {
  static const std::vector<Ref> all = [] {
    std::vector<Ref> v;
    for (const Spec& sp : specs()) v.emplace_back(sp);
    return v;
  }();
  for (const Ref& r : all)
    if (r.s.f == &f) return r;
  throw std::logic_error("ref::ref_of: no reference for this format");
}
inline uint32_t encode_rn_sat(const fp4lab::Format& f, double x) {
  return ref_of(f).encode(x, fp4lab::Round::rn, fp4lab::Overflow::saturate);
}
inline double value_of(const fp4lab::Format& f, uint32_t code) { return value(ref_of(f).s, code); }
inline float round_rn_sat(const fp4lab::Format& f, double x) { return float(value_of(f, encode_rn_sat(f, x))); }

}  // namespace ref
