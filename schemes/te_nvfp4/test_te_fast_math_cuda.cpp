// emulate 'te_fast_math' (schemes/te_nvfp4/fast_math.hpp) on the GPU's generic rule kernels: codes, scale
// codes, scales and dequant bit-exact with sim, BF16-valued input given as FP32 and as BF16, [1,16] and [16,1],
// rn and rs (ptx_x4), partial blocks, NaN / Inf / zeros / subnormals. Part of test_cuda (skipped without a GPU).
#include <doctest/doctest.h>

#include <vector>

#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

TEST_CASE("cuda quantize: emulate te_fast_math (TE's NVFP4 fast-math coefficient), bit-exact with sim") {
  const test::Size sizes[] = {{37, 53}, {64, 96}, {1, 1}, {130, 7}};
  int cases = 0, failures = 0;
  uint32_t seed = 4100;
  for (bool col : {false, true})
    for (Round r : {Round::rn, Round::rs})
      for (const test::Size s : sizes)
        for (int data = 0; data < 4; ++data) {
          QuantizerSpec q = quantizer_by_name(col ? "nvfp4_col" : "nvfp4");
          q.emulate = Emulation::te_fast_math;
          q.round = r;
          if (r == Round::rs) q.sr_bits = SrBits::ptx_x4;
          auto x = data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 12)
                            : test::adversarial(s.rows, s.cols, seed++, true);
          test::round_to_bf16(x);  // the kernel's input is BF16
          ++cases;
          if (!test::check_case(q, x, s, RandomStream{3, uint64_t(cases)}, QuantPath::automatic, data % 2 == 1))
            ++failures;
        }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}
