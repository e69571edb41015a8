// compare's arms (--by config keys, the keys absent from older runs' config.json) and compared metric
// (--metric final|best) on fixture run directories with known numbers. The expected Welch intervals are
// mpmath's (an implementation independent of train/stats.cpp), from this script (mpmath 1.3.0):
//   from mpmath import mp, mpf, betainc, findroot, sqrt; mp.dps = 40
//   def tcdf(t, df):
//       tail = betainc(df / 2, mpf(1) / 2, 0, df / (df + t * t), regularized=True) / 2
//       return 1 - tail if t > 0 else tail
//   def welch(a, b):  # a, b: lists of decimal strings
//       a, b = [mpf(x) for x in a], [mpf(x) for x in b]
//       m = lambda v: sum(v) / len(v); var = lambda v: sum((x - m(v)) ** 2 for x in v) / (len(v) - 1)
//       va, vb = var(a) / len(a), var(b) / len(b); se = sqrt(va + vb)
//       df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
//       q = findroot(lambda t: tcdf(t, df) - mpf('0.975'), mpf(2)); d = m(a) - m(b)
//       return d, df, d - q * se, d + q * se
// Means, differences, standard errors and Welch's df are also computed here from the raw numbers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "train/compare.hpp"
#include "train/compare_archive.hpp"
#include "train/config.hpp"
#include "train/text_fixture.hpp"

using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A finished run as compare reads it: config.json (`cfg`, with recipe and seed set), summary.json (final: the
// last evaluation; best: the best, lowest or highest per `higher`, unless `best` is given) and metrics.jsonl
// (a training loss line, then one evaluation line per value of `evals`, 100 steps apart).
void write_run(const fs::path& dir, const std::string& recipe, int seed, json cfg, const std::vector<double>& evals,
               const std::string& metric = "val_loss", bool higher = false, double best = NAN) {
  fs::create_directories(dir);
  cfg["recipe"] = recipe;
  cfg["seed"] = seed;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  if (std::isnan(best)) best = higher ? *std::max_element(evals.begin(), evals.end())
                                      : *std::min_element(evals.begin(), evals.end());
  const json s = {{"name", "arms"},       {"recipe", recipe},       {"seed", seed},      {"status", "completed"},
                  {"metric", metric},     {"higher_is_better", higher}, {"final", evals.back()}, {"best", best},
                  {"final_train_loss", 1.0}, {"ms_per_step", 1.0},   {"items_per_s", 100.0}};
  std::ofstream(dir / "summary.json") << s.dump(2);
  std::ofstream m(dir / "metrics.jsonl");
  m << json{{"step", 1}, {"loss", 3.0}}.dump() << "\n";
  for (size_t i = 0; i < evals.size(); ++i)
    m << json{{"step", 100 * i}, {"eval", true}, {metric, evals[i]}}.dump() << "\n";
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}
double var(const std::vector<double>& v) {  // sample variance (n - 1)
  const double m = mean(v);
  double q = 0;
  for (double x : v) q += (x - m) * (x - m);
  return q / double(v.size() - 1);
}

const RecipeStats& arm(const CompareResult& c, const std::string& label) {
  for (const RecipeStats& s : c.recipes)
    if (s.recipe == label) return s;
  FAIL("no arm " << label);
  return c.recipes[0];
}

// The one-line error compare_runs throws.
std::string compare_error(const std::vector<std::string>& dirs, const CompareOptions& o) {
  try {
    compare_runs(dirs, o);
  } catch (const fp4lab::Error& e) {
    const std::string m = e.what();
    CHECK(m.find('\n') == std::string::npos);
    return m;
  }
  FAIL("no error");
  return "";
}

const json kGpt = {{"name", "arms"}, {"model", {{"type", "gpt"}, {"layers", 2}, {"width", 64}}},
                   {"training", {{"lr", 0.001}}}, {"layers", {{"keep_high_precision", json::array()}}},
                   {"eval_recipe", nullptr}};

}  // namespace

TEST_CASE("compare --by model.attention: one key, absent in older runs (fp32), final and best") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_compare_arms_one";
  fs::remove_all(tmp);
  // Arm bf16_flash (model.attention set) seeds 1-4, listed first; arm fp32: runs written before the key existed.
  const std::vector<std::vector<double>> flash = {{2.0, 1.52, 1.70}, {2.0, 1.47, 1.49}, {2.0, 1.51, 1.62},
                                                  {2.0, 1.44, 1.50}};
  const std::vector<std::vector<double>> plain = {{2.0, 1.50, 1.60}, {2.0, 1.40, 1.45}, {2.0, 1.55, 1.58}};
  std::vector<std::string> dirs;
  for (int s = 1; s <= 4; ++s) {
    json cfg = kGpt;
    cfg["model"]["attention"] = "bf16_flash";
    dirs.push_back((tmp / "runs" / ("flash_s" + std::to_string(s))).string());
    write_run(dirs.back(), "bf16", s, cfg, flash[size_t(s - 1)]);
  }
  for (int s = 1; s <= 3; ++s) {
    dirs.push_back((tmp / "runs" / ("old_s" + std::to_string(s))).string());
    write_run(dirs.back(), "bf16", s, kGpt, plain[size_t(s - 1)]);
  }
  // Without --by: one arm (the recipe), as before.
  const CompareResult one = compare_runs(dirs, CompareOptions{"-", "", "", {}, CompareMetric::final});
  REQUIRE(one.recipes.size() == 1);
  CHECK(one.recipes[0].final.n == 7);

  for (const std::string metric : {"final", "best"}) {
    CAPTURE(metric);
    const bool best = metric == "best";
    // The compared values: the last evaluation (final) or the lowest (best) of each run.
    std::vector<double> a, b;
    for (const auto& e : flash) a.push_back(best ? e[1] : e[2]);
    for (const auto& e : plain) b.push_back(best ? e[1] : e[2]);
    const CompareResult c = compare_runs(dirs, CompareOptions{"-", "", "", {"model.attention"}, parse_compare_metric(metric)});
    CHECK(c.baseline == "fp32");  // the default baseline: the arm named fp32
    REQUIRE(c.recipes.size() == 2);
    CHECK(c.recipes[0].recipe == "bf16_flash");
    CHECK(c.recipes[1].recipe == "fp32");
    const RecipeStats& fl = c.recipes[0];
    CHECK(fl.final.n == 4);
    CHECK(fl.final.mean == doctest::Approx(mean(a)).epsilon(1e-12));
    CHECK(fl.final.std == doctest::Approx(std::sqrt(var(a))).epsilon(1e-12));
    CHECK(c.recipes[1].final.mean == doctest::Approx(mean(b)).epsilon(1e-12));
    // Welch: the difference and se from the raw numbers; df and the interval also mpmath's (header).
    const double va = var(a) / 4, vb = var(b) / 3, se = std::sqrt(va + vb);
    CHECK(fl.welch.diff == doctest::Approx(mean(a) - mean(b)).epsilon(1e-12));
    CHECK(fl.welch.se == doctest::Approx(se).epsilon(1e-12));
    CHECK(fl.welch.df == doctest::Approx((va + vb) * (va + vb) / (va * va / 3 + vb * vb / 2)).epsilon(1e-12));
    if (best) {  // welch(["1.52","1.47","1.51","1.44"], ["1.50","1.40","1.55"])
      CHECK(fl.welch.diff == doctest::Approx(0.0016666666666666667).epsilon(1e-12));
      CHECK(fl.welch.df == doctest::Approx(2.7088500777866207).epsilon(1e-12));
      CHECK(fl.welch.lo == doctest::Approx(-0.16018048696214574).epsilon(1e-10));
      CHECK(fl.welch.hi == doctest::Approx(0.16351382029547908).epsilon(1e-10));
    } else {  // welch(["1.70","1.49","1.62","1.50"], ["1.60","1.45","1.58"])
      CHECK(fl.welch.diff == doctest::Approx(0.034166666666666667).epsilon(1e-12));
      CHECK(fl.welch.df == doctest::Approx(4.9123763450329811).epsilon(1e-12));
      CHECK(fl.welch.lo == doctest::Approx(-0.14396621452180691).epsilon(1e-10));
      CHECK(fl.welch.hi == doctest::Approx(0.21229954785514025).epsilon(1e-10));
    }
    // Paired over seeds 1-3 (seed 4 has no fp32 run): t_{0.975,2} = 4.3026527297494639 (mpmath, as above).
    const std::vector<double> d = {a[0] - b[0], a[1] - b[1], a[2] - b[2]};
    CHECK(fl.diff.n == 3);
    CHECK(fl.diff.mean == doctest::Approx(mean(d)).epsilon(1e-12));
    const double h = 4.3026527297494639 * std::sqrt(var(d) / 3);
    CHECK(fl.diff.lo == doctest::Approx(mean(d) - h).epsilon(1e-10));
    CHECK(fl.diff.hi == doctest::Approx(mean(d) + h).epsilon(1e-10));

    // The table names the key and the compared metric; the JSON says both and each run's arm.
    CHECK(c.table.rfind("run", 0) == 0);
    CHECK(c.table.find("model.attention") != std::string::npos);
    CHECK(c.table.find("mean " + metric) != std::string::npos);
    CHECK(c.table.find("gap = " + metric) != std::string::npos);
    const json j = read_json_file(c.stats);
    CHECK(j["compared"] == metric);
    CHECK(j["by"] == json::array({"model.attention"}));
    CHECK(j["runs"][0]["arm"] == "bf16_flash");
    CHECK(j["runs"][0]["recipe"] == "bf16");
    CHECK(j["runs"][4]["arm"] == "fp32");
    CHECK(j["recipes"][0]["recipe"] == "bf16_flash");
    CHECK(j["recipes"][0][metric]["mean"].get<double>() == doctest::Approx(mean(a)).epsilon(1e-12));
    CHECK(j["recipes"][0]["tests_vs_baseline"]["welch_ci95"][0].get<double>() == doctest::Approx(fl.welch.lo));
  }

  // --baseline bf16_flash: fp32's differences are the negations.
  const CompareResult r = compare_runs(dirs, CompareOptions{"-", "bf16_flash", "", {"model.attention"}, CompareMetric::best});
  CHECK(r.baseline == "bf16_flash");
  CHECK(arm(r, "fp32").welch.diff == doctest::Approx(-0.0016666666666666667).epsilon(1e-12));
  CHECK(arm(r, "fp32").welch.hi == doctest::Approx(0.16018048696214574).epsilon(1e-10));
  CHECK(std::isnan(arm(r, "bf16_flash").welch.diff));
  const std::string e = compare_error(dirs, CompareOptions{"-", "flash", "", {"model.attention"}, CompareMetric::final});
  CHECK(e == "compare: no run with model.attention \"flash\"; valid --baseline: \"bf16_flash\", \"fp32\"");
  fs::remove_all(tmp);
}

TEST_CASE("compare --by recipe,precision.activations: two keys, the baseline arm, Holm over the arms") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_compare_arms_two";
  fs::remove_all(tmp);
  std::vector<std::string> dirs;
  const auto add = [&](const std::string& name, const std::string& recipe, int seed, const char* act, double v) {
    json cfg = kGpt;
    if (act) cfg["precision"] = {{"activations", act}};
    dirs.push_back((tmp / name).string());
    write_run(dirs.back(), recipe, seed, cfg, {3.0, v});
  };
  add("nv_s1", "nvfp4", 1, nullptr, 2.50);  // first: the default baseline (no arm is named fp32 or bf16)
  add("nv_s2", "nvfp4", 2, nullptr, 2.60);
  add("bf_s1", "bf16", 1, nullptr, 2.10);  // precision.activations absent: fp32 (config_to_json omits it)
  add("bf_s2", "bf16", 2, nullptr, 2.30);
  add("bf_s3", "bf16", 3, "fp32", 2.20);  // or written as the default
  add("act_s1", "bf16", 1, "bf16", 2.15);
  add("act_s2", "bf16", 2, "bf16", 2.40);
  add("act_s3", "bf16", 3, "bf16", 2.35);

  const CompareResult d = compare_runs(dirs, CompareOptions{"-", "", "", {"recipe", "precision.activations"}, CompareMetric::final});
  CHECK(d.baseline == "nvfp4,fp32");
  REQUIRE(d.recipes.size() == 3);
  CHECK(d.recipes[1].recipe == "bf16,fp32");
  CHECK(d.recipes[2].recipe == "bf16,bf16");

  const CompareResult c =
      compare_runs(dirs, CompareOptions{"-", "bf16,fp32", "", {"recipe", "precision.activations"}, CompareMetric::best});
  CHECK(c.baseline == "bf16,fp32");
  const RecipeStats &act = arm(c, "bf16,bf16"), &nv = arm(c, "nvfp4,fp32");
  CHECK(arm(c, "bf16,fp32").final.n == 3);
  CHECK(act.final.mean == doctest::Approx((2.15 + 2.40 + 2.35) / 3).epsilon(1e-12));
  // welch(["2.15","2.40","2.35"], ["2.10","2.30","2.20"]) and welch(["2.50","2.60"], ["2.10","2.30","2.20"])
  CHECK(act.welch.diff == doctest::Approx(0.1).epsilon(1e-12));
  CHECK(act.welch.df == doctest::Approx(3.7230769230769231).epsilon(1e-12));
  CHECK(act.welch.lo == doctest::Approx(-0.17380663650032374).epsilon(1e-10));
  CHECK(act.welch.hi == doctest::Approx(0.37380663650032374).epsilon(1e-10));
  CHECK(nv.welch.diff == doctest::Approx(0.35).epsilon(1e-12));
  CHECK(nv.welch.df == doctest::Approx(2.8823529411764706).epsilon(1e-12));
  CHECK(nv.welch.lo == doctest::Approx(0.10122662017946166).epsilon(1e-10));
  CHECK(nv.welch.hi == doctest::Approx(0.59877337982053834).epsilon(1e-10));
  // Paired: bf16,bf16 - bf16,fp32 over seeds 1-3: 0.05, 0.10, 0.15 (t = 0.1 / (0.05 / sqrt 3), 2 df: two-sided
  // p = 1 - t / sqrt(2 + t^2)); nvfp4 over seeds 1-2: 0.40, 0.30 (t = 0.35 / (sqrt(0.005) / sqrt 2) = 7, 1 df,
  // Cauchy: p = 1 - 2 atan(7) / pi). Holm over the two: the smaller p times 2, the larger the max of itself and that.
  const double pi = std::acos(-1.0), t2 = 0.1 / (0.05 / std::sqrt(3.0));
  const double p_act = 1 - t2 / std::sqrt(2 + t2 * t2), p_nv = 1 - 2 * std::atan(7.0) / pi;
  CHECK(act.test.p == doctest::Approx(p_act).epsilon(1e-10));
  CHECK(nv.test.p == doctest::Approx(p_nv).epsilon(1e-10));
  REQUIRE(p_act < p_nv);  // 0.0742 and 0.0903
  CHECK(act.p_holm == doctest::Approx(2 * p_act).epsilon(1e-10));
  CHECK(nv.p_holm == doctest::Approx(std::max(p_nv, 2 * p_act)).epsilon(1e-10));
  CHECK(c.table.find("recipe,precision.activations") != std::string::npos);
  CHECK(c.table.find("tests vs bf16,fp32") != std::string::npos);
  fs::remove_all(tmp);
}

TEST_CASE("compare --by: a key without a default absent in some runs is \"missing\"; bad keys and values") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_compare_arms_bad";
  fs::remove_all(tmp);
  json no_lr = kGpt;
  no_lr["training"].erase("lr");
  no_lr["model"]["attention"] = std::string(300, 'x');
  const std::vector<std::string> dirs = {(tmp / "a").string(), (tmp / "b").string()};
  write_run(dirs[0], "fp32", 1, kGpt, {2.0, 1.5});
  write_run(dirs[1], "fp32", 2, no_lr, {2.0, 1.6});
  const CompareResult c = compare_runs(dirs, CompareOptions{"-", "", "", {"training.lr"}, CompareMetric::final});
  REQUIRE(c.recipes.size() == 2);
  CHECK(c.recipes[0].recipe == "0.001");
  CHECK(c.recipes[1].recipe == "missing");
  const CompareResult two = compare_runs(dirs, CompareOptions{"-", "", "", {"recipe", "training.lr"}, CompareMetric::final});
  REQUIRE(two.recipes.size() == 2);
  CHECK(two.recipes[1].recipe == "fp32,missing");
  CHECK(two.baseline == "fp32,0.001");  // no arm named fp32/bf16: the first run's
  CHECK(compare_runs(dirs, CompareOptions{"-", "", "", {"model.layers"}, CompareMetric::final}).recipes[0].recipe == "2");
  // An arm is untrusted text: the table shows its control characters escaped.
  json esc = kGpt;
  esc["model"]["attention"] = "x\x1b[31m";
  write_run(tmp / "e", "fp32", 3, esc, {2.0, 1.7});
  const CompareResult e =
      compare_runs({dirs[0], (tmp / "e").string()}, CompareOptions{"-", "", "", {"model.attention"}, CompareMetric::final});
  CHECK(e.recipes[1].recipe == "x\x1b[31m");
  CHECK(e.table.find('\x1b') == std::string::npos);
  CHECK(e.table.find("x\\x1b[31m") != std::string::npos);
  fs::remove_all(tmp / "e");

  const std::string a = "compare: " + (tmp / "a" / "config.json").string() + ": key ";
  const auto by = [&](const std::string& k) { return compare_error(dirs, CompareOptions{"-", "", "", {k}, CompareMetric::final}); };
  CHECK(by("model..attention") ==
        "compare: --by \"model..attention\": not a config key; valid: dotted names of letters, digits and '_' "
        "(e.g. model.attention, precision.activations, training.lr) or recipe");
  CHECK(by("").starts_with("compare: --by \"\": not a config key"));
  CHECK(by("model attention").starts_with("compare: --by \"model attention\": not a config key"));
  CHECK(by("model.bias").starts_with("compare: --by \"model.bias\": no run's config.json has this key"));
  CHECK(by("modle.attention") ==
        "compare: --by \"modle.attention\": no run's config.json has this key; valid: a key of the runs' "
        "config.json (e.g. model.attention, precision.activations, training.lr) or recipe");
  CHECK(by("model") == a + "\"model\": an object; --by takes keys whose values are strings, numbers or "
                           "true/false (e.g. model.attention)");
  CHECK(by("layers.keep_high_precision").starts_with(a + "\"layers.keep_high_precision\": an array; --by takes"));
  CHECK(by("eval_recipe").starts_with(a + "\"eval_recipe\": null; --by takes"));
  CHECK(by("training.lr.x") == a + "\"training.lr.x\": \"training.lr\" is number 0.001, not an object");
  CHECK(by("model.attention") == "compare: " + (tmp / "b" / "config.json").string() +
                                     ": key \"model.attention\": a string of 300 bytes (at most 256)");
  CHECK(compare_error(dirs, CompareOptions{"-", "", "", {"recipe", "recipe"}, CompareMetric::final}) ==
        "compare: --by \"recipe\" given twice");
  CHECK_THROWS_WITH_AS(parse_compare_metric("last"), "compare: --metric \"last\": valid: final, best", fp4lab::Error);
  CHECK(parse_compare_metric("best") == CompareMetric::best);
  CHECK(parse_compare_metric("final") == CompareMetric::final);
  fs::remove(tmp / "a" / "config.json");
  CHECK(by("training.lr") == "compare: " + (tmp / "a" / "config.json").string() +
                                 " not found (the run's config, which --by reads)");
  CHECK(compare_runs(dirs, CompareOptions{"-", "", "", {"recipe"}, CompareMetric::final}).recipes.size() == 1);  // reads no config
  std::ofstream(tmp / "a" / "config.json") << "[1, 2]";
  CHECK(by("training.lr") ==
        "compare: " + (tmp / "a" / "config.json").string() + ": expected a JSON object, got an array");
  fs::remove_all(tmp);
}

TEST_CASE("compare --metric best: the best evaluation by the task's direction, checked against summary best") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_compare_arms_best";
  fs::remove_all(tmp);
  // Accuracy (higher is better): the best is the highest evaluation, not the last nor the lowest.
  std::vector<std::string> dirs;
  for (int s = 1; s <= 2; ++s) {
    dirs.push_back((tmp / ("acc_s" + std::to_string(s))).string());
    write_run(dirs.back(), "fp32", s, kGpt, {80.0 + s, 92.0 + s, 85.0}, "test_acc", true);
  }
  const CompareResult c = compare_runs(dirs, CompareOptions{"-", "", "", {}, CompareMetric::best});
  CHECK(c.recipes[0].final.mean == doctest::Approx(93.5));
  CHECK(compare_runs(dirs, CompareOptions{"-", "", "", {}, CompareMetric::final}).recipes[0].final.mean == doctest::Approx(85.0));
  CHECK(c.table.find("mean best") != std::string::npos);
  CHECK(c.table.find("gap = best - mean best of fp32") != std::string::npos);

  // A summary whose best is not its metrics.jsonl's: an error naming both numbers.
  write_run(dirs[1], "fp32", 2, kGpt, {80.0, 92.0, 85.0}, "test_acc", true, 95.0);
  CHECK(compare_error(dirs, CompareOptions{"-", "", "", {}, CompareMetric::best}) ==
        "compare: " + dirs[1] + ": summary.json's best 95 is not the best test_acc 92 of metrics.jsonl's "
                                "evaluations (files of two runs mixed, or edited by hand)");
  // --metric final does not read best.
  CHECK(compare_runs(dirs, CompareOptions{"-", "", "", {}, CompareMetric::final}).recipes[0].final.n == 2);
  fs::remove_all(tmp);
}

TEST_CASE("archived_default: the value config_to_json leaves out, so an absent key stands for it") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_compare_arms_defaults";
  fs::remove_all(tmp);
  const std::string text = test::write_words_corpus(tmp);
  const auto lacks = [](const json& j, const std::string& key) {
    const json* cur = &j;
    for (size_t at = 0; at <= key.size();) {
      const size_t dot = std::min(key.find('.', at), key.size());
      const auto it = cur->find(key.substr(at, dot - at));
      if (it == cur->end()) return true;
      cur = &*it;
      at = dot + 1;
    }
    return false;
  };
  for (const char* key : {"precision.activations", "training.loss_scale", "training.moments", "distributed.zero",
                          "distributed.primary_weights", "distributed.shard_cast", "distributed.expert_parallel",
                          "distributed.reduce", "output.numerics_interval", "model.moe.dispatch",
                          "model.moe.dispatch_cast"}) {
    CAPTURE(key);
    const json d = compare_archive::archived_default(key);
    REQUIRE_FALSE(d.is_null());
    const bool moe = std::string(key).starts_with("model.moe.");
    json j = moe ? test::tiny_moe_config(text, (tmp / "runs").string(), "m")
                 : test::tiny_gpt_config(text, (tmp / "runs").string());
    CHECK(lacks(config_to_json(config_from_json(j)), key));
    apply_set(j, std::string(key) + "=" + (d.is_string() ? d.get<std::string>() : d.dump()));
    CHECK(lacks(config_to_json(config_from_json(j)), key));  // set to it: still left out (the default)
  }
  // model.moe.experts 0: no model.moe (a dense MLP); distributed.timeout_s: written only when not 600.
  json g = test::tiny_gpt_config(text, (tmp / "runs").string());
  CHECK(compare_archive::archived_default("model.moe.experts") == 0);
  CHECK(lacks(config_to_json(config_from_json(g)), "model.moe"));
  CHECK(compare_archive::archived_default("distributed.timeout_s") == 600.0);
  CHECK(lacks(config_to_json(config_from_json(g)), "distributed.timeout_s"));
  // model.attention: written always now; absent, the run predates it and its attention was fp32, the value
  // the run identity drops (the same config_hash with and without it).
  CHECK(compare_archive::archived_default("model.attention") == "fp32");
  g["model"]["attention"] = "fp32";
  json with = config_to_json(config_from_json(g)), without = with;
  without["model"].erase("attention");
  CHECK(config_hash(with) == config_hash(without));
  CHECK(compare_archive::archived_default("training.lr").is_null());
  CHECK(compare_archive::archived_default("model.attention.x").is_null());
  fs::remove_all(tmp);
}
