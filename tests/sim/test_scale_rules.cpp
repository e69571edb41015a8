// Scale rules (sim/scale_rules.hpp) against hand-worked numbers.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "sim/scale_rules.hpp"

using namespace fp4lab;

namespace {
uint32_t ab(float x) { return abs_bits(x); }
float next_up(float x) { return std::nextafter(x, INFINITY); }
float next_down(float x) { return std::nextafter(x, 0.0f); }
}  // namespace

TEST_CASE("floor_log2_bits and significand24 are exact, subnormals included") {
  CHECK(floor_log2_bits(ab(1.0f)) == 0);
  CHECK(floor_log2_bits(ab(7.0f)) == 2);
  CHECK(floor_log2_bits(ab(0.75f)) == -1);
  CHECK(floor_log2_bits(ab(FLT_MAX)) == 127);
  CHECK(floor_log2_bits(ab(0x1p-149f)) == -149);  // smallest subnormal: bit 0
  CHECK(floor_log2_bits(ab(0x1.8p-140f)) == -140);
  CHECK(significand24(ab(1.5f)) == 0xC00000u);
  CHECK(significand24(ab(0x1.8p-140f)) == 0xC00000u);  // subnormal, normalised
}

TEST_CASE("ocp: e = floor(log2 amax) - emax(element)") {
  // e2m1: emax = 2 (largest power of two <= 6 is 4).
  // amax 7: floor(log2 7) = 2 -> e = 0, scale 1 (7 itself will clamp to 6: OCP truncation).
  CHECK(mx_scale_ocp(ab(7.0f), float4_e2m1fn).exp == 0);
  CHECK(mx_scale_ocp(ab(7.0f), float4_e2m1fn).code() == 127);
  // amax 6 -> floor 2 -> 0; amax 8 -> 3 - 2 = 1; amax 0.75 -> -1 - 2 = -3.
  CHECK(mx_scale_ocp(ab(6.0f), float4_e2m1fn).exp == 0);
  CHECK(mx_scale_ocp(ab(8.0f), float4_e2m1fn).exp == 1);
  CHECK(mx_scale_ocp(ab(0.75f), float4_e2m1fn).exp == -3);
  // power of two exactly (4 = 2^2 -> 0) and just under the next one (8^- -> still 0).
  CHECK(mx_scale_ocp(ab(4.0f), float4_e2m1fn).exp == 0);
  CHECK(mx_scale_ocp(ab(next_down(8.0f)), float4_e2m1fn).exp == 0);
  // e4m3: emax 8 (256 <= 448 < 512). amax 448 -> 8 - 8 = 0; amax 1 -> -8.
  CHECK(mx_scale_ocp(ab(448.0f), float8_e4m3fn).exp == 0);
  CHECK(mx_scale_ocp(ab(1.0f), float8_e4m3fn).exp == -8);
  // e5m2 emax 15, e3m2 emax 4, e2m3 emax 2, int8 emax 0.
  CHECK(mx_scale_ocp(ab(1.0f), float8_e5m2).exp == -15);
  CHECK(mx_scale_ocp(ab(1.0f), float6_e3m2fn).exp == -4);
  CHECK(mx_scale_ocp(ab(1.0f), float6_e2m3fn).exp == -2);
  CHECK(mx_scale_ocp(ab(1.5f), int8_mx).exp == 0);
}

TEST_CASE("ocp: E8M0 range ends, zero, NaN/Inf") {
  // amax 0: e = -127 (code 0), not an underflow.
  MxScale z = mx_scale_ocp(0u, float4_e2m1fn);
  CHECK(z.exp == -127);
  CHECK(z.code() == 0u);
  CHECK_FALSE(z.underflow);
  // amax = 2^-130 (FP32 subnormal): -130 - 2 = -132 < -127 -> clamped, underflow.
  MxScale u = mx_scale_ocp(ab(0x1p-130f), float4_e2m1fn);
  CHECK(u.exp == -127);
  CHECK(u.underflow);
  // amax = 2^-125 for e2m1: -125 - 2 = -127: exactly the bottom end, no underflow.
  MxScale b = mx_scale_ocp(ab(0x1p-125f), float4_e2m1fn);
  CHECK(b.exp == -127);
  CHECK_FALSE(b.underflow);
  // amax = FLT_MAX: floor 127 -> e2m1: 125, int8 (emax 0): 127 (top end, no overflow).
  CHECK(mx_scale_ocp(ab(FLT_MAX), float4_e2m1fn).exp == 125);
  MxScale t = mx_scale_ocp(ab(FLT_MAX), int8_mx);
  CHECK(t.exp == 127);
  CHECK(t.code() == 254u);
  CHECK_FALSE(t.overflow);
  // NaN / Inf amax: NaN scale, E8M0 code 0xFF.
  CHECK(mx_scale_ocp(0x7FC00000u, float4_e2m1fn).nan);
  CHECK(mx_scale_ocp(0x7F800000u, float4_e2m1fn).code() == 0xFFu);
}

TEST_CASE("ceil: smallest e with amax <= max * 2^e") {
  // e2m1 max 6. amax 6: 6/6 = 1 -> e = 0; the next float above 6 -> e = 1.
  CHECK(mx_scale_ceil(ab(6.0f), float4_e2m1fn).exp == 0);
  CHECK(mx_scale_ceil(ab(next_up(6.0f)), float4_e2m1fn).exp == 1);
  // amax 7: log2(7/6) = 0.22 -> 1. amax 3: log2(0.5) = -1 exactly -> -1; 3^+ -> 0.
  CHECK(mx_scale_ceil(ab(7.0f), float4_e2m1fn).exp == 1);
  CHECK(mx_scale_ceil(ab(3.0f), float4_e2m1fn).exp == -1);
  CHECK(mx_scale_ceil(ab(next_up(3.0f)), float4_e2m1fn).exp == 0);
  // amax 4: log2(4/6) = -0.58 -> 0.  amax 8^-: log2(7.99/6) = 0.41 -> 1 (ocp gives 0).
  CHECK(mx_scale_ceil(ab(4.0f), float4_e2m1fn).exp == 0);
  CHECK(mx_scale_ceil(ab(next_down(8.0f)), float4_e2m1fn).exp == 1);
  // e4m3 max 448: amax 448 -> 0, 449 -> 1, amax 1: log2(1/448) = -8.81 -> -8 (448 * 2^-8 = 1.75 >= 1 > 0.875).
  CHECK(mx_scale_ceil(ab(448.0f), float8_e4m3fn).exp == 0);
  CHECK(mx_scale_ceil(ab(449.0f), float8_e4m3fn).exp == 1);
  CHECK(mx_scale_ceil(ab(1.0f), float8_e4m3fn).exp == -8);
  // int8 max 127/64: amax FLT_MAX needs e = 128 -> clamped to 127, overflow.
  MxScale o = mx_scale_ceil(ab(FLT_MAX), int8_mx);
  CHECK(o.exp == 127);
  CHECK(o.overflow);
  // underflow: e4m3 amax 2^-140: -140 - 8 = -148 (significand 1.0 <= 1.75) -> clamped.
  CHECK(mx_scale_ceil(ab(0x1p-140f), float8_e4m3fn).underflow);
  CHECK(mx_scale_ceil(0u, float8_e4m3fn).exp == -127);
}

TEST_CASE("tetrajet: ceil(log2(2 amax / (Qmax - Qmin))) equals ceil for symmetric formats") {
  // e2m1: 2 * 7 / (6 - (-6)) = 7/6 -> log2 = 0.22 -> 1.
  CHECK(mx_scale_tetrajet(ab(7.0f), float4_e2m1fn).exp == 1);
  for (float a : {1e-30f, 0.1f, 1.0f, 5.99f, 6.0f, 6.01f, 448.0f, 1e30f})
    for (const Format* f : {&float4_e2m1fn, &float8_e4m3fn, &float8_e5m2, &int8_mx})
      CHECK(mx_scale_tetrajet(ab(a), *f).exp == mx_scale_ceil(ab(a), *f).exp);
}

TEST_CASE("nv: TransformerEngine's global and block scale, hand-worked") {
  // amax_tensor = 5376 = 2 * 2688: g_enc = 2688 / 5376 = 0.5 exactly, g_dec = 2,
  // mult = 0.5 * fl(1/6) = fl(1/12) (exact halving of 0x3E2AAAAB).
  NvGlobal g = nv_global(5376.0f, 448.0f, 6.0f);
  CHECK(g.g_enc == 0.5f);
  CHECK(g.g_dec == 2.0f);
  CHECK(float_bits(1.0f / 6.0f) == 0x3E2AAAABu);
  CHECK(float_bits(g.mult) == 0x3DAAAAABu);  // 0x3E2AAAAB with the exponent lowered by one
  // Block with amax 5376: s_f = 5376 * fl(1/12) = 448.0000134 -> FP32 448 -> e4m3 448 (0x7E).
  NvBlockScale s = nv_block_scale(5376.0f, g, ufloat8_e4m3);
  CHECK(s.code == 0x7Eu);
  CHECK(s.scale == 448.0f);
  // Block with amax 10: s_f = 10/12 = 0.8333 -> e4m3 neighbours 0.8125 (0x35) and 0.875: 0.8125 is nearer.
  NvBlockScale t = nv_block_scale(10.0f, g, ufloat8_e4m3);
  CHECK(t.code == 0x35u);
  CHECK(t.scale == 0.8125f);
  // encode scale e = 1 / (0.8125 * 2) = 1/1.625 rounded to FP32.
  CHECK(t.encode == 1.0f / 1.625f);
  // amax_tensor = 0: g_enc = 1 (TE kernel rule), not FLT_MAX.
  CHECK(nv_global(0.0f, 448.0f, 6.0f).g_enc == 1.0f);
  // amax_tensor = Inf: 2688 / Inf = 0 -> 1.
  CHECK(nv_global(INFINITY, 448.0f, 6.0f).g_enc == 1.0f);
  // amax_tensor tiny: 2688 / 1e-38 = 2.7e41 > FLT_MAX -> FLT_MAX.
  CHECK(nv_global(1e-38f, 448.0f, 6.0f).g_enc == FLT_MAX);
  // NaN propagates.
  CHECK(std::isnan(nv_global(NAN, 448.0f, 6.0f).g_enc));
}

TEST_CASE("nv: block-scale underflow of UE4M3 without the global scale") {
  // No global scale: s_f = amax * fl(1/6). amax 1e-6 -> 1.67e-7, far below half of
  // e4m3's smallest subnormal 2^-9 / 2 = 9.8e-4 -> code 0: the block flushes.
  NvBlockScale s = nv_block_scale(1e-6f, nv_no_global(6.0f), ufloat8_e4m3);
  CHECK(s.code == 0u);
  CHECK(s.underflow);
  CHECK(s.encode == FLT_MAX);  // 1 / (0 * 1) = Inf -> FLT_MAX
  // With the global scale for a tensor whose amax is 1e-6 the same block maps to 448.
  NvBlockScale w = nv_block_scale(1e-6f, nv_global(1e-6f, 448.0f, 6.0f), ufloat8_e4m3);
  CHECK(w.scale == 448.0f);
  CHECK_FALSE(w.underflow);
}

TEST_CASE("nv_noglobal: fp4-trainkit eq. 3, scale clamped to [2^-9, 448]") {
  // amax 3: 3/6 = 0.5 -> e4m3 0.5 (0x30).
  NvBlockScale s = nv_noglobal_block_scale(3.0f, 6.0f, ufloat8_e4m3);
  CHECK(s.code == 0x30u);
  CHECK(s.scale == 0.5f);
  // amax 1e-6: 1.67e-7 < 2^-9 -> clamped to 2^-9 (code 0x01), counted as underflow.
  NvBlockScale u = nv_noglobal_block_scale(1e-6f, 6.0f, ufloat8_e4m3);
  CHECK(u.code == 0x01u);
  CHECK(u.scale == 0x1p-9f);
  CHECK(u.underflow);
  // amax 6000: 1000 > 448 -> 448, overflow.
  NvBlockScale o = nv_noglobal_block_scale(6000.0f, 6.0f, ufloat8_e4m3);
  CHECK(o.scale == 448.0f);
  CHECK(o.overflow);
}

TEST_CASE("nv rules: the compile-time E4M3 variants equal the generic rule on every bf16 amax and random floats") {
  // Inputs: every non-negative bf16 pattern (all binades, subnormals, Inf,
  // NaNs) and 200k random non-negative float32 patterns; both E4M3 scale
  // formats; an element max of 6 (e2m1) and 448 (e4m3); several globals.
  std::vector<float> amaxes;
  for (uint32_t h = 0; h < 0x8000u; ++h) amaxes.push_back(bits_float(h << 16));
  std::mt19937 g(5);
  for (int i = 0; i < 200000; ++i) amaxes.push_back(bits_float(uint32_t(g()) & 0x7FFFFFFFu));
  auto same = [](const NvBlockScale& x, const NvBlockScale& y) {
    return x.code == y.code && float_bits(x.scale) == float_bits(y.scale) &&
           float_bits(x.encode) == float_bits(y.encode) && x.underflow == y.underflow && x.overflow == y.overflow;
  };
  int64_t bad = 0;
  for (float elem_max : {6.0f, 448.0f}) {
    for (float a : amaxes) {
      bad +=
          !same(nv_noglobal_block_scale<ufloat8_e4m3>(a, elem_max), nv_noglobal_block_scale(a, elem_max, ufloat8_e4m3));
      bad += !same(nv_noglobal_block_scale<float8_e4m3fn>(a, elem_max),
                   nv_noglobal_block_scale(a, elem_max, float8_e4m3fn));
    }
    for (float tensor_amax : {1e-6f, 1.0f, 3.5e4f}) {
      const NvGlobal gl = nv_global(tensor_amax, 448.0f, elem_max);
      for (float a : amaxes) {
        bad += !same(nv_block_scale<ufloat8_e4m3>(a, gl), nv_block_scale(a, gl, ufloat8_e4m3));
        bad += !same(nv_block_scale<float8_e4m3fn>(a, gl), nv_block_scale(a, gl, float8_e4m3fn));
      }
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("tensor_amax: FP8 current scaling as TransformerEngine") {
  // e4m3: amax 224 -> enc = 448 / 224 = 2, dec = 0.5.
  TensorScale t = tensor_amax_scale(224.0f, 448.0f);
  CHECK(t.encode == 2.0f);
  CHECK(t.decode == 0.5f);
  // amax 0, Inf, NaN -> 1.
  CHECK(tensor_amax_scale(0.0f, 448.0f).encode == 1.0f);
  CHECK(tensor_amax_scale(INFINITY, 448.0f).encode == 1.0f);
  CHECK(tensor_amax_scale(NAN, 448.0f).encode == 1.0f);
  // tiny amax: 448 / 1e-40 overflows -> FLT_MAX.
  CHECK(tensor_amax_scale(1e-40f, 448.0f).encode == FLT_MAX);
}
