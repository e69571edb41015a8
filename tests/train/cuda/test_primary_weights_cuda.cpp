// NVFP4 primary weights on the CUDA backend (the device cast, cuda/shard_cast.hpp,
// in a training run): tests/train/primary_weights_case.hpp.
#include "train/primary_weights_case.hpp"

TEST_CASE("cuda backend, NVFP4 primary weights: the model's weights are quantize(nvfp4_2d, master).dequant") {
  fp4lab::train::test::check_primary_weights_run("cuda");
}
