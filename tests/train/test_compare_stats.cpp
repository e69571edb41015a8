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
#include "train/stats.hpp"
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
  CHECK(t975(31) == doctest::Approx(2.0395134463964081).epsilon(1e-12));  // computed, no longer 1.96 past 30
  CHECK(t975(60) == doctest::Approx(2.0002978220142601).epsilon(1e-12));
  CHECK(t975(1000000) == doctest::Approx(1.959966).epsilon(1e-6));
  CHECK_THROWS_AS(t975(0), fp4lab::Error);
}

// The oracles: closed forms (df 1: Cauchy, df 2; the large-df expansion
// around the normal cdf through std::erfc) and mpmath 1.3.0 at 40 digits (betainc, findroot), an independent
// implementation.
TEST_CASE("student_t_cdf and student_t_quantile against closed forms and mpmath") {
  const double pi = std::acos(-1.0);
  for (double t = -50; t <= 50; t += 0.37) {
    CHECK(student_t_cdf(t, 1) == doctest::Approx(0.5 + std::atan(t) / pi).epsilon(1e-13));
    CHECK(student_t_cdf(t, 2) == doctest::Approx(0.5 + t / (2 * std::sqrt(2 + t * t))).epsilon(1e-13));
  }
  // Large df: the normal cdf with the first term of the expansion in 1/df (error O(df^-2)).
  for (double t = -6; t <= 6; t += 0.25) {
    const double df = 1e4, phi = std::exp(-0.5 * t * t) / std::sqrt(2 * pi);
    CHECK(student_t_cdf(t, df) ==
          doctest::Approx(0.5 * std::erfc(-t / std::sqrt(2.0)) - phi * (t + t * t * t) / (4 * df)).epsilon(1e-7));
  }
  struct C {
    double t, df, cdf;
  };
  for (const C& c :
       {C{1.3, 3.7, 0.86566663791368617}, C{-2.5, 7, 0.020496109292876448}, C{0.1, 1000, 0.53981781548819794},
        C{4.0, 2.5, 0.98049351207934088}, C{12.0, 5, 0.99996455253741419}, C{-0.7, 0.6, 0.33226903609926831}}) {
    CAPTURE(c.t);
    CAPTURE(c.df);
    CHECK(student_t_cdf(c.t, c.df) == doctest::Approx(c.cdf).epsilon(1e-12));
  }
  struct Q {
    double p, df, q;
  };
  for (const Q& c :
       {Q{0.975, 6.972222222222222, 2.3665353610161175}, Q{0.8, 4, 0.94096457723518136}, Q{0.8, 9, 0.88340385968553471},
        Q{0.999, 3.3, 8.9515951094625013}, Q{0.6, 100, 0.25402218245822776}}) {
    CAPTURE(c.p);
    CAPTURE(c.df);
    CHECK(student_t_quantile(c.p, c.df) == doctest::Approx(c.q).epsilon(1e-11));
    CHECK(student_t_quantile(1 - c.p, c.df) == doctest::Approx(-c.q).epsilon(1e-11));
  }
  for (double df : {0.5, 1.0, 2.5, 7.0, 30.0, 1000.0})
    for (double p : {1e-6, 0.01, 0.3, 0.5, 0.77, 0.99, 0.999999}) {
      CAPTURE(df);
      CAPTURE(p);
      CHECK(student_t_cdf(student_t_quantile(p, df), df) == doctest::Approx(p).epsilon(1e-10));
    }
  CHECK(student_t_cdf(INFINITY, 3) == 1.0);
  CHECK(student_t_cdf(-INFINITY, 3) == 0.0);
  CHECK_THROWS_AS(student_t_cdf(1, 0), fp4lab::Error);
  CHECK_THROWS_AS(student_t_cdf(NAN, 2), fp4lab::Error);
  CHECK_THROWS_AS(student_t_quantile(1.0, 2), fp4lab::Error);
  CHECK_THROWS_AS(student_t_quantile(0.5, -1), fp4lab::Error);
}

TEST_CASE("welch_diff, paired_test, holm_adjust and the paired test's power") {
  // Welch (mpmath at 40 digits): a = 1..5, b = 2, 4, ..., 12.
  const WelchDiff w = welch_diff({1, 2, 3, 4, 5}, {2, 4, 6, 8, 10, 12});
  CHECK(w.diff == -4.0);
  CHECK(w.se == doctest::Approx(1.6832508230603463).epsilon(1e-13));
  CHECK(w.df == doctest::Approx(6.9722557297949337).epsilon(1e-13));
  CHECK(w.p == doctest::Approx(0.049284338206730521).epsilon(1e-10));
  CHECK(w.lo == doctest::Approx(-7.9834686956288321).epsilon(1e-11));
  CHECK(w.hi == doctest::Approx(-0.016531304371167857).epsilon(1e-9));
  // Equal sizes and variances: Welch's df is 2n - 2 and its se the pooled one.
  const WelchDiff e = welch_diff({1, 2, 3}, {5, 6, 7});
  CHECK(e.df == doctest::Approx(4.0));
  CHECK(e.se == doctest::Approx(std::sqrt(2.0 / 3.0)));
  CHECK(std::isnan(welch_diff({1}, {2, 3}).se));
  CHECK(welch_diff({1}, {2, 3}).diff == -1.5);
  CHECK(std::isnan(welch_diff({}, {2, 3}).diff));
  CHECK(welch_diff({2, 2}, {2, 2}).p == 1.0);
  CHECK(welch_diff({3, 3}, {2, 2}).p == 0.0);

  // Paired t test (mpmath): differences 0.012, 0.020, 0.009, 0.031, 0.017.
  const SampleStats d = sample_stats({0.012, 0.020, 0.009, 0.031, 0.017});
  const PairedTest pt = paired_test(d);
  CHECK(pt.df == 4);
  CHECK(pt.t == doctest::Approx(4.6680747204386467).epsilon(1e-12));
  CHECK(pt.p == doctest::Approx(0.0095319833766479761).epsilon(1e-10));
  CHECK(std::isnan(paired_test(sample_stats({0.1})).p));
  CHECK(paired_test(sample_stats({0.0, 0.0})).p == 1.0);

  // Holm (Holm 1979's step-down): p = .01, .04, .03, .005 over m = 4:
  // sorted .005 x4 = .02, .01 x3 = .03, .03 x2 = .06, .04 x1 = .04 -> max with the running .06.
  const std::vector<double> h = holm_adjust({0.01, 0.04, 0.03, 0.005});
  CHECK(h[3] == doctest::Approx(0.02));
  CHECK(h[0] == doctest::Approx(0.03));
  CHECK(h[2] == doctest::Approx(0.06));
  CHECK(h[1] == doctest::Approx(0.06));
  const std::vector<double> hn = holm_adjust({NAN, 0.2, 0.9});  // NaN: not a comparison (m = 2)
  CHECK(std::isnan(hn[0]));
  CHECK(hn[1] == doctest::Approx(0.4));
  CHECK(hn[2] == doctest::Approx(0.9));
  CHECK(holm_adjust({0.6, 0.7})[0] == 1.0);  // capped at 1

  // Power (mpmath): MDE at n = 5 of the differences above; pairs for sd 0.0283 and effect 0.0124.
  CHECK(paired_mde(d.std, 5) == doctest::Approx(0.014174985686837754).epsilon(1e-10));
  CHECK(pairs_for_power(0.0283, 0.0124) == 43);
  CHECK(pairs_for_power(0.0283, -0.0124) == 43);
  CHECK(pairs_for_power(0.0283, 0.0) == -1);
  CHECK(pairs_for_power(1.0, 1e-6, 0.05, 0.8, 1000) == -1);
  CHECK(std::isnan(paired_mde(0.1, 1)));
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

  const CompareResult c = compare_runs(dirs, CompareOptions{"-", "", "", {}, CompareMetric::final});
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

  // The tests vs fp32. Paired: t = 0.2 / (0.1 / sqrt 3) with 2 df, whose two-sided p has the closed form
  // 1 - t / sqrt(2 + t^2); Holm over the one comparison with a p (mx_baseline has one pair) leaves it.
  // Welch: se^2 = (0.04 + 0.01) / 3, df = 0.05^2 / (0.04^2 / 2 + 0.01^2 / 2).
  const double t = 0.2 / (0.1 / std::sqrt(3.0)), p2 = 1 - t / std::sqrt(2 + t * t);
  CHECK(nv.test.t == doctest::Approx(t));
  CHECK(nv.test.p == doctest::Approx(p2).epsilon(1e-10));
  CHECK(nv.p_holm == doctest::Approx(p2).epsilon(1e-10));
  CHECK(std::isnan(mx.test.p));
  CHECK(std::isnan(mx.p_holm));
  CHECK(std::isnan(c.recipes[1].p_holm));
  CHECK(nv.welch.diff == doctest::Approx(0.2));
  CHECK(nv.welch.se == doctest::Approx(std::sqrt(0.05 / 3)));
  CHECK(nv.welch.df == doctest::Approx(0.0025 / 0.00085));
  CHECK(nv.mde80 == doctest::Approx(paired_mde(0.1, 3)));
  CHECK(nv.pairs_needed == pairs_for_power(0.1, 0.2));
  const size_t tests_at = c.table.find("tests vs fp32");
  REQUIRE(tests_at != std::string::npos);
  CHECK(c.table.find("nvfp4", tests_at) != std::string::npos);
  CHECK(c.table.find("0.0742", tests_at) != std::string::npos);  // p = 0.074180
  CHECK(jn["tests_vs_baseline"]["paired_p"].get<double>() == doctest::Approx(p2).epsilon(1e-10));
  CHECK(jn["tests_vs_baseline"]["paired_p_holm"].get<double>() == doctest::Approx(p2).epsilon(1e-10));
  CHECK(jn["tests_vs_baseline"]["welch_df"].get<double>() == doctest::Approx(0.0025 / 0.00085));
  CHECK(j["recipes"][1]["tests_vs_baseline"].is_null());
  CHECK(j["recipes"][2]["tests_vs_baseline"]["paired_p"].is_null());

  // With a plot: the forest plot of the paired differences beside it (where gnuplot is installed).
  const CompareResult pl = compare_runs(dirs, CompareOptions{(tmp / "c.png").string(), "", "", {}, CompareMetric::final});
  if (!pl.plot.empty()) {
    CHECK(pl.forest == (tmp / "c_forest.png").string());
    CHECK(fs::file_size(pl.forest) > 1000);
  } else {
    CHECK(pl.forest.empty());
  }

  // --baseline nvfp4: fp32's paired diff is the negation.
  const CompareResult b = compare_runs(dirs, CompareOptions{"-", "nvfp4", "", {}, CompareMetric::final});
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
