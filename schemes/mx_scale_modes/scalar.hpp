// The E8M0 scale rules of torchao's MX formats and of TransformerEngine's MXFP8 kernels, scalar by scalar
// (host and device): the `scale_rule`s torchao_floor, torchao_ceil, torchao_even, torchao_rceil and te_mxfp8
// of the standard block rule (sim/block_rule.hpp). Each gives the biased E8M0 byte b of a block (255: NaN);
// the block's scale is 2^(b - 127) (byte 0: 2^-127), elements are x * 2^(127 - b) rounded by the element
// encoder (RN, saturating: torchao's casts, TE's cvt.rn.satfinite), dequant decode(code) * 2^(b - 127).
//
// torchao: github.com/pytorch/ao at 36027d82d (torchao/prototype/mx_formats/mx_tensor.py: to_mx,
// _to_mx_rceil, _f32_to_e8m0_rceil, _e8m0_scale_to_reciprocal_fp32; unchanged since 5d73a0c10, #4725, whose
// byte-0 and Inf rules differ from earlier torchao). Checked bit for bit against torchao's own to_mx run on
// torch 2.11 (tests/cli/test_mx_modes.py). With amax the block's max |x| as float32
// (NaN propagates: torch.amax), its bits A = (E, M) (biased exponent field, 23-bit mantissa field) and
// emax the element's largest power-of-two exponent (torchao's *_MAX_POW2: e2m1 2, e2m3 2, e3m2 4, e4m3 8,
// e5m2 15), mbits its mantissa bits, max_pos its largest finite value:
//   FLOOR  e = (E - 127) - emax                                   (OCP MX v1.0 sec. 6.3; equal to fp4lab's ocp)
//   CEIL   e = (E - 127) + (M > 0) - emax                         (ceil(log2 amax) - emax: NOT fp4lab's ceil,
//                                                                  which is ceil(log2(amax / max_pos)))
//   EVEN   A' = (A + 2^(23 - mbits - 1)) & 0xFF800000 (amax rounded to a power of two at the element's
//          precision; a NaN amax stays NaN), then FLOOR on A'
//   then   e = clamp(e, -127, 128); b = e + 127; b = 255 where amax (A' for EVEN) is not finite
//   RCEIL  d = fl(amax * fl(1 / max_pos)); b = E_d + (E_d == 0 ? M_d > 0x400000 : M_d != 0); 255 where d is not
//          finite (round up to a power of two; E8M0 byte 0 is 2^-127, so FP32 subnormals up to it stay at 0)
// TransformerEngine: github.com/NVIDIA/TransformerEngine (common/cast/mxfp8/quantize_mxfp8.cuh,
// util/ptx_arch_spec.cuh float_to_e8m0's software path, which Blackwell's cvt.rp.satfinite.ue8m0x2.f32 matches):
//   te_mxfp8  d = fl(amax * fl(1 / max_pos)); NaN -> 255, Inf -> 254 (satfinite), 0 -> 0; else b = E_d, plus 1
//             if M_d > 0 and E_d != 254 and not (E_d == 0 and M_d <= 0x400000)
//             TE's amax is an fmaxf reduction, which drops NaN: the block rule's amax NaN policy
//             (StandardRule::amax_drops_nan) models it; a NaN element itself still encodes NaN.
// The two RCEIL forms differ only on non-finite d (255 against 254) and where E_d is 254, which no element
// format reaches (d <= FLT_MAX / 6 < 2^126).
#pragma once

#include <cstdint>

#include "core/bits.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab {

enum class MxScaleMode : uint8_t { torchao_floor, torchao_ceil, torchao_even, torchao_rceil, te_mxfp8 };

// fl(amax * fl(1 / max_pos)): torchao's `max_abs * (1.0 / max_pos)` (a float32 tensor times a Python float,
// which PyTorch takes as float32) and TE's `amax * max_norm_rcp` (1 / max computed in double, then float).
FP4LAB_HD inline float mx_descale(float amax, const Format& element) {
  const float rcp = float(1.0 / double(max_finite(element)));
  return amax * rcp;
}

// The biased E8M0 byte of a block with amax bits a (sign cleared) under mode m.
FP4LAB_HD inline uint32_t mx_mode_biased(MxScaleMode m, uint32_t a, const Format& element) {
  if (m == MxScaleMode::torchao_rceil || m == MxScaleMode::te_mxfp8) {
    const uint32_t d = float_bits(mx_descale(bits_float(a), element));
    const uint32_t e = (d >> 23) & 0xFFu, man = d & 0x7FFFFFu;
    if (m == MxScaleMode::torchao_rceil) {
      if (e == 0xFFu) return 255u;  // Inf or NaN
      return (e + (e == 0 ? uint32_t(man > 0x400000u) : uint32_t(man != 0))) & 0xFFu;
    }
    if (e == 0xFFu) return man != 0 ? 255u : 254u;  // NaN; Inf saturates
    const bool up = (man > 0 && e != 0xFEu) && !(e == 0 && man <= 0x400000u);
    return e + uint32_t(up);
  }
  uint32_t bits = a;
  if (m == MxScaleMode::torchao_even) {
    const uint32_t add = 1u << (23 - element.man_bits - 1);
    bits = a > 0x7F800000u ? a : (a + add) & 0xFF800000u;  // a NaN amax stays NaN
  }
  if (bits >= 0x7F800000u) return 255u;  // not finite (EVEN: rounded up to Inf)
  int e = int((bits >> 23) & 0xFFu) - 127;
  if (m == MxScaleMode::torchao_ceil) e += int((bits & 0x7FFFFFu) != 0);
  e -= emax(element);
  e = e < -127 ? -127 : (e > 128 ? 128 : e);
  return uint32_t(e + 127);
}

// The mode's MxScale (sim/scale_rules.hpp's form: exp = b - 127, nan for b = 255). underflow: a non-zero block
// whose scale stays above what its amax wants (FLOOR / CEIL / EVEN clamped at -127; the RCEIL forms never
// clamp, their byte 0 is their floor).
FP4LAB_HD inline MxScale mx_scale_mode(MxScaleMode m, uint32_t a, const Format& element) {
  const uint32_t b = mx_mode_biased(m, a, element);
  MxScale s;
  s.nan = b == 255u;
  s.exp = s.nan ? 0 : int(b) - 127;
  if (!s.nan && b == 0 && a != 0 && m != MxScaleMode::torchao_rceil && m != MxScaleMode::te_mxfp8) {
    const int want = int((a >> 23) & 0xFFu) - 127 - emax(element);
    s.underflow = want < -127;
  }
  return s;
}

}  // namespace fp4lab
