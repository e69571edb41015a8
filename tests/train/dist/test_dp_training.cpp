// Data-parallel training runs (train/run.cpp with RunOptions::comm) on
// in-process thread ranks, a tiny GPT on a generated corpus: N ranks follow the
// one-process loss curve of the same global batch within float rounding; two
// runs with the same N are bitwise identical; ZeRO-1 equals ZeRO-0; NVFP4
// primary weights cast shard by shard equal the whole-tensor cast in every
// loss (and, under the nvfp4 recipe, the FP32-primary run: the layers take the
// NVFP4 weights as the recipe's quantized W, not re-quantized); a run resumes bit-exactly with the same N and refuses
// another N; rank 0 alone writes the run directory.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path scratch() { return test::scratch_dir("fp4lab_dp_"); }

std::string corpus(const fs::path& dir) {
  const fs::path p = dir / "text.txt";
  std::ofstream(p) << test::words_corpus();
  return p.string();
}

json tiny(const std::string& text, const std::string& out, const std::string& name, int steps = 12) {
  return json{
      {"name", name},
      {"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 32}, {"context", 16}, {"dropout", 0.0}}},
      {"data", {{"type", "char"}, {"path", text}}},
      {"training",
       {{"batch_size", 6},
        {"steps", steps},
        {"lr", 1e-2},
        {"grad_clip", 0.0},
        {"eval_interval", 6},
        {"eval_iters", 2},
        {"log_interval", 1}}},
      {"seed", 5},
      {"threads", 1},
      {"output", {{"dir", out}}}};
}

RunResult run_on(int world, const json& cfgj, bool resume = false, int64_t stop_after = -1) {
  return test::run_on_threads(world, cfgj, resume, stop_after);
}

}  // namespace

TEST_CASE("data parallel: N ranks follow one process within rounding; same N bitwise; ZeRO-1 = ZeRO-0") {
  const fs::path d = scratch();
  const std::string text = corpus(d), out = (d / "runs").string();
  const RunResult one = run_on(1, tiny(text, out, "one"));
  for (int world : {2, 3}) {
    CAPTURE(world);
    json j = tiny(text, out, "w" + std::to_string(world));
    const RunResult a = run_on(world, j);
    REQUIRE(a.step_losses.size() == one.step_losses.size());
    double worst = 0.0;
    for (size_t s = 0; s < a.step_losses.size(); ++s)
      worst = std::max(worst, std::fabs(a.step_losses[s] - one.step_losses[s]) / one.step_losses[s]);
    MESSAGE("largest relative loss difference, " << world << " ranks vs one process: " << worst);
    CHECK(worst < 1e-4);
    CHECK(worst > 0.0);  // the sums' order differs: were it 0, the ranks would not be sharing the batch
    j["name"] = "w" + std::to_string(world) + "b";
    const RunResult b = run_on(world, j);
    CHECK(b.step_losses == a.step_losses);
    CHECK(b.final_params == a.final_params);
    j["name"] = "w" + std::to_string(world) + "z1";
    j["distributed"] = {{"zero", 1}};
    const RunResult z = run_on(world, j);
    CHECK(z.step_losses == a.step_losses);
    CHECK(z.final_params == a.final_params);
    CHECK(z.summary["distributed"]["moments_bytes"].get<int64_t>() <
          a.summary["distributed"]["moments_bytes"].get<int64_t>());
  }
  // Rank 0 alone wrote: one directory per run, no stray files from the other ranks.
  CHECK(fs::exists(fs::path(out) / "w2-fp32-s5" / "summary.json"));
  fs::remove_all(d);
}

TEST_CASE("data parallel: NVFP4 primary weights, shard cast = whole cast in every loss, on 3 ranks") {
  const fs::path d = scratch();
  const std::string text = corpus(d), out = (d / "runs").string();
  json j = tiny(text, out, "sc");
  j["recipe"] = "nvfp4";
  j["distributed"] = {{"zero", 1}, {"primary_weights", "nvfp4"}, {"shard_cast", true}};
  const RunResult sc = run_on(3, j);
  j["name"] = "whole";
  j["distributed"]["shard_cast"] = false;
  const RunResult whole = run_on(3, j);
  CHECK(sc.step_losses == whole.step_losses);
  CHECK(sc.final_params == whole.final_params);
  // What a step moved (summary.json distributed.collectives, CountingComm): the shard cast reduces the
  // amaxes, gathers the packed windows and all-gathers only the FP32-stored parameters; the whole cast
  // moves no codes and all-gathers every parameter in FP32; both reduce-scatter the FP32 gradient.
  const json& cs = sc.summary["distributed"]["collectives"]["per_step"];
  const json& cw = whole.summary["distributed"]["collectives"]["per_step"];
  CHECK(cs["allreduce_max"]["calls"] == 1);
  CHECK(cs["allgather_equal"]["calls"] == 1);
  CHECK(!cw.contains("allreduce_max"));
  CHECK(!cw.contains("allgather_equal"));
  CHECK(cw["allgather"]["bytes_out"] == 4 * int64_t(sc.final_params.size()));
  const int64_t sc_wire =
      cs["allgather"]["ring_bytes"].get<int64_t>() + cs["allgather_equal"]["ring_bytes"].get<int64_t>();
  CHECK(sc_wire < cw["allgather"]["ring_bytes"].get<int64_t>());
  MESSAGE("weight gather wire bytes a step, rank 0 of 3: ", sc_wire, " (FP32 parts + packed windows) against ",
          cw["allgather"]["ring_bytes"].get<int64_t>(), " (every parameter in FP32)");
  CHECK(cs["reduce_scatter_sum"]["bytes_in"] == 4 * int64_t(sc.final_params.size()));
  CHECK(cs["reduce_scatter_sum"] == cw["reduce_scatter_sum"]);
  // nvfp4's weight quantizer is the primary cast's (nvfp4_2d, round to nearest), and
  // the layers take the cast as their W operand (LinearContext::weight_cast; not
  // re-quantized: NVFP4 is not idempotent): the same run as FP32 primary weights,
  // losses, master values and moments bit for bit.
  j["name"] = "fp32primary";
  j["distributed"] = {{"zero", 1}};
  const RunResult fp = run_on(3, j);
  CHECK(fp.step_losses == sc.step_losses);
  {
    const int64_t n = int64_t(sc.final_params.size());
    const Checkpoint a = load_checkpoint(fs::path(sc.dir) / "checkpoint.bin", n);
    const Checkpoint b = load_checkpoint(fs::path(fp.dir) / "checkpoint.bin", n);
    CHECK(a.values == b.values);
    CHECK(a.m == b.m);
    CHECK(a.v == b.v);
  }
  // Under the fp32 recipe the NVFP4 weights are what the model computes with: another run.
  j["recipe"] = "fp32";
  j["name"] = "fp32recipe";
  const RunResult plain = run_on(3, j);
  j["name"] = "fp32recipe_nvfp4";
  j["distributed"] = {{"zero", 1}, {"primary_weights", "nvfp4"}};
  const RunResult nvw = run_on(3, j);
  CHECK(nvw.step_losses != plain.step_losses);
  CHECK(nvw.step_losses.back() < nvw.step_losses.front());  // and it still learns
  fs::remove_all(d);
}

TEST_CASE("data parallel: resume with the same N is bit-exact; another N is refused") {
  const fs::path d = scratch();
  const std::string text = corpus(d), out = (d / "runs").string();
  json j = tiny(text, out, "straight");
  j["recipe"] = "nvfp4";
  j["distributed"] = {{"zero", 1}, {"primary_weights", "nvfp4"}};
  const RunResult straight = run_on(2, j);
  j["name"] = "resumed";
  j["training"]["checkpoint_interval"] = 3;
  j["training"]["eval_interval"] = 3;
  j["name"] = "resumed";
  run_on(2, j, false, 7);  // stops after 7 steps; checkpoint at 6
  CHECK_THROWS_WITH_AS(run_on(3, j, true), doctest::Contains("resume it with 2, not 3"), Error);
  const RunResult rest = run_on(2, j, true);
  CHECK(rest.first_step == 6);
  CHECK(rest.final_params == straight.final_params);
  REQUIRE(rest.step_losses.size() == 6);
  for (size_t k = 0; k < 6; ++k) CHECK(rest.step_losses[k] == straight.step_losses[6 + k]);
  fs::remove_all(d);
}
