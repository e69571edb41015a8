// Expert-parallel training runs (distributed.expert_parallel; train/run.cpp
// with RunOptions::comm) on in-process thread ranks, a tiny MoE GPT on the
// generated corpus (plan docs/log/2026-12-02-expert-parallel-plan.md section
// 6, test 5): R ranks, each holding E/R experts and computing a share of the
// batch, follow the one-process loss curve within float rounding and evaluate
// to its losses; the first step's routing is one process's; a repeat is
// bitwise; ZeRO-1 equals ZeRO-0; a run resumes bit-exactly and every rank
// returns one process's parameter layout; the config errors are one line each.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path scratch() { return test::scratch_dir("fp4lab_ep_"); }

std::vector<json> records(const RunResult& r, bool eval) {
  std::ifstream f(fs::path(r.dir) / "metrics.jsonl");
  std::vector<json> out;
  for (std::string line; std::getline(f, line);) {
    const json j = json::parse(line);
    if (j.value("eval", false) == eval) out.push_back(j);
  }
  return out;
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
  return worst;
}

}  // namespace

TEST_CASE("expert parallel runs: R ranks follow one process; routing, evaluation, repeat, ZeRO-1, resume") {
  const fs::path d = scratch();
  const std::string text = test::write_words_corpus(d), out = (d / "runs").string();
  const RunResult one = test::run_on_threads(1, test::tiny_moe_config(text, out, "one", 1));
  const std::vector<json> one_eval = records(one, true), one_steps = records(one, false);
  for (int R : {2, 4}) {
    CAPTURE(R);
    json j = test::tiny_moe_config(text, out, "r" + std::to_string(R), R);
    const RunResult a = test::run_on_threads(R, j);
    // Every rank holds E/R experts, but the run's parameters are one process's, in its layout.
    CHECK(a.summary["params"] == one.summary["params"]);
    REQUIRE(a.final_params.size() == one.final_params.size());
    const double worst = worst_relative(a.step_losses, one.step_losses);
    MESSAGE("largest relative loss difference, " << R << " expert-parallel ranks vs one process: " << worst);
    CHECK(worst < 1e-4);
    CHECK(worst > 0.0);  // the sums' order differs: were it 0, the ranks would not be sharing the batch
    // Evaluation: every rank evaluates its share of each batch; the losses are one process's within rounding.
    const std::vector<json> ev = records(a, true);
    REQUIRE(ev.size() == one_eval.size());
    for (size_t k = 0; k < ev.size(); ++k)
      for (const char* key : {"train_loss", "val_loss"})
        CHECK(std::fabs(ev[k][key].get<double>() - one_eval[k][key].get<double>()) <
              1e-4 * one_eval[k][key].get<double>());
    // The first step's routing is global (one process's): 64 token rows a rank at R = 2 (bit-exact GEMM rows).
    const std::vector<json> steps = records(a, false);
    REQUIRE(!steps.empty());
    if (R == 2) CHECK(steps[0]["expert_load"] == one_steps[0]["expert_load"]);
    CHECK(std::fabs(steps[0]["moe_aux_loss"].get<double>() - one_steps[0]["moe_aux_loss"].get<double>()) < 1e-6);
    // Same R: bitwise.
    j["name"] = "r" + std::to_string(R) + "b";
    const RunResult b = test::run_on_threads(R, j);
    CHECK(b.step_losses == a.step_losses);
    CHECK(b.final_params == a.final_params);
    // ZeRO-1 over the replicated parameters: the same bits, fewer moment bytes a rank.
    j["name"] = "r" + std::to_string(R) + "z1";
    j["distributed"]["zero"] = 1;
    const RunResult z = test::run_on_threads(R, j);
    CHECK(z.step_losses == a.step_losses);
    CHECK(z.final_params == a.final_params);
    CHECK(z.summary["distributed"]["moments_bytes"].get<int64_t>() <
          a.summary["distributed"]["moments_bytes"].get<int64_t>());
  }
  // Resume: stopped after 5 steps (its last checkpoint at step 3), resumed with the same R: the uninterrupted
  // run's losses and parameters, bit for bit.
  {
    json j = test::tiny_moe_config(text, out, "res", 2);
    j["training"]["checkpoint_interval"] = 3;
    json w = j;
    w["name"] = "whole";
    const RunResult whole = test::run_on_threads(2, w);
    test::run_on_threads(2, j, false, 5);
    const RunResult rest = test::run_on_threads(2, j, true);
    REQUIRE(rest.first_step == 3);
    const std::vector<double> tail(whole.step_losses.begin() + 3, whole.step_losses.end());
    CHECK(rest.step_losses == tail);
    CHECK(rest.final_params == whole.final_params);
    // Another R is another run: its config differs, and a resume says so instead of loading the experts wrongly.
    json other = j;
    other["distributed"]["expert_parallel"] = 4;
    try {
      test::run_on_threads(4, other, true);
      FAIL("a resume with another expert_parallel ran");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("expert_parallel") != std::string::npos);
    }
  }
  fs::remove_all(d);
}

TEST_CASE("expert parallel: config and world errors, one line each") {
  const fs::path d = scratch();
  const std::string text = test::write_words_corpus(d), out = (d / "runs").string();
  auto err = [&](const json& j) { return test::config_error(j); };
  CHECK(err(test::tiny_moe_config(text, out, "ok", 2)).empty());
  json j = test::tiny_moe_config(text, out, "e", 2);
  j["distributed"]["expert_parallel"] = 0;
  CHECK(err(j).find("distributed.expert_parallel") != std::string::npos);
  j = test::tiny_moe_config(text, out, "e", 3);
  CHECK(err(j).find("model.moe.experts 8 is not a multiple of distributed.expert_parallel 3") != std::string::npos);
  j = test::tiny_moe_config(text, out, "e", 2);
  j["model"].erase("moe");
  CHECK(err(j).find("needs a mixture-of-experts model") != std::string::npos);
  j = test::tiny_moe_config(text, out, "e", 4);
  j["training"]["batch_size"] = 6;
  CHECK(err(j).find("training.batch_size 6 leaves unequal shares") != std::string::npos);
  j = test::tiny_moe_config(text, out, "e", 2);
  j["distributed"]["primary_weights"] = "nvfp4";
  j["recipe"] = "nvfp4";
  CHECK(err(j).find("primary_weights nvfp4 with expert parallelism is not built yet") != std::string::npos);
  j = test::tiny_moe_config(text, out, "e", 2);
  j["output"]["numerics_interval"] = 2;
  CHECK(err(j).find("output.numerics_interval") != std::string::npos);
  // A model.moe object without experts (as `--set model.moe.top_k=2` on a dense config makes): the missing key.
  j = test::tiny_moe_config(text, out, "e", 1);
  j["model"]["moe"].erase("experts");
  CHECK(err(j).find("config.model.moe: no \"experts\" key") != std::string::npos);
  j = test::tiny_moe_config(text, out, "e", 2);
  j["model"]["moe"]["dispatch_cast"] = "fp4";
  CHECK(err(j).find("config.model.moe.dispatch_cast") != std::string::npos);
  CHECK(err(j).find("mxfp8") != std::string::npos);
  // R must equal the world for now: on 4 ranks, R = 2 is refused by every rank with the same line.
  try {
    test::run_on_threads(4, test::tiny_moe_config(text, out, "w", 2));
    FAIL("expert_parallel 2 on 4 ranks ran");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("must equal the number of ranks, 4") != std::string::npos);
  }
  fs::remove_all(d);
}
