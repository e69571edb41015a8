// compare's per-recipe statistics: mean, sample std, Student-t 95% CI and the
// paired differences against the baseline recipe (hand-computed values).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "train/compare.hpp"
#include "train/config.hpp"
#include "core/error.hpp"

using namespace fp4lab::train;
using nlohmann::json;
namespace fs = std::filesystem;

TEST_CASE("sample_stats: mean, sample std (n-1) and the t-based 95% CI") {
  const SampleStats s = sample_stats({1, 2, 3, 4});
  CHECK(s.n == 4);
  CHECK(s.mean == doctest::Approx(2.5));
  CHECK(s.std == doctest::Approx(1.2909944).epsilon(1e-7));
  const double h = 3.1824463 * 1.2909944 / 2.0;  // t_{0.975,3} * std / sqrt(4)
  CHECK(s.lo == doctest::Approx(2.5 - h).epsilon(1e-7));
  CHECK(s.hi == doctest::Approx(2.5 + h).epsilon(1e-7));

  const SampleStats one = sample_stats({7.0});
  CHECK(one.n == 1);
  CHECK(one.mean == 7.0);
  CHECK(std::isnan(one.std));
  CHECK(std::isnan(one.lo));
  CHECK(std::isnan(one.hi));
  CHECK(sample_stats({}).n == 0);
  CHECK(std::isnan(sample_stats({}).mean));

  CHECK(t975(1) == doctest::Approx(12.7062047));
  CHECK(t975(3) == doctest::Approx(3.1824463));
  CHECK(t975(10) == doctest::Approx(2.2281389));
  CHECK(t975(30) == doctest::Approx(2.0422725));
  CHECK(t975(31) == 1.96);
  CHECK(t975(1000) == 1.96);
  CHECK_THROWS_AS(t975(0), fp4lab::Error);
}

namespace {

void fake_run(const fs::path& dir, const std::string& recipe, int seed, double final) {
  fs::create_directories(dir);
  const json s = {{"name", "fake"},       {"recipe", recipe},      {"seed", seed},      {"status", "completed"},
                  {"metric", "val_loss"}, {"higher_is_better", false}, {"final", final}, {"best", final},
                  {"final_train_loss", final + 0.1}, {"ms_per_step", 1.0}, {"items_per_s", 100.0}};
  std::ofstream(dir / "summary.json") << s.dump(2);
  std::ofstream m(dir / "metrics.jsonl");
  m << json{{"step", 1}, {"loss", final + 0.5}}.dump() << "\n"
    << json{{"step", 2}, {"eval", true}, {"val_loss", final}}.dump() << "\n";
}

std::string line_of(const std::string& table, const std::string& start) {
  // The per-recipe table's line of a recipe (after the blank line).
  const size_t sec = table.find("\n\n");
  REQUIRE(sec != std::string::npos);
  std::istringstream in(table.substr(sec + 2));
  std::string l;
  while (std::getline(in, l))
    if (l.rfind(start + " ", 0) == 0) return l;
  FAIL("no line for " << start);
  return "";
}

}  // namespace

TEST_CASE("compare: per-recipe statistics and paired differences (table, JSON, result)") {
  const fs::path tmp = fs::temp_directory_path() / "fp4lab_test_compare_stats";
  fs::remove_all(tmp);
  // fp32 seeds 1,2,3: 2.0, 2.2, 2.1; nvfp4 (listed out of seed order): 2.1, 2.5, 2.3;
  // mx_baseline: one seed.
  std::vector<std::string> dirs;
  const auto add = [&](const std::string& recipe, int seed, double v) {
    const fs::path d = tmp / "runs" / (recipe + "_s" + std::to_string(seed));
    fake_run(d, recipe, seed, v);
    dirs.push_back(d.string());
  };
  add("nvfp4", 3, 2.3);
  add("fp32", 1, 2.0);
  add("fp32", 2, 2.2);
  add("fp32", 3, 2.1);
  add("nvfp4", 1, 2.1);
  add("nvfp4", 2, 2.5);
  add("mx_baseline", 2, 2.4);

  const CompareResult c = compare_runs(dirs, CompareOptions{"-", ""});
  CHECK(c.baseline == "fp32");
  REQUIRE(c.recipes.size() == 3);
  CHECK(c.recipes[0].recipe == "nvfp4");
  CHECK(c.recipes[1].recipe == "fp32");
  CHECK(c.recipes[2].recipe == "mx_baseline");
  const RecipeStats& nv = c.recipes[0];
  CHECK(nv.final.n == 3);
  CHECK(nv.final.mean == doctest::Approx(2.3));
  CHECK(nv.final.std == doctest::Approx(0.2));
  const double h = 4.3026527 * 0.2 / std::sqrt(3.0);  // t_{0.975,2} * std / sqrt(3)
  CHECK(nv.final.lo == doctest::Approx(2.3 - h));
  CHECK(nv.final.hi == doctest::Approx(2.3 + h));
  // Paired by seed: differences 0.1, 0.3, 0.2.
  CHECK(nv.diff.n == 3);
  CHECK(nv.diff.mean == doctest::Approx(0.2));
  CHECK(nv.diff.std == doctest::Approx(0.1));
  CHECK(nv.diff.lo == doctest::Approx(0.2 - h / 2));
  CHECK(nv.diff.hi == doctest::Approx(0.2 + h / 2));
  CHECK(c.recipes[1].final.mean == doctest::Approx(2.1));
  CHECK(c.recipes[1].final.std == doctest::Approx(0.1));
  const RecipeStats& mx = c.recipes[2];
  CHECK(mx.final.n == 1);
  CHECK(std::isnan(mx.final.std));
  CHECK(mx.diff.n == 1);
  CHECK(mx.diff.mean == doctest::Approx(0.2));  // seed 2: 2.4 - 2.2
  CHECK(std::isnan(mx.diff.lo));

  // The table: 2.3 +- 0.4968 and the paired +0.2 +- 0.2484.
  const std::string nl = line_of(c.table, "nvfp4");
  CHECK(nl.find("2.3000") != std::string::npos);
  CHECK(nl.find("0.2000") != std::string::npos);
  CHECK(nl.find("[1.8032, 2.7968]") != std::string::npos);
  CHECK(nl.find("+0.2000 [-0.0484, +0.4484]") != std::string::npos);
  const std::string ml = line_of(c.table, "mx_baseline");
  CHECK(ml.find("2.4000") != std::string::npos);
  CHECK(ml.find("+0.2000 -") != std::string::npos);
  CHECK(ml.find("[") == std::string::npos);
  CHECK(c.table.find("paired diff vs fp32") != std::string::npos);

  // The JSON beside the (default) plot path.
  CHECK(c.stats == (tmp / "runs" / "compare.json").string());
  const json j = read_json_file(c.stats);
  CHECK(j["baseline"] == "fp32");
  CHECK(j["metric"] == "val_loss");
  CHECK(j["runs"].size() == 7);
  REQUIRE(j["recipes"].size() == 3);
  const json& jn = j["recipes"][0];
  CHECK(jn["recipe"] == "nvfp4");
  CHECK(jn["final"]["n"] == 3);
  CHECK(jn["final"]["mean"].get<double>() == doctest::Approx(2.3));
  CHECK(jn["final"]["std"].get<double>() == doctest::Approx(0.2));
  CHECK(jn["final"]["ci95"][0].get<double>() == doctest::Approx(2.3 - h));
  CHECK(jn["final"]["ci95"][1].get<double>() == doctest::Approx(2.3 + h));
  CHECK(jn["paired_diff_vs_baseline"]["n"] == 3);
  CHECK(jn["paired_diff_vs_baseline"]["mean"].get<double>() == doctest::Approx(0.2));
  CHECK(jn["paired_diff_vs_baseline"]["ci95"][1].get<double>() == doctest::Approx(0.2 + h / 2));
  CHECK(j["recipes"][1]["paired_diff_vs_baseline"].is_null());
  CHECK(j["recipes"][2]["final"]["std"].is_null());
  for (const auto& e : fs::directory_iterator(tmp / "runs"))
    CHECK(e.path().filename().string().find(".tmp") == std::string::npos);

  // --baseline nvfp4: fp32's paired diff is the negation.
  const CompareResult b = compare_runs(dirs, CompareOptions{"-", "nvfp4"});
  CHECK(b.recipes[1].diff.mean == doctest::Approx(-0.2));
  CHECK(b.recipes[1].diff.hi == doctest::Approx(-0.2 + h / 2));
  fs::remove_all(tmp);
}

TEST_CASE("seed_band: mean and +-1 sample std at the steps every curve has") {
  using Curve = std::vector<std::pair<double, double>>;
  const Curve a = {{0, 1.0}, {10, 2.0}, {20, 3.0}};
  const Curve b = {{0, 3.0}, {10, 4.0}, {20, 5.0}, {30, 9.0}};
  const Curve c = {{0, 5.0}, {20, 4.0}};  // no step 10: it leaves the band
  const std::vector<BandPoint> band = seed_band({a, b, c});
  REQUIRE(band.size() == 2);
  CHECK(band[0].step == 0);
  CHECK(band[0].mean == doctest::Approx(3.0));
  CHECK(band[0].hi - band[0].mean == doctest::Approx(2.0));  // sample std of 1, 3, 5
  CHECK(band[0].mean - band[0].lo == doctest::Approx(2.0));
  CHECK(band[1].step == 20);
  CHECK(band[1].mean == doctest::Approx(4.0));
  CHECK(band[1].hi == doctest::Approx(5.0));  // 3, 5, 4: std 1
  const std::vector<BandPoint> one = seed_band({a});
  REQUIRE(one.size() == 3);
  CHECK(one[1].lo == one[1].hi);  // one curve: no spread
}
