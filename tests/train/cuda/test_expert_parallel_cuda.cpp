// Expert parallelism on the CUDA backend, on one GPU: R thread ranks, each
// with its own CUDA backend (rows staged through host memory by the thread
// communicator, as with MPI), against one process of the CUDA backend. The
// layer: tests/train/expert_parallel_case.hpp (C1 with injected logits, C2 as
// far as cuBLAS's shape-chosen kernels allow); a whole run: R
// ranks follow one process within float rounding, and a repeat is bitwise;
// the dispatch cast: the CUDA fake_quantize equals the CPU's, and R ranks
// with the cast equal one process with it.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "train/expert_parallel_case.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

TEST_CASE("cuda backend, expert parallel MoE layer: R thread ranks equal one process holding every expert") {
  fp4lab::train::test::check_expert_parallel_layer([] { return fp4lab::train::make_cuda_backend(); },
                                                   {"fp32", "bf16", "mxfp8", "nvfp4"},
                                                   fp4lab::train::test::GemmRows::shape_dependent);
}

TEST_CASE("cuda backend, expert parallel runs: R thread ranks follow one process; a repeat is bitwise") {
  using namespace fp4lab::train;
  const fs::path d = fs::temp_directory_path() / ("fp4lab_ep_cuda_" + std::to_string(::getpid()));
  const std::string text = test::write_words_corpus(d), out = (d / "runs").string();
  for (const char* recipe : {"bf16", "nvfp4"}) {
    CAPTURE(recipe);
    json one_cfg = test::tiny_moe_config(text, out, std::string("one_") + recipe, 1);
    one_cfg["backend"] = "cuda", one_cfg["recipe"] = recipe;
    const RunResult one = test::run_on_threads(1, one_cfg);
    json j = test::tiny_moe_config(text, out, std::string("r2_") + recipe, 2);
    j["backend"] = "cuda", j["recipe"] = recipe;
    const RunResult a = test::run_on_threads(2, j);
    REQUIRE(a.step_losses.size() == one.step_losses.size());
    double worst = 0;
    for (size_t s = 0; s < a.step_losses.size(); ++s)
      worst = std::max(worst, std::fabs(a.step_losses[s] - one.step_losses[s]) / one.step_losses[s]);
    MESSAGE(std::string(recipe) << ": largest relative loss difference, 2 expert-parallel ranks vs one process: " << worst);
    CHECK(worst < (std::string(recipe) == "nvfp4" ? 2e-2 : 1e-3));
    CHECK(a.final_params.size() == one.final_params.size());
    j["name"] = std::string("r2b_") + recipe;
    const RunResult b = test::run_on_threads(2, j);
    CHECK(b.step_losses == a.step_losses);
    CHECK(b.final_params == a.final_params);
  }
  fs::remove_all(d);
}

TEST_CASE("cuda backend, Backend::fake_quantize equals the CPU backend's (the MoE dispatch cast's quantizer)") {
  using namespace fp4lab::train;
  using fp4lab::Operand;
  using fp4lab::QuantizerSpec;
  std::mt19937 rng(63);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const QuantizerSpec q = *fp4lab::recipe_by_name("mxfp8").operands[size_t(Operand::fwd_x)];
  auto gpu = make_cuda_backend();
  auto cpu = make_cpu_backend(1);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{7, 32}, {333, 96}, {5, 50}, {1024, 256}}) {
    std::vector<float> h(size_t(rows * cols));
    for (auto& v : h) v = nd(rng) * std::ldexp(1.0f, int(nd(rng) * 6));
    h[0] = 0.0f, h[1] = -0.0f;
    std::vector<float> a(h.size()), b(h.size());
    for (auto* be : {gpu.get(), cpu.get()}) {
      Tensor t = be->empty(rows, cols);
      be->upload(h.data(), t);
      be->fake_quantize(t, q);
      be->download(t, (be == gpu.get() ? a : b).data());
    }
    CHECK(test::ep_case::same_bits(a, b));
  }
}

TEST_CASE("cuda backend, MoE dispatch cast mxfp8 on R thread ranks equals one process with it") {
  fp4lab::train::test::check_expert_parallel_layer([] { return fp4lab::train::make_cuda_backend(); }, {"bf16", "mxfp8"},
                                                   fp4lab::train::test::GemmRows::shape_dependent,
                                                   fp4lab::train::MoeConfig::DispatchCast::mxfp8);
}
