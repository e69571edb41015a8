// ZeRO-3 with NVFP4-stored weights (train/dist/sharded_params.hpp; distributed.gather "nvfp4"), on in-process
// thread ranks (sums in rank order; clipping off), against the independent path: the ZeRO-1 run with NVFP4
// primary weights of the same world (itself tested against quantize(nvfp4_2d, master), test_dp_training.cpp and
// tests/train/primary_weights_case.hpp). Every step loss, every evaluation, the final parameters (the
// dequantized cast) and the checkpoint's masters and moments bit for bit, on 1, 2, 3 and 5 ranks with a width
// that is no multiple of 16 (partial tiles; units cut mid-tile, mid-row, with empty pieces); the codes kept
// from forward to backward or gathered again; the FP32 gather (every rank casts the gathered masters) too;
// resume; what travels (CountingComm): the weights' gather under 1/6 of the FP32 gather of the same
// parameters, and the schedule's calls.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "train/checkpoint.hpp"
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

// A 2-block GPT of width 40 under nvfp4 (thread_ranks.hpp: partial tiles, odd unit sizes).
json model_config(const std::string& text, const std::string& out, const std::string& name) {
  return test::zero3_config(text, out, name, 40, "nvfp4");
}

// Two runs the same bit for bit (thread_ranks.hpp): evaluations at the start, after 3 and after 6 steps.
void check_same_run(const RunResult& a, const RunResult& b) { test::check_same_run(a, b, 3); }

const json kZero1 = {{"zero", 1}, {"primary_weights", "nvfp4"}};
const json kZero3 = {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "nvfp4"}};

struct Scratch {
  fs::path dir = test::scratch_dir("fp4lab_z3nv_");
  std::string text = (dir / "text.txt").string(), out = (dir / "runs").string();
  Scratch() { std::ofstream(text) << test::words_corpus(); }
  ~Scratch() { fs::remove_all(dir); }
};

}  // namespace

TEST_CASE("ZeRO-3 gather nvfp4 equals ZeRO-1 NVFP4 primary weights bit for bit on 1, 2, 3 and 5 thread ranks") {
  Scratch s;
  for (int world : {1, 2, 3, 5}) {
    CAPTURE(world);
    json j = model_config(s.text, s.out, "z1-" + std::to_string(world));
    j["distributed"] = kZero1;
    const RunResult z1 = test::run_on_threads(world, j);
    j["name"] = "z3-" + std::to_string(world);
    j["distributed"] = kZero3;
    const RunResult z3 = test::run_on_threads(world, j);
    check_same_run(z1, z3);
    const json& m = z3.summary["distributed"];
    CHECK(m["gather"] == "nvfp4");
    CHECK(m["reshard_after_forward"] == false);
    CHECK(m["nvfp4_bytes"].get<int64_t>() > 0);
    // The layers saw the cast, not the masters: the final values differ from the checkpoint's masters.
    const Checkpoint c = load_checkpoint(fs::path(z3.dir) / "checkpoint.bin", int64_t(z3.final_params.size()));
    CHECK(c.values != z3.final_params);
  }
}

TEST_CASE("ZeRO-3 with NVFP4 storage: codes regathered, the FP32 gather, the fp32 recipe: the ZeRO-1 run") {
  Scratch s;
  const int world = 3;
  json j = model_config(s.text, s.out, "z1");
  j["distributed"] = kZero1;
  const RunResult z1 = test::run_on_threads(world, j);
  SUBCASE("codes gathered again in the backward") {
    j["name"] = "regather";
    j["distributed"] = kZero3;
    j["distributed"]["reshard_after_forward"] = true;
    check_same_run(z1, test::run_on_threads(world, j));
  }
  SUBCASE("gather fp32: the masters travel, every rank casts them whole") {
    j["name"] = "fp32gather";
    j["distributed"] = {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "fp32"}};
    check_same_run(z1, test::run_on_threads(world, j));
  }
  SUBCASE("the fp32 recipe (the layers compute with the cast itself)") {
    j["recipe"] = "fp32";
    j["name"] = "z1fp32";
    const RunResult a = test::run_on_threads(world, j);
    j["name"] = "z3fp32";
    j["distributed"] = kZero3;
    check_same_run(a, test::run_on_threads(world, j));
    CHECK(a.step_losses != z1.step_losses);  // another run: weight-only NVFP4
  }
}

TEST_CASE("ZeRO-3 gather nvfp4: a run resumes bit-exactly; the schedule; refusals name the keys") {
  Scratch s;
  json j = model_config(s.text, s.out, "straight");
  j["distributed"] = kZero3;
  const RunResult straight = test::run_on_threads(3, j);
  j["name"] = "resumed";
  const RunResult first = test::run_on_threads(3, j, false, 4);
  CHECK(first.status == "stopped");
  const RunResult second = test::run_on_threads(3, j, true);
  REQUIRE(second.status == "completed");
  CHECK(second.final_params == straight.final_params);
  REQUIRE(second.first_step == 3);
  std::vector<double> losses(first.step_losses.begin(), first.step_losses.begin() + 3);
  losses.insert(losses.end(), second.step_losses.begin(), second.step_losses.end());
  CHECK(losses == straight.step_losses);
  // A step (3 units: the root {wte, wpe, ln_f} in FP32, two blocks with NVFP4 weights): the forward gathers
  // the root and each block's FP32 parts (3 all-gathers) and each block's codes (2 allgather_equal); the
  // backward gathers nothing (codes kept); 3 reduce-scatters; the cast's one MAX all-reduce.
  const json& per = straight.summary["distributed"]["collectives"]["per_step"];
  CHECK(per["allgather"]["calls"] == 3);
  CHECK(per["allgather_equal"]["calls"] == 2);
  CHECK(per["reduce_scatter_sum"]["calls"] == 3);
  CHECK(per["allreduce_max"]["calls"] == 1);
  j["name"] = "regather";
  j["distributed"]["reshard_after_forward"] = true;
  const RunResult regather = test::run_on_threads(3, j);
  const json& per2 = regather.summary["distributed"]["collectives"]["per_step"];
  CHECK(per2["allgather"]["calls"] == 5);
  CHECK(per2["allgather_equal"]["calls"] == 4);
  // Refusals: one line naming the key and what is valid.
  json c = j;
  c["distributed"] = {{"zero", 3}, {"gather", "nvfp4"}};
  CHECK(test::config_error(c).find("distributed.gather: \"nvfp4\" needs config.distributed.primary_weights") !=
        std::string::npos);
  c["distributed"] = {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "bf16"}};
  CHECK(test::config_error(c).find("distributed.gather: \"bf16\" needs config.distributed.primary_weights \"bf16\" "
                                   "(the weights travel as their stored cast); valid with primary_weights nvfp4: "
                                   "\"fp32\", \"nvfp4\"") != std::string::npos);
  c["distributed"] = {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "int8"}};
  CHECK(test::config_error(c).find("distributed.gather: \"int8\" is not valid; valid: fp32, bf16, fp8, nvfp4") !=
        std::string::npos);
  c["distributed"] = {{"zero", 1}, {"primary_weights", "nvfp4"}, {"gather", "fp32"}, {"shard_cast", true}};
  CHECK(test::config_error(c).find("distributed.gather \"fp32\" and config.distributed.shard_cast true disagree") !=
        std::string::npos);
  c["distributed"] = {{"zero", 1}, {"reshard_after_forward", false}};
  CHECK(test::config_error(c).find("distributed.reshard_after_forward: only with distributed.zero 3") !=
        std::string::npos);
}

namespace {

// Runs f(counting comm) on n thread ranks; rank 0's counts.
template <class F>
std::map<int64_t, std::map<std::string, CollectiveCounts>> rank0_counts(int n, F f) {
  auto comms = make_thread_comms(n);
  std::map<int64_t, std::map<std::string, CollectiveCounts>> out;
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r)
    t.emplace_back([&, r] {
      CountingComm c(*comms[size_t(r)]);
      f(c);
      if (r == 0) out = c.counts();
    });
  for (auto& th : t) th.join();
  return out;
}

// One ZeRO-3 step over two NVFP4 weights around an FP32 bias (units: root {bias}, {a.weight}, {b.weight}),
// the parameters read in the forward's order and their gradients in the backward's; rank 0's counts of step 0.
std::map<std::string, CollectiveCounts> zero3_step(int N, const DistributedConfig& dc) {
  return rank0_counts(N, [&](Communicator& c) {
           auto be = make_cpu_backend(1);
           ParamStore ps;
           ps.add("a.weight", 19, 37, true, Init::normal, 0.5f);
           ps.add("a.bias", 1, 19, false, Init::normal, 0.1f);
           ps.add("b.weight", 33, 17, true, Init::normal, 0.5f);
           ps.finalize(*be, 7);
           const int nv[] = {0, 2};
           ps.set_storage(nv, Storage::nvfp4_2d, *be);
           DataParallel dp(c, *be, ps, AdamWConfig{}, dc, {{1}, {0}, {2}});
           // ZeRO-3's units hold the cast: the whole-model store is released, and the host stores keep no form.
           CHECK(ps.cast_store() == nullptr);
           for (int i : {0, 1, 2}) CHECK(ps.stored(i) == nullptr);
           c.set_step(0);  // the step's collectives begin with the forward's gathers (as run.cpp counts them)
           dp.begin_step(1.0f, 1.0 / N);
           for (int i : {1, 0, 2}) CHECK(ps.value_ptr(i) != nullptr);
           for (int i : {2, 0, 1}) {
             float* g = ps.grad_ptr(i);
             for (int64_t k = 0; k < ps.info(i).size(); ++k) g[k] = 0.01f * float(k % 13);
           }
           dp.step(1e-3);
         })
      .at(0);
}

}  // namespace

TEST_CASE("ZeRO-3 gather nvfp4 with CountingComm: the weights' gather is under 1/6 of the FP32 gather") {
  const int N = 3;
  DistributedConfig nvfp4;
  nvfp4.zero = 3;
  nvfp4.primary_weights = Storage::nvfp4_2d;  // shard_cast true: gather nvfp4, the codes kept forward to backward
  DistributedConfig fp32 = nvfp4;
  fp32.shard_cast = false;         // gather fp32: the masters travel
  fp32.reshard_after_forward = 0;  // each unit gathered once a step, as the codes are
  const auto f = zero3_step(N, fp32), q = zero3_step(N, nvfp4);
  // The FP32 gather: every unit once (3 all-gathers, 4 bytes an element), no codes, no cast collective.
  CHECK(f.at("allgather").calls == 3);
  CHECK(f.at("allgather").bytes_out == 4 * (19 * 37 + 19 + 33 * 17));
  CHECK(f.count("allgather_equal") == 0);
  // gather nvfp4: the root's FP32 bias (the weight units have no FP32 parts), each weight unit's packed windows.
  CHECK(q.at("allgather").calls == 1);
  CHECK(q.at("allgather").bytes_out == 4 * 19);
  CHECK(q.at("allgather_equal").calls == 2);
  CHECK(q.at("allreduce_max").calls == 1);
  CHECK(q.at("reduce_scatter_sum") == f.at("reduce_scatter_sum"));
  const int64_t wire_q = q.at("allgather").ring_bytes + q.at("allgather_equal").ring_bytes;
  const int64_t wire_f = f.at("allgather").ring_bytes;
  MESSAGE("ZeRO-3 weight gather, rank 0 of 3, ring bytes a step: ", wire_q, " (codes) against ", wire_f, " (FP32)");
  CHECK(6 * wire_q < wire_f);
}
