// Hostile config values (issue 42): every numeric key of train/config.cpp has a
// range, and a value outside it is one fp4lab::Error naming the key and what is
// valid, never a crash, a hang or a run of garbage. Sizes beyond the machine's
// memory fail before anything is allocated, naming the keys that drive them;
// deeply nested JSON in a config, a --set value or an inline recipe is refused.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/json.hpp"
#include "sim/quantizer.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/data.hpp"

using namespace fp4lab;
using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json tiny_gpt() {
  return json{{"name", "tiny"},
              {"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 16}, {"context", 16}}},
              {"data", {{"type", "char"}, {"path", "x.txt"}}},
              {"training", {{"batch_size", 4}, {"steps", 10}}}};
}
json tiny_vit() {
  return json{{"name", "tiny"},
              {"model", {{"type", "vit"}}},
              {"data", {{"type", "mnist"}, {"path", "mnist"}}},
              {"training", {{"batch_size", 4}, {"steps", 10}}}};
}

// The message of config_from_json(j) after `--set assignment`, or "" when valid.
std::string error_after(json j, const std::string& assignment) {
  try {
    apply_set(j, assignment);
    config_from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Bad {
  const char* set;     // --set key=value
  const char* expect;  // a substring of the message
};

}  // namespace

TEST_CASE("config ranges: each numeric key out of its range names the key and the valid range") {
  const Bad gpt[] = {
      {"model.context=0", "config.model.context: 0 is out of range; valid: an integer in 1..65536"},
      {"model.context=-5", "config.model.context: -5 is out of range"},
      {"model.layers=0", "config.model.layers: 0 is out of range; valid: an integer in 1..1024"},
      {"model.layers=1000000000", "config.model.layers: 1000000000 is out of range; valid: an integer in 1..1024"},
      {"model.width=0", "config.model.width: 0 is out of range"},
      {"model.width=1000000", "config.model.width: 1000000 is out of range; valid: an integer in 1..65536"},
      {"model.heads=0", "config.model.heads: 0 is out of range"},
      {"model.heads=32", "config.model.heads: 32 is out of range; valid: an integer in 1..16"},
      {"model.dropout=1", "config.model.dropout: 1 is out of range; valid: a finite number in [0, 1)"},
      {"model.dropout=-0.1", "config.model.dropout: -0.1 is out of range"},
      {"model.layernorm_eps=0", "config.model.layernorm_eps: 0 is out of range; valid: a finite number in (0, 1]"},
      {"model.layernorm_eps=-1e-5", "config.model.layernorm_eps"},
      {"model.vocab_size=0", "config.model.vocab_size: 0 is out of range"},
      {"model.moe.experts=0", "config.model.moe.experts: 0 is out of range"},
      {"model.moe.experts=100000", "config.model.moe.experts: 100000 is out of range; valid: an integer in 1..4096"},
      {"model.moe.top_k=5", "config.model.moe.top_k: 5 is out of range; valid: an integer in 1..4"},
      {"model.moe.aux_loss=-1", "config.model.moe.aux_loss: -1 is out of range; valid: a finite number >= 0"},
      {"model.moe.z_loss=-0.5", "config.model.moe.z_loss: -0.5 is out of range"},
      {"model.moe.expert_hidden=-1", "config.model.moe.expert_hidden: -1 is out of range"},
      {"model.moe.capacity_factor=0", "config.model.moe.capacity_factor: 0 is out of range; valid: a finite number in (0, 4]"},
      {"training.lr=0", "config.training.lr: 0 is out of range; valid: a finite number > 0"},
      {"training.lr=-1", "config.training.lr: -1 is out of range"},
      {"training.min_lr=-1", "config.training.min_lr: -1 is out of range; valid: a finite number >= 0"},
      {"training.eps=-1", "config.training.eps: -1 is out of range; valid: a finite number in (0, 1]"},
      {"training.eps=0", "config.training.eps: 0 is out of range"},
      {"training.weight_decay=-0.1", "config.training.weight_decay: -0.1 is out of range; valid: a finite number >= 0"},
      {"training.beta1=1", "config.training.beta1: 1 is out of range; valid: a finite number in [0, 1)"},
      {"training.beta2=-0.5", "config.training.beta2: -0.5 is out of range"},
      {"training.grad_clip=-1", "config.training.grad_clip: -1 is out of range; valid: a finite number >= 0"},
      {"training.warmup_steps=-1", "config.training.warmup_steps: -1 is out of range; valid: an integer in 0.."},
      {"training.decay_steps=-3", "config.training.decay_steps: -3 is out of range"},
      {"training.log_interval=0", "config.training.log_interval: 0 is out of range; valid: an integer in 1.."},
      {"training.eval_interval=-1", "config.training.eval_interval: -1 is out of range"},
      {"training.eval_iters=0", "config.training.eval_iters: 0 is out of range; valid: an integer in 1..1000000"},
      {"training.eval_iters=-2", "config.training.eval_iters: -2 is out of range"},
      {"training.eval_batch_size=0", "config.training.eval_batch_size: 0 is out of range"},
      {"training.checkpoint_interval=-1", "config.training.checkpoint_interval: -1 is out of range"},
      {"training.batch_size=0", "config.training.batch_size: 0 is out of range"},
      {"training.batch_size=100000000", "config.training.batch_size: 100000000 is out of range"},
      {"training.steps=-1", "config.training.steps: -1 is out of range"},
      {"training.epochs=-1", "config.training.epochs: -1 is out of range"},
      {"training.loss_scale=0", "config.training.loss_scale: 0 is out of range"},
      {"training.loss_scale=1e300", "config.training.loss_scale: 1e+300 is out of range"},
      {"data.train_limit=-1", "config.data.train_limit: -1 is out of range; valid: an integer >= 0"},
      {"data.test_limit=-7", "config.data.test_limit: -7 is out of range"},
      {"data.path=\"\"", "config.data.path: empty"},
      {"distributed.zero=2", "config.distributed.zero: 2 is not built; valid: 0, 1 (ZeRO-1), 3 (ZeRO-3)"},
      {"distributed.zero=4", "config.distributed.zero: 4 is out of range; valid: an integer in 0..3"},
      {"output.capture_step=-2", "config.output.capture_step: -2 is out of range"},
      {"output.numerics_interval=-1", "config.output.numerics_interval: -1 is out of range"},
  };
  for (const Bad& b : gpt) {
    const std::string set = b.set;
    json base = tiny_gpt();  // the MoE's other keys, with experts
    if (set.starts_with("model.moe.") && !set.starts_with("model.moe.experts")) apply_set(base, "model.moe.experts=4");
    const std::string e = error_after(base, b.set);
    CAPTURE(set);
    CAPTURE(e);
    CHECK(e.find(b.expect) != std::string::npos);
  }
  const Bad vit[] = {
      {"data.std=0", "config.data.std: 0 is out of range; valid: a finite number > 0"},
      {"data.std=-1", "config.data.std: -1 is out of range"},
      {"model.channels=3", "config.model.channels: 3 is out of range; valid: an integer in 1..1"},
      {"model.classes=5", "config.model.classes: 5 is out of range; valid: an integer in 10..65536"},
      {"model.image_size=0", "config.model.image_size: 0 is out of range"},
      {"model.patch_size=0", "config.model.patch_size: 0 is out of range"},
      {"model.patch_size=56", "config.model.patch_size: 56 is out of range; valid: an integer in 1..28"},
      {"model.mlp_ratio=0", "config.model.mlp_ratio: 0 is out of range; valid: a finite number in (0, 64]"},
      {"model.mlp_ratio=0.001", "config.model.mlp_ratio: 0.001 x width 64 leaves an MLP of no units"},
  };
  for (const Bad& b : vit) {
    const std::string set = b.set, e = error_after(tiny_vit(), b.set);
    CAPTURE(set);
    CAPTURE(e);
    CHECK(e.find(b.expect) != std::string::npos);
  }
  // The defaults and the edges of each range are valid.
  CHECK(error_after(tiny_gpt(), "training.min_lr=0") == "");
  CHECK(error_after(tiny_gpt(), "model.dropout=0.99") == "");
  CHECK(error_after(tiny_gpt(), "training.beta2=0") == "");
  CHECK(error_after(tiny_gpt(), "training.eval_interval=0") == "");
  CHECK(error_after(tiny_vit(), "data.std=0.5") == "");
}

TEST_CASE("config ranges: 1e999 and other non-finite numbers name the key, from --set and from a file") {
  // --set: nlohmann refuses 1e999 (beyond a double) while parsing; the error names the key.
  for (const char* s : {"training.lr=1e999", "training.lr=-1e999"})
    CHECK(error_after(tiny_gpt(), s).find("--set training.lr: number overflow parsing") != std::string::npos);
  // In a file: the file and the key.
  const fs::path p = fs::temp_directory_path() / "fp4lab_test_config_ranges_inf.json";
  std::ofstream(p) << R"({"name": "x", "training": {"batch_size": 4, "lr": 1e999}})";
  CHECK_THROWS_WITH_AS(read_json_file(p.string()), doctest::Contains((p.string() + ": training.lr: number overflow").c_str()),
                       Error);
  fs::remove(p);
  // An integer literal beyond 64 bits for a float key becomes inf: a range error naming the key.
  CHECK(error_after(tiny_gpt(), "training.lr=" + std::string(400, '9'))
            .find("config.training.lr: inf is out of range; valid: a finite number > 0") != std::string::npos);
  // A wrong type names the key (no nlohmann type_error text).
  const std::string e = error_after(tiny_gpt(), "training.lr=\"abc\"");
  CHECK(e.find("config.training.lr: \"abc\" has the wrong type; expected a number") != std::string::npos);
  CHECK(e.find("type must be") == std::string::npos);
}

TEST_CASE("config size check: sizes beyond memory fail before any allocation, naming the keys and the bytes") {
  // 1024 layers of width 65536: about 5e13 parameters, 768 TiB with their state; no machine has it.
  std::string e = error_after(tiny_gpt(), "model.layers=1024");
  CHECK(e.empty());
  json big = tiny_gpt();
  apply_set(big, "model.layers=1024");
  apply_set(big, "model.width=65536");
  apply_set(big, "model.heads=1");
  e = error_after(big, "name=\"big\"");
  CHECK(e.find("config: the model and one training step need at least") != std::string::npos);
  CHECK(e.find("parameters, gradients and AdamW moments") != std::string::npos);
  CHECK(e.find("model.layers x model.width^2") != std::string::npos);
  CHECK(e.find("of memory") != std::string::npos);
  // Products that overflow 64 bits saturate: "more than 2^64 bytes", never a wrapped small number.
  json huge = big;
  apply_set(huge, "training.batch_size=16777216");
  apply_set(huge, "model.context=65536");
  apply_set(huge, "model.vocab_size=16777216");
  apply_set(huge, "data.type=\"char\"");
  e = error_after(huge, "name=\"huge\"");
  CHECK(e.find("more than 2^64 bytes") != std::string::npos);
  // The activations and the logits name their keys; the limit is the caller's.
  RunConfig c = config_from_json(tiny_gpt());
  CHECK_NOTHROW(check_run_size(c, uint64_t(1) << 40));
  c.training.batch_size = 4096;
  c.model.context = 4096;
  CHECK_THROWS_WITH_AS(check_run_size(c, uint64_t(1) << 30), doctest::Contains("(training.batch_size x model.context"),
                       Error);
  CHECK_THROWS_WITH_AS(check_run_size(c, uint64_t(1) << 30), doctest::Contains("activations"), Error);
  RunConfig v = config_from_json(tiny_vit());
  v.training.eval_batch_size = 1 << 24;
  CHECK_THROWS_WITH_AS(check_run_size(v, uint64_t(1) << 34), doctest::Contains("training.eval_batch_size"), Error);
  CHECK(physical_memory_bytes() > (uint64_t(1) << 20));
}

TEST_CASE("config: model.layers=1e9 and a model of 2^60 parameters fail fast (no model is built)") {
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(error_after(tiny_gpt(), "model.layers=1000000000").find("config.model.layers") != std::string::npos);
  json big = tiny_gpt();
  apply_set(big, "model.layers=1024");
  apply_set(big, "model.width=65536");
  CHECK(error_after(big, "model.heads=64").find("need at least") != std::string::npos);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 2.0);
}

TEST_CASE("config: deeply nested JSON in a file, a --set value, a --set key or an inline recipe is one Error") {
  const fs::path p = fs::temp_directory_path() / "fp4lab_test_config_ranges_deep.json";
  std::ofstream(p) << "{\"name\": " << std::string(100000, '[');
  CHECK_THROWS_WITH_AS(read_json_file(p.string()), doctest::Contains((p.string() + ": JSON nested deeper than 64").c_str()),
                       Error);
  fs::remove(p);
  json j = tiny_gpt();
  CHECK_THROWS_WITH_AS(apply_set(j, "training.lr=" + std::string(100000, '[')),
                       doctest::Contains("--set training.lr: JSON nested deeper than"), Error);
  std::string key = "a";
  for (int i = 0; i < 100000; ++i) key += ".a";
  CHECK_THROWS_WITH_AS(apply_set(j, key + "=1"), doctest::Contains("components; valid: fewer than 64"), Error);
  // Through a non-object: named, the top level as "the config".
  json arr = json::array({1});
  CHECK_THROWS_WITH_AS(apply_set(arr, "a=1"), doctest::Contains("the config is [1], not an object"), Error);
  CHECK_THROWS_WITH_AS(apply_set(j, "training.steps.x=1"), doctest::Contains("\"training.steps\" is 10, not an object"),
                       Error);
  // A value that fits under its key: the whole stays within the limit.
  CHECK_NOTHROW(apply_set(j, "recipe.x=" + std::string(60, '[') + std::string(60, ']')));
  // An inline recipe string with deep JSON: the recipe's error, prefixed with the key.
  json r = tiny_gpt();
  r["recipe"] = "{\"extends\": " + std::string(100000, '[');
  CHECK(error_after(r, "name=\"r\"").find("config.recipe: recipe JSON: JSON nested deeper than 64") !=
        std::string::npos);
  // A quantizer spec (--quantizer JSON text) and a checkpoint header: the same limit.
  std::string q;
  for (int i = 0; i < 100000; ++i) q += "{\"a\":";
  CHECK_THROWS_WITH_AS(parse_quantizer(q + "1" + std::string(100000, '}')),
                       doctest::Contains("quantizer JSON: JSON nested deeper than 64"), Error);
  const fs::path ck = fs::temp_directory_path() / "fp4lab_test_config_ranges_deep.ckpt";
  {
    const std::string h = std::string(100000, '[') + std::string(100000, ']');
    const uint64_t len = h.size();
    std::ofstream f(ck, std::ios::binary);
    f.write("FP4LCK01", 8);
    f.write(reinterpret_cast<const char*>(&len), 8);
    f << h;
  }
  CHECK_THROWS_WITH_AS(read_checkpoint_header(ck), doctest::Contains("(checkpoint header): JSON nested deeper"), Error);
  fs::remove(ck);
  // A long bad value is quoted in ~60 characters, not whole.
  json w = tiny_gpt();
  w["training"]["lr"] = std::string(100000, 'x');
  CHECK(error_after(w, "name=\"w\"").size() < 200);
}

TEST_CASE("data.path: a directory where the data file belongs names the key and the path") {
  const fs::path d = fs::temp_directory_path() / "fp4lab_test_config_ranges_dir";
  fs::create_directories(d / "train-images-idx3-ubyte");
  CHECK_THROWS_WITH_AS(load_char_text(d.string()), doctest::Contains(("data.path: " + d.string() + " is a directory").c_str()),
                       Error);
  CHECK_THROWS_WITH_AS(load_mnist(d.string(), true), doctest::Contains("is a directory"), Error);
  CHECK_THROWS_WITH_AS(read_json_file(d.string()), doctest::Contains((d.string() + " is a directory; expected a JSON file").c_str()), Error);
  // output.dir naming a file: the key, not a "filesystem error" when the run directory is made.
  std::ofstream(d / "file") << "x";
  CHECK(error_after(tiny_gpt(), "output.dir=\"" + (d / "file").string() + "\"")
            .find("config.output.dir: " + (d / "file").string() + " exists and is not a directory") !=
        std::string::npos);
  // A recipe or quantizer "file" that is a directory: named, not a bare "Is a directory".
  json r = tiny_gpt();
  r["recipe"] = d.string();
  CHECK(error_after(r, "name=\"r\"").find("recipe: " + d.string() + " is a directory") != std::string::npos);
  fs::remove_all(d);
}
