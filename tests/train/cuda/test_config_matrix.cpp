// Every shipped config x every canned recipe trains and evaluates on the CUDA
// backend (tests/train/config_matrix.hpp).
#include <doctest/doctest.h>

#include "train/config_matrix.hpp"

TEST_CASE("shipped configs x canned recipes: 2 steps and an evaluation on the GPU") {
  fp4lab::train::test::check_config_matrix("cuda", 0);
}
