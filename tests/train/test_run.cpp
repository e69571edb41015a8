// Runs (train/run.cpp) and configs (config.cpp): a tiny end-to-end training
// run on a generated fixture must reduce the loss; --resume continues
// bit-exactly; config errors name the JSON path.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "train/config.hpp"
#include "train/compare.hpp"
#include "train/run.hpp"
#include "core/error.hpp"

using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A generated char corpus: a repeating pattern with a little variety (learnable).
std::string fixture_text(const fs::path& dir) {
  fs::create_directories(dir);
  std::string s;
  const char* words[] = {"the cat sat. ", "a dog ran! ", "we sing low; ", "to be or not. "};
  for (int i = 0; i < 600; ++i) s += words[(i * 7 + i / 3) % 4];
  const fs::path p = dir / "text.txt";
  std::ofstream(p) << s;
  return p.string();
}

json tiny_gpt(const std::string& text, const std::string& out, const std::string& recipe = "fp32") {
  return json{
      {"name", "tiny"},
      {"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 16}, {"context", 16}, {"dropout", 0.1}}},
      {"data", {{"type", "char"}, {"path", text}}},
      {"training",
       {{"batch_size", 4},
        {"steps", 60},
        {"lr", 1e-2},
        {"warmup_steps", 5},
        {"eval_interval", 20},
        {"eval_iters", 2},
        {"log_interval", 5}}},
      {"recipe", recipe},
      {"seed", 3},
      {"output", {{"dir", out}}}};
}

std::string error_of(const json& j) {
  try {
    config_from_json(j);
  } catch (const fp4lab::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a tiny GPT run reduces the loss and writes its run directory") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_e2e";
  fs::remove_all(tmp);
  const std::string text = fixture_text(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  RunResult r = run_training(config_from_json(tiny_gpt(text, (tmp / "runs").string())), o);
  CHECK(r.status == "completed");
  REQUIRE(r.step_losses.size() == 60);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += r.step_losses[size_t(i)], last += r.step_losses[size_t(55 + i)];
  CHECK(last < 0.7 * first);
  for (const char* f : {"config.json", "metrics.jsonl", "summary.json", "checkpoint.bin"})
    CHECK(fs::exists(fs::path(r.dir) / f));
  const auto m = read_metrics((fs::path(r.dir) / "metrics.jsonl").string());
  int evals = 0;
  for (const auto& l : m) evals += l.contains("eval");
  CHECK(evals == 4);  // steps 0, 20, 40, 60
  CHECK(r.summary["best"].get<double>() <= r.summary["final"].get<double>() + 1e-12);
  // An existing directory is refused without --force.
  CHECK_THROWS_AS(run_training(config_from_json(tiny_gpt(text, (tmp / "runs").string())), o), fp4lab::Error);
  // compare without a plot
  CompareResult c = compare_runs({r.dir}, CompareOptions{"-", ""});
  CHECK(c.table.find("val_loss") != std::string::npos);
  fs::remove_all(tmp);
}

TEST_CASE("resume continues bit-exactly (quantized recipe with stochastic rounding and dropout)") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_resume";
  fs::remove_all(tmp);
  const std::string text = fixture_text(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  json a = tiny_gpt(text, (tmp / "a").string(), "nvfp4");
  a["training"]["steps"] = 30;
  json b = a;
  b["output"]["dir"] = (tmp / "b").string();
  RunResult full = run_training(config_from_json(a), o);
  RunOptions stop = o;
  stop.stop_after = 27;  // interrupted after the checkpoint of step 20
  RunResult part = run_training(config_from_json(b), stop);
  CHECK(part.status == "stopped");
  RunOptions res = o;
  res.resume = true;
  RunResult rest = run_training(config_from_json(b), res);
  CHECK(rest.first_step == 20);
  REQUIRE(rest.step_losses.size() == 10);
  for (size_t i = 0; i < 10; ++i) CHECK(rest.step_losses[i] == full.step_losses[20 + i]);  // bit-exact
  CHECK(rest.final_params == full.final_params);
  // The metrics files agree on the losses too.
  auto ma = read_metrics((fs::path(full.dir) / "metrics.jsonl").string());
  auto mb = read_metrics((fs::path(rest.dir) / "metrics.jsonl").string());
  REQUIRE(ma.size() == mb.size());
  for (size_t i = 0; i < ma.size(); ++i) CHECK(ma[i].value("loss", 0.0) == mb[i].value("loss", 0.0));
  fs::remove_all(tmp);
}

TEST_CASE("config validation errors name the JSON path") {
  json j = tiny_gpt("x.txt", "runs");
  json bad = j;
  bad["training"]["lr_max"] = 1;
  CHECK(error_of(bad).find("config.training.lr_max: unknown key") != std::string::npos);
  bad = j;
  bad["model"]["type"] = "rnn";
  CHECK(error_of(bad).find("config.model.type") != std::string::npos);
  bad = j;
  bad["training"]["batch_size"] = "12";
  CHECK(error_of(bad).find("config.training.batch_size") != std::string::npos);
  bad = j;
  bad["recipe"] = "nvfp5";
  CHECK(error_of(bad).find("config.recipe") != std::string::npos);
  bad = j;
  bad["model"]["heads"] = 3;
  CHECK(error_of(bad).find("config.model.width") != std::string::npos);
  bad = j;
  bad["data"]["type"] = "mnist";
  CHECK(error_of(bad).find("config.data.type") != std::string::npos);
  bad = j;
  bad["model"]["dropout"] = 1.5;
  CHECK(error_of(bad).find("config.model.dropout") != std::string::npos);
  CHECK(error_of(j).empty());
  // --set with dotted keys
  apply_set(j, "training.lr=3e-4");
  apply_set(j, "output.name=abc");
  CHECK(j["training"]["lr"].get<double>() == 3e-4);
  CHECK(j["output"]["name"] == "abc");
  CHECK_THROWS_AS(apply_set(j, "nokey"), fp4lab::Error);
  CHECK_THROWS_AS(apply_set(j, "training.lr.x=1"), fp4lab::Error);
}

TEST_CASE("a NaN/Inf loss stops the run with a clear error and keeps the last good checkpoint") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_nan";
  fs::remove_all(tmp);
  const std::string text = fixture_text(tmp);
  json j = tiny_gpt(text, (tmp / "runs").string());
  j["training"]["lr"] = 1e30;
  j["training"]["warmup_steps"] = 0;
  j["training"]["eval_interval"] = 1;
  j["training"]["grad_clip"] = 0.0;
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  std::string err;
  try {
    run_training(config_from_json(j), o);
  } catch (const fp4lab::Error& e) {
    err = e.what();
  }
  CHECK(err.find("diverged at step") != std::string::npos);
  CHECK(err.find("checkpoint") != std::string::npos);
  const fs::path dir = tmp / "runs" / "tiny-fp32-s3";
  CHECK(fs::exists(dir / "checkpoint.bin"));
  CHECK(read_json_file((dir / "summary.json").string())["status"] == "diverged");
  fs::remove_all(tmp);
}
