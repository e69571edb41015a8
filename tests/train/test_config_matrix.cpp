// Every shipped config x every canned recipe trains and evaluates on the CPU
// backend (config_matrix.hpp); tests/train/cuda/test_config_matrix.cpp runs the
// same matrix on the GPU.
#include <doctest/doctest.h>

#include "train/config_matrix.hpp"

TEST_CASE("shipped configs x canned recipes: 2 steps and an evaluation on the CPU") {
  fp4lab::train::test::check_config_matrix("cpu", 2);
}

// precision.activations "bf16" (docs/DESIGN.md, "BF16 activations"): every canned recipe keeps its meaning
// on the BF16 activations; one config of each model form (dense GPT, MoE GPT, ViT).
TEST_CASE("shipped configs x canned recipes under bf16 activations: 2 steps and an evaluation on the CPU") {
  fp4lab::train::test::check_config_matrix("cpu", 2, "bf16", {"gpt_baby", "gpt_moe_baby", "vit_mnist_quick"});
}
