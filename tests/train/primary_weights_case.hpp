// A training run with NVFP4 primary weights on one backend (shared by the
// CPU and CUDA trainer tests): after the run, every NVFP4 weight the model
// holds equals quantize(nvfp4_2d, master).dequant of the FP32 master values
// its checkpoint holds (sim's quantizer: an independent path from the
// protocol's shard_scales / shard_cast / dequantize_packed and from the GPU
// kernels), and every other parameter equals its master value. Under the
// nvfp4 recipe, whose W quantizer is the cast's, the run is bit for bit the
// FP32-primary run (losses, masters): the layers take the cast as their W
// operand, on the CUDA backend in its exact BF16 form on the tensor cores,
// as the FP32-primary run's quantized W.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "sim/quantizer.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/data.hpp"
#include "train/dist/data_parallel.hpp"
#include "train/layer_recipes.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"

namespace fp4lab::train::test {

inline int64_t param_count(const ModelConfig& mc) {
  auto be = make_cpu_backend(1);
  return make_model(mc, *be, 1)->params().size();
}

inline void check_primary_weights_run(const std::string& backend) {
  using nlohmann::json;
  namespace fs = std::filesystem;

  const fs::path d = fs::temp_directory_path() / ("fp4lab_pw_" + backend + "_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::ofstream(d / "text.txt") << words_corpus();
  for (const char* recipe : {"bf16", "nvfp4"}) {
    CAPTURE(recipe);
    json j = {{"name", "pw"},
                    {"model", {{"type", "gpt"}, {"layers", 2}, {"heads", 2}, {"width", 40}, {"context", 16}}},
                    {"data", {{"type", "char"}, {"path", (d / "text.txt").string()}}},
                    {"training", {{"batch_size", 4}, {"steps", 5}, {"lr", 1e-2}, {"eval_interval", 5}, {"eval_iters", 1}}},
                    {"recipe", recipe},
                    {"backend", backend},
                    {"distributed", {{"primary_weights", "nvfp4"}}},
                    {"output", {{"dir", (d / "runs").string()}}}};
    const RunConfig cfg = config_from_json(j);
    std::ostringstream log;
    RunOptions o;
    o.progress = false;
    o.log = &log;
    const RunResult r = run_training(cfg, o);
    REQUIRE(r.status == "completed");
    const Checkpoint c = load_checkpoint(fs::path(r.dir) / "checkpoint.bin", int64_t(r.final_params.size()));
    auto be = make_cpu_backend(1);
    ModelConfig mc = cfg.model;
    mc.vocab_size = int64_t(load_char_text((d / "text.txt").string()).vocab.size());  // as the run's data set it
    REQUIRE(param_count(mc) == int64_t(r.final_params.size()));
    auto model = make_model(mc, *be, cfg.seed);
    const std::vector<int> nv = resolve_layer_recipes(cfg).low_precision_weight_params(model->linear_layers());
    CHECK(nv.size() == 8);  // c_attn, attn c_proj, c_fc, mlp c_proj of 2 blocks; lm_head is tied
    const ParamStore& ps = model->params();
    for (int i = 0; i < int(ps.infos().size()); ++i) {
      const ParamInfo& p = ps.info(i);
      CAPTURE(p.name);
      const float* master = c.values.data() + p.offset;
      const float* held = r.final_params.data() + p.offset;
      if (std::find(nv.begin(), nv.end(), i) != nv.end()) {
        const QuantizedTensor q = quantize(quantizer_by_name("nvfp4_2d"), MatrixView<const float>(master, p.rows, p.cols));
        CHECK(std::memcmp(held, q.dequant.data(), size_t(p.size()) * 4) == 0);
        CHECK(std::memcmp(held, master, size_t(p.size()) * 4) != 0);  // the cast changed them
      } else {
        CHECK(std::memcmp(held, master, size_t(p.size()) * 4) == 0);
      }
    }
    if (std::string(recipe) == "nvfp4") {
      j["name"] = "fp32primary";
      j.erase("distributed");
      const RunResult fp = run_training(config_from_json(j), o);
      REQUIRE(fp.status == "completed");
      CHECK(fp.step_losses == r.step_losses);
      const Checkpoint fc = load_checkpoint(fs::path(fp.dir) / "checkpoint.bin", int64_t(fp.final_params.size()));
      CHECK(fc.values == c.values);
      CHECK(fc.m == c.m);
    }
  }
  fs::remove_all(d);
}

}  // namespace fp4lab::train::test
