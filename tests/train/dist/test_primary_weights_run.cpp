// NVFP4 primary weights on the CPU backend (the host cast, train/dist/primary_weights.hpp,
// in a training run): tests/train/primary_weights_case.hpp.
#include "train/primary_weights_case.hpp"

TEST_CASE("cpu backend, NVFP4 primary weights: the model's weights are quantize(nvfp4_2d, master).dequant") {
  fp4lab::train::test::check_primary_weights_run("cpu");
}
