// TransformerEngine's NVFP4 + RHT arithmetic on the GPU (schemes/te_nvfp4/test_te_rht.cpp on the CPU), bit-exact
// with sim: TE's sign set on the fused kernels; the generic path's RHT (rht_output bf16, and the emulations'
// rules) from FP32 and from BF16 input; emulate te_fused_fast_math (rcp.approx.ftz the instruction) rowwise and
// columnwise after the RHT, rn and rs (ptx_x4); te_fast_math on TE's BF16 RHT output. Part of test_cuda
// (skipped without a GPU).
#include <doctest/doctest.h>

#include <vector>

#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

TEST_CASE("cuda quantize: TE's RHT signs and BF16 RHT output, te_fused_fast_math, te_fast_math after the RHT") {
  const test::Size sizes[] = {{64, 48}, {37, 53}, {128, 16}, {16, 1}};
  int cases = 0, failures = 0;
  uint32_t seed = 6100;
  enum Mode { te_signs_fused, te_bf16_generic, fused_fast_row, fused_fast_col, fast_math_rht };
  for (Mode m : {te_signs_fused, te_bf16_generic, fused_fast_row, fused_fast_col, fast_math_rht})
    for (Round r : {Round::rn, Round::rs})
      for (const test::Size s : sizes)
        for (int data = 0; data < 3; ++data) {
          const bool col = m != fused_fast_row;
          QuantizerSpec q = quantizer_by_name(col ? "nvfp4_col" : "nvfp4");
          q.round = r;
          if (r == Round::rs) q.sr_bits = SrBits::ptx_x4;
          q.rht = m != fused_fast_row;
          if (q.rht) q.rht_signs = RhtSigns::te;  // the rowwise fused case has no RHT
          if (m == te_bf16_generic || m == fast_math_rht) q.rht_output = RhtOutput::bf16;
          if (m == fused_fast_row || m == fused_fast_col) q.emulate = Emulation::te_fused_fast_math;
          if (m == fast_math_rht) q.emulate = Emulation::te_fast_math;
          auto x = data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 12)
                            : test::adversarial(s.rows, s.cols, seed++, true);
          test::round_to_bf16(x);  // TE's input is BF16
          ++cases;
          const QuantPath path = m == te_signs_fused ? QuantPath::fused : QuantPath::automatic;
          if (!test::check_case(q, x, s, RandomStream{5, uint64_t(cases)}, path, data == 1)) ++failures;
        }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}
