// emulate 'tetrajet2_source' / '_triton' / '_kernel' (schemes/tetrajet2/scalar.hpp) against a construction from a
// different path: the 1x128 and 1x16 maxima by their own loops, IEEE quotients in float64 rounded once (source),
// core/ptx_approx.hpp's div_full (Triton's /, from ptxas's SASS) and div.approx.ftz / rcp.approx.ftz (the CUDA
// kernels' fast math, measured on the GPU), E4M3 and E2M1 through tests/core/ref_format.hpp's brute-force
// encoder; TetraJet-v2's own Triton kernel is the oracle of the triton mode (tests/cli/test_tetrajet2.py, once
// its GPU run is recorded). Also the three modes' departures and the spec's checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/ptx_approx.hpp"
#include "core/ref_format.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;

namespace {

QuantizerSpec tetrajet2_spec(Emulation e) {
  QuantizerSpec q = quantizer_by_name("nvfp4");
  q.global_scale = GlobalScale::none;
  q.emulate = e;
  return q;
}

float ftz(float v) { return std::fabs(v) < 0x1p-126f ? std::copysign(0.0f, v) : v; }

// One mode's arithmetic, written out: quotient, product.
float quotient(Emulation e, float a, float b) {
  if (e == Emulation::tetrajet2_source) return float(double(a) / double(b));
  if (e == Emulation::tetrajet2_triton) return div_full(a, b);
  return ftz(float(double(ftz(a)) * double(rcp_approx_ftz(b))));  // div.approx.ftz
}
float product(Emulation e, float a, float b) {
  const float p = float(double(e == Emulation::tetrajet2_kernel ? ftz(a) : a) * double(b));
  return e == Emulation::tetrajet2_kernel ? ftz(p) : p;
}

std::vector<float> varied(int64_t n, uint32_t seed) {  // magnitudes 2^-40 .. 2^40 per 16, some zero runs
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  float mag = 1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (i % 16 == 0) mag = g() % 11 == 0 ? 0.0f : std::ldexp(1.0f, int(g() % 81) - 40);
    x[i] = nd(g) * mag;
  }
  return x;
}

}  // namespace

TEST_CASE("tetrajet2: codes, inner scale codes, scales and dequant against a construction, three arithmetics") {
  for (Emulation e : {Emulation::tetrajet2_source, Emulation::tetrajet2_triton, Emulation::tetrajet2_kernel}) {
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t rows = 9, cols = trial % 2 ? 200 : 256;  // 200: a partial segment and block
      std::vector<float> x = varied(rows * cols, uint32_t(100 + trial));
      x[3] = -0.0f;
      for (int64_t c = 0; c < 128; ++c) x[size_t(2 * cols + c)] = 0.0f;              // a zero segment
      for (int64_t c = 0; c < 16; ++c) x[size_t(3 * cols + c)] = 1e-12f * float(c);  // an underflowing block
      x[size_t(3 * cols + 40)] = 1e3f;
      const QuantizedTensor t = quantize(tetrajet2_spec(e), MatrixView<const float>(x.data(), rows, cols));
      int64_t bad = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t bj = 0; bj * 16 < cols; ++bj) {
          const int64_t c0 = bj * 16, s0 = c0 / 128 * 128;
          float a128 = 0, a16 = 0;
          for (int64_t c = s0; c < std::min(cols, s0 + 128); ++c) {
            float a = std::fabs(x[size_t(r * cols + c)]);
            if (e == Emulation::tetrajet2_kernel) a = ftz(a);
            a128 = std::max(a128, a);
            if (c >= c0 && c < c0 + 16) a16 = std::max(a16, a);
          }
          float os = quotient(e, quotient(e, a128, 448.0f), 6.0f);
          if (os == 0) os = 1;
          float is = quotient(e, quotient(e, a16, os), 6.0f);
          if (e != Emulation::tetrajet2_triton && is == 0) is = 0x1p-9f;
          const uint32_t s = ref::encode_rn_sat(float8_e4m3fn, is);
          const float sp = product(e, os, float(ref::value_of(float8_e4m3fn, s)));
          const size_t si = size_t(r * t.scale_cols + bj);
          bad += t.scale_codes[si] != s;
          bad += float_bits(t.scales[si]) != float_bits(sp);
          for (int64_t c = c0; c < std::min(cols, c0 + 16); ++c) {
            const float v = x[size_t(r * cols + c)];
            float y;
            if (e == Emulation::tetrajet2_triton)
              y = sp == 0 ? v * 0.0f : div_full(v, sp);
            else if (e == Emulation::tetrajet2_kernel)
              y = product(e, v, sp != 0 ? rcp_approx_ftz(sp) : 0.0f);
            else
              y = float(double(v) * double(sp != 0 ? float(1.0 / double(sp)) : 0.0f));
            const uint32_t q = ref::encode_rn_sat(float4_e2m1fn, y);
            bad += t.codes[size_t(r * cols + c)] != q;
            const float dq = float(ref::value_of(float4_e2m1fn, q) * double(sp));
            bad += float_bits(t.dequant[size_t(r * cols + c)]) != float_bits(dq);
          }
        }
      INFO("mode ", int(e), ", trial ", trial);
      CHECK(bad == 0);
      CHECK(t.global_decode == 1.0f);
    }
  }
}

TEST_CASE("tetrajet2: the arithmetics differ from one another, and from NVFP4's tensor-scaled rule") {
  std::vector<float> x = varied(64 * 256, 7);
  const MatrixView<const float> v(x.data(), 64, 256);
  const QuantizedTensor s = quantize(tetrajet2_spec(Emulation::tetrajet2_source), v);
  const QuantizedTensor tr = quantize(tetrajet2_spec(Emulation::tetrajet2_triton), v);
  const QuantizedTensor k = quantize(tetrajet2_spec(Emulation::tetrajet2_kernel), v);
  int64_t d_tr = 0, d_k = 0;
  for (size_t i = 0; i < s.dequant.size(); ++i) {
    d_tr += float_bits(s.dequant[i]) != float_bits(tr.dequant[i]);
    d_k += float_bits(s.dequant[i]) != float_bits(k.dequant[i]);
  }
  MESSAGE("dequant differs from the IEEE source in " << d_tr << " (Triton) and " << d_k << " (kernel) of "
                                                     << s.dequant.size());
  CHECK(d_tr > 0);
  CHECK(d_k > 0);
}

TEST_CASE("tetrajet2: the spec's checks") {
  QuantizerSpec q = tetrajet2_spec(Emulation::tetrajet2_triton);
  CHECK_NOTHROW(validate(q, "q"));
  q.global_scale = GlobalScale::tensor_amax;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("global_scale 'none'"), Error);
  q = tetrajet2_spec(Emulation::tetrajet2_kernel);
  q.round = Round::rs;
  q.sr_bits = SrBits::ptx_x4;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("round must be rn"), Error);
  q = tetrajet2_spec(Emulation::tetrajet2_source);
  q.block_rows = 16;
  q.block_cols = 1;
  CHECK_THROWS_WITH_AS(validate(q, "q"), doctest::Contains("[1,16]"), Error);
  q = tetrajet2_spec(Emulation::tetrajet2_kernel);
  CHECK(quantizer_to_json(quantizer_from_json(quantizer_to_json(q), "j"))["emulate"] == "tetrajet2_kernel");
}
