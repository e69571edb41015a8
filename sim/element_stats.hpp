// The per-element statistics of a quantization, one definition for every
// reporter: quant_stats (`fp4lab quantize --stats`, sim/quantizer.hpp) and the
// training numerics statistics (train/numerics.hpp, CPU and CUDA). Host and
// device (FP4LAB_HD). For an input value v, its dequantized value d and its
// element code:
//   nan        v is NaN
//   nonzero    v != 0 and v not NaN (Inf counts)
//   flushed    nonzero and d == 0 (+0 or -0): a value the quantizer flushed to zero
//   saturated  the code's magnitude is the element format's largest (E2M1 6;
//              int8 127 or -128), |v| > |d|, and d is neither NaN nor 0: the
//              scaled value lay beyond the element max and was clamped (an
//              element of a block whose scale is 0, an underflowed ue4m3 scale,
//              is flushed, not saturated, whatever its code)
//   inexact    v not NaN and d != v (-0 == +0; a NaN d is inexact)
//   finite     v and d both finite
#pragma once

#include <cstdint>

#include "core/format.hpp"
#include "core/hd.hpp"

namespace fp4lab {

inline constexpr uint32_t kNumNan = 1, kNumNonzero = 2, kNumFlushed = 4, kNumSaturated = 8, kNumInexact = 16,
                          kNumFinite = 32;

// What element_flags needs of the element format.
struct ElementRule {
  uint32_t maxmag = 0;   // Format::max_magnitude_code()
  uint32_t magmask = 0;  // Format::magnitude_mask(), 0xFF for integers
  bool is_int = false;
};
inline ElementRule element_rule(const Format& f) {
  return ElementRule{f.max_magnitude_code(), f.is_int ? 0xFFu : f.magnitude_mask(), f.is_int};
}

FP4LAB_HD inline bool num_is_nan(float v) { return v != v; }
FP4LAB_HD inline bool num_is_finite(float v) { return v - v == 0.0f; }
FP4LAB_HD inline float num_abs(float v) { return v < 0.0f ? -v : v; }

// The flags kNum* of one element (input v, dequantized d, element code).
FP4LAB_HD inline uint32_t element_flags(float v, float d, uint32_t code, const ElementRule& e) {
  uint32_t f = 0;
  const bool vnan = num_is_nan(v);
  if (vnan) f |= kNumNan;
  if (v != 0.0f && !vnan) {
    f |= kNumNonzero;
    if (d == 0.0f) f |= kNumFlushed;
  }
  const uint32_t mag = e.is_int ? (code >= 0x80u ? 0x100u - code : code) : (code & e.magmask);
  if ((mag == e.maxmag || (e.is_int && mag == 0x80u)) && num_abs(v) > num_abs(d) && !num_is_nan(d) && d != 0.0f)
    f |= kNumSaturated;
  if (!vnan && !(d == v)) f |= kNumInexact;
  if (num_is_finite(v) && num_is_finite(d)) f |= kNumFinite;
  return f;
}

}  // namespace fp4lab
