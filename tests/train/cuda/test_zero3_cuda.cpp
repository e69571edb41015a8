// ZeRO-3 on the CUDA backend (train/dist/sharded_params.hpp; issue 46, plan step S5): thread ranks on one GPU,
// each rank its own CudaBackend, the collectives staged through host memory (a host communicator), and NCCL
// (world 1 here; 2 GPUs where the machine has them). The oracle is the same-N ZeRO-1 run on the CUDA backend,
// itself tested (test_primary_weights_cuda.cpp): ZeRO-3 gather nvfp4 = ZeRO-1 NVFP4 primary weights and gather
// fp32 = ZeRO-1 (FP32 or NVFP4 storage alike) bit for bit in every step loss, every evaluation, the final
// parameters and the checkpoint's masters and moments. The conditions are the CPU tests'
// (tests/train/dist/test_zero3_nvfp4.cpp): thread ranks sum in rank order, clipping off (the norm's partial
// sums follow the shard layout). The model is a 2-block GPT of width 40: partial 16x16 tiles, and units cut
// mid-tile and mid-row into uneven shards. Against the CPU's ZeRO-3 run: the first step's loss and the first
// evaluation (the same initial weights, the same cast) within the CPU/GPU step rule of test_backend.cpp
// (expect_step_matches: 1e-5 x (1 + |loss|), FP32 and bf16 recipes). Without a GPU only the "host" cases run.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/dist/comm_nccl.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The CPU test's model (test_zero3_nvfp4.cpp, thread_ranks.hpp's zero3_config of width 40) on `backend`.
json model_config(const std::string& text, const std::string& out, const std::string& name, const std::string& recipe,
                  const std::string& backend = "cuda") {
  return test::zero3_config(text, out, name, 40, recipe, backend);
}

void check_same_run(const RunResult& a, const RunResult& b) { test::check_same_run(a, b, 3); }

const json kZero1Nv = {{"zero", 1}, {"primary_weights", "nvfp4"}};
const json kZero3Nv = {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "nvfp4"}};

struct Scratch {
  fs::path dir = test::scratch_dir("fp4lab_z3cuda_");
  std::string text = (dir / "text.txt").string(), out = (dir / "runs").string();
  Scratch() { std::ofstream(text) << test::words_corpus(); }
  ~Scratch() { fs::remove_all(dir); }
};

// The config on NCCL communicators, rank r on devices[r] in its own thread (make_nccl_comm with a file
// rendezvous for one device, make_nccl_comms_single_process otherwise); rank 0's result, every rank's final
// parameters checked equal. Each communicator is destroyed in its rank's thread (comm_nccl.hpp).
RunResult run_on_nccl(const std::vector<int>& devices, const json& cfgj) {
  const RunConfig cfg = config_from_json(cfgj);
  const int world = int(devices.size());
  std::vector<std::unique_ptr<Communicator>> comms;
  std::string rendezvous;
  if (world == 1) {
    static std::atomic<int> k{0};
    const fs::path p = fs::temp_directory_path() /
                       ("fp4lab_z3nccl_" + std::to_string(::getpid()) + "_" + std::to_string(k++));
    fs::remove(p);
    rendezvous = "file:" + p.string();
    comms.resize(1);
  } else {
    comms = make_nccl_comms_single_process(devices);
  }
  std::vector<RunResult> res(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      try {
        cuda::check(cudaSetDevice(devices[size_t(r)]), "cudaSetDevice");
        if (!comms[size_t(r)]) comms[size_t(r)] = make_nccl_comm(0, 1, rendezvous);
        std::ostringstream log;
        RunOptions o;
        o.progress = false;
        o.log = &log;
        o.comm = comms[size_t(r)].get();
        res[size_t(r)] = run_training(cfg, o);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
      comms[size_t(r)].reset();
    });
  for (auto& t : th) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw Error(e);
  for (int r = 1; r < world; ++r) CHECK(res[size_t(r)].final_params == res[0].final_params);
  return res[0];
}

bool fewer_than_2_gpus() {
  static const bool few = cuda::device_count() < 2;
  return few;
}

}  // namespace

TEST_CASE("cuda backend, ZeRO-3 equals ZeRO-1 bit for bit on 1, 2 and 3 thread ranks (recipes nvfp4, bf16)") {
  Scratch s;
  for (const char* recipe : {"nvfp4", "bf16"})
    for (int world : {1, 2, 3}) {
      CAPTURE(recipe);
      CAPTURE(world);
      const std::string tag = std::string(recipe) + "-" + std::to_string(world);
      // NVFP4 storage: ZeRO-3 gather nvfp4 (codes gathered, kept from forward to backward) = ZeRO-1 NVFP4 primary.
      json j = model_config(s.text, s.out, "z1nv-" + tag, recipe);
      j["distributed"] = kZero1Nv;
      const RunResult z1 = test::run_on_threads(world, j);
      j["name"] = "z3nv-" + tag;
      j["distributed"] = kZero3Nv;
      const RunResult z3 = test::run_on_threads(world, j);
      check_same_run(z1, z3);
      const json& m = z3.summary["distributed"];
      CHECK(m["zero"] == 3);
      CHECK(m["gather"] == "nvfp4");
      CHECK(m["reshard_after_forward"] == false);
      CHECK(m["nvfp4_bytes"].get<int64_t>() > 0);
      // The layers saw the cast, not the masters: the final values differ from the checkpoint's masters.
      const Checkpoint c = load_checkpoint(fs::path(z3.dir) / "checkpoint.bin", int64_t(z3.final_params.size()));
      CHECK(c.values != z3.final_params);
      // FP32 storage: ZeRO-3 (gather fp32) = ZeRO-1.
      j["name"] = "z1fp-" + tag;
      j["distributed"] = {{"zero", 1}};
      const RunResult f1 = test::run_on_threads(world, j);
      j["name"] = "z3fp-" + tag;
      j["distributed"] = {{"zero", 3}};
      const RunResult f3 = test::run_on_threads(world, j);
      check_same_run(f1, f3);
      CHECK(f3.summary["distributed"]["gather"] == "fp32");
      // Under nvfp4 the layers quantize W to the cast anyway (NVFP4 storage changes nothing: the same losses);
      // under bf16 they see the FP32 masters, not the cast: another run.
      if (std::string(recipe) == "nvfp4")
        CHECK(f3.step_losses == z3.step_losses);
      else
        CHECK(f3.step_losses != z3.step_losses);
    }
}

TEST_CASE("cuda backend, ZeRO-3 on 3 thread ranks: reshard_after_forward, gather fp32, the fp32 recipe, resume") {
  Scratch s;
  const int world = 3;
  json j = model_config(s.text, s.out, "z1", "nvfp4");
  j["distributed"] = kZero1Nv;
  const RunResult z1 = test::run_on_threads(world, j);
  SUBCASE("gather nvfp4, the codes gathered again in the backward") {
    j["name"] = "regather";
    j["distributed"] = kZero3Nv;
    j["distributed"]["reshard_after_forward"] = true;
    const RunResult r = test::run_on_threads(world, j);
    check_same_run(z1, r);
    CHECK(r.summary["distributed"]["collectives"]["per_step"]["allgather_equal"]["calls"] == 4);
  }
  SUBCASE("gather fp32 (the masters travel, every rank casts them whole), regathered or kept") {
    for (bool reshard : {true, false}) {
      CAPTURE(reshard);
      j["name"] = std::string("fp32gather-") + (reshard ? "re" : "kept");
      j["distributed"] = {{"zero", 3}, {"primary_weights", "nvfp4"}, {"gather", "fp32"}};
      j["distributed"]["reshard_after_forward"] = reshard;
      check_same_run(z1, test::run_on_threads(world, j));
    }
  }
  SUBCASE("FP32 storage with the FP32 values kept from forward to backward") {
    j["name"] = "f1";
    j["distributed"] = {{"zero", 1}};
    const RunResult f1 = test::run_on_threads(world, j);
    j["name"] = "f3kept";
    j["distributed"] = {{"zero", 3}, {"reshard_after_forward", false}};
    check_same_run(f1, test::run_on_threads(world, j));
  }
  SUBCASE("the fp32 recipe (weight-only NVFP4: the layers compute with the cast's FP32 values)") {
    j["recipe"] = "fp32";
    j["name"] = "z1fp32";
    const RunResult a = test::run_on_threads(world, j);
    j["name"] = "z3fp32";
    j["distributed"] = kZero3Nv;
    check_same_run(a, test::run_on_threads(world, j));
    CHECK(a.step_losses != z1.step_losses);  // another run
  }
  SUBCASE("a run stopped after 4 steps resumes bit-exactly; the schedule's collectives") {
    j["name"] = "straight";
    j["distributed"] = kZero3Nv;
    const RunResult straight = test::run_on_threads(world, j);
    check_same_run(z1, straight);
    // The forward gathers the root and each block's FP32 parts (3 all-gathers) and each block's codes (2
    // allgather_equal); the backward gathers nothing; 3 reduce-scatters; the cast's one MAX all-reduce.
    const json& per = straight.summary["distributed"]["collectives"]["per_step"];
    CHECK(per["allgather"]["calls"] == 3);
    CHECK(per["allgather_equal"]["calls"] == 2);
    CHECK(per["reduce_scatter_sum"]["calls"] == 3);
    CHECK(per["allreduce_max"]["calls"] == 1);
    j["name"] = "resumed";
    const RunResult first = test::run_on_threads(world, j, false, 4);
    CHECK(first.status == "stopped");
    const RunResult second = test::run_on_threads(world, j, true);
    REQUIRE(second.status == "completed");
    REQUIRE(second.first_step == 3);
    CHECK(second.final_params == straight.final_params);
    std::vector<double> losses(first.step_losses.begin(), first.step_losses.begin() + 3);
    losses.insert(losses.end(), second.step_losses.begin(), second.step_losses.end());
    CHECK(losses == straight.step_losses);
  }
}

TEST_CASE("cuda backend, ZeRO-3 equals ZeRO-1 bit for bit: the MoE GPT on 3 thread ranks (grouped experts)") {
  // The experts and the router sit in their block's unit; the grouped linear reads the experts' W from the unit
  // buffer (the decoded cast with NVFP4 storage).
  Scratch s;
  for (const json& dist : {json{{"zero", 1}}, kZero1Nv}) {
    CAPTURE(dist.dump());
    const std::string tag = dist.contains("primary_weights") ? "nv" : "fp";
    json j = test::tiny_moe_config(s.text, s.out, "moe-z1-" + tag);
    j["backend"] = "cuda";
    j["recipe"] = "nvfp4";
    j["training"]["grad_clip"] = 0.0;
    j["training"]["batch_size"] = 9;
    j["training"]["steps"] = 6;
    j["training"]["eval_interval"] = 3;
    j["distributed"] = dist;
    const RunResult z1 = test::run_on_threads(3, j);
    j["name"] = "moe-z3-" + tag;
    j["distributed"]["zero"] = 3;
    check_same_run(z1, test::run_on_threads(3, j));
  }
}

TEST_CASE("cuda backend, ZeRO-3 against the CPU's ZeRO-3: the first step's loss and first evaluation agree") {
  // The same initial masters and the same NVFP4 cast (bit for bit quantize(nvfp4_2d, master) on both
  // backends); the layers differ in summation order only, so the rule is test_backend.cpp's one-step rule
  // for the FP32 and bf16 recipes: |gpu - cpu| <= 1e-5 (1 + |cpu|). Later steps follow different updates.
  Scratch s;
  for (const char* recipe : {"fp32", "bf16"})
    for (const json& dist : {kZero3Nv, json{{"zero", 3}}}) {
      CAPTURE(recipe);
      CAPTURE(dist.dump());
      const std::string tag = std::string(recipe) + (dist.contains("gather") ? "-nv" : "-fp");
      json j = model_config(s.text, s.out, "cpu-" + tag, recipe, "cpu");
      j["distributed"] = dist;
      const RunResult cpu = test::run_on_threads(2, j);
      j = model_config(s.text, s.out, "cuda-" + tag, recipe, "cuda");
      j["distributed"] = dist;
      const RunResult gpu = test::run_on_threads(2, j);
      REQUIRE(!cpu.step_losses.empty());
      REQUIRE(!gpu.step_losses.empty());
      const double a = cpu.step_losses[0], b = gpu.step_losses[0];
      CHECK(std::abs(a - b) <= 1e-5 * (1.0 + std::abs(a)));
      const std::vector<json> ec = test::evals(cpu), eg = test::evals(gpu);
      REQUIRE(!ec.empty());
      REQUIRE(!eg.empty());
      REQUIRE(ec[0]["step"] == 0);
      for (const char* k : {"val_loss", "train_loss"}) {
        CAPTURE(k);
        const double x = ec[0][k].get<double>(), y = eg[0][k].get<double>();
        CHECK(std::abs(x - y) <= 1e-5 * (1.0 + std::abs(x)));
      }
    }
}

TEST_CASE("cuda backend, ZeRO-3 over NCCL, world of one: the thread-rank run bit for bit") {
  REQUIRE(have_nccl());
  Scratch s;
  json j = model_config(s.text, s.out, "threads1", "nvfp4");
  j["distributed"] = kZero3Nv;
  const RunResult t = test::run_on_threads(1, j);
  j["name"] = "nccl1";
  const RunResult n = run_on_nccl({0}, j);
  check_same_run(t, n);
  CHECK(n.summary["distributed"]["zero"] == 3);
}

// Two NCCL ranks sum two values, a + b, which is the same bits in either order: ZeRO-3 = ZeRO-1 bit for bit.
TEST_CASE("cuda backend, ZeRO-3 over NCCL on 2 GPUs: the 2-GPU ZeRO-1 run bit for bit" *
          doctest::skip(fewer_than_2_gpus())) {
  REQUIRE(have_nccl());
  Scratch s;
  for (const char* recipe : {"nvfp4", "bf16"}) {
    CAPTURE(recipe);
    json j = model_config(s.text, s.out, std::string("nccl-z1-") + recipe, recipe);
    j["distributed"] = kZero1Nv;
    const RunResult z1 = run_on_nccl({0, 1}, j);
    j["name"] = std::string("nccl-z3-") + recipe;
    j["distributed"] = kZero3Nv;
    check_same_run(z1, run_on_nccl({0, 1}, j));
    j["name"] = std::string("nccl-z3re-") + recipe;
    j["distributed"]["reshard_after_forward"] = true;
    check_same_run(z1, run_on_nccl({0, 1}, j));
  }
}

TEST_CASE("ZeRO-3 on the cuda backend: accepted by the config; what is not built is refused in one line" *
          doctest::test_suite("host")) {
  json j = model_config("x.txt", "runs", "cfg", "nvfp4");
  j["distributed"] = kZero3Nv;
  const RunConfig c = config_from_json(j);
  CHECK(c.backend == "cuda");
  CHECK(c.distributed.zero == 3);
  CHECK(c.distributed.shard_cast);  // gather nvfp4
  j["output"]["numerics_interval"] = 2;
  CHECK(test::config_error(j).find("distributed.zero 3 (ZeRO-3) with expert_parallel, output.capture_step or "
                                   "output.numerics_interval is not built yet") != std::string::npos);
}
