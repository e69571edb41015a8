// The backend interface's free functions (train/backend.cpp): make_backend's
// names and errors. The ranges check is tested with the optimiser
// (test_optim.cpp), its user.
#include <doctest/doctest.h>

#include "core/error.hpp"
#include "train/backend.hpp"

using namespace fp4lab::train;

TEST_CASE("make_backend: cpu by name; unknown names are errors naming the valid ones") {
  CHECK(make_backend("cpu")->name() == "cpu");
  CHECK_THROWS_WITH_AS(make_backend("gpu"), doctest::Contains("valid: cpu, cuda"), fp4lab::Error);
}

#ifndef FP4LAB_WITH_CUDA
TEST_CASE("make_backend: \"cuda\" in a build without CUDA says so") {
  CHECK_THROWS_WITH_AS(make_backend("cuda"), doctest::Contains("built without CUDA"), fp4lab::Error);
}
#endif
