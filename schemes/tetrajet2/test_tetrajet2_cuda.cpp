// emulate 'tetrajet2_*' (schemes/tetrajet2/scalar.hpp) on the GPU's generic rule kernels, where div.full,
// div.approx.ftz, rcp.approx.ftz and mul.ftz are the instructions: codes, inner scale codes, scales and dequant
// bit-exact with sim (core's models), FP32 and BF16 input, partial segments and blocks, zeros and subnormals. Part
// of test_cuda (skipped without a GPU).
#include <doctest/doctest.h>

#include <vector>

#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

TEST_CASE("cuda quantize: emulate tetrajet2 (source, triton, kernel arithmetic), bit-exact with sim") {
  const test::Size sizes[] = {{9, 200}, {64, 256}, {1, 1}, {130, 128}};
  int cases = 0, failures = 0;
  uint32_t seed = 7300;
  for (Emulation e : {Emulation::tetrajet2_source, Emulation::tetrajet2_triton, Emulation::tetrajet2_kernel})
    for (const test::Size s : sizes)
      for (int data = 0; data < 3; ++data) {
        QuantizerSpec q = quantizer_by_name("nvfp4");
        q.global_scale = GlobalScale::none;
        q.emulate = e;
        auto x = data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 30)
                          : test::adversarial(s.rows, s.cols, seed++, false);
        if (data == 1) test::round_to_bf16(x);
        ++cases;
        if (!test::check_case(q, x, s, RandomStream{3, uint64_t(cases)}, QuantPath::automatic, data == 1)) ++failures;
      }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}
