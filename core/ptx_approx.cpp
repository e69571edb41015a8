// The host model of rcp.approx.ftz.f32 (core/ptx_approx.hpp).
#include "core/ptx_approx.hpp"

#include <cstdint>

#include "core/bits.hpp"

// core/data/rcp_approx_ftz_sm90.bin (scripts/ptx_approx_probe.cu wrote it on an H200; kept as .tar.xz, unpacked
// into the build tree by core/CMakeLists.txt): for x = 1 + m 2^-23,
// rcp.approx.ftz.f32(x) - fl(1/x) in ulps, 2 bits an entry (0: 0, 1: +1, 2: -1), entry m in byte m / 4 at bit
// 2 (m % 4). Embedded whole (2 MiB) by the assembler: FP4LAB_RCP_TABLE is its path (core/CMakeLists.txt).
asm(".section .rodata\n"
    ".balign 64\n"
    ".type fp4lab_rcp_approx_ftz_table, @object\n"
    "fp4lab_rcp_approx_ftz_table:\n"
    ".incbin \"" FP4LAB_RCP_TABLE
    "\"\n"
    ".size fp4lab_rcp_approx_ftz_table, . - fp4lab_rcp_approx_ftz_table\n"
    ".previous\n");
extern "C" const unsigned char fp4lab_rcp_approx_ftz_table[1u << 21];

namespace fp4lab {

namespace {

int rcp_correction(uint32_t m) {
  static constexpr int kDelta[4] = {0, 1, -1, 0};
  return kDelta[(fp4lab_rcp_approx_ftz_table[m >> 2] >> (2 * (m & 3u))) & 3u];
}

}  // namespace

float rcp_approx_ftz_model(float x) {
  const uint32_t xb = float_bits(x), s = xb & 0x80000000u, e = (xb >> 23) & 0xFFu, m = xb & 0x7FFFFFu;
  if (e == 0xFFu) return m ? bits_float(0x7FFFFFFFu) : bits_float(s);  // NaN; +-Inf -> +-0
  if (e == 0u) return bits_float(s | 0x7F800000u);                     // +-0 and subnormals (flushed) -> +-Inf
  // r1 = rcp(1.m) in (0.5, 1]: the correctly rounded reciprocal plus the measured correction.
  const uint32_t r1 = uint32_t(int32_t(float_bits(1.0f / bits_float(0x3F800000u | m))) + rcp_correction(m));
  const int32_t re = int32_t((r1 >> 23) & 0xFFu) + 127 - int32_t(e);  // rcp(2^(e-127) 1.m) = 2^(127-e) r1
  if (re <= 0) return bits_float(s);                                  // below 2^-126: flushed to +-0
  return bits_float(s | (uint32_t(re) << 23) | (r1 & 0x7FFFFFu));
}

}  // namespace fp4lab
