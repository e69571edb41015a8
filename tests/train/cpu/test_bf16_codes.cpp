// The cpu backend's round_bf16_codes and sum_bf16_codes (distributed.reduce "bf16"'s element rules,
// train/bf16_codes.hpp) against the integer oracle of bf16_codes_cases.hpp; with 1 and 4 OpenMP threads (the
// same bits). The cuda backend runs the same cases (cuda/test_reduce_bf16_cuda.cpp).
#include <doctest/doctest.h>

#include "train/backend.hpp"
#include "train/bf16_codes_cases.hpp"

using namespace fp4lab::train;

TEST_CASE("cpu backend: round_bf16_codes equals the integer RNE oracle on every upper half's ties, NaN, Inf") {
  for (int threads : {1, 4}) {
    CAPTURE(threads);
    auto be = make_cpu_backend(threads);
    test::check_round_bf16_codes(*be);
  }
}

TEST_CASE("cpu backend: sum_bf16_codes equals the rank-order FP32 sum on 1, 2, 3 and 5 rows") {
  for (int threads : {1, 4}) {
    CAPTURE(threads);
    auto be = make_cpu_backend(threads);
    test::check_sum_bf16_codes(*be);
  }
}
