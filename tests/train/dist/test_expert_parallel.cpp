// Expert parallelism's MoE layer on CPU thread ranks (one thread a rank)
// against one process: tests/train/expert_parallel_case.hpp.
#include <doctest/doctest.h>

#include "train/expert_parallel_case.hpp"

TEST_CASE("expert parallel MoE layer: R thread ranks equal one process holding every expert") {
  fp4lab::train::test::check_expert_parallel_layer([] { return fp4lab::train::make_cpu_backend(1); },
                                                   {"fp32", "bf16", "mxfp8", "nvfp4"});
}
