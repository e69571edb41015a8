// Element and scale formats: one parametric descriptor, one generic codec.
//
// A Format describes a small binary number format by its field widths, its
// exponent bias, whether it has a sign bit, and how it encodes NaN/Inf
// (`Special`). Every limit (max finite, min normal, min subnormal, NaN code)
// is derived from those fields by constexpr functions; nothing is tabulated.
//
// Codes are unsigned integers holding the format's bits right-aligned: an
// e2m1 code is 0..15 with the sign in bit 3, an e4m3 code 0..255 with the sign
// in bit 7, a bfloat16 code 0..65535.
//
// Decoding (`decode`) is exact: every value of every format here is a float32.
// Encoding (`encode`, in encode.hpp) rounds a float32 or float64 with one of
// the rounding modes of `Round` and applies one of the overflow policies of
// `Overflow`.
//
// Special-value conventions (the same for every format of a `Special` kind):
//   Special::ieee  (e5m2, bf16, f16, f32): exponent all ones is Inf (mantissa 0)
//                  or NaN. Canonical NaN written by the encoder: sign 0,
//                  exponent and mantissa all ones (0x7F for e5m2, 0x7FFF for
//                  bf16/f16), matching CUDA's converters.
//   Special::fn    (e4m3fn, ue4m3): only S.1111.111 is NaN; no Inf.
//                  Canonical NaN 0x7F.
//   Special::fnuz  (e4m3fnuz, e5m2fnuz): 0x80 ("negative zero") is the only
//                  NaN; no Inf; no -0 (a negative result that rounds to zero
//                  is +0).
//   Special::e8m0  (e8m0fnu): unsigned, no mantissa, no zero, no subnormals;
//                  code c is 2^(c-127); 0xFF is NaN.
//   Special::none  (e2m1, e2m3, e3m2, int8): every code is finite. NaN input
//                  encodes as +max (there is nothing better; CUDA's fp4/fp6
//                  converters do the same), overflow always saturates.
// Unsigned formats (ue4m3, e8m0): negative non-zero input encodes as NaN
// (the value is not representable and the sign cannot be kept).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/bits.hpp"
#include "core/hd.hpp"

namespace fp4lab {

enum class Special : uint8_t { none, ieee, fn, fnuz, e8m0 };

// A number format. For floating formats the value of a finite code with
// exponent field E and mantissa field M is
//   normal    (E > 0 or Special::e8m0): (-1)^s * 2^(E - bias) * (1 + M / 2^man_bits)
//   subnormal (E == 0):                 (-1)^s * 2^(1 - bias) * (M / 2^man_bits)
// For the integer format (`is_int`, MXINT8) the code is a two's-complement
// integer k of `1 + man_bits` bits and the value is k * 2^-int_frac_bits()
// (int_frac_bits() is stored in `bias`).
struct Format {
  std::string_view name;  // ml_dtypes / PyTorch name, e.g. "float8_e4m3fn"
  int exp_bits;           // exponent field width (0 for int8)
  int man_bits;           // mantissa (fraction) field width; int8: magnitude bits (7)
  int bias;               // exponent bias; int8: number of fraction bits (6)
  bool is_signed;         // has a sign bit
  Special special;        // NaN / Inf encoding
  bool is_int;            // two's-complement fixed point (MXINT8 element)

  // --- derived limits (all constexpr) -------------------------------------
  FP4LAB_HD constexpr int bits() const { return is_int ? man_bits + 1 : int(is_signed) + exp_bits + man_bits; }
  // Number of codes, 2^bits(). float32's 2^32 does not fit a uint32_t and
  // wraps to 0 (so code_count() - 1u is still the right mask; use code_mask()).
  FP4LAB_HD constexpr uint32_t code_count() const { return bits() >= 32 ? 0u : 1u << bits(); }
  FP4LAB_HD constexpr uint32_t code_mask() const { return code_count() - 1u; }
  FP4LAB_HD constexpr uint32_t sign_bit() const { return is_signed ? 1u << (exp_bits + man_bits) : 0u; }
  FP4LAB_HD constexpr uint32_t magnitude_mask() const { return (1u << (exp_bits + man_bits)) - 1u; }
  FP4LAB_HD constexpr uint32_t exp_field_max() const { return (1u << exp_bits) - 1u; }
  FP4LAB_HD constexpr uint32_t man_mask() const { return (1u << man_bits) - 1u; }
  FP4LAB_HD constexpr bool has_inf() const { return special == Special::ieee; }
  FP4LAB_HD constexpr bool has_nan() const { return special != Special::none; }
  FP4LAB_HD constexpr bool has_negative_zero() const { return is_signed && !is_int && special != Special::fnuz; }
  FP4LAB_HD constexpr bool has_subnormals() const { return !is_int && special != Special::e8m0; }
  // Unbiased exponent of the smallest normal (e8m0: of code 0).
  FP4LAB_HD constexpr int min_exponent() const { return special == Special::e8m0 ? -bias : 1 - bias; }
  // Largest finite magnitude code.
  FP4LAB_HD constexpr uint32_t max_magnitude_code() const {
    if (is_int) return (1u << man_bits) - 1u;  // +127: MXINT8 is symmetric
    switch (special) {
      case Special::ieee: return ((exp_field_max() - 1u) << man_bits) | man_mask();
      case Special::fn: return (exp_field_max() << man_bits) | (man_mask() - 1u);
      case Special::e8m0: return 0xFEu;
      default: return magnitude_mask();
    }
  }
  // Code of the canonical NaN written by the encoder (undefined if !has_nan()).
  FP4LAB_HD constexpr uint32_t nan_code() const {
    switch (special) {
      case Special::fnuz: return sign_bit();
      case Special::e8m0: return 0xFFu;
      default: return magnitude_mask();  // S=0, exponent and mantissa all ones
    }
  }
  FP4LAB_HD constexpr uint32_t inf_code() const { return exp_field_max() << man_bits; }  // ieee only
  // Number of fraction bits of the integer format (value = k * 2^-frac).
  FP4LAB_HD constexpr int int_frac_bits() const { return bias; }
};

// ---- the formats -----------------------------------------------------------
//                                    name               E  M  bias  signed special         int
inline constexpr Format float4_e2m1fn{"float4_e2m1fn", 2, 1, 1, true, Special::none, false};
inline constexpr Format float6_e2m3fn{"float6_e2m3fn", 2, 3, 1, true, Special::none, false};
inline constexpr Format float6_e3m2fn{"float6_e3m2fn", 3, 2, 3, true, Special::none, false};
inline constexpr Format float8_e4m3fn{"float8_e4m3fn", 4, 3, 7, true, Special::fn, false};
inline constexpr Format float8_e5m2{"float8_e5m2", 5, 2, 15, true, Special::ieee, false};
inline constexpr Format float8_e4m3fnuz{"float8_e4m3fnuz", 4, 3, 8, true, Special::fnuz, false};
inline constexpr Format float8_e5m2fnuz{"float8_e5m2fnuz", 5, 2, 16, true, Special::fnuz, false};
inline constexpr Format float8_e8m0fnu{"float8_e8m0fnu", 8, 0, 127, false, Special::e8m0, false};
inline constexpr Format ufloat8_e4m3{"ufloat8_e4m3", 4, 3, 7, false, Special::fn, false};
// MXINT8 element (OCP MX v1.0 sec. 5.3): 8-bit two's complement, 6 fraction
// bits, value k/64. Encoding is symmetric: it saturates to +-127/64 as the
// OCP reference (microxcaling) does; the code 0x80 (-2.0) decodes but is
// never produced.
inline constexpr Format int8_mx{"int8", 0, 7, 6, true, Special::none, true};
inline constexpr Format bfloat16{"bfloat16", 8, 7, 127, true, Special::ieee, false};
inline constexpr Format float16{"float16", 5, 10, 15, true, Special::ieee, false};
inline constexpr Format float32{"float32", 8, 23, 127, true, Special::ieee, false};

// Checks of the derived limits against the formats' definitions.
static_assert(float4_e2m1fn.bits() == 4 && float6_e2m3fn.bits() == 6 && float6_e3m2fn.bits() == 6);
static_assert(float8_e4m3fn.bits() == 8 && float8_e8m0fnu.bits() == 8 && ufloat8_e4m3.bits() == 7);
static_assert(int8_mx.bits() == 8 && bfloat16.bits() == 16 && float16.bits() == 16 && float32.bits() == 32);
static_assert(float8_e4m3fn.max_magnitude_code() == 0x7E && float8_e4m3fn.nan_code() == 0x7F);
static_assert(float8_e5m2.max_magnitude_code() == 0x7B && float8_e5m2.inf_code() == 0x7C);
static_assert(float8_e4m3fnuz.nan_code() == 0x80 && float8_e4m3fnuz.max_magnitude_code() == 0x7F);
static_assert(float4_e2m1fn.max_magnitude_code() == 0x7 && float4_e2m1fn.sign_bit() == 0x8);
static_assert(float8_e8m0fnu.max_magnitude_code() == 0xFE && float8_e8m0fnu.min_exponent() == -127);
static_assert(ufloat8_e4m3.max_magnitude_code() == 0x7E && ufloat8_e4m3.sign_bit() == 0);

// ---- decoding ---------------------------------------------------------------

// True if `code` is a NaN of format `f`.
FP4LAB_HD constexpr bool is_nan_code(const Format& f, uint32_t code) {
  const uint32_t mag = code & f.magnitude_mask();
  switch (f.special) {
    case Special::ieee: return (mag >> f.man_bits) == f.exp_field_max() && (mag & f.man_mask()) != 0;
    case Special::fn: return mag == f.magnitude_mask();
    case Special::fnuz: return code == f.sign_bit();
    case Special::e8m0: return code == 0xFFu;
    default: return false;
  }
}

// Exact value of `code` as a float32 (NaN for NaN codes, +-Inf for Inf codes).
// Bits of `code` above f.bits() are ignored.
FP4LAB_HD constexpr float decode(const Format& f, uint32_t code) {
  code &= f.code_mask();
  if (f.is_int) {
    const int k = (code & f.sign_bit()) ? int(code) - int(f.code_count()) : int(code);
    return float(k) * pow2f(-f.int_frac_bits());
  }
  if (is_nan_code(f, code)) return quiet_nan_f();
  const bool neg = (code & f.sign_bit()) != 0;
  const uint32_t mag = code & f.magnitude_mask();
  const uint32_t e = mag >> f.man_bits;
  const uint32_t m = mag & f.man_mask();
  float v;
  if (f.special == Special::ieee && e == f.exp_field_max()) {
    v = inf_f();
  } else if (f.special == Special::e8m0) {
    v = pow2f(int(e) - f.bias);
  } else if (e == 0) {
    v = float(m) * pow2f(1 - f.bias - f.man_bits);
  } else {
    v = float((1u << f.man_bits) | m) * pow2f(int(e) - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

// decode() for a format known at compile time, without branches or integer-to-
// float conversions (the hot loops of the quantizers decode every element).
// Same bits as decode(F, code) for every code (tests/core/test_format.cpp
// checks all codes of every format it accepts):
//   normal     the magnitude bits shifted into float32's fields, exponent rebased;
//   subnormal  (1.m - 1) * 2^(1 - bias), one exact float subtraction
//              (1.m * 2^(1-bias) and 2^(1-bias) are float32 normals whose
//              difference m * 2^(1-bias-M) is representable);
//   Inf / NaN  per Special (NaN decodes to the canonical quiet NaN, as decode()).
// Float formats with subnormals only (not e8m0, not the integer format).
template <const Format& F>
FP4LAB_HD constexpr float decode_f32(uint32_t code) {
  static_assert(!F.is_int && F.has_subnormals() && F.exp_bits <= 8 && F.man_bits <= 23 && F.bias <= 127);
  constexpr int shift = 23 - F.man_bits;
  constexpr uint32_t rebias = uint32_t(127 - F.bias) << 23;
  constexpr uint32_t min_normal_bits = uint32_t(128 - F.bias) << 23;  // 2^(1 - bias)
  code &= F.code_mask();
  const uint32_t mag = code & F.magnitude_mask();
  const uint32_t sign = F.is_signed ? ((code >> (F.exp_bits + F.man_bits)) & 1u) << 31 : 0u;
  const uint32_t normal = (mag << shift) + rebias;
  const uint32_t subnormal = float_bits(bits_float(min_normal_bits | (mag << shift)) - bits_float(min_normal_bits));
  uint32_t v = mag < (1u << F.man_bits) ? subnormal : normal;
  if constexpr (F.special == Special::ieee) v = (mag >> F.man_bits) == F.exp_field_max() ? 0x7F800000u : v;
  constexpr Format f = F;  // a local copy: device code cannot refer to the host global F
  return is_nan_code(f, code) ? quiet_nan_f() : bits_float(v | sign);
}

// Largest finite value, smallest positive normal and subnormal of a format.
FP4LAB_HD constexpr float max_finite(const Format& f) { return decode(f, f.max_magnitude_code()); }
FP4LAB_HD constexpr float min_normal(const Format& f) {
  return f.is_int ? pow2f(-f.int_frac_bits()) : pow2f(f.min_exponent());
}
FP4LAB_HD constexpr float min_subnormal(const Format& f) {
  if (f.is_int) return pow2f(-f.int_frac_bits());
  return f.has_subnormals() ? pow2f(f.min_exponent() - f.man_bits) : pow2f(f.min_exponent());
}
// Unbiased exponent of the largest power of two <= max_finite (OCP's emax).
FP4LAB_HD constexpr int emax(const Format& f) {
  if (f.is_int) return 0;
  return int(f.max_magnitude_code() >> f.man_bits) - f.bias;
}

static_assert(max_finite(float4_e2m1fn) == 6.0f && max_finite(float6_e2m3fn) == 7.5f);
static_assert(max_finite(float6_e3m2fn) == 28.0f && max_finite(float8_e4m3fn) == 448.0f);
static_assert(max_finite(float8_e5m2) == 57344.0f && max_finite(float8_e4m3fnuz) == 240.0f);
static_assert(max_finite(float8_e5m2fnuz) == 57344.0f && max_finite(int8_mx) == 127.0f / 64.0f);
static_assert(max_finite(float32) == 0x1.fffffep127f && max_finite(bfloat16) == 0x1.fep127f);
static_assert(emax(float4_e2m1fn) == 2 && emax(float8_e4m3fn) == 8 && emax(float8_e5m2) == 15);
static_assert(emax(float6_e2m3fn) == 2 && emax(float6_e3m2fn) == 4 && emax(float8_e8m0fnu) == 127);
static_assert(min_subnormal(float4_e2m1fn) == 0.5f && min_subnormal(float8_e4m3fn) == 0x1p-9f);
static_assert(min_normal(float8_e8m0fnu) == 0x1p-127f);

// ---- lookup by name -------------------------------------------------------

// All formats, in the order `fp4lab formats` lists them.
inline constexpr const Format* all_formats[] = {
    &float4_e2m1fn,  &float6_e2m3fn, &float6_e3m2fn, &float8_e4m3fn, &float8_e5m2, &float8_e4m3fnuz, &float8_e5m2fnuz,
    &float8_e8m0fnu, &ufloat8_e4m3,  &int8_mx,       &bfloat16,      &float16,     &float32};

// Finds a format by its full name or a short alias (e2m1, e2m3, e3m2, e4m3,
// e5m2, e4m3fnuz, e5m2fnuz, e8m0, ue4m3, int8/mxint8, bf16, fp16/f16/half,
// fp32/f32). Throws fp4lab::Error naming the valid choices otherwise.
const Format& format_by_name(std::string_view name);
// The valid names, comma-separated, for error messages and --help.
std::string format_names();
// The short name used in JSON and describe(): e2m1, e2m3, e3m2, e4m3, e5m2,
// e4m3fnuz, e5m2fnuz, e8m0, ue4m3, int8, bf16, f16, f32 (the format's first
// alias; format_by_name accepts it back).
std::string_view short_format_name(const Format& f);

}  // namespace fp4lab
