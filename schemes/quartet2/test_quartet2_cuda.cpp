// emulate 'quartet2' (schemes/quartet2/scalar.hpp) on the GPU's generic rule kernels, where rcp.approx.ftz is
// the instruction: codes, scale codes, scales and dequant bit-exact with sim (the host model), round-to-nearest
// and 4/6, BF16-valued input given as FP32 and as BF16, partial blocks, NaN / Inf / zeros / subnormals. Part of
// test_cuda (skipped without a GPU).
#include <doctest/doctest.h>

#include <vector>

#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

TEST_CASE("cuda quantize: emulate quartet2 (Quartet II's forward kernels), bit-exact with sim") {
  const test::Size sizes[] = {{37, 53}, {64, 128}, {1, 1}, {130, 16}};
  int cases = 0, failures = 0;
  uint32_t seed = 5200;
  for (bool four_six : {false, true})
    for (const test::Size s : sizes)
      for (int data = 0; data < 4; ++data) {
        QuantizerSpec q = quantizer_by_name("nvfp4");
        q.emulate = Emulation::quartet2;
        if (four_six) {
          q.scale_select = ScaleSelect::four_over_six;
          q.select_error = SelectError::mse;
          q.e4m3_max = 256;
        }
        auto x = data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 12)
                          : test::adversarial(s.rows, s.cols, seed++, data == 3);
        test::round_to_bf16(x);  // the kernel's input is BF16
        ++cases;
        if (!test::check_case(q, x, s, RandomStream{3, uint64_t(cases)}, QuantPath::automatic, data % 2 == 1))
          ++failures;
      }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: emulate quartet2_triton (div.full the instruction), bit-exact with sim") {
  const test::Size sizes[] = {{37, 48}, {64, 128}, {1, 1}, {130, 16}};
  int cases = 0, failures = 0;
  uint32_t seed = 5300;
  for (const test::Size s : sizes)
    for (int data = 0; data < 4; ++data) {
      QuantizerSpec q = quantizer_by_name("nvfp4");
      q.emulate = Emulation::quartet2_triton;
      q.round = Round::rna;
      auto x =
          data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 20) : test::adversarial(s.rows, s.cols, seed++, false);
      if (data % 2) test::round_to_bf16(x);
      ++cases;
      if (!test::check_case(q, x, s, RandomStream{3, uint64_t(cases)}, QuantPath::automatic, data % 2 == 1)) ++failures;
    }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: emulate quartet2_eden_triton with and without rht_kind quartet2_128, bit-exact with sim") {
  // Whole and partial 128-chunks along rows ([1,16]) and columns ([16,1]); FP32 and BF16 input; the scale's
  // stochastic choice from the call's stream.
  const test::Size sizes[] = {{6, 256}, {37, 200}, {256, 24}, {130, 128}, {1, 1}};
  int cases = 0, failures = 0;
  uint32_t seed = 5400;
  for (const bool cols_axis : {false, true})
    for (const bool rht : {false, true})
      for (const test::Size s : sizes)
        for (int data = 0; data < 3; ++data) {
          QuantizerSpec q = quantizer_by_name(cols_axis ? "nvfp4_col" : "nvfp4");
          q.emulate = Emulation::quartet2_eden_triton;
          q.round = Round::rna;
          q.rht = rht;
          if (rht) {
            q.rht_kind = RhtKind::quartet2_128;
            q.rht_seed = seed;
          }
          auto x = data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 12)
                            : test::adversarial(s.rows, s.cols, seed++, false);
          if (data == 1) test::round_to_bf16(x);
          ++cases;
          if (!test::check_case(q, x, s, RandomStream{17, uint64_t(cases)}, QuantPath::automatic, data == 1))
            ++failures;
        }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: fp4lab's NVFP4 after rht_kind quartet2_128 (the generic path's 128-point rotation)") {
  const test::Size sizes[] = {{6, 256}, {37, 200}, {256, 40}};
  int cases = 0, failures = 0;
  uint32_t seed = 5500;
  for (const bool cols_axis : {false, true})
    for (const test::Size s : sizes)
      for (const Round r : {Round::rn, Round::rs}) {
        QuantizerSpec q = quantizer_by_name(cols_axis ? "nvfp4_col" : "nvfp4");
        q.round = r;
        q.rht = true;
        q.rht_kind = RhtKind::quartet2_128;
        q.rht_seed = seed;
        const auto x = test::varied_randn(s.rows, s.cols, seed++, 12);
        ++cases;
        for (const cuda::QuantPath path : test::paths_for(q))
          if (!test::check_case(q, x, s, RandomStream{19, uint64_t(cases)}, path)) ++failures;
      }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}
