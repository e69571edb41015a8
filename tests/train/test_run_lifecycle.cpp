// The run lifecycle's API (train/run.hpp): plan_run and RunOptions::reuse (what
// `sweep` does with existing run directories), the no-op note, DivergedError,
// read_metrics' torn-line mode, config_hash and config_warnings.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/run.hpp"
#include "train/text_fixture.hpp"

using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Fixture {
  fs::path tmp;
  std::ostringstream log;
  RunOptions o;
  json base;
  explicit Fixture(const char* name) : tmp(fs::temp_directory_path() / name) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::ofstream(tmp / "text.txt") << fp4lab::train::test::words_corpus();
    base = {{"name", "tiny"},
            {"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 16}, {"context", 16}}},
            {"data", {{"type", "char"}, {"path", (tmp / "text.txt").string()}}},
            {"training",
             {{"batch_size", 4},
              {"steps", 20},
              {"lr", 1e-2},
              {"warmup_steps", 2},
              {"eval_interval", 10},
              {"eval_iters", 2},
              {"log_interval", 5}}},
            {"seed", 3},
            {"output", {{"dir", (tmp / "runs").string()}}}};
    o.log = &log;
    o.progress = false;
  }
  ~Fixture() { fs::remove_all(tmp); }
  RunConfig cfg(const std::string& name, double lr = 1e-2) const {
    json j = base;
    j["output"]["name"] = name;
    j["training"]["lr"] = lr;
    return config_from_json(j);
  }
  fs::path dir(const std::string& name) const { return tmp / "runs" / name; }
};

std::string plan_error(const RunConfig& c, const RunOptions& o) {
  try {
    plan_run(c, o);
  } catch (const fp4lab::Error& e) {
    return e.what();
  }
  return "";
}

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("sweep's handling of existing run directories (RunOptions::reuse, plan_run)") {
  Fixture F("fp4lab_test_run_lifecycle_sweep");
  run_training(F.cfg("done"), F.o);
  RunOptions stop = F.o;
  stop.stop_after = 15;  // checkpoint at step 10
  run_training(F.cfg("half"), stop);
  const std::string done_summary = read_all(F.dir("done") / "summary.json");

  RunOptions sweep = F.o;
  sweep.reuse = true;
  SUBCASE("plain sweep: absent starts, finished with the same config is kept, unfinished needs --resume") {
    CHECK(plan_run(F.cfg("new"), sweep).action == RunAction::start);
    const RunPlan p = plan_run(F.cfg("done"), sweep);
    CHECK(p.action == RunAction::none);
    CHECK(p.note.find(F.dir("done").string() + ": already completed at step 20 (best val_loss ") == 0);
    CHECK(plan_error(F.cfg("half"), sweep).find("unfinished, checkpoint at step 10); pass --resume") !=
          std::string::npos);
    const RunResult r = run_training(F.cfg("done"), sweep);
    CHECK(r.note == p.note);
    CHECK(r.summary["status"] == "completed");
    CHECK(read_all(F.dir("done") / "summary.json") == done_summary);
  }
  SUBCASE("sweep --resume: unfinished runs continue, finished ones are kept, absent ones start") {
    sweep.resume = true;
    CHECK(plan_run(F.cfg("new"), sweep).action == RunAction::start);
    CHECK(plan_run(F.cfg("done"), sweep).action == RunAction::none);
    CHECK(plan_run(F.cfg("half"), sweep).action == RunAction::resume);
    const RunResult r = run_training(F.cfg("half"), sweep);
    CHECK(r.first_step == 10);
    CHECK(r.status == "completed");
    CHECK(run_training(F.cfg("new"), sweep).status == "completed");
  }
  SUBCASE("a different config is an error naming the keys, with or without --resume") {
    for (bool resume : {false, true}) {
      sweep.resume = resume;
      const std::string e = plan_error(F.cfg("done", 2e-2), sweep);
      CHECK(e.find("training.lr 0.01 -> 0.02") != std::string::npos);
      CHECK(e.find(F.dir("done").string()) != std::string::npos);
    }
    CHECK_THROWS_WITH_AS(run_training(F.cfg("done", 2e-2), sweep), doctest::Contains("training.lr 0.01 -> 0.02"),
                         fp4lab::Error);
    CHECK(read_all(F.dir("done") / "summary.json") == done_summary);
  }
  SUBCASE("sweep --force replaces; --resume with --force is an error") {
    sweep.force = true;
    CHECK(plan_run(F.cfg("done", 2e-2), sweep).action == RunAction::replace);
    sweep.resume = true;
    CHECK(plan_error(F.cfg("done"), sweep).find("--resume and --force exclude each other") != std::string::npos);
  }
}

TEST_CASE("train --resume of a finished run: the note; a diverged run is finished too (resume: an error)") {
  Fixture F("fp4lab_test_run_lifecycle_note");
  const RunResult done = run_training(F.cfg("a"), F.o);
  RunOptions res = F.o;
  res.resume = true;
  const RunResult r = run_training(F.cfg("a"), res);
  char best[32];
  std::snprintf(best, sizeof best, "%.4f", done.summary["best"].get<double>());
  CHECK(r.note == F.dir("a").string() + ": already completed at step 20 (best val_loss " + best + "); nothing to do");
  // A fresh run that diverges throws DivergedError and keeps its summary.
  json j = F.base;
  j["training"]["lr"] = 1e30;
  j["training"]["warmup_steps"] = 0;
  j["training"]["grad_clip"] = 0.0;
  j["output"]["name"] = "nan";
  CHECK_THROWS_AS(run_training(config_from_json(j), F.o), DivergedError);
  const std::string summary = read_all(F.dir("nan") / "summary.json");
  CHECK(summary.find("diverged") != std::string::npos);
  CHECK_THROWS_WITH_AS(run_training(config_from_json(j), res), doctest::Contains("--force runs it again"),
                       fp4lab::Error);
  RunOptions sweep = F.o;
  sweep.reuse = true;  // sweep keeps it (and compares it) like a completed run
  const RunResult again = run_training(config_from_json(j), sweep);
  CHECK(again.status == "diverged");
  CHECK(again.note.find("diverged at step") != std::string::npos);
  CHECK(read_all(F.dir("nan") / "summary.json") == summary);
  // A replacement that diverges before its first checkpoint is not a DivergedError
  // (the directory holds the old run again).
  RunOptions force = F.o;
  force.force = true;
  j["output"]["name"] = "a";
  j["training"]["eval_interval"] = 1000;
  try {
    run_training(config_from_json(j), force);
    FAIL("no error");
  } catch (const DivergedError&) {
    FAIL("a DivergedError");
  } catch (const fp4lab::Error& e) {
    CHECK(std::string(e.what()).find("holds the run it was to replace again") != std::string::npos);
  }
  CHECK(read_json_file((F.dir("a") / "summary.json").string())["status"] == "completed");
}

TEST_CASE("leftovers: a failed start's directory under --resume; a run set aside by an interrupted --force") {
  Fixture F("fp4lab_test_run_lifecycle_leftovers");
  fs::create_directories(F.dir("a"));
  std::ofstream(F.dir("a") / "config.json") << "{}";
  RunOptions res = F.o;
  res.resume = true;
  CHECK(plan_error(F.cfg("a"), res).find("holds only the config.json of a start that failed") != std::string::npos);
  // An interrupted --force whose replacement never reached a checkpoint: the old run moves back.
  run_training(F.cfg("b"), F.o);
  const std::string b_summary = read_all(F.dir("b") / "summary.json");
  fs::rename(F.dir("b"), F.dir("b.old.12345"));
  fs::create_directories(F.dir("b"));
  std::ofstream(F.dir("b") / "config.json") << "{}";
  CHECK(run_training(F.cfg("b"), res).note.find("already completed") != std::string::npos);
  CHECK(F.log.str().find("moved " + F.dir("b.old.12345").string() + " back to " + F.dir("b").string()) !=
        std::string::npos);
  CHECK(read_all(F.dir("b") / "summary.json") == b_summary);
  CHECK(!fs::exists(F.dir("b.old.12345")));
  // Its replacement past its first checkpoint: the new run stands, the old one goes.
  fs::create_directories(F.dir("b.old.777"));
  std::ofstream(F.dir("b.old.777") / "config.json") << "{}";
  run_training(F.cfg("b"), res);
  CHECK(F.log.str().find("removed " + F.dir("b.old.777").string()) != std::string::npos);
  CHECK(!fs::exists(F.dir("b.old.777")));
}

TEST_CASE("read_metrics drops only a torn last line, and only when asked") {
  const fs::path p = fs::temp_directory_path() / "fp4lab_test_run_lifecycle_metrics.jsonl";
  std::ofstream(p) << "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3, \"lo";
  std::string torn;
  CHECK(read_metrics(p.string(), &torn).size() == 2);
  CHECK(torn.find(p.string() + ":3: dropped a torn last line") == 0);
  CHECK_THROWS_AS(read_metrics(p.string()), fp4lab::Error);
  std::ofstream(p) << "{\"step\": 1}\n{\"st\n{\"step\": 3}\n";
  CHECK_THROWS_WITH_AS(read_metrics(p.string(), &torn), doctest::Contains(":2: invalid JSON line"), fp4lab::Error);
  std::ofstream(p) << "{\"step\": 1}\n";
  CHECK(read_metrics(p.string(), &torn).size() == 1);
  CHECK(torn.empty());
  fs::remove(p);
}

TEST_CASE("config_hash ignores threads and output; config_warnings") {
  Fixture F("fp4lab_test_run_lifecycle_hash");
  json a = config_to_json(F.cfg("x")), b = a;
  b["threads"] = 7;
  b["output"]["dir"] = "elsewhere";
  CHECK(config_hash(a) == config_hash(b));
  b["training"]["lr"] = 0.5;
  CHECK(config_hash(a) != config_hash(b));
  const RunConfig c = F.cfg("x");
  CHECK(config_warnings(c, 20).empty());
  const auto w = config_warnings(c, 2);
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("config.training.warmup_steps 2 >= the run's 2 steps") != std::string::npos);
}

TEST_CASE("a run directory that cannot be made is an fp4lab::Error naming the path") {
  Fixture F("fp4lab_test_run_lifecycle_fs");
  json j = F.base;
  j["output"]["dir"] = (F.tmp / "text.txt" / "runs").string();  // under a file
  CHECK_THROWS_WITH_AS(run_training(config_from_json(j), F.o), doctest::Contains("text.txt/runs"), fp4lab::Error);
}

TEST_CASE("a run of fewer than 3 steps still reports ms_per_step (its warm-up steps timed)") {
  Fixture F("fp4lab_test_run_lifecycle_short");
  json j = F.base;
  j["training"]["steps"] = 2;
  j["training"]["warmup_steps"] = 0;
  const RunResult r = run_training(config_from_json(j), F.o);
  CHECK(r.summary["ms_per_step"].is_number());
  const json s = read_json_file((fs::path(r.dir) / "summary.json").string());
  CHECK(s["ms_per_step"].is_number());
  CHECK(s["items_per_s"].is_number());
}
