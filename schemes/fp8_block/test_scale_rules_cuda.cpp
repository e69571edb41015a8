// The schemes' scale rules of the standard block rule (schemes/fp8_block: deepgemm, te_fp8_block, amax_div;
// schemes/mx_scale_modes: torchao_floor, torchao_ceil, torchao_even, torchao_rceil, te_mxfp8) on the GPU's
// generic rule kernels: codes, scale codes, decoded scales and dequant bit-exact with sim, FP32 and BF16
// input, every rounding mode the encoder has, partial blocks, NaN / Inf / zero blocks / subnormals (which
// exercise the NaN-dropping amax of the TE rules). Part of test_cuda (skipped without a GPU).
#include <doctest/doctest.h>

#include <vector>

#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

TEST_CASE("cuda quantize: the schemes' scale rules (FP8 block scaling, torchao's and TE's E8M0 modes), bit-exact") {
  struct Rule {
    ScaleRule rule;
    const Format* scale;
    std::vector<const Format*> elems;
  };
  const std::vector<const Format*> fp8 = {&float8_e4m3fn, &float8_e5m2};
  const std::vector<const Format*> mx = {&float4_e2m1fn, &float6_e2m3fn, &float6_e3m2fn, &float8_e4m3fn, &float8_e5m2};
  const Rule rules[] = {{ScaleRule::deepgemm, &float32, fp8},
                        {ScaleRule::deepgemm, &float8_e8m0fnu, fp8},
                        {ScaleRule::te_fp8_block, &float32, fp8},
                        {ScaleRule::te_fp8_block, &float8_e8m0fnu, fp8},
                        {ScaleRule::amax_div, &float32, fp8},
                        {ScaleRule::torchao_floor, &float8_e8m0fnu, mx},
                        {ScaleRule::torchao_ceil, &float8_e8m0fnu, mx},
                        {ScaleRule::torchao_even, &float8_e8m0fnu, mx},
                        {ScaleRule::torchao_rceil, &float8_e8m0fnu, mx},
                        {ScaleRule::te_mxfp8, &float8_e8m0fnu, fp8}};
  const int shapes[][2] = {{1, 128}, {128, 128}, {128, 1}, {1, 32}, {32, 32}, {32, 1}};
  const test::Size sizes[] = {{130, 200}, {1, 1}, {64, 256}};
  int cases = 0, failures = 0;
  uint32_t seed = 900;
  for (const Rule& rl : rules)
    for (const auto& sh : shapes)
      for (const Format* e : rl.elems)
        for (Round r : {Round::rn, Round::rs, Round::rz, Round::rm}) {
          QuantizerSpec q;
          q.element = e;
          q.scale = rl.scale;
          q.scale_rule = rl.rule;
          q.block_rows = sh[0];
          q.block_cols = sh[1];
          q.round = r;
          for (const test::Size s : sizes)
            for (int data = 0; data < 3; ++data) {
              // 0: varied FP32; 1: those values in BF16; 2: adversarial (NaN, Inf, zero blocks, subnormals).
              auto x = data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 12)
                                : test::adversarial(s.rows, s.cols, seed++, true);
              if (data == 1) test::round_to_bf16(x);
              ++cases;
              if (!test::check_case(q, x, s, RandomStream{5, uint64_t(cases)}, QuantPath::automatic, data == 1))
                ++failures;
            }
        }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
  // No fused kernel takes them: the automatic path is the generic one, an explicit fused path an error.
  CHECK_FALSE(fused_supported(quantizer_by_name("fp8_block_1x128")));
  CHECK_FALSE(fused_supported(quantizer_by_name("mxfp8_te_32x32")));
  QuantizerSpec q = quantizer_by_name("mxfp8_e4m3");
  q.scale_rule = ScaleRule::torchao_rceil;
  CHECK_FALSE(fused_supported(q));
}
