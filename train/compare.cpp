// `fp4lab compare`: the statistics, tables and plots of finished runs (their archives: compare_archive.cpp).
#include "train/compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "train/compare_archive.hpp"
#include "train/process.hpp"
#include "train/run_files.hpp"
#include "core/error.hpp"
#include "core/json.hpp"

namespace fp4lab::train {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using compare_archive::Curve;
using compare_archive::name_of;
using compare_archive::Run;
using compare_archive::shown;
using compare_archive::Summary;

std::string f(double v, const char* fmt = "%.4f") {
  if (std::isnan(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}
std::string pad(const std::string& s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

// The reference of the gaps: the first run of the arm `baseline` (empty: the
// first fp32/bf16 run, else the first run); its value is the mean compared
// metric (final or best) over all runs of that arm (several seeds).
struct Baseline {
  std::string label;
  double final = 0.0;
};

Baseline find_baseline(const std::vector<Run>& runs, const std::string& baseline, const std::string& arm) {
  int base = -1;
  for (size_t i = 0; i < runs.size() && base < 0; ++i)
    if (baseline.empty() ? (runs[i].label == "fp32" || runs[i].label == "bf16") : runs[i].label == baseline)
      base = int(i);
  if (base < 0 && !baseline.empty()) {
    std::string arms;
    for (size_t i = 0; i < runs.size(); ++i)
      if (std::none_of(runs.begin(), runs.begin() + long(i), [&](const Run& r) { return r.label == runs[i].label; }))
        arms += (arms.empty() ? "\"" : ", \"") + shown(runs[i].label) + "\"";
    throw Error("compare: no run with " + arm + " \"" + shown(baseline) + "\"; valid --baseline: " + arms);
  }
  if (base < 0) base = 0;
  Baseline b{runs[size_t(base)].label, 0.0};
  int nb = 0;
  for (const auto& r : runs)
    if (r.label == b.label && std::isfinite(r.value)) b.final += r.value, ++nb;
  b.final = nb ? b.final / nb : std::nan("");
  return b;
}

std::string signed_f(double v, const char* fm) {
  std::string s = f(v, fm);
  if (!std::isnan(v) && v >= 0) s.insert(s.begin(), '+');  // (not "+" + s: GCC 12's -Wrestrict false positive)
  return s;
}

// How the tables show the metric.
struct MetricFormat {
  std::string metric, title;  // title: "top-1 %" for test_acc
  const char* fmt;            // printf format of its values
  bool higher;
  CompareMetric compared = CompareMetric::final;  // the value compared
  std::string arm = "recipe";                     // what an arm is
  bool by = false;                                 // arms by --by keys
};

MetricFormat metric_format(const std::string& metric, bool higher) {
  const bool acc = metric == "test_acc";
  return MetricFormat{metric, acc ? "top-1 %" : metric, acc ? "%.2f" : "%.4f", higher};
}

// One line per run (and its numbers as out.rows), then which way is better.
void run_table(std::ostream& t, const std::vector<Run>& runs, const Baseline& base, const MetricFormat& mf,
               json& rows) {
  const char* fm = mf.fmt;
  // Column widths fit the longest run directory name and recipe label as shown (+2 spaces).
  size_t wrun = 34, wrec = std::max<size_t>(26, shown(mf.arm).size() + 2);
  for (const auto& r : runs) {
    wrun = std::max(wrun, shown(name_of(r)).size() + 2);
    wrec = std::max(wrec, shown(r.label).size() + 2);
  }
  t << pad("run", wrun) << pad(shown(mf.arm), wrec) << pad("status", 10) << pad("final " + mf.title, 16, true)
    << pad("best", 10, true) << pad("gap", 9, true) << pad("train loss", 12, true) << pad("ms/step", 10, true)
    << pad(shown(runs[0].summary.item) + "/s", 12, true) << "\n";
  for (const auto& r : runs) {
    const Summary& s = r.summary;
    const double gap = r.value - base.final, best = mf.compared == CompareMetric::best ? r.value : s.best;
    t << pad(shown(name_of(r)), wrun) << pad(shown(r.label), wrec) << pad(shown(s.status), 10)
      << pad(f(s.final, fm), 16, true) << pad(f(best, fm), 10, true)
      << pad(signed_f(gap, fm), 9, true)
      << pad(f(s.final_train_loss), 12, true) << pad(f(s.ms_per_step, "%.1f"), 10, true)
      << pad(f(s.items_per_s, "%.0f"), 12, true) << "\n";
    rows.push_back({{"dir", r.dir},
                    {"recipe", r.recipe},
                    {"status", s.status},
                    {"final", s.final},
                    {"best", best},
                    {"gap", gap},
                    {"ms_per_step", s.ms_per_step},
                    {"items_per_s", s.items_per_s}});
    if (mf.by) rows.back()["arm"] = r.label;
  }
  t << "(" << mf.title << ": " << (mf.higher ? "higher" : "lower") << " is better; gap = " << compare_metric_name(mf.compared) << " - "
    << (mf.compared == CompareMetric::final ? "" : "mean ") << compare_metric_name(mf.compared) << " of " << shown(base.label) << ")\n";
}

// Per recipe (in order of first appearance): the statistics of its finite
// final metrics, and the paired differences against the baseline recipe over
// the seeds both have (a run's seed: summary "seed", else its ordinal among
// the recipe's runs; the first run of a seed counts).
std::vector<RecipeStats> recipe_stats(const std::vector<Run>& runs, const std::string& baseline) {
  std::vector<std::string> order;
  std::map<std::string, std::map<int64_t, double>> by_seed;
  std::map<std::string, std::vector<double>> finals;
  std::map<std::string, int64_t> count;
  for (const auto& r : runs) {
    if (!count.count(r.label)) order.push_back(r.label);
    const int64_t seed = r.summary.seed ? *r.summary.seed : count[r.label];
    ++count[r.label];
    const double fin = r.value;
    if (!std::isfinite(fin)) continue;
    finals[r.label].push_back(fin);
    by_seed[r.label].emplace(seed, fin);
  }
  const double nan = std::nan("");
  std::vector<RecipeStats> out;
  std::vector<double> p;  // the paired tests' p, NaN for the baseline (not a comparison)
  for (const auto& k : order) {
    RecipeStats rs;
    rs.recipe = k;
    rs.final = sample_stats(finals[k]);
    std::vector<double> d;
    for (const auto& [seed, v] : by_seed[k]) {
      const auto& b = by_seed[baseline];
      if (auto it = b.find(seed); it != b.end()) d.push_back(v - it->second);
    }
    rs.diff = sample_stats(d);
    if (k == baseline) {
      rs.test = {nan, nan, nan};
      rs.mde80 = nan;
      rs.welch = {nan, nan, nan, nan, nan, nan};
    } else {
      rs.test = paired_test(rs.diff);
      rs.mde80 = paired_mde(rs.diff.std, rs.diff.n);
      rs.pairs_needed = pairs_for_power(rs.diff.std, rs.diff.mean);
      rs.welch = welch_diff(finals[k], finals[baseline]);
    }
    p.push_back(rs.test.p);
    out.push_back(rs);
  }
  const std::vector<double> holm = holm_adjust(p);
  for (size_t i = 0; i < out.size(); ++i) out[i].p_holm = holm[i];
  return out;
}

std::string interval(double lo, double hi, const char* fm, bool sign = false) {
  if (std::isnan(lo) || std::isnan(hi)) return "-";
  return "[" + (sign ? signed_f(lo, fm) : f(lo, fm)) + ", " + (sign ? signed_f(hi, fm) : f(hi, fm)) + "]";
}

std::string p_text(double p) {
  if (std::isnan(p)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, p < 1e-4 ? "%.1e" : "%.4f", p);
  return b;
}

// The tests against the baseline (train/stats.hpp): Welch's unpaired
// difference with its 95% CI, the paired t test's p, Holm's adjusted p over
// the table's recipes (* where < 0.05), the smallest paired difference 80%
// power detects at these pairs, and the pairs 80% power needs at the observed
// difference.
void tests_table(std::ostream& t, const std::vector<RecipeStats>& stats, const Baseline& base, const MetricFormat& mf,
                 size_t wrec) {
  const char* fm = mf.fmt;
  t << "\n"
    << pad("tests vs " + shown(base.label), wrec) << pad("Welch diff [95% CI]", 34, true) << pad("df", 6, true)
    << pad("paired p", 10, true) << pad("Holm p", 10, true) << pad("MDE80", 9, true) << pad("pairs80", 8, true) << "\n";
  for (const auto& s : stats) {
    if (s.recipe == base.label) continue;
    const std::string welch =
        std::isnan(s.welch.lo) ? "-" : signed_f(s.welch.diff, fm) + " " + interval(s.welch.lo, s.welch.hi, fm, true);
    char df[16] = "-";
    if (!std::isnan(s.welch.df)) std::snprintf(df, sizeof df, "%.1f", s.welch.df);
    const std::string holm = p_text(s.p_holm) + (s.p_holm < 0.05 ? "*" : "");
    t << pad(shown(s.recipe), wrec) << pad(welch, 34, true) << pad(df, 6, true) << pad(p_text(s.test.p), 10, true)
      << pad(holm, 10, true) << pad(std::isnan(s.mde80) ? "-" : f(s.mde80, fm), 9, true)
      << pad(s.pairs_needed < 0 ? "-" : std::to_string(s.pairs_needed), 8, true) << "\n";
  }
  t << "(Welch: unpaired difference of the means, Welch-Satterthwaite df; paired p: two-sided paired t test over"
    << " shared seeds; Holm p: step-down adjusted over this table's " << (mf.by ? "arms" : "recipes")
    << ", * = significant at family-wise 0.05;"
    << " MDE80: the smallest true paired difference detected with 80% power at two-sided 0.05 with these pairs;"
    << " pairs80: the pairs that power needs at the observed mean difference and spread)\n";
}

// The per-recipe table (n, mean, sample std, 95% CI of the mean, gap of the
// mean, paired difference vs the baseline with its 95% CI and number of
// pairs); printed only when some recipe has several runs (seeds).
void recipe_table(std::ostream& t, const std::vector<Run>& runs, const std::vector<RecipeStats>& stats,
                  const Baseline& base, const MetricFormat& mf) {
  std::map<std::string, int> n_runs;
  bool multi = false;
  for (const auto& r : runs) multi |= ++n_runs[r.label] > 1;
  if (!multi) return;
  const char* fm = mf.fmt;
  size_t wrec = std::max<size_t>(26, shown(mf.arm).size() + 2);
  for (const auto& s : stats) wrec = std::max(wrec, shown(s.recipe).size() + 2);
  t << "\n"
    << pad(shown(mf.arm), wrec) << pad("n", 4, true) << pad(std::string("mean ") + compare_metric_name(mf.compared), 12, true) << pad("std", 9, true)
    << pad("95% CI", 22, true) << pad("gap", 9, true) << pad("paired diff vs " + shown(base.label), 34, true)
    << pad("pairs", 6, true) << "\n";
  for (const auto& s : stats) {
    const double gap = s.final.mean - base.final;
    const std::string diff = s.recipe == base.label || s.diff.n == 0
                                 ? "-"
                                 : signed_f(s.diff.mean, fm) + " " + interval(s.diff.lo, s.diff.hi, fm, true);
    t << pad(shown(s.recipe), wrec) << pad(std::to_string(s.final.n), 4, true) << pad(f(s.final.mean, fm), 12, true)
      << pad(f(s.final.std, fm), 9, true) << pad(interval(s.final.lo, s.final.hi, fm), 22, true)
      << pad(std::isnan(gap) ? "-" : signed_f(gap, fm), 9, true) << pad(diff, 34, true)
      << pad(s.recipe == base.label ? "-" : std::to_string(s.diff.n), 6, true) << "\n";
  }
  t << "(n: runs with a " << compare_metric_name(mf.compared) << " " << mf.title
    << "; std: sample std (n-1); 95% CI of the mean: Student's t, n-1 df;"
    << " paired diff: mean of (" << (mf.by ? "arm" : "recipe") << " - " << shown(base.label)
    << ") over shared seeds, paired-t 95% CI)\n";
  tests_table(t, stats, base, mf, wrec);
}

// A number, or null where it is not finite (JSON has no NaN).
json num_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json stats_json(const SampleStats& s) {
  return {{"n", s.n}, {"mean", s.mean}, {"std", s.std}, {"ci95", {s.lo, s.hi}}};
}

// Run r's curves: the training loss as a moving average over a window of ~2%
// of the points (single-step losses are noisy), and the evaluation metric;
// (step, value) pairs in step order.
std::pair<Curve, Curve> run_curves(const Run& run) {
  const Curve& pts = run.loss;
  Curve loss;
  const size_t w = std::max<size_t>(1, pts.size() / 50);
  double s = 0;
  for (size_t k = 0; k < pts.size(); ++k) {
    s += pts[k].second;
    if (k >= w) s -= pts[k - w].second;
    if (k + 1 >= w) loss.emplace_back(pts[k].first, s / double(w));
  }
  return {loss, run.eval};
}

// The band of seed_band as gnuplot data "step mean lo hi" into f; false if empty.
bool write_band(const std::vector<Curve>& curves, const fs::path& f) {
  const std::vector<BandPoint> band = seed_band(curves);
  std::ofstream o(f);
  for (const BandPoint& b : band) o << b.step << " " << b.mean << " " << b.lo << " " << b.hi << "\n";
  return !band.empty();
}

// The gnuplot script of the two panels (loss curves, evaluation metric), run
// in dir (where it writes the curve files). Its text is constants, numbers,
// the fixed file names below (loss_3.dat, band_eval_1.dat, plot.png) and
// gnuplot_string literals of the titles: nothing from a run archive or a path
// is script text. A recipe with several runs (seeds) is drawn as its mean curve
// with a band of +-1 sample standard deviation at the steps all its runs
// share; a recipe with one run as that run's curve.
std::string plot_script(const std::vector<Run>& runs, const MetricFormat& mf, const fs::path& dir,
                        const std::string& title) {
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 1400,560 font ',10'\nset output 'plot.png'\n"
     << "set multiplot layout 1,2" << (title.empty() ? "" : " title " + gnuplot_string(title)) << "\nset grid\nset key top right\nset xlabel 'step'\n"
     << "set style fill transparent solid 0.2 noborder\n";
  std::vector<std::string> labels;  // recipes in order of first appearance
  std::map<std::string, std::vector<size_t>> members;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!members.count(runs[i].label)) labels.push_back(runs[i].label);
    members[runs[i].label].push_back(i);
  }
  std::vector<std::pair<Curve, Curve>> curves;
  for (const Run& r : runs) curves.push_back(run_curves(r));
  std::string loss_plot, eval_plot;
  auto add = [](std::string& plot, const std::string& term) { plot += (plot.empty() ? "" : ", ") + term; };
  int color = 0;
  for (const std::string& label : labels) {
    const std::vector<size_t>& idx = members[label];
    if (idx.size() == 1) {
      const size_t i = idx[0];
      const std::string lf = "loss_" + std::to_string(i) + ".dat", ef = "eval_" + std::to_string(i) + ".dat";
      std::ofstream l(dir / lf), e(dir / ef);
      for (const auto& [x, y] : curves[i].first) l << x << " " << y << "\n";
      for (const auto& [x, y] : curves[i].second) e << x << " " << y << "\n";
      const std::string title = gnuplot_string(label + " (" + name_of(runs[i]) + ")");
      add(loss_plot, "'" + lf + "' with lines lw 2 title " + title);
      if (!curves[i].second.empty()) add(eval_plot, "'" + ef + "' with linespoints lw 2 title " + title);
      continue;
    }
    ++color;
    const std::string lc = " lc " + std::to_string(color);
    const std::string title = gnuplot_string(label + " (" + std::to_string(idx.size()) + " runs: mean, band +-1 std)");
    std::vector<Curve> lcs, ecs;
    for (size_t i : idx) lcs.push_back(curves[i].first), ecs.push_back(curves[i].second);
    const std::string lf = "band_loss_" + std::to_string(color) + ".dat",
                      ef = "band_eval_" + std::to_string(color) + ".dat";
    if (write_band(lcs, dir / lf)) {
      add(loss_plot, "'" + lf + "' using 1:3:4 with filledcurves" + lc + " notitle");
      add(loss_plot, "'" + lf + "' using 1:2 with lines lw 2" + lc + " title " + title);
    }
    if (write_band(ecs, dir / ef)) {
      add(eval_plot, "'" + ef + "' using 1:3:4 with filledcurves" + lc + " notitle");
      add(eval_plot, "'" + ef + "' using 1:2 with linespoints lw 2" + lc + " title " + title);
    }
  }
  gp << "set title 'training loss (moving average)'\nset ylabel 'loss'\nplot " << loss_plot << "\n";
  if (!eval_plot.empty())
    gp << "set title " << gnuplot_string("evaluation: " + mf.title) << "\nset ylabel " << gnuplot_string(mf.title)
       << "\nplot " << eval_plot << "\n";
  gp << "unset multiplot\n";
  return gp.str();
}

// The forest plot's rows: the recipes (table order) with a paired-t interval vs the baseline.
std::vector<const RecipeStats*> forest_rows(const std::vector<RecipeStats>& stats, const Baseline& base) {
  std::vector<const RecipeStats*> rows;
  for (const auto& s : stats)
    if (s.recipe != base.label && s.diff.n >= 2 && std::isfinite(s.diff.lo)) rows.push_back(&s);
  return rows;
}

// The forest plot's script (data written into dir): one row per recipe, top to
// bottom, its mean paired difference vs the baseline and the paired-t 95% CI as
// a horizontal error bar, a dashed line at 0; recipe names only as
// gnuplot_string literals.
std::string forest_script(const std::vector<const RecipeStats*>& rows, const Baseline& base, const MetricFormat& mf,
                          const fs::path& dir, const std::string& title) {
  std::ofstream d(dir / "forest.dat");
  d.precision(17);
  std::string tics;
  for (size_t i = 0; i < rows.size(); ++i) {
    const RecipeStats& s = *rows[i];
    d << i + 1 << " " << s.diff.mean << " " << s.diff.lo << " " << s.diff.hi << "\n";
    const std::string label = s.recipe + (s.p_holm < 0.05 ? " *" : "") + " (n=" + std::to_string(s.diff.n) + ")";
    tics += (tics.empty() ? "" : ", ") + gnuplot_string(label) + " " + std::to_string(i + 1);
  }
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 900," << 160 + 45 * rows.size() << " font ',10'\n"
     << "set output 'plot.png'\n"
     << "set title " << gnuplot_string(title.empty() ? "paired differences vs " + base.label : title) << "\n"
     << "set xlabel "
     << gnuplot_string((mf.compared == CompareMetric::final ? "" : std::string(compare_metric_name(mf.compared)) + " ") +
                       mf.title + " of " +
                       (mf.by ? "arm" : "recipe") + " - " + base.label +
                       " over shared seeds: mean and paired-t 95% CI (* Holm-adjusted p < 0.05)")
     << "\n"
     << "set grid x\nset ytics (" << tics << ")\nset yrange [" << rows.size() + 0.5 << ":0.5]\n"
     << "set arrow from 0, graph 0 to 0, graph 1 nohead dt 2\n"
     << "plot 'forest.dat' using 2:1:3:4 with xerrorbars pt 7 ps 1.2 lw 2 notitle\n";
  return gp.str();
}

// Draws png from a gnuplot script (writing its data into the directory it is
// given) in a private temporary directory, then writes it atomically; false if
// gnuplot is not installed. Throws with gnuplot's message if it fails.
template <class Script>
bool draw_png(const fs::path& png, Script&& script) {
  const TempDir tmp("fp4lab_compare_");
  try {
    run_gnuplot(script(tmp.path()), tmp.path());
  } catch (const ProgramNotFound&) {
    return false;
  } catch (const EnvironmentError& e) {
    throw EnvironmentError("compare: drawing " + shown(png) + ": " + e.what());
  } catch (const Error& e) {
    throw Error("compare: drawing " + shown(png) + ": " + e.what());
  }
  std::ifstream in(tmp.path() / "plot.png", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) throw Error("compare: drawing " + shown(png) + ": gnuplot wrote no image");
  if (fs::path(png).has_parent_path()) fs::create_directories(fs::path(png).parent_path());
  write_atomic(png, bytes);
  return true;
}

}  // namespace

std::vector<BandPoint> seed_band(const std::vector<std::vector<std::pair<double, double>>>& curves) {
  std::map<double, std::vector<double>> at;
  for (const auto& c : curves)
    for (const auto& [step, v] : c) at[step].push_back(v);
  std::vector<BandPoint> out;
  for (const auto& [step, vs] : at) {
    if (vs.size() != curves.size()) continue;
    double m = 0, q = 0;
    for (double v : vs) m += v;
    m /= double(vs.size());
    for (double v : vs) q += (v - m) * (v - m);
    const double sd = vs.size() > 1 ? std::sqrt(q / double(vs.size() - 1)) : 0.0;
    out.push_back({step, m, m - sd, m + sd});
  }
  return out;
}

const char* compare_metric_name(CompareMetric m) { return m == CompareMetric::best ? "best" : "final"; }

CompareMetric parse_compare_metric(const std::string& v) {
  if (v == "final") return CompareMetric::final;
  if (v == "best") return CompareMetric::best;
  throw Error("compare: --metric \"" + shown(v) + "\": valid: final, best");
}

CompareResult compare_runs(const std::vector<std::string>& dirs, const CompareOptions& opt) {
  if (dirs.empty()) throw Error("compare: give at least one run directory");
  std::vector<std::string> notes;
  std::vector<Run> runs = compare_archive::load_runs(dirs, notes);
  const std::string metric = compare_archive::common_metric(runs);
  compare_archive::set_arms(runs, opt.by);
  compare_archive::set_values(runs, opt.metric == CompareMetric::best);
  MetricFormat mf = metric_format(metric, runs[0].summary.higher_is_better);
  mf.compared = opt.metric;
  mf.by = !opt.by.empty();
  if (mf.by) {
    mf.arm.clear();
    for (const std::string& k : opt.by) mf.arm += (mf.arm.empty() ? "" : ",") + k;
  }
  const Baseline base = find_baseline(runs, opt.baseline, mf.arm);

  CompareResult out;
  out.rows = json::array();
  std::ostringstream t;
  run_table(t, runs, base, mf, out.rows);
  out.baseline = base.label;
  out.recipes = recipe_stats(runs, base.label);
  recipe_table(t, runs, out.recipes, base, mf);
  for (const std::string& n : notes) t << n << "\n";
  out.table = t.str();

  const fs::path png = opt.plot.empty() || opt.plot == "-" ? fs::path(runs[0].dir).parent_path() / "compare.png"
                                                           : fs::path(opt.plot);
  json js = {{"metric", metric},
             {"compared", compare_metric_name(mf.compared)},
             {"by", opt.by.empty() ? json::array({"recipe"}) : json(opt.by)},
             {"higher_is_better", mf.higher},
             {"baseline", base.label},
             {"runs", out.rows},
             {"recipes", json::array()}};
  for (const auto& s : out.recipes) {
    json d = stats_json(s.diff), tests = nullptr;
    if (s.recipe == base.label) {
      d = nullptr;
    } else {
      tests = {{"paired_t", num_or_null(s.test.t)},
               {"paired_df", num_or_null(s.test.df)},
               {"paired_p", num_or_null(s.test.p)},
               {"paired_p_holm", num_or_null(s.p_holm)},
               {"mde80", num_or_null(s.mde80)},
               {"pairs_for_80pct_power", s.pairs_needed < 0 ? json(nullptr) : json(s.pairs_needed)},
               {"welch_diff", num_or_null(s.welch.diff)},
               {"welch_se", num_or_null(s.welch.se)},
               {"welch_df", num_or_null(s.welch.df)},
               {"welch_ci95", {num_or_null(s.welch.lo), num_or_null(s.welch.hi)}},
               {"welch_p", num_or_null(s.welch.p)}};
    }
    js["recipes"].push_back({{"recipe", s.recipe},
                             {compare_metric_name(mf.compared), stats_json(s.final)},
                             {"paired_diff_vs_baseline", d},
                             {"tests_vs_baseline", tests}});
  }
  out.stats = fs::path(png).replace_extension(".json").string();
  // A directory name that is not UTF-8 is written with U+FFFD in place of its bad bytes (JSON text is UTF-8).
  if (fs::path(out.stats).has_parent_path()) fs::create_directories(fs::path(out.stats).parent_path());
  write_atomic(out.stats, js.dump(2, ' ', false, json::error_handler_t::replace) + "\n");

  if (opt.plot == "-") return out;
  if (!draw_png(png, [&](const fs::path& dir) { return plot_script(runs, mf, dir, opt.title); })) {
    out.plot_note = "gnuplot not found (apt-get install gnuplot-nox); no plot drawn";
    return out;
  }
  out.plot = png.string();
  const fs::path forest = fs::path(png).replace_extension().string() + "_forest.png";
  const std::vector<const RecipeStats*> rows = forest_rows(out.recipes, base);
  if (!rows.empty() &&
      draw_png(forest, [&](const fs::path& dir) { return forest_script(rows, base, mf, dir, opt.title); }))
    out.forest = forest.string();
  return out;
}

}  // namespace fp4lab::train
