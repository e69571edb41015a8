// fp4-trainkit's quantizers (emulate fp4tk, schemes/fp4tk/rule.hpp) on the GPU's generic rule kernels:
// every rule, both axes, rn and rs, FP32 and BF16 input, edge values, bit-exact with sim. Part of test_cuda
// (skipped without a GPU).
#include <doctest/doctest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "core/bits.hpp"
#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;
using test::check_case;
using test::same_quantized;
using test::Size;

TEST_CASE("cuda quantize: fp4-trainkit's quantizers (emulate fp4tk), every rule, axis, rounding, bit-exact") {
  // Values around E2M1's and the scales' edges as well as Gaussian data of many magnitudes.
  auto edge_values = [](int64_t rows, int64_t cols, uint32_t seed) {
    std::vector<float> x = test::varied_randn(rows, cols, seed, 40);
    const float specials[] = {0.0f, -0.0f, 1.75f,  1.9999999f, 3.5f,   3.9999998f, 0.25f,     5.0f,
                              6.0f, 1e-8f, 1e-40f, 3e38f,      -3e38f, INFINITY,   -INFINITY, NAN};
    for (size_t i = 0; i < x.size(); i += 7) x[i] = specials[(i / 7) % std::size(specials)];
    return x;
  };
  const Size sizes[] = {{64, 64}, {37, 53}, {1, 200}, {96, 17}};
  int cases = 0, failures = 0;
  for (const char* name : {"fp4tk_mxfp4", "fp4tk_nvfp4"}) {
    const QuantizerSpec base = quantizer_by_name(name);
    const bool mx = base.scale_rule != ScaleRule::nv_noglobal;
    for (const ScaleRule rule : {ScaleRule::ocp, ScaleRule::ceil, ScaleRule::tetrajet, ScaleRule::nv_noglobal}) {
      if (mx != (rule != ScaleRule::nv_noglobal)) continue;
      for (const bool cols : {false, true}) {
        for (const Round r : {Round::rn, Round::rs}) {
          QuantizerSpec q = base;
          q.scale_rule = rule;
          q.round = r;
          if (cols) std::swap(q.block_rows, q.block_cols);
          for (size_t si = 0; si < std::size(sizes); ++si) {
            for (const bool bf16 : {false, true}) {
              std::vector<float> x = edge_values(sizes[si].rows, sizes[si].cols, uint32_t(cases + 3));
              if (bf16)
                for (float& v : x) v = bits_float(float_bits(v) & 0xFFFF0000u);  // exactly bfloat16 values
              ++cases;
              if (!check_case(q, x, sizes[si], RandomStream{11, uint64_t(cases)}, QuantPath::automatic, bf16))
                ++failures;
            }
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases compared");
  CHECK(cases == 4 * 2 * 2 * 4 * 2);  // (3 MX rules + 1 NVFP4) x axes x roundings x sizes x inputs
  CHECK(failures == 0);
}
