// Encoding float32 / float64 values into any Format of format.hpp.
//
// Rounding (`Round`, PTX names):
//   rn   nearest, ties to even code          rna  nearest, ties away from zero
//        (e8m0 has no mantissa bits: its ties, 1.5 * 2^k, round up, as PyTorch's
//        float8_e8m0fnu and ml_dtypes do -- checked against ml_dtypes 0.6)
//   rz   toward zero                         rp   toward +Inf
//   rm   toward -Inf                         rs   stochastic (below)
// Rounding happens on the exact input value (a float64 input is not first
// rounded to float32), at the target's precision: in the subnormal range the
// quantum is the subnormal step; MXINT8's quantum is 2^-6.
//
// Overflow (`Overflow`), applied when the rounded magnitude exceeds the largest
// finite code:
//   saturate     -> +-max finite (PTX .satfinite). Inf input -> +-max as well.
//   nonsaturate  -> IEEE behaviour: +-Inf where the format has Inf, else its
//                   NaN, when the rounding direction points away from zero
//                   (rn, rna, rs; rp for positive, rm for negative values);
//                   +-max finite otherwise (rz, rp for negative, rm for
//                   positive), exactly as an IEEE conversion does.
//                   Inf input -> Inf, else NaN. The NaN of an overflowed
//                   e4m3fn value keeps its sign (0xFF for negatives, as
//                   CUDA's converters do). Formats with neither Inf nor NaN
//                   (e2m1, e2m3, e3m2, int8) always saturate.
// NaN input -> the format's canonical NaN (format.hpp), +max where it has none.
// Underflow: values below the smallest subnormal round to +-0 (or to it) by the
// rounding mode; -0 is kept where the format has it. e8m0 has no zero: zero and
// values below 2^-127 encode as code 0 (2^-127).
//
// Stochastic rounding (rs), following PTX cvt.rs ("the carry out of the
// integer addition of the supplied random bits to the truncated off
// (discarded) bits of mantissa"), with a random value r of W bits (W = 32 by
// default; 8, 13 or 16 under the PTX x4/x2 contract, core/sr.hpp). With D the
// number of bits of the input's magnitude significand that the target
// discards (D grows in the target's subnormal range):
//   D <= W: r mod 2^D is added to the D discarded bits; the magnitude rounds
//           up iff discarded + (r mod 2^D) >= 2^D: probability exactly
//           discarded / 2^D, so E[q(x)] = x;
//   D >  W: r is added to the top W discarded bits (r lands right below the
//           target's last kept bit; the lower discarded bits are truncated
//           first): rounds up iff top_W(discarded) + r >= 2^W, probability
//           floor(2^W f) / 2^W for the residual f = discarded / 2^D (a bias of
//           up to 2^-W of a quantum toward zero; below 2^-W it never rounds up).
// With W = 32 this is fp4lab's per-element contract; with W = 8 the PTX
// cvt.rs.e2m1x4 / e4m3x4 one (r/256 of a quantum added, then truncated).
// Overflow under rs follows the away-from-zero rule above.
//
// Example: encode(float8_e4m3fn, 0.3f, Round::rn, Overflow::saturate) == 0x2A
// (0.3 lies between 0.28125 = 0x29 and 0.3125 = 0x2A, nearer the latter).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/bits.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"

namespace fp4lab {

enum class Round : uint8_t { rn, rna, rz, rp, rm, rs };
enum class Overflow : uint8_t { saturate, nonsaturate };

namespace detail {

template <class T>
struct SourceFloat;
template <>
struct SourceFloat<float> {
  using U = uint32_t;
  static constexpr int man = 23, width = 32, bias = 127;
  FP4LAB_HD static constexpr U bits(float x) { return float_bits(x); }
};
template <>
struct SourceFloat<double> {
  using U = uint64_t;
  static constexpr int man = 52, width = 64, bias = 1023;
  FP4LAB_HD static constexpr U bits(double x) { return double_bits(x); }
};

// Does a rounding mode move a value of this sign away from zero on overflow?
FP4LAB_HD constexpr bool overflows_to_infinity(Round r, bool negative) {
  switch (r) {
    case Round::rz: return false;
    case Round::rp: return !negative;
    case Round::rm: return negative;
    default: return true;
  }
}

// Code for a finite value whose rounded magnitude is beyond the largest finite.
FP4LAB_HD constexpr uint32_t overflow_code(const Format& f, bool negative, bool to_infinity, Overflow o) {
  const uint32_t s = negative ? f.sign_bit() : 0u;
  if (o == Overflow::nonsaturate && to_infinity && f.has_nan()) {
    // e4m3fn keeps the sign: an overflowed negative value is 0xFF (as CUDA).
    return f.has_inf() ? (s | f.inf_code()) : (f.special == Special::fn ? s | f.nan_code() : f.nan_code());
  }
  if (f.is_int && negative) return (f.code_count() - f.max_magnitude_code()) & (f.code_count() - 1u);
  return s | f.max_magnitude_code();
}

// The branch-free encoders' last step: the code of float32 magnitude bits `a`
// (sign code bit `sign`) whose rounded magnitude code is `mag`: overflow (Inf
// input or mag beyond the largest finite code) by the policy as in encode(),
// NaN input to the format's NaN (+max where it has none), fnuz's -0 to +0.
template <const Format& F>
FP4LAB_HD constexpr uint32_t fast_code(uint32_t a, uint32_t sign, uint32_t mag, Overflow o) {
  constexpr uint32_t max_code = F.max_magnitude_code();
  if constexpr (F.special == Special::none) {
    // Every code finite, overflow saturates under both policies: a clamp. An
    // Inf input's rounded magnitude is beyond max_code too (exponent 255 is
    // above every target's range), so only NaN needs its own select. Fewer
    // integer instructions than the general form below (the GPU kernels are
    // bound by the integer pipe).
    const uint32_t clamped = mag < max_code ? mag : max_code;
    return a > 0x7F800000u ? max_code : (sign | clamped);
  }
  const bool overflow = a >= 0x7F800000u || mag > max_code;  // Inf or too large (NaN handled below)
  const uint32_t ovf =
      (o == Overflow::nonsaturate && F.has_nan())
          ? (F.has_inf() ? (sign | F.inf_code()) : (F.special == Special::fn ? sign | F.nan_code() : F.nan_code()))
          : (sign | max_code);
  uint32_t code = sign | mag;
  if constexpr (F.special == Special::fnuz) code = mag == 0 ? 0u : code;
  code = overflow ? ovf : code;
  constexpr uint32_t nan_result = F.has_nan() ? F.nan_code() : max_code;
  return a > 0x7F800000u ? nan_result : code;
}

}  // namespace detail

// Encodes x into format f. `rbits` are the random bits of stochastic rounding
// (ignored by the other modes): its low `sr_width` bits (1..32) are the random
// value r above. Returns the code (bits above f.bits() zero).
template <class T>
FP4LAB_HD constexpr uint32_t encode(const Format& f, T x, Round r, Overflow o, uint32_t rbits = 0,
                                    int sr_width = 32) {
  using Src = detail::SourceFloat<T>;
  using U = typename Src::U;
  const U u = Src::bits(x);
  const bool negative = (u >> (Src::width - 1)) != 0;
  const U a = u & (~U(0) >> 1);
  const U inf_bits = (~U(0) >> 1) >> Src::man << Src::man;
  if (a > inf_bits) return f.has_nan() ? f.nan_code() : f.max_magnitude_code();
  if (!f.is_signed && negative && a != 0) return f.has_nan() ? f.nan_code() : 0u;
  const bool neg = negative && f.is_signed;
  if (a == inf_bits) return detail::overflow_code(f, neg, true, o);
  if (a == 0) return f.has_negative_zero() && neg ? f.sign_bit() : 0u;

  // Normalise: |x| = sig * 2^(e - Src::man) with sig in [2^man, 2^(man+1)).
  const U exp_field = a >> Src::man;
  const U man_field = a & ((U(1) << Src::man) - 1);
  int e;
  uint64_t sig;
  int sig_zeros = 0;  // zero bits appended to a subnormal input by normalising
  if (exp_field == 0) {
    const int lz = clz64(uint64_t(man_field)) - (63 - Src::man);
    sig_zeros = lz;
    sig = uint64_t(man_field) << lz;
    e = 1 - Src::bias - lz;
  } else {
    sig = uint64_t(man_field) | (uint64_t(1) << Src::man);
    e = int(exp_field) - Src::bias;
  }

  // Exponent of the target's quantum (ulp) at this magnitude.
  int ulp_e;
  int binade_e = 0;  // unbiased exponent of the target binade (floats)
  if (f.is_int) {
    ulp_e = -f.int_frac_bits();
  } else {
    const int emin = f.min_exponent();
    if (e < emin && !f.has_subnormals()) return 0u;  // e8m0: clamps to 2^-127
    binade_e = e > emin ? e : emin;
    ulp_e = binade_e - f.man_bits;
  }
  // |x| = sig * 2^d quanta.
  const int d = (e - Src::man) - ulp_e;
  uint64_t q;
  bool round_up = false;
  if (d >= 0) {
    if (d > 40) return detail::overflow_code(f, neg, detail::overflows_to_infinity(r, neg), o);
    q = sig << d;  // exact, nothing discarded
  } else {
    const int shift = -d;  // number of discarded bits, >= 1
    q = shift < 64 ? sig >> shift : 0u;
    const uint64_t rem = shift < 64 ? sig & ((uint64_t(1) << shift) - 1u) : sig;
    const bool above_half = shift < 64 && rem > (uint64_t(1) << (shift - 1));
    const bool at_half = shift < 64 && rem == (uint64_t(1) << (shift - 1));
    switch (r) {
      case Round::rn: round_up = above_half || (at_half && (q & 1u)); break;
      case Round::rna: round_up = above_half || at_half; break;
      case Round::rz: break;
      case Round::rp: round_up = !negative && rem != 0; break;
      case Round::rm: round_up = negative && rem != 0; break;
      case Round::rs: {
        // D counts the input's own significand bits (a subnormal input's
        // mantissa field as stored), not the zeros appended by normalising:
        // PTX adds the random bits to the FP32 word's discarded low bits.
        const int D = shift - sig_zeros, W = sr_width;
        const uint64_t wmask = (uint64_t(1) << W) - 1u;
        const uint64_t rw = uint64_t(rbits) & wmask;
        const uint64_t rem_in = shift < 64 ? rem >> sig_zeros : 0u;
        if (shift >= 64 || D <= 0) {
          const uint64_t top = shift - W < 64 ? rem >> (shift - W) : 0u;
          round_up = rem != 0 && top + rw > wmask;
        } else if (D <= W) {
          const uint64_t mask = (uint64_t(1) << D) - 1u;
          round_up = rem_in + (rw & mask) > mask;
        } else {
          const uint64_t top = rem >> (shift - W);
          round_up = top + rw > wmask;
        }
        break;
      }
    }
  }
  q += round_up ? 1u : 0u;

  uint64_t mag;
  if (f.is_int) {
    mag = q;
  } else {
    // ((binade + bias - 1) << M) + q: q carries its implicit bit into the
    // exponent field, so rounding up across a binade needs no special case.
    // (For e8m0, M = 0 and code 0 is the normal 2^-127: the same formula.)
    mag = (uint64_t(binade_e + f.bias - 1) << f.man_bits) + q;
  }
  if (mag > f.max_magnitude_code()) {
    return detail::overflow_code(f, neg, detail::overflows_to_infinity(r, neg), o);
  }
  if (mag == 0) return f.has_negative_zero() && neg ? f.sign_bit() : 0u;
  if (f.is_int) return neg ? uint32_t(f.code_count() - mag) : uint32_t(mag);
  return (neg ? f.sign_bit() : 0u) | uint32_t(mag);
}

// E2M1 (float4_e2m1fn) round to nearest even by float32 rounding, for |x| >= 0
// (not NaN). With B = 2^23, where the float32 quantum is 1, the three sums
//   2|x| + B          rounds |x| to the quantum 0.5 of [0, 2):  B + code on [0, 2)  (codes 0..4)
//   |x| + (B + 2)     rounds |x| to the quantum 1 of [2, 4):    B + code on [2, 4)  (codes 4..6)
//   |x|/2 + (B + 4)   rounds |x| to the quantum 2 of [4, 8):    B + code on [4, 8)  (codes 6..8)
// are each >= the right one outside their range (monotone in |x|), so their
// minimum, capped at B + 7 (saturation to 6; Inf included), is B + the
// magnitude code, ties to the even code (adding the even 2 or 4 keeps the
// parity). Returns float_bits(B + code): subtract kE2m1MagnitudeBase for the
// code. Three float operations and two integer minimums: the GPU kernels use it
// (with the sign and NaN handled per block) because their integer pipe is the
// bottleneck; encode_rn_f32<float4_e2m1fn> is built on it. Tests: every
// float32 pattern of |x| in [2^-10, 16) and a sampled sweep of all others
// against encode().
inline constexpr uint32_t kE2m1MagnitudeBase = 0x4B000000u;                   // float_bits(2^23)
FP4LAB_HD constexpr float mul_add_exact_product(float a, float b, float c) {  // a * b exact (or overflowing)
#ifdef __CUDA_ARCH__
  if (!__builtin_is_constant_evaluated()) return __fmaf_rn(a, b, c);  // one FFMA; same value as below
#endif
  return a * b + c;
}
FP4LAB_HD constexpr uint32_t e2m1_rn_magnitude_biased(float abs_x) {
  constexpr float B = 8388608.0f;
  // Signed minimums of the bits (all are positive floats, or NaN's bits for a
  // NaN input: below 2^31 either way): SSE2 has a signed 32-bit compare only.
  const int32_t c1 = int32_t(float_bits(mul_add_exact_product(abs_x, 2.0f, B)));
  const int32_t c2 = int32_t(float_bits(abs_x + (B + 2.0f)));
  const int32_t c3 = int32_t(float_bits(mul_add_exact_product(abs_x, 0.5f, B + 4.0f)));
  constexpr int32_t cap = int32_t(kE2m1MagnitudeBase + 7u);
  const int32_t m12 = c1 < c2 ? c1 : c2;
  const int32_t m3 = c3 < cap ? c3 : cap;
  return uint32_t(m12 < m3 ? m12 : m3);
}

// The value of E2M1 round-to-nearest-even, without the code: returns
// float_bits(decode(encode_rn_f32<float4_e2m1fn>(y, o))) for y's bits yb, y
// not NaN, either policy. The magnitude code c of e2m1_rn_magnitude_biased
// becomes its value's bits directly: from c = 2 (1.0) up the code's bits are
// the exponent's low bits and the mantissa bit, (c << 22) + bits(0.5); c = 1
// is 0.5, c = 0 zero. Used where only values are wanted (the GPU's BF16
// operands).
FP4LAB_HD constexpr uint32_t e2m1_rn_value_bits(uint32_t yb) {
  const uint32_t c = e2m1_rn_magnitude_biased(bits_float(yb & 0x7FFFFFFFu)) - kE2m1MagnitudeBase;
  const uint32_t v = c >= 2 ? (c << 22) + 0x3F000000u : (c == 1 ? 0x3F000000u : 0u);
  return v | (yb & 0x80000000u);
}

// The value of round-to-nearest-even with saturation, without the code: returns
// float_bits(decode(encode_rn_f32<F>(y, Overflow::saturate))) for y's bits yb,
// y not NaN, F a signed floating-point format with subnormals and fewer than
// 23 mantissa bits (the FP8 and FP6 elements). |y| is first clamped to F's
// largest finite value (saturation: the result of anything above it, Inf
// included), then rounded in place: in F's normal range by adding half an ulp
// of F (plus the tie-to-even bit) and clearing the bits F lacks; below it by
// one float addition of a number whose ulp is F's subnormal quantum (the
// hardware rounds to nearest even) and its subtraction (exact). The sign is
// kept (-0 stays -0, as E4M3 / E5M2 code it). Used where only values are
// wanted (the GPU's BF16 GEMM operands).
template <const Format& F>
FP4LAB_HD constexpr uint32_t rn_sat_value_bits(uint32_t yb) {
  static_assert(!F.is_int && F.is_signed && F.has_subnormals() && F.man_bits < 23 && F.exp_bits <= 8);
  constexpr uint32_t max_bits = float_bits(max_finite(F));
  constexpr int shift = 23 - F.man_bits;
  constexpr uint32_t min_normal_bits = uint32_t(F.min_exponent() + 127) << 23;
  constexpr float magic = pow2f(F.min_exponent() - F.man_bits + 23);
  const uint32_t m = yb & 0x7FFFFFFFu;
  const uint32_t a = m < max_bits ? m : max_bits;
  const uint32_t normal = (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) & ~((1u << shift) - 1u);
  const uint32_t subnormal = float_bits((bits_float(a) + magic) - magic);
  return (a < min_normal_bits ? subnormal : normal) | (yb & 0x80000000u);
}

// Round-to-nearest-even magnitude code of float32 magnitude bits `a` (|x|) in
// a format F of up to 16 bits with subnormals (not bfloat16: see below), by one
// float rounding. With E = max(exponent of |x|, F's minimum normal exponent)
// and the float M = 2^(E + 23 - man), whose ulp is F's quantum at |x|, the
// float sum |x| + M rounds |x| (RNE, in hardware) to whole quanta q =
// bits(|x| + M) - bits(M), and the code is q plus the code of 2^E's binade
// start, (E - emin) << man. |x| is first capped at 2^(emax + 1), so Inf (and
// NaN: callers handle it) give a code above every finite one (overflow).
// Returns codes > max_magnitude_code() for overflowing magnitudes.
template <const Format& F>
FP4LAB_HD constexpr uint32_t rn_magnitude_code(uint32_t a) {
  static_assert(!F.is_int && F.has_subnormals() && F.man_bits < 23 && emax(F) < 100);
  constexpr int sh = 23 - F.man_bits;
  constexpr uint32_t emin_bits = uint32_t(F.min_exponent() + 127) << 23;
  constexpr uint32_t cap_bits = uint32_t(emax(F) + 1 + 127) << 23;
  constexpr uint32_t code_offset = (emin_bits >> sh) + (uint32_t(sh) << F.man_bits);
  // Signed compares (a < 2^31: magnitude bits): SSE2 has a signed 32-bit compare only.
  const uint32_t c = int32_t(a) < int32_t(cap_bits) ? a : cap_bits;
  const uint32_t e = c & 0x7F800000u;
  const uint32_t m = (int32_t(e) > int32_t(emin_bits) ? e : emin_bits) + (uint32_t(sh) << 23);
  return float_bits(bits_float(c) + bits_float(m)) - m + (m >> sh) - code_offset;
}

// Round-to-nearest-even encode of float32 into a signed floating format with
// subnormals (every format here except e8m0, ue4m3 and int8), without branches, so
// loops over it vectorise. Identical results to encode(F, x, Round::rn, o);
// tests check that over all float32 inputs of a sampled grid and every edge,
// and exhaustively on the ranges around E2M1's, E4M3's and E5M2's codes.
// The magnitude: e2m1_rn_magnitude_biased() for E2M1, rn_magnitude_code()
// for the other formats of at most 16 bits, and integer rounding of the bits
// for bfloat16 (its exponent range is float32's, so no float M above exists,
// and none is needed: its subnormals are float32's cut short).
template <const Format& F>
FP4LAB_HD constexpr uint32_t encode_rn_f32(float x, Overflow o) {
  static_assert(!F.is_int && F.is_signed && F.has_subnormals() && F.man_bits < 23);
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t sign = (u >> (31 - F.exp_bits - F.man_bits)) & F.sign_bit();  // float sign -> code sign
  uint32_t mag;
  if constexpr (F.exp_bits == 2 && F.man_bits == 1 && F.bias == 1 && F.special == Special::none) {
    mag = e2m1_rn_magnitude_biased(bits_float(a)) - kE2m1MagnitudeBase;  // (NaN: fast_code)
  } else if constexpr (emax(F) < 100) {
    mag = rn_magnitude_code<F>(a);
  } else {
    constexpr int shift = 23 - F.man_bits;
    constexpr uint32_t rebias = uint32_t(127 - F.bias) << 23;
    const uint32_t normal = (a - rebias + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) >> shift;
    if constexpr (F.exp_bits == 8 && F.bias == 127) {
      // bfloat16: float32's exponent field, so its codes are the top bits of
      // float32's (subnormals included): the integer rounding above holds
      // across the subnormal boundary too.
      mag = normal;
    } else {
      constexpr uint32_t min_normal_bits = uint32_t(F.min_exponent() + 127) << 23;
      // A float whose ulp equals the target's subnormal quantum: adding it rounds
      // |x| (RNE, in hardware) to a whole number of quanta held in its low bits.
      constexpr float magic = pow2f(F.min_exponent() - F.man_bits + 23);
      const uint32_t subnormal = float_bits(bits_float(a) + magic) - float_bits(magic);
      // A mask blend, not `?:`: with a select GCC sinks the float add into the
      // subnormal branch and then (trapping math, which we keep) refuses to
      // if-convert the loop, so the loop does not vectorise.
      const uint32_t sub_mask = 0u - uint32_t(a < min_normal_bits);
      mag = (subnormal & sub_mask) | (normal & ~sub_mask);
    }
  }
  return detail::fast_code<F>(a, sign, mag, o);
}

// E2M1 (float4_e2m1fn) stochastic rounding of a magnitude, as encode_rs_f32's
// contract below gives it, in one computation for every exponent instead of
// its normal and target-subnormal branches (fewer integer-pipe instructions:
// the GPU's SR kernels are bound by that pipe). a: y's bits (its sign bit
// is ignored), y not NaN.
// Returns the magnitude code before saturation (above 7 for |y| beyond the
// format: callers clamp, as fast_code does). With e = a's exponent field:
//   E2M1's quantum at |y| is 0.5 below 2 and 2^(e - 128) above; the bits of
//   |y|'s significand sig (implicit bit set, also for e == 0, as the
//   contract's subnormal branch takes it) below that quantum are the
//   discarded ones: d = 149 - e of them below 2 (e <= 127), 22 above.
//   sp = clamp(e - 117, 0, 10) = 32 - min(d, 32), sn = max(117 - e, 0) = d - 32 where d > 32:
//   X = (sig >> sn) << sp as 64 bits holds the discarded bits (their top 32
//   where d > 32, truncated as the contract truncates them) in its low word
//   and the whole quanta in its high word; rbits << sp (mod 2^32) is the
//   contract's random addend (the low min(d, 32) bits of rbits, left-aligned);
//   q = (X + (rbits << sp mod 2^32)) >> 32 is the rounded count of quanta, and
//   each binade above [1, 2) adds 2 codes: 2 (e - 127).
// W < 32 (a W-bit random value, encode()'s rule): d >= 22 > W always, so the
// addend is r << (32 - W), r's top bit right below the quantum.
// On the GPU, W = 8 takes e2m1_rs8_magnitude_fp below (the same codes, on the
// FP pipe); the host and constant evaluation take this integer form.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ uint32_t e2m1_rs8_magnitude_fp(uint32_t a, uint32_t rbits);
#endif
template <int W = 32>
FP4LAB_HD constexpr uint32_t e2m1_rs_magnitude(uint32_t a, uint32_t rbits) {
  static_assert(W >= 1 && W <= 32);
#if defined(__CUDA_ARCH__)
  if constexpr (W == 8)
    if (!__builtin_is_constant_evaluated()) return e2m1_rs8_magnitude_fp(a, rbits);
#endif
  const uint32_t top = a >> 23;  // exponent field, the sign above it
  const int32_t e = int32_t(top & 0xFFu);
  const int32_t s = e - 117;
  const uint32_t sp = uint32_t(s < 0 ? 0 : (s > 10 ? 10 : s));
  const uint32_t sn = uint32_t(s < 0 ? -s : 0);
  // (a & 0x7FFFFF) | 0x800000 as a multiply-add (the FMA pipe, not the integer ALU's two logic operations).
  const uint32_t sig = shr_clamped(a - (top - 1u) * 0x800000u, sn);
  const uint32_t p = 1u << sp;
  uint32_t add;
  if constexpr (W == 32) {
    add = rbits * p;
  } else {
    add = (rbits & ((1u << W) - 1u)) << (32 - W);
  }
  const uint32_t q = uint32_t((uint64_t(sig) * p + add) >> 32);
  const int32_t k = 2 * (e - 127);
  return q + uint32_t(k > 0 ? k : 0);
}

#if defined(__CUDA_ARCH__)
// e2m1_rs_magnitude<8> in floating point, for the GPU's SR kernels (bound by
// the integer pipe): the 8-bit carry rule is t = |y| + (r / 256) step(|y|)
// (step 0.5 below 2, 1 below 4, else 2), truncated to the E2M1 grid. The fma
// rounds toward zero, and every grid point is a float, so the grid point
// below fl_rz(t) is the one below the exact t; E2M1's three magic sums of
// e2m1_rn_magnitude_biased with rounding toward zero then give that grid
// point's code (their minimum, capped at 7: codes above 7 saturate in the
// callers either way). Returns the magnitude code (0..7). a: |y|'s bits,
// y not NaN (callers select NaN's code). Equal to the integer form on every
// BF16 pattern x all 256 bytes and on sampled float32 (tests/cuda/test_quantize.cpp).
__device__ __forceinline__ uint32_t e2m1_rs8_magnitude_fp(uint32_t a, uint32_t rbits) {
  constexpr float B = 8388608.0f;
  const float x = bits_float(a & 0x7FFFFFFFu);
  const float unit = x < 2.0f ? 0.5f / 256.0f : (x < 4.0f ? 1.0f / 256.0f : 2.0f / 256.0f);
  const float r = bits_float(0x4B000000u | (rbits & 0xFFu)) - B;  // exact: the byte as a float
  const float t = __fmaf_rz(r, unit, x);                            // exact product, one RZ sum
  const float c1 = __fmaf_rz(t, 2.0f, B);
  const float c2 = __fadd_rz(t, B + 2.0f);
  const float c3 = __fmaf_rz(t, 0.5f, B + 4.0f);
  const float m = fminf(fminf(c1, c2), fminf(c3, B + 7.0f));
  return float_bits(m) - kE2m1MagnitudeBase;
}
#endif

// The value of E2M1 stochastic rounding, without the code: returns
// float_bits(decode(encode_rs_f32<float4_e2m1fn>(y, rbits, o))) for y's bits
// yb, y not NaN, either policy (E2M1 saturates under both; Inf gives 6):
// e2m1_rs_magnitude capped at code 7, its value's bits ((m + 252) << 22 for
// codes 2..7, m * 0.5 for 0 and 1), y's sign. The GPU's dequantize-only path
// (the trainer's BF16 GEMM operands) uses it.
template <int W = 32>
FP4LAB_HD constexpr uint32_t e2m1_rs_value_bits(uint32_t yb, uint32_t rbits) {
  const uint32_t m0 = e2m1_rs_magnitude<W>(yb, rbits);
  const uint32_t m = m0 < 7u ? m0 : 7u;
  const uint32_t v = m >= 2u ? (m + 252u) << 22 : m * 0x3F000000u;
  return v | (yb & 0x80000000u);
}

// Stochastic-rounding encode of float32 (PTX cvt.rs, as encode(F, x,
// Round::rs, o, rbits) above) into the same formats as encode_rn_f32, without
// branches. Identical results to the generic encoder; tests check that over
// all bfloat16 patterns and random float32 patterns, each with several random
// words, for every format and overflow policy.
//   target normal range:    D = 23 - M discarded bits; the low D bits of rbits
//                           are added to them and the sum truncated (the carry
//                           runs into the exponent field, as in the generic code).
//   target subnormal range: the quantum is 2^(emin - M); D = the number of bits
//                           of the input's stored significand below it. The
//                           discarded bits, left-aligned in 32 bits (only the top
//                           32 when D > 32), plus rbits shifted up by 32 - D
//                           (its low D bits, or all 32 when D >= 32) round up
//                           iff the sum carries out of 32 bits.
// W < 32: a W-bit random value (encode()'s rule, W <= 23 - M here): in the
// normal range r << (D - W) is added; in the subnormal range (D > W) r << (32 - W).
template <const Format& F, int W = 32>
FP4LAB_HD constexpr uint32_t encode_rs_f32(float x, uint32_t rbits, Overflow o) {
  static_assert(!F.is_int && F.is_signed && F.has_subnormals() && F.man_bits < 23);
  static_assert(W == 32 || (W >= 1 && W <= 23 - F.man_bits));
  constexpr int shift = 23 - F.man_bits;
  constexpr uint32_t mask = (1u << shift) - 1u;
  constexpr uint32_t rebias = uint32_t(127 - F.bias) << 23;
  constexpr uint32_t min_normal_bits = uint32_t(F.min_exponent() + 127) << 23;
  // Discarded bits of a target-subnormal value: S0 - (biased input exponent).
  constexpr int s0 = F.min_exponent() - F.man_bits + 150;
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t sign = (u >> (31 - F.exp_bits - F.man_bits)) & F.sign_bit();  // float sign -> code sign
  if constexpr (F.exp_bits == 2 && F.man_bits == 1 && F.bias == 1 && F.special == Special::none) {
    // E2M1: both branches below in one computation (e2m1_rs_magnitude).
    return detail::fast_code<F>(a, sign, e2m1_rs_magnitude<W>(a, rbits), o);
  }
  constexpr uint32_t wmask = W == 32 ? 0xFFFFFFFFu : (1u << W) - 1u;
  // Normal target: truncate (a rebased + random low bits).
  const uint32_t t = a - rebias;
  const uint32_t add = W == 32 ? (rbits & mask) : (rbits & wmask) << (W == 32 ? 0 : shift - W);
  const uint32_t normal = (t >> shift) + (((t & mask) + add) >> shift);
  // Subnormal target (also for subnormal inputs: their stored significand, exponent field 1).
  const uint32_t exp_field = a >> 23;
  const uint32_t exp_eff = exp_field | uint32_t(exp_field == 0);
  const uint32_t sig = (a & 0x7FFFFFu) | (uint32_t(exp_field != 0) << 23);
  int d = s0 - int(exp_eff);  // >= 1 wherever this branch is selected
  d = d < 1 ? 1 : (d > 63 ? 63 : d);
  // In 32-bit operations (every shift count below is in [0, 31]):
  //   d < 32:  q = sig >> d, frac32 = sig << (32 - d) (mod 2^32), r32 = rbits << (32 - d);
  //   d >= 32: q = 0 (sig < 2^24), frac32 = sig >> (d - 32), r32 = rbits;
  // and the carry of frac32 + r32 out of 32 bits rounds up.
  const bool far = d >= 32;
  const int dl = d & 31, up = (32 - dl) & 31;
  const uint32_t q = far ? 0u : sig >> dl;
  const uint32_t frac32 = far ? sig >> dl : sig << up;
  const uint32_t r32 = W < 32 ? (rbits & wmask) << (W < 32 ? 32 - W : 0) : far ? rbits : rbits << up;
  const uint32_t subnormal = q + uint32_t(frac32 + r32 < frac32);
  const uint32_t sub_mask = 0u - uint32_t(a < min_normal_bits);
  const uint32_t mag = (subnormal & sub_mask) | (normal & ~sub_mask);
  return detail::fast_code<F>(a, sign, mag, o);
}

// Text names of the modes and policies: "rn" ... "rs" (long aliases accepted
// on input: nearest_even, nearest_away, toward_zero, up, down, stochastic),
// "saturate"/"nonsaturate". Parsing throws fp4lab::Error naming the valid set.
std::string_view round_name(Round r);
Round parse_round(std::string_view s);
std::string_view overflow_name(Overflow o);
Overflow parse_overflow(std::string_view s);

}  // namespace fp4lab
