// The CUDA toolkit's host-callable converters as an independent oracle for
// the encoder: cuda_fp8.h (e4m3, e5m2, e8m0), cuda_fp6.h (e2m3, e3m2),
// cuda_fp4.h (e2m1), cuda_bf16.h / cuda_fp16.h. Compiled only where the
// toolkit's headers exist; these run on the host, no GPU needed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp6.h>
#include <cuda_fp8.h>
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/encode.hpp"

using namespace fp4lab;

namespace {

// Inputs: every bfloat16 bit pattern (as float32), then random float32 bit
// patterns, then random values near each format's range.
std::vector<float> oracle_inputs() {
  std::vector<float> xs;
  for (uint32_t b = 0; b < 65536; ++b) xs.push_back(bits_float(b << 16));
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 400000; ++i) xs.push_back(bits_float(uint32_t(rng())));
  std::uniform_real_distribution<float> expo(-30.0f, 20.0f);
  for (int i = 0; i < 400000; ++i) {
    const float v = std::exp2(expo(rng));
    xs.push_back((rng() & 1) ? -v : v);
  }
  return xs;
}

uint32_t cuda_raw(__nv_fp8_storage_t s) { return s; }

}  // namespace

TEST_CASE("encoder agrees with cuda_fp8.h for e4m3/e5m2 (rn, both overflow policies, float and double)") {
  const auto xs = oracle_inputs();
  struct Case {
    const Format* f;
    __nv_fp8_interpretation_t interp;
  } cases[] = {{&float8_e4m3fn, __NV_E4M3}, {&float8_e5m2, __NV_E5M2}};
  for (const auto& c : cases) {
    for (auto [sat, ovf] :
         {std::pair{__NV_SATFINITE, Overflow::saturate}, std::pair{__NV_NOSAT, Overflow::nonsaturate}}) {
      int64_t mismatches = 0;
      for (float x : xs) {
        const uint32_t want = cuda_raw(__nv_cvt_float_to_fp8(x, sat, c.interp));
        const uint32_t got = encode(*c.f, x, Round::rn, ovf);
        if (want != got) {
          if (mismatches < 5)
            MESSAGE(c.f->name, " x=", x, " bits=", float_bits(x), " cuda=", want, " ours=", got, " sat=", int(sat));
          ++mismatches;
        }
        // CUDA's double converter keeps a NaN's sign (its float converter does
        // not); fp4lab always writes the canonical positive NaN, so NaN inputs
        // are compared through the float path only.
        if (std::isnan(x)) continue;
        const double xd = x;
        const uint32_t want_d = cuda_raw(__nv_cvt_double_to_fp8(xd, sat, c.interp));
        if (want_d != encode(*c.f, xd, Round::rn, ovf)) {
          if (mismatches < 5)
            MESSAGE(c.f->name, " double x=", xd, " cuda=", want_d, " ours=", encode(*c.f, xd, Round::rn, ovf));
          ++mismatches;
        }
        if (c.f == &float8_e5m2 && encode_rn_f32<float8_e5m2>(x, ovf) != got) ++mismatches;
        if (c.f == &float8_e4m3fn && encode_rn_f32<float8_e4m3fn>(x, ovf) != got) ++mismatches;
      }
      CHECK_MESSAGE(mismatches == 0, c.f->name);
    }
  }
}

TEST_CASE("encoder agrees with cuda_fp6.h and cuda_fp4.h (rn, satfinite)") {
  const auto xs = oracle_inputs();
  int64_t mm = 0;
  for (float x : xs) {
    const uint32_t w4 = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
    const uint32_t w63 = __nv_cvt_float_to_fp6(x, __NV_E2M3, cudaRoundNearest);
    const uint32_t w62 = __nv_cvt_float_to_fp6(x, __NV_E3M2, cudaRoundNearest);
    const uint32_t g4 = encode(float4_e2m1fn, x, Round::rn, Overflow::saturate);
    const uint32_t g63 = encode(float6_e2m3fn, x, Round::rn, Overflow::saturate);
    const uint32_t g62 = encode(float6_e3m2fn, x, Round::rn, Overflow::saturate);
    if (w4 != g4 || w63 != g63 || w62 != g62) {
      if (mm < 5) MESSAGE("x=", x, " fp4 ", w4, "/", g4, " e2m3 ", w63, "/", g63, " e3m2 ", w62, "/", g62);
      ++mm;
    }
    if (encode_rn_f32<float4_e2m1fn>(x, Overflow::saturate) != g4) ++mm;
    if (encode_rn_f32<float6_e2m3fn>(x, Overflow::saturate) != g63) ++mm;
    if (encode_rn_f32<float6_e3m2fn>(x, Overflow::saturate) != g62) ++mm;
  }
  CHECK(mm == 0);
}

TEST_CASE("encoder agrees with cuda_fp8.h's e8m0 converter (rz, rp; both overflow policies)") {
  const auto xs = oracle_inputs();
  int64_t mm = 0;
  for (float x : xs) {
    if (x < 0.0f) continue;  // CUDA takes |x| for e8m0; fp4lab encodes negatives as NaN (documented)
    for (auto [cr, r] : {std::pair{cudaRoundZero, Round::rz}, std::pair{cudaRoundPosInf, Round::rp}}) {
      for (auto [sat, ovf] :
           {std::pair{__NV_SATFINITE, Overflow::saturate}, std::pair{__NV_NOSAT, Overflow::nonsaturate}}) {
        const uint32_t want = __nv_cvt_float_to_e8m0(x, sat, cr);
        const uint32_t got = encode(float8_e8m0fnu, x, r, ovf);
        if (want != got) {
          if (mm < 5)
            MESSAGE("e8m0 x=", x, " bits=", float_bits(x), " cuda=", want, " ours=", got, " r=", int(r),
                    " sat=", int(sat));
          ++mm;
        }
      }
    }
  }
  CHECK(mm == 0);
}

TEST_CASE("encoder agrees with cuda_bf16.h / cuda_fp16.h in every mode they offer") {
  const auto xs = oracle_inputs();
  int64_t mm = 0;
  for (float x : xs) {
    __nv_bfloat16_raw b = __float2bfloat16_rn(x);
    __half_raw h_rn = __float2half_rn(x), h_rz = __float2half_rz(x), h_rd = __float2half_rd(x),
               h_ru = __float2half_ru(x);
    if (b.x != encode(bfloat16, x, Round::rn, Overflow::nonsaturate)) ++mm;
    if (h_rn.x != encode(float16, x, Round::rn, Overflow::nonsaturate)) ++mm;
    if (h_rz.x != encode(float16, x, Round::rz, Overflow::nonsaturate)) ++mm;
    if (h_rd.x != encode(float16, x, Round::rm, Overflow::nonsaturate)) ++mm;
    if (h_ru.x != encode(float16, x, Round::rp, Overflow::nonsaturate)) {
      if (mm < 5)
        MESSAGE("f16 ru x=", x, " cuda=", h_ru.x, " ours=", encode(float16, x, Round::rp, Overflow::nonsaturate));
      ++mm;
    }
    if (encode_rn_f32<bfloat16>(x, Overflow::nonsaturate) != b.x) ++mm;
    if (encode_rn_f32<float16>(x, Overflow::nonsaturate) != h_rn.x) ++mm;
  }
  CHECK(mm == 0);
}
