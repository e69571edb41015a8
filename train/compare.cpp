#include "train/compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "train/config.hpp"
#include "train/run.hpp"
#include "core/error.hpp"

namespace fp4lab::train {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

double num(const json& j, const char* k) {
  auto it = j.find(k);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}
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
std::string quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("''") : std::string(1, c);
  return o + "'";
}

// A finished run: its directory (without trailing '/'), recipe label, summary and metrics.
struct Run {
  std::string dir, label;
  json summary;
  std::vector<json> metrics;
};

Run load_run(const std::string& d) {
  Run r;
  r.dir = d;  // "runs/x/" names the run "x", like "runs/x"
  while (r.dir.size() > 1 && r.dir.back() == '/') r.dir.pop_back();
  const fs::path sp = fs::path(d) / "summary.json";
  if (!fs::exists(sp))
    throw Error("compare: " + sp.string() + " not found (not a run directory, or the run has not finished)");
  r.summary = read_json_file(sp.string());
  r.metrics = read_metrics((fs::path(d) / "metrics.jsonl").string());
  r.label = r.summary.value("recipe", fs::path(d).filename().string());
  return r;
}

std::string name_of(const Run& r) { return fs::path(r.dir).filename().string(); }

// The metric every run reports (an error if they differ).
std::string common_metric(const std::vector<Run>& runs) {
  const std::string metric = runs[0].summary.value("metric", "");
  for (const auto& r : runs)
    if (r.summary.value("metric", "") != metric)
      throw Error("compare: " + r.dir + " reports metric \"" + r.summary.value("metric", "") + "\" but " + runs[0].dir +
                  " reports \"" + metric + "\"; compare runs of one task");
  return metric;
}

// The reference of the gaps: the first run of the recipe `baseline` (empty:
// the first fp32/bf16 run, else the first run); its value is the mean final
// metric over all runs of that recipe (several seeds).
struct Baseline {
  std::string label;
  double final = 0.0;
};

Baseline find_baseline(const std::vector<Run>& runs, const std::string& baseline) {
  int base = -1;
  for (size_t i = 0; i < runs.size() && base < 0; ++i)
    if (baseline.empty() ? (runs[i].label == "fp32" || runs[i].label == "bf16") : runs[i].label == baseline)
      base = int(i);
  if (base < 0 && !baseline.empty()) throw Error("compare: no run with recipe \"" + baseline + "\"");
  if (base < 0) base = 0;
  Baseline b{runs[size_t(base)].label, 0.0};
  int nb = 0;
  for (const auto& r : runs)
    if (r.label == b.label && std::isfinite(num(r.summary, "final"))) b.final += num(r.summary, "final"), ++nb;
  b.final = nb ? b.final / nb : std::nan("");
  return b;
}

// How the tables show the metric.
struct MetricFormat {
  std::string metric, title;  // title: "top-1 %" for test_acc
  const char* fmt;            // printf format of its values
  bool higher;
};

MetricFormat metric_format(const std::string& metric, bool higher) {
  const bool acc = metric == "test_acc";
  return MetricFormat{metric, acc ? "top-1 %" : metric, acc ? "%.2f" : "%.4f", higher};
}

// One line per run (and its numbers as out.rows), then which way is better.
void run_table(std::ostream& t, const std::vector<Run>& runs, const Baseline& base, const MetricFormat& mf,
               json& rows) {
  const char* fm = mf.fmt;
  // Column widths fit the longest run directory name and recipe label (+2 spaces).
  size_t wrun = 34, wrec = 26;
  for (const auto& r : runs) {
    wrun = std::max(wrun, name_of(r).size() + 2);
    wrec = std::max(wrec, r.label.size() + 2);
  }
  t << pad("run", wrun) << pad("recipe", wrec) << pad("status", 10) << pad("final " + mf.title, 16, true)
    << pad("best", 10, true) << pad("gap", 9, true) << pad("train loss", 12, true) << pad("ms/step", 10, true)
    << pad(runs[0].summary.value("item", "items") + "/s", 12, true) << "\n";
  for (const auto& r : runs) {
    const double fin = num(r.summary, "final"), best = num(r.summary, "best");
    const double gap = fin - base.final;
    t << pad(name_of(r), wrun) << pad(r.label, wrec) << pad(r.summary.value("status", "?"), 10)
      << pad(f(fin, fm), 16, true) << pad(f(best, fm), 10, true)
      << pad(std::isnan(gap) ? "-" : (gap >= 0 ? "+" : "") + f(gap, fm), 9, true)
      << pad(f(num(r.summary, "final_train_loss")), 12, true) << pad(f(num(r.summary, "ms_per_step"), "%.1f"), 10, true)
      << pad(f(num(r.summary, "items_per_s"), "%.0f"), 12, true) << "\n";
    rows.push_back({{"dir", r.dir},
                    {"recipe", r.label},
                    {"status", r.summary.value("status", "?")},
                    {"final", fin},
                    {"best", best},
                    {"gap", gap},
                    {"ms_per_step", num(r.summary, "ms_per_step")},
                    {"items_per_s", num(r.summary, "items_per_s")}});
  }
  t << "(" << mf.title << ": " << (mf.higher ? "higher" : "lower") << " is better; gap = final - final of "
    << base.label << ")\n";
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
    const auto s = r.summary.find("seed");
    const int64_t seed = s != r.summary.end() && s->is_number_integer() ? s->get<int64_t>() : count[r.label];
    ++count[r.label];
    const double fin = num(r.summary, "final");
    if (!std::isfinite(fin)) continue;
    finals[r.label].push_back(fin);
    by_seed[r.label].emplace(seed, fin);
  }
  std::vector<RecipeStats> out;
  for (const auto& k : order) {
    RecipeStats rs{k, sample_stats(finals[k]), {}};
    std::vector<double> d;
    for (const auto& [seed, v] : by_seed[k]) {
      const auto& b = by_seed[baseline];
      if (auto it = b.find(seed); it != b.end()) d.push_back(v - it->second);
    }
    rs.diff = sample_stats(d);
    out.push_back(rs);
  }
  return out;
}

std::string signed_f(double v, const char* fm) {
  std::string s = f(v, fm);
  if (!std::isnan(v) && v >= 0) s.insert(s.begin(), '+');  // (not "+" + s: GCC 12's -Wrestrict false positive)
  return s;
}
std::string interval(double lo, double hi, const char* fm, bool sign = false) {
  if (std::isnan(lo) || std::isnan(hi)) return "-";
  return "[" + (sign ? signed_f(lo, fm) : f(lo, fm)) + ", " + (sign ? signed_f(hi, fm) : f(hi, fm)) + "]";
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
  size_t wrec = 26;
  for (const auto& s : stats) wrec = std::max(wrec, s.recipe.size() + 2);
  t << "\n"
    << pad("recipe", wrec) << pad("n", 4, true) << pad("mean final", 12, true) << pad("std", 9, true)
    << pad("95% CI", 22, true) << pad("gap", 9, true) << pad("paired diff vs " + base.label, 34, true)
    << pad("pairs", 6, true) << "\n";
  for (const auto& s : stats) {
    const double gap = s.final.mean - base.final;
    const std::string diff = s.recipe == base.label || s.diff.n == 0
                                 ? "-"
                                 : signed_f(s.diff.mean, fm) + " " + interval(s.diff.lo, s.diff.hi, fm, true);
    t << pad(s.recipe, wrec) << pad(std::to_string(s.final.n), 4, true) << pad(f(s.final.mean, fm), 12, true)
      << pad(f(s.final.std, fm), 9, true) << pad(interval(s.final.lo, s.final.hi, fm), 22, true)
      << pad(std::isnan(gap) ? "-" : signed_f(gap, fm), 9, true) << pad(diff, 34, true)
      << pad(s.recipe == base.label ? "-" : std::to_string(s.diff.n), 6, true) << "\n";
  }
  t << "(n: runs with a final " << mf.title << "; std: sample std (n-1); 95% CI of the mean: Student's t, n-1 df;"
    << " paired diff: mean of (recipe - " << base.label << ") over shared seeds, paired-t 95% CI)\n";
}

json stats_json(const SampleStats& s) {
  return {{"n", s.n}, {"mean", s.mean}, {"std", s.std}, {"ci95", {s.lo, s.hi}}};
}

// Writes text to path atomically (a temporary file beside it, then rename).
void write_file_atomic(const fs::path& path, const std::string& text) {
  if (path.has_parent_path()) fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    o << text;
    o.flush();
    if (!o) throw Error("compare: cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp);
    throw Error("compare: cannot write " + path.string() + ": " + ec.message());
  }
}

// Run r's curves: the training loss as a moving average over a window of ~2%
// of the points (single-step losses are noisy), and the evaluation metric;
// (step, value) pairs in step order.
using Curve = std::vector<std::pair<double, double>>;
std::pair<Curve, Curve> run_curves(const Run& run, const std::string& metric) {
  Curve pts, ev, loss;
  for (const auto& m : run.metrics) {
    if (m.contains("eval") && m.contains(metric))
      ev.emplace_back(num(m, "step"), num(m, metric.c_str()));
    else if (m.contains("loss") && m["loss"].is_number())
      pts.emplace_back(num(m, "step"), num(m, "loss"));
  }
  const size_t w = std::max<size_t>(1, pts.size() / 50);
  double s = 0;
  for (size_t k = 0; k < pts.size(); ++k) {
    s += pts[k].second;
    if (k >= w) s -= pts[k - w].second;
    if (k + 1 >= w) loss.emplace_back(pts[k].first, s / double(w));
  }
  return {loss, ev};
}

// The band of seed_band as gnuplot data "step mean lo hi" into f; false if empty.
bool write_band(const std::vector<Curve>& curves, const fs::path& f) {
  const std::vector<BandPoint> band = seed_band(curves);
  std::ofstream o(f);
  for (const BandPoint& b : band) o << b.step << " " << b.mean << " " << b.lo << " " << b.hi << "\n";
  return !band.empty();
}

// The gnuplot script of the two panels (loss curves, evaluation metric), with
// the curve files in tmp. A recipe with several runs (seeds) is drawn as its
// mean curve with a band of +-1 sample standard deviation at the steps all its
// runs share; a recipe with one run as that run's curve.
std::string plot_script(const std::vector<Run>& runs, const MetricFormat& mf, const fs::path& png,
                        const fs::path& tmp) {
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 1400,560 font ',10'\nset output " << quote(png.string()) << "\n"
     << "set multiplot layout 1,2\nset grid\nset key top right\nset xlabel 'step'\n"
     << "set style fill transparent solid 0.2 noborder\n";
  std::vector<std::string> labels;  // recipes in order of first appearance
  std::map<std::string, std::vector<size_t>> members;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!members.count(runs[i].label)) labels.push_back(runs[i].label);
    members[runs[i].label].push_back(i);
  }
  std::vector<std::pair<Curve, Curve>> curves;
  for (const Run& r : runs) curves.push_back(run_curves(r, mf.metric));
  std::string loss_plot, eval_plot;
  auto add = [](std::string& plot, const std::string& term) { plot += (plot.empty() ? "" : ", ") + term; };
  int color = 0;
  for (const std::string& label : labels) {
    const std::vector<size_t>& idx = members[label];
    if (idx.size() == 1) {
      const size_t i = idx[0];
      const fs::path lf = tmp / ("loss" + std::to_string(i) + ".dat"), ef = tmp / ("eval" + std::to_string(i) + ".dat");
      std::ofstream l(lf), e(ef);
      for (const auto& [x, y] : curves[i].first) l << x << " " << y << "\n";
      for (const auto& [x, y] : curves[i].second) e << x << " " << y << "\n";
      const std::string title = quote(label + " (" + name_of(runs[i]) + ")");
      add(loss_plot, quote(lf.string()) + " with lines lw 2 title " + title);
      if (!curves[i].second.empty()) add(eval_plot, quote(ef.string()) + " with linespoints lw 2 title " + title);
      continue;
    }
    ++color;
    const std::string lc = " lc " + std::to_string(color);
    const std::string title = quote(label + " (" + std::to_string(idx.size()) + " runs: mean, band +-1 std)");
    std::vector<Curve> lcs, ecs;
    for (size_t i : idx) lcs.push_back(curves[i].first), ecs.push_back(curves[i].second);
    const fs::path lf = tmp / ("band_loss" + std::to_string(color) + ".dat"),
                   ef = tmp / ("band_eval" + std::to_string(color) + ".dat");
    if (write_band(lcs, lf)) {
      add(loss_plot, quote(lf.string()) + " using 1:3:4 with filledcurves" + lc + " notitle");
      add(loss_plot, quote(lf.string()) + " using 1:2 with lines lw 2" + lc + " title " + title);
    }
    if (write_band(ecs, ef)) {
      add(eval_plot, quote(ef.string()) + " using 1:3:4 with filledcurves" + lc + " notitle");
      add(eval_plot, quote(ef.string()) + " using 1:2 with linespoints lw 2" + lc + " title " + title);
    }
  }
  gp << "set title 'training loss (moving average)'\nset ylabel 'loss'\nplot " << loss_plot << "\n";
  if (!eval_plot.empty())
    gp << "set title 'evaluation: " << mf.title << "'\nset ylabel " << quote(mf.title) << "\nplot " << eval_plot
       << "\n";
  gp << "unset multiplot\n";
  return gp.str();
}

// Draws png with gnuplot (which must exist); throws with gnuplot's message if it fails.
void draw_plot(const std::vector<Run>& runs, const MetricFormat& mf, const fs::path& png) {
  const fs::path tmp = fs::temp_directory_path() / ("fp4lab_compare_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  const fs::path script = tmp / "plot.gp";
  std::ofstream(script) << plot_script(runs, mf, png, tmp);
  const int rc = std::system(("gnuplot " + quote(script.string()) + " 2>" + quote((tmp / "err.txt").string())).c_str());
  if (rc != 0) {
    std::ifstream e(tmp / "err.txt");
    std::string msg((std::istreambuf_iterator<char>(e)), {});
    fs::remove_all(tmp);
    throw Error("compare: gnuplot failed drawing " + png.string() + ": " + msg);
  }
  fs::remove_all(tmp);
}

}  // namespace

double t975(int df) {
  // Two-sided 95% quantiles of Student's t distribution (standard tables).
  static const double t[30] = {12.7062047, 4.3026527, 3.1824463, 2.7764451, 2.5705818, 2.4469119, 2.3646243,
                               2.3060041,  2.2621572, 2.2281389, 2.2009852, 2.1788128, 2.1603687, 2.1447867,
                               2.1314495,  2.1199053, 2.1098156, 2.1009220, 2.0930241, 2.0859634, 2.0796138,
                               2.0738731,  2.0686576, 2.0638986, 2.0595386, 2.0555294, 2.0518305, 2.0484071,
                               2.0452296,  2.0422725};
  if (df < 1) throw Error("t975: degrees of freedom must be >= 1");
  return df <= 30 ? t[df - 1] : 1.96;
}

SampleStats sample_stats(const std::vector<double>& v) {
  const double nan = std::nan("");
  SampleStats s{int(v.size()), nan, nan, nan, nan};
  if (v.empty()) return s;
  double m = 0;
  for (double x : v) m += x;
  s.mean = m / double(v.size());
  if (v.size() < 2) return s;
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(ss / double(v.size() - 1));
  const double h = t975(s.n - 1) * s.std / std::sqrt(double(s.n));
  s.lo = s.mean - h;
  s.hi = s.mean + h;
  return s;
}

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

CompareResult compare_runs(const std::vector<std::string>& dirs, const CompareOptions& opt) {
  if (dirs.empty()) throw Error("compare: give at least one run directory");
  std::vector<Run> runs;
  for (const auto& d : dirs) runs.push_back(load_run(d));
  const std::string metric = common_metric(runs);
  const MetricFormat mf = metric_format(metric, runs[0].summary.value("higher_is_better", false));
  const Baseline base = find_baseline(runs, opt.baseline);

  CompareResult out;
  out.rows = json::array();
  std::ostringstream t;
  run_table(t, runs, base, mf, out.rows);
  out.baseline = base.label;
  out.recipes = recipe_stats(runs, base.label);
  recipe_table(t, runs, out.recipes, base, mf);
  out.table = t.str();

  const fs::path png = opt.plot.empty() || opt.plot == "-" ? fs::path(runs[0].dir).parent_path() / "compare.png"
                                                           : fs::path(opt.plot);
  json js = {{"metric", metric},
             {"higher_is_better", mf.higher},
             {"baseline", base.label},
             {"runs", out.rows},
             {"recipes", json::array()}};
  for (const auto& s : out.recipes) {
    json d = stats_json(s.diff);
    if (s.recipe == base.label) d = nullptr;
    js["recipes"].push_back({{"recipe", s.recipe}, {"final", stats_json(s.final)}, {"paired_diff_vs_baseline", d}});
  }
  out.stats = fs::path(png).replace_extension(".json").string();
  write_file_atomic(out.stats, js.dump(2) + "\n");

  if (opt.plot == "-") return out;
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    out.plot_note = "gnuplot not found (apt-get install gnuplot-nox); no plot drawn";
    return out;
  }
  draw_plot(runs, mf, png);
  out.plot = png.string();
  return out;
}

}  // namespace fp4lab::train
