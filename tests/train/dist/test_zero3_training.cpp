// ZeRO-3 (train/dist/sharded_params.hpp) in training runs on in-process thread
// ranks, against ZeRO-1 of the same world (the thread engine sums in rank
// order; clipping off): every step loss, every evaluation, the final
// parameters and the checkpoint's masters and moments bit for bit, for 1, 2,
// 3 and 5 ranks (units of odd sizes cut into uneven parts, empty parts
// included), for the dense GPT and the MoE GPT (experts and router in their
// block's unit); a run resumes bit-exactly; the
// refusals name the key. The gathers and reduce-scatters per step are those of
// the schedule (one gather a unit in the forward, one more a non-root unit in
// the backward; one reduce-scatter a unit).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/dist/counting_comm.hpp"
#include "train/dist/data_parallel.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The dense GPT of width 24 (thread_ranks.hpp).
json dense(const std::string& text, const std::string& out, const std::string& name) {
  return test::zero3_config(text, out, name, 24);
}

// ZeRO-3 against ZeRO-1 on `world` ranks: the same run, bit for bit.
void check_same_as_zero1(json j, int world, const std::string& tag) {
  CAPTURE(world);
  CAPTURE(tag);
  j["name"] = tag + "-z1-" + std::to_string(world);
  j["distributed"]["zero"] = 1;
  const RunResult z1 = test::run_on_threads(world, j);
  j["name"] = tag + "-z3-" + std::to_string(world);
  j["distributed"]["zero"] = 3;
  const RunResult z3 = test::run_on_threads(world, j);
  test::check_same_run(z1, z3, 3);  // evaluations at the start, after 3 and after 6 steps
  const int64_t n = int64_t(z1.final_params.size());
  // Memory per rank (summary distributed.memory): the optimiser's parts are this rank's only.
  const json& m3 = z3.summary["distributed"];
  CHECK(m3["zero"] == 3);
  CHECK(m3["params_bytes"] == 0);
  CHECK(m3["optimizer_bytes"].get<int64_t>() <= 3 * 4 * (n / world + m3["units"].get<int64_t>()));
}

}  // namespace

TEST_CASE("ZeRO-3 equals ZeRO-1 bit for bit: dense GPT on 1, 2, 3 and 5 thread ranks") {
  const fs::path d = test::scratch_dir("fp4lab_z3_");
  const std::string text = (d / "text.txt").string();
  std::ofstream(text) << test::words_corpus();
  for (int world : {1, 2, 3, 5}) check_same_as_zero1(dense(text, (d / "runs").string(), "dense"), world, "dense");
  fs::remove_all(d);
}

TEST_CASE("ZeRO-3 equals ZeRO-1 bit for bit with BF16 moments (training.moments) on 3 thread ranks") {
  const fs::path d = test::scratch_dir("fp4lab_z3b_");
  const std::string text = (d / "text.txt").string();
  std::ofstream(text) << test::words_corpus();
  json j = dense(text, (d / "runs").string(), "bf16m");
  j["training"]["moments"] = "bf16";
  check_same_as_zero1(j, 3, "bf16m");
  // Each rank stores its moments' parts as BF16: ceil(local / 2) floats a moment.
  j["name"] = "bf16m-z3-sizes";
  j["distributed"]["zero"] = 3;
  const RunResult z3 = test::run_on_threads(3, j);
  const json& m3 = z3.summary["distributed"];
  const int64_t local = m3["shard_elements"].get<int64_t>();
  CHECK(m3["moments_bytes"].get<int64_t>() == 2 * 4 * ((local + 1) / 2));
  CHECK(m3["optimizer_bytes"].get<int64_t>() == 4 * local + m3["moments_bytes"].get<int64_t>());
  fs::remove_all(d);
}

TEST_CASE("ZeRO-3 equals ZeRO-1 bit for bit: the MoE GPT on 3 thread ranks") {
  const fs::path d = test::scratch_dir("fp4lab_z3m_");
  const std::string text = (d / "text.txt").string();
  std::ofstream(text) << test::words_corpus();
  json moe = test::tiny_moe_config(text, (d / "runs").string(), "moe");
  moe["training"]["grad_clip"] = 0.0;
  moe["training"]["batch_size"] = 9;
  moe["training"]["steps"] = 6;
  moe["training"]["eval_interval"] = 3;
  check_same_as_zero1(moe, 3, "moe");
  fs::remove_all(d);
}

TEST_CASE("ZeRO-3: a run resumes bit-exactly; the refusals name the key") {
  const fs::path d = test::scratch_dir("fp4lab_z3r_");
  const std::string text = (d / "text.txt").string();
  std::ofstream(text) << test::words_corpus();
  json j = dense(text, (d / "runs").string(), "straight");
  j["distributed"] = {{"zero", 3}};
  const RunResult straight = test::run_on_threads(3, j);
  j["name"] = "resumed";
  const RunResult first = test::run_on_threads(3, j, false, 4);
  CHECK(first.status == "stopped");
  const RunResult second = test::run_on_threads(3, j, true);
  REQUIRE(second.status == "completed");
  CHECK(second.final_params == straight.final_params);
  // The resumed run starts at its checkpoint (after 3 steps) and repeats the steps after it bit for bit.
  REQUIRE(second.first_step == 3);
  std::vector<double> losses(first.step_losses.begin(), first.step_losses.begin() + 3);
  losses.insert(losses.end(), second.step_losses.begin(), second.step_losses.end());
  CHECK(losses == straight.step_losses);
  CHECK(first.step_losses[3] == straight.step_losses[3]);
  // Refusals: one line naming the key and what is valid.
  json c = j;
  c["distributed"]["zero"] = 2;
  CHECK(test::config_error(c).find("distributed.zero: 2 is not built; valid: 0, 1 (ZeRO-1), 3 (ZeRO-3)") !=
        std::string::npos);
  // ZeRO-3 is built for both backends (cuda: tests/train/cuda/test_zero3_cuda.cpp); what is not built is refused.
  c["distributed"]["zero"] = 3;
  c["backend"] = "cuda";
  CHECK(config_from_json(c).distributed.zero == 3);
  c["output"]["capture_step"] = 1;
  CHECK(test::config_error(c).find(
            "distributed.zero 3 (ZeRO-3) with expert_parallel, output.capture_step or output.numerics_interval is not "
            "built yet") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("ZeRO-3's schedule: one gather a unit forward, a regather a non-root unit backward, one reduce a unit") {
  // A GPT of 2 blocks: 3 units (root, block 0, block 1); per step 3 gathers in the forward and 2 in the backward
  // (the root stays), 3 reduce-scatters; then one MAX-free sum for the norm.
  const fs::path d = test::scratch_dir("fp4lab_z3s_");
  const std::string text = (d / "text.txt").string();
  std::ofstream(text) << test::words_corpus();
  json j = dense(text, (d / "runs").string(), "sched");
  j["distributed"] = {{"zero", 3}};
  j["training"]["eval_interval"] = 100;
  const RunResult r = test::run_on_threads(2, j);
  const json& per = r.summary["distributed"]["collectives"]["per_step"];
  CHECK(per["allgather"]["calls"] == 5);
  CHECK(per["reduce_scatter_sum"]["calls"] == 3);
  // Every parameter's FP32 elements pass through a gather twice but the root's once, and a reduce once.
  const int64_t n = int64_t(r.final_params.size());
  CHECK(per["reduce_scatter_sum"]["bytes_in"] == 4 * n);
  CHECK(per["allgather"]["bytes_out"].get<int64_t>() < 2 * 4 * n);
  CHECK(per["allgather"]["bytes_out"].get<int64_t>() > 4 * n);
  fs::remove_all(d);
}
