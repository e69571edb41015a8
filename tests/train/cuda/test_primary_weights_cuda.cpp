// NVFP4 primary weights on the CUDA backend (the device cast, cuda/shard_cast.hpp,
// in a training run): tests/train/primary_weights_case.hpp.
#include "train/primary_weights_case.hpp"
#include "train/thread_ranks.hpp"

TEST_CASE("cuda backend, NVFP4 primary weights: the model's weights are quantize(nvfp4_2d, master).dequant") {
  fp4lab::train::test::check_primary_weights_run("cuda");
}

// ZeRO-1 on 3 thread ranks of one GPU (a host communicator: the cast's amaxes, packed windows and the FP32
// parts of the weight gather staged through host memory): the shard cast, the whole cast and FP32 primary
// weights give the same run under nvfp4, losses, masters and moments bit for bit.
TEST_CASE("cuda backend, NVFP4 primary weights on 3 thread ranks: shard cast = whole cast = FP32 primary") {
  using nlohmann::json;
  namespace fs = std::filesystem;
  const fs::path d = fp4lab::train::test::scratch_dir("fp4lab_pw3_cuda_");
  std::ofstream(d / "text.txt") << fp4lab::train::test::words_corpus();
  json j = {{"name", "sc"},
            {"model", {{"type", "gpt"}, {"layers", 2}, {"heads", 2}, {"width", 40}, {"context", 16}}},
            {"data", {{"type", "char"}, {"path", (d / "text.txt").string()}}},
            {"training", {{"batch_size", 6}, {"steps", 5}, {"lr", 1e-2}, {"eval_interval", 5}, {"eval_iters", 1}}},
            {"recipe", "nvfp4"},
            {"backend", "cuda"},
            {"distributed", {{"zero", 1}, {"primary_weights", "nvfp4"}}},
            {"output", {{"dir", (d / "runs").string()}}}};
  const fp4lab::train::RunResult sc = fp4lab::train::test::run_on_threads(3, j);
  j["name"] = "whole";
  j["distributed"]["shard_cast"] = false;
  const fp4lab::train::RunResult whole = fp4lab::train::test::run_on_threads(3, j);
  j["name"] = "fp32primary";
  j["distributed"] = {{"zero", 1}};
  const fp4lab::train::RunResult fp = fp4lab::train::test::run_on_threads(3, j);
  CHECK(sc.step_losses == whole.step_losses);
  CHECK(sc.final_params == whole.final_params);
  CHECK(sc.step_losses == fp.step_losses);
  const int64_t n = int64_t(sc.final_params.size());
  const fp4lab::train::Checkpoint a = fp4lab::train::load_checkpoint(fs::path(sc.dir) / "checkpoint.bin", n);
  const fp4lab::train::Checkpoint b = fp4lab::train::load_checkpoint(fs::path(fp.dir) / "checkpoint.bin", n);
  CHECK(a.values == b.values);
  CHECK(a.m == b.m);
  CHECK(a.v == b.v);
  // The packed windows travelled instead of the NVFP4 weights' FP32 values.
  const json& cs = sc.summary["distributed"]["collectives"]["per_step"];
  CHECK(cs["allgather_equal"]["calls"] == 1);
  CHECK(cs["allgather"]["bytes_out"].get<int64_t>() < 4 * n);
  fs::remove_all(d);
}
