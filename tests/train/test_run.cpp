// Runs (train/run.cpp) and configs (config.cpp): a tiny end-to-end training
// run on a generated fixture must reduce the loss; --resume continues
// bit-exactly; config errors name the JSON path.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/compare.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"
#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/npy.hpp"

using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

TEST_CASE("a tiny GPT run reduces the loss and writes its run directory") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_e2e";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  RunResult r = run_training(config_from_json(test::tiny_gpt_config(text, (tmp / "runs").string())), o);
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
  CHECK_THROWS_AS(run_training(config_from_json(test::tiny_gpt_config(text, (tmp / "runs").string())), o), fp4lab::Error);
  // compare without a plot
  CompareResult c = compare_runs({r.dir}, CompareOptions{"-", "", "", {}, CompareMetric::final});
  CHECK(c.table.find("val_loss") != std::string::npos);
  fs::remove_all(tmp);
}

TEST_CASE("resume continues bit-exactly (quantized recipe with stochastic rounding and dropout)") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_resume";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  json a = test::tiny_gpt_config(text, (tmp / "a").string(), "nvfp4");
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

TEST_CASE("training.moments bf16: moments stored as BF16 (half the bytes in the memory count), resume bit-exact") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_bf16_moments";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  auto config = [&](const std::string& dir, const char* moments) {
    json j = test::tiny_gpt_config(text, (tmp / dir).string(), "nvfp4");
    j["training"]["steps"] = 30;
    j["distributed"]["zero"] = 1;  // one rank: the summary's memory count (distributed)
    if (moments) j["training"]["moments"] = moments;
    return j;
  };
  const RunResult fp32 = run_training(config_from_json(config("fp32", nullptr)), o);
  const RunResult full = run_training(config_from_json(config("a", "bf16")), o);
  REQUIRE(full.step_losses.size() == 30);
  CHECK(full.final_params != fp32.final_params);  // the storage changes the run
  CHECK(full.step_losses[0] == fp32.step_losses[0]);  // not the first forward
  // The checkpoint's moments are BF16 values (low 16 bits zero), the summary counts 2 bytes a moment.
  const Checkpoint ck = load_checkpoint(fs::path(full.dir) / "checkpoint.bin", int64_t(full.final_params.size()));
  int64_t wide = 0, nonzero = 0;
  for (size_t i = 0; i < ck.m.size(); ++i) {
    wide += (fp4lab::float_bits(ck.m[i]) & 0xFFFFu) != 0 || (fp4lab::float_bits(ck.v[i]) & 0xFFFFu) != 0;
    nonzero += ck.m[i] != 0.0f;
  }
  CHECK(wide == 0);
  CHECK(nonzero > int64_t(ck.m.size()) / 2);
  const int64_t n = int64_t(full.final_params.size());
  CHECK(full.summary["distributed"]["moments_bytes"].get<int64_t>() == 2 * 4 * ((n + 1) / 2));  // ceil(n/2) floats
  CHECK(fp32.summary["distributed"]["moments_bytes"].get<int64_t>() == 2 * 4 * n);
  // Interrupted after the checkpoint of step 20, then resumed: the same losses and parameters.
  RunOptions stop = o;
  stop.stop_after = 27;
  CHECK(run_training(config_from_json(config("b", "bf16")), stop).status == "stopped");
  RunOptions res = o;
  res.resume = true;
  const RunResult rest = run_training(config_from_json(config("b", "bf16")), res);
  REQUIRE(rest.step_losses.size() == 10);
  for (size_t i = 0; i < 10; ++i) CHECK(rest.step_losses[i] == full.step_losses[20 + i]);
  CHECK(rest.final_params == full.final_params);
  // Written to config.json only when set; a bad value names the key and the valid ones.
  const json ca = json::parse(std::ifstream(fs::path(fp32.dir) / "config.json"));
  const json cb = json::parse(std::ifstream(fs::path(full.dir) / "config.json"));
  CHECK_FALSE(ca["training"].contains("moments"));
  CHECK(cb["training"]["moments"] == "bf16");
  CHECK_THROWS_WITH_AS(config_from_json(config("c", "fp8")),
                       doctest::Contains("training.moments: \"fp8\""), fp4lab::Error);
  fs::remove_all(tmp);
}

TEST_CASE("training.loss_scale: a power of two leaves an FP32 run bit-identical; it changes what FP4 operands see") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_loss_scale";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  auto run = [&](const std::string& recipe, double ls, const std::string& dir) {
    json j = test::tiny_gpt_config(text, (tmp / dir).string(), recipe);
    j["training"]["steps"] = 12;
    j["training"]["loss_scale"] = ls;
    return run_training(config_from_json(j), o);
  };
  const RunResult a = run("fp32", 1.0, "a"), b = run("fp32", 1024.0, "b");
  REQUIRE(a.step_losses.size() == 12);
  CHECK(a.step_losses == b.step_losses);  // the loss is not scaled, the gradients are unscaled exactly
  CHECK(a.final_params == b.final_params);
  // fp4-trainkit's NVFP4 with its 2^-9 scale floor sees larger gradients under a loss scale: its run changes.
  const RunResult c = run("fp4tk_fp4_all_the_way", 1.0, "c"), d = run("fp4tk_fp4_all_the_way", 4096.0, "d");
  CHECK(c.final_params != d.final_params);
  // Written to config.json only when set.
  const json ca = json::parse(std::ifstream(fs::path(a.dir) / "config.json"));
  const json cb = json::parse(std::ifstream(fs::path(b.dir) / "config.json"));
  CHECK_FALSE(ca["training"].contains("loss_scale"));
  CHECK(cb["training"]["loss_scale"] == 1024.0);
  fs::remove_all(tmp);
}

TEST_CASE("config validation errors name the JSON path") {
  json j = test::tiny_gpt_config("x.txt", "runs");
  json bad = j;
  bad["training"]["lr_max"] = 1;
  CHECK(test::config_error(bad).find("config.training.lr_max: unknown key") != std::string::npos);
  bad = j;
  bad["model"]["type"] = "rnn";
  CHECK(test::config_error(bad).find("config.model.type") != std::string::npos);
  bad = j;
  bad["training"]["batch_size"] = "12";
  CHECK(test::config_error(bad).find("config.training.batch_size") != std::string::npos);
  bad = j;
  bad["recipe"] = "nvfp5";
  CHECK(test::config_error(bad).find("config.recipe") != std::string::npos);
  bad = j;
  bad["model"]["heads"] = 3;
  CHECK(test::config_error(bad).find("config.model.width") != std::string::npos);
  bad = j;
  bad["data"]["type"] = "mnist";
  CHECK(test::config_error(bad).find("config.data.type") != std::string::npos);
  bad = j;
  bad["model"]["dropout"] = 1.5;
  CHECK(test::config_error(bad).find("config.model.dropout") != std::string::npos);
  for (const double ls : {0.0, -2.0, 1e40}) {
    bad = j;
    bad["training"]["loss_scale"] = ls;
    CHECK(test::config_error(bad).find("config.training.loss_scale") != std::string::npos);
  }
  CHECK(test::config_error(j).empty());
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
  const std::string text = test::write_words_corpus(tmp);
  json j = test::tiny_gpt_config(text, (tmp / "runs").string());
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

// ---- the run lifecycle: nothing finished is modified or deleted unless the command's success is certain ----

namespace {

// Every file of a directory (name -> bytes), to show that nothing changed.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> m;
  if (!fs::exists(dir)) return m;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    m[e.path().filename().string()] = s.str();
  }
  return m;
}

std::string run_error(const json& j, const RunOptions& o) {
  try {
    run_training(config_from_json(j), o);
  } catch (const fp4lab::Error& e) {
    return e.what();
  }
  return "";
}

// Entries of `parent` whose name starts with `prefix` (leftover .old./.tmp. siblings).
int siblings(const fs::path& parent, const std::string& prefix) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(parent)) n += e.path().filename().string().starts_with(prefix);
  return n;
}

struct Lifecycle {
  fs::path tmp;
  std::string text;
  std::ostringstream log;
  RunOptions o;
  explicit Lifecycle(const char* name) : tmp(fs::temp_directory_path() / name) {
    fs::remove_all(tmp);
    text = test::write_words_corpus(tmp);
    o.log = &log;
    o.progress = false;
  }
  ~Lifecycle() { fs::remove_all(tmp); }
  json cfg(int steps = 20) const {
    json j = test::tiny_gpt_config(text, (tmp / "runs").string());
    j["training"]["steps"] = steps;
    j["training"]["eval_interval"] = 10;
    return j;
  }
  fs::path dir() const { return tmp / "runs" / "tiny-fp32-s3"; }
};

}  // namespace

TEST_CASE("resume of a finished run changes no file") {
  Lifecycle L("fp4lab_test_run_resume_done");
  const RunResult done = run_training(config_from_json(L.cfg()), L.o);
  REQUIRE(done.status == "completed");
  const auto before = snapshot(L.dir());
  RunOptions res = L.o;
  res.resume = true;
  RunResult r;
  REQUIRE_NOTHROW(r = run_training(config_from_json(L.cfg()), res));
  CHECK(r.status == "completed");
  CHECK(r.step_losses.empty());
  CHECK(snapshot(L.dir()) == before);  // was: summary.json rewritten with "final": null, "ms_per_step": null
  const json s = read_json_file((L.dir() / "summary.json").string());
  CHECK(s["final"].is_number());
  CHECK(s["ms_per_step"].is_number());
  CHECK(r.summary["final"] == s["final"]);
  // Killed after the last checkpoint but before summary.json: resume runs no step and writes the
  // summary.json the run would have written (no nulls: the final metric and timing come from metrics.jsonl).
  const json full = s;
  fs::remove(L.dir() / "summary.json");
  const auto no_summary = snapshot(L.dir());
  REQUIRE_NOTHROW(r = run_training(config_from_json(L.cfg()), res));
  CHECK(r.step_losses.empty());
  const json again = read_json_file((L.dir() / "summary.json").string());
  for (const char* k : {"final", "best", "final_train_loss", "steps", "status", "config_hash", "checksums", "data"})
    CHECK_MESSAGE(again[k] == full[k], k);
  CHECK(again["ms_per_step"].is_number());
  fs::remove(L.dir() / "summary.json");
  CHECK(snapshot(L.dir()) == no_summary);  // nothing else changed
}

TEST_CASE("--force keeps the old run until the new one has a checkpoint") {
  Lifecycle L("fp4lab_test_run_force");
  run_training(config_from_json(L.cfg()), L.o);
  const auto before = snapshot(L.dir());
  RunOptions force = L.o;
  force.force = true;
  SUBCASE("the new run fails before its first checkpoint: the old run is moved back") {
    json bad = L.cfg();
    bad["model"]["context"] = 1000;  // longer than the validation split: the step-0 evaluation throws
    CHECK(run_error(bad, force).find("too short for context") != std::string::npos);
    CHECK(snapshot(L.dir()) == before);  // was: the old run deleted, config.json + metrics.jsonl left
  }
  SUBCASE("the new run diverges before its first checkpoint: the old run is moved back") {
    json bad = L.cfg();
    bad["training"]["lr"] = 1e30;
    bad["training"]["warmup_steps"] = 0;
    bad["training"]["grad_clip"] = 0.0;
    bad["training"]["eval_interval"] = 1000;  // no checkpoint before the end
    CHECK(run_error(bad, force).find("diverged at step") != std::string::npos);
    CHECK(snapshot(L.dir()) == before);
  }
#ifndef FP4LAB_WITH_CUDA
  SUBCASE("backend cuda on a build without CUDA: nothing is touched") {
    json bad = L.cfg();
    bad["backend"] = "cuda";
    CHECK(run_error(bad, force).find("cuda") != std::string::npos);
    CHECK(snapshot(L.dir()) == before);
  }
#endif
  SUBCASE("the new run succeeds: it replaces the old one, nothing is left aside") {
    json j = L.cfg();
    j["training"]["lr"] = 2e-2;
    const RunResult r = run_training(config_from_json(j), force);
    CHECK(r.status == "completed");
    CHECK(read_json_file((L.dir() / "config.json").string())["training"]["lr"] == 2e-2);
    CHECK(snapshot(L.dir()) != before);
  }
  CHECK(siblings(L.tmp / "runs", "tiny-fp32-s3.") == 1);  // no .old.PID / .tmp.PID left behind, only the lock
  CHECK(fs::exists(L.tmp / "runs" / "tiny-fp32-s3.lock"));
}

TEST_CASE("an existing run directory with a different config: the error names the keys; the config hash is recorded") {
  Lifecycle L("fp4lab_test_run_config_diff");
  run_training(config_from_json(L.cfg()), L.o);
  const auto before = snapshot(L.dir());
  const json s = read_json_file((L.dir() / "summary.json").string());
  REQUIRE(s.contains("config_hash"));
  CHECK(s["config_hash"].get<std::string>().size() == 16);
  json j = L.cfg();
  j["training"]["lr"] = 2e-2;
  const std::string e = run_error(j, L.o);
  CHECK(e.find(L.dir().string() + ": exists with a different config: training.lr 0.01 -> 0.02") != std::string::npos);
  CHECK(e.find("--force") != std::string::npos);
  RunOptions res = L.o;
  res.resume = true;
  CHECK(run_error(j, res).find("training.lr 0.01 -> 0.02") != std::string::npos);
  // threads and output do not make a different run
  json t = L.cfg();
  t["threads"] = 1;
  CHECK(run_error(t, res).empty());
  CHECK(snapshot(L.dir()) == before);
}

TEST_CASE("a failed start leaves no run directory, and a failed start's config.json does not block a retry") {
  Lifecycle L("fp4lab_test_run_failed_start");
  json bad = L.cfg();
  bad["model"]["context"] = 1000;  // the step-0 evaluation throws
  CHECK(run_error(bad, L.o).find("too short for context") != std::string::npos);
  CHECK(!fs::exists(L.dir()));  // was: config.json + an empty metrics.jsonl
#ifndef FP4LAB_WITH_CUDA
  json cuda = L.cfg();
  cuda["backend"] = "cuda";
  CHECK(!run_error(cuda, L.o).empty());
  CHECK(!fs::exists(L.dir()));
#endif
  // What an older fp4lab left after a failed start: only config.json (and an empty metrics.jsonl).
  fs::create_directories(L.dir());
  std::ofstream(L.dir() / "config.json") << config_to_json(config_from_json(bad)).dump(2);
  std::ofstream(L.dir() / "metrics.jsonl");
  RunResult r;
  REQUIRE_NOTHROW(r = run_training(config_from_json(L.cfg()), L.o));
  CHECK(r.status == "completed");
  CHECK(L.log.str().find("start that failed") != std::string::npos);
  CHECK(read_json_file((L.dir() / "config.json").string())["model"]["context"] == 16);
}

TEST_CASE("resume drops a torn last line of metrics.jsonl with a warning") {
  Lifecycle L("fp4lab_test_run_torn");
  const RunResult full = run_training(config_from_json(L.cfg()), L.o);
  json b = L.cfg();
  b["output"]["name"] = "b";
  RunOptions stop = L.o;
  stop.stop_after = 15;  // after the checkpoint of step 10
  run_training(config_from_json(b), stop);
  const fs::path m = L.tmp / "runs" / "b" / "metrics.jsonl";
  std::ofstream(m, std::ios::app) << "{\"step\": 16, \"loss\": 2.1";  // killed mid-write
  RunOptions res = L.o;
  res.resume = true;
  RunResult r;
  REQUIRE_NOTHROW(r = run_training(config_from_json(b), res));  // was: "invalid JSON line"
  CHECK(r.status == "completed");
  CHECK(L.log.str().find("torn last line") != std::string::npos);
  CHECK(r.final_params == full.final_params);
  const auto ma = read_metrics((fs::path(full.dir) / "metrics.jsonl").string());
  const auto mb = read_metrics(m.string());  // strict: every line parses again
  CHECK(ma.size() == mb.size());
  // Read strictly (compare), a torn last line is still an error naming file:line.
  std::ofstream(m, std::ios::app) << "{\"step\": 2";
  CHECK_THROWS_WITH_AS(read_metrics(m.string()), doctest::Contains("metrics.jsonl:"), fp4lab::Error);
}

TEST_CASE("config checks: run names, threads, seed range, a warmup longer than the run") {
  const json j = test::tiny_gpt_config("x.txt", "runs");
  for (const char* name : {"../../escape", "a/b", "..", ""}) {
    json bad = j;
    bad["name"] = name;
    CHECK(test::config_error(bad).find("config.name: \"" + std::string(name) + "\" cannot name a run directory") !=
          std::string::npos);
    bad = j;
    bad["output"]["name"] = name;
    if (*name) CHECK(test::config_error(bad).find("config.output.name") != std::string::npos);
  }
  for (int t : {-3, 1025, 100000}) {
    json bad = j;
    bad["threads"] = t;
    CHECK(test::config_error(bad).find("config.threads: " + std::to_string(t) +
                             " is not valid; valid: 0 (OpenMP's default) or 1..1024") != std::string::npos);
  }
  for (int t : {0, 1, 1024}) {
    json ok = j;
    ok["threads"] = t;
    CHECK(test::config_error(ok).empty());
  }
  json bad = j;
  apply_set(bad, "seed=-1");
  CHECK(test::config_error(bad).find("config.seed: -1 is out of range; valid: an integer in 0..18446744073709551615") !=
        std::string::npos);
  bad = j;
  apply_set(bad, "seed=18446744073709551616");
  CHECK(test::config_error(bad).find("config.seed: 18446744073709551616 is out of range") != std::string::npos);
  json ok = j;
  apply_set(ok, "seed=18446744073709551615");
  CHECK(test::config_error(ok).empty());
  CHECK(config_from_json(ok).seed == 18446744073709551615ull);
  // warmup_steps >= steps: a one-line warning, the run goes on
  Lifecycle L("fp4lab_test_run_warmup");
  json w = L.cfg(10);
  w["training"]["warmup_steps"] = 100;
  CHECK(run_training(config_from_json(w), L.o).status == "completed");
  CHECK(L.log.str().find("warmup_steps 100 >= the run's 10 steps: the learning rate never reaches its set value") !=
        std::string::npos);
}

TEST_CASE("output.capture_step writes every linear layer's x, w and dy of that step") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_run_capture";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  json j = test::tiny_gpt_config(text, (tmp / "runs").string(), "nvfp4");
  j["training"]["steps"] = 6;
  j["model"]["dropout"] = 0.0;
  j["output"]["capture_step"] = 3;
  std::ostringstream log;
  RunOptions o;
  o.log = &log;
  const RunResult r = run_training(config_from_json(j), o);
  REQUIRE(r.status == "completed");
  const fs::path cap = fs::path(r.dir) / "capture" / "step_3";
  REQUIRE(fs::is_directory(cap));
  int files = 0;
  for (const auto& e : fs::directory_iterator(cap)) files += e.path().extension() == ".npy";
  // 1 block x 4 linears + lm_head, each x, w, dy.
  CHECK(files == 15);
  using fp4lab::Shape;
  const auto x = fp4lab::read_npy_float32((cap / "h.0.mlp.c_fc.x.npy").string());
  const auto w = fp4lab::read_npy_float32((cap / "h.0.mlp.c_fc.w.npy").string());
  const auto dy = fp4lab::read_npy_float32((cap / "h.0.mlp.c_fc.dy.npy").string());
  CHECK(x.shape == Shape{4 * 16, 16});  // batch x context rows, width
  CHECK(w.shape == Shape{64, 16});      // mlp 4x
  CHECK(dy.shape == Shape{4 * 16, 64});
  double norm = 0;
  for (float v : dy.data) norm += double(v) * v;
  CHECK(norm > 0);
  // No leftovers, and bad values are refused.
  for (const auto& e : fs::directory_iterator(fs::path(r.dir) / "capture"))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  json bad = j;
  bad["output"]["capture_step"] = -2;
  CHECK(test::config_error(bad).find("output.capture_step") != std::string::npos);
  fs::remove_all(tmp);
}
