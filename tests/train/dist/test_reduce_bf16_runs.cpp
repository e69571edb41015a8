// distributed.reduce "bf16" (train/dist/grad_reduce.hpp) in whole training runs on in-process thread ranks:
// ZeRO-1, ZeRO-3 and zero 0 give the same run bit for bit (every step loss, every evaluation, the final
// parameters, the checkpoint's masters and moments) on 1, 2, 3 and 5 ranks, since each sums the same rounded
// contributions in rank order and AdamW is element-wise (clipping off); the run differs from reduce fp32's; the
// gradients' wire bytes a step (summary.json's collectives) are half the FP32 reduce-scatter's. The step-level
// oracle is test_reduce_bf16.cpp's.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "train/thread_ranks.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path dir = test::scratch_dir("fp4lab_rbf16_");
  std::string text = (dir / "text.txt").string(), out = (dir / "runs").string();
  Scratch() { std::ofstream(text) << test::words_corpus(); }
  ~Scratch() { fs::remove_all(dir); }
};

RunResult run(const Scratch& s, int world, int zero, const std::string& reduce) {
  json j = test::zero3_config(s.text, s.out, "r" + reduce + "-z" + std::to_string(zero) + "-" + std::to_string(world), 24);
  j["distributed"] = {{"zero", zero}, {"reduce", reduce}};
  return test::run_on_threads(world, j);
}

// The per_step counts of one collective in rank 0's summary (zeros when it was not called).
json per_step(const RunResult& r, const std::string& collective) {
  const json& p = r.summary["distributed"]["collectives"]["per_step"];
  return p.contains(collective) ? p[collective] : json{{"calls", 0}, {"ring_bytes", 0}};
}

}  // namespace

TEST_CASE("reduce bf16: ZeRO-3 = ZeRO-1 = zero 0 bit for bit on 1, 2, 3 and 5 thread ranks; half the gradient bytes") {
  Scratch s;
  for (int world : {1, 2, 3, 5}) {
    CAPTURE(world);
    const RunResult z1 = run(s, world, 1, "bf16");
    REQUIRE(z1.status == "completed");
    const RunResult z3 = run(s, world, 3, "bf16");
    test::check_same_run(z1, z3, 3);
    if (world == 1 || world == 3) test::check_same_run(z1, run(s, world, 0, "bf16"), 3);
    const RunResult f1 = run(s, world, 1, "fp32");
    CHECK(f1.step_losses != z1.step_losses);  // world 1 too: the gradient is rounded once
    // CountingComm: the codes' alltoallv moves half the FP32 reduce-scatter's ring bytes, no reduce-scatter left.
    const json a = per_step(z1, "alltoallv"), rs = per_step(f1, "reduce_scatter_sum");
    CHECK(per_step(z1, "reduce_scatter_sum")["calls"] == 0);
    CHECK(a["calls"] == 1);
    CHECK(2 * a["ring_bytes"].get<int64_t>() == rs["ring_bytes"].get<int64_t>());
    if (world == 3) {  // ZeRO-3: one alltoallv a unit (root and 2 blocks)
      const RunResult f3 = run(s, world, 3, "fp32");
      CHECK(per_step(z3, "alltoallv")["calls"] == 3);
      CHECK(per_step(f3, "reduce_scatter_sum")["calls"] == 3);
      CHECK(2 * per_step(z3, "alltoallv")["ring_bytes"].get<int64_t>() ==
            per_step(f3, "reduce_scatter_sum")["ring_bytes"].get<int64_t>());
      CHECK(per_step(z3, "alltoallv")["ring_bytes"].get<int64_t>() > 0);
    }
  }
}
