#include "train/compare.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
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

// Mean and sample std of the final metric per recipe, in order of first
// appearance; printed only when some recipe has several runs (seeds).
void recipe_table(std::ostream& t, const std::vector<Run>& runs, const Baseline& base, const MetricFormat& mf) {
  std::map<std::string, std::vector<double>> by_recipe;
  std::vector<std::string> order;
  for (const auto& r : runs) {
    if (!by_recipe.count(r.label)) order.push_back(r.label);
    by_recipe[r.label].push_back(num(r.summary, "final"));
  }
  bool multi = false;
  for (const auto& [k, v] : by_recipe) multi |= v.size() > 1;
  if (!multi) return;
  const char* fm = mf.fmt;
  t << "\n"
    << pad("recipe", 26) << pad("seeds", 6, true) << pad("mean final", 12, true) << pad("std", 9, true)
    << pad("gap", 9, true) << "\n";
  for (const auto& k : order) {
    const auto& v = by_recipe[k];
    double m = 0, s = 0;
    for (double x : v) m += x;
    m /= double(v.size());
    for (double x : v) s += (x - m) * (x - m);
    s = v.size() > 1 ? std::sqrt(s / double(v.size() - 1)) : 0.0;
    t << pad(k, 26) << pad(std::to_string(v.size()), 6, true) << pad(f(m, fm), 12, true) << pad(f(s, fm), 9, true)
      << pad((m - base.final >= 0 ? "+" : "") + f(m - base.final, fm), 9, true) << "\n";
  }
}

// Writes run i's curves for gnuplot: lf, the training loss as a moving average
// over a window of ~2% of the points (single-step losses are noisy); ef, the
// evaluation metric. Returns whether there were evaluation points.
bool write_curves(const Run& run, const std::string& metric, const fs::path& lf, const fs::path& ef) {
  std::vector<std::pair<double, double>> pts, ev;
  for (const auto& m : run.metrics) {
    if (m.contains("eval") && m.contains(metric))
      ev.emplace_back(num(m, "step"), num(m, metric.c_str()));
    else if (m.contains("loss") && m["loss"].is_number())
      pts.emplace_back(num(m, "step"), num(m, "loss"));
  }
  const size_t w = std::max<size_t>(1, pts.size() / 50);
  std::ofstream o(lf);
  double s = 0;
  for (size_t k = 0; k < pts.size(); ++k) {
    s += pts[k].second;
    if (k >= w) s -= pts[k - w].second;
    if (k + 1 >= w) o << pts[k].first << " " << s / double(w) << "\n";
  }
  std::ofstream e(ef);
  for (auto& p : ev) e << p.first << " " << p.second << "\n";
  return !ev.empty();
}

// The gnuplot script of the two panels (loss curves, evaluation metric), with
// the curve files in tmp.
std::string plot_script(const std::vector<Run>& runs, const MetricFormat& mf, const fs::path& png,
                        const fs::path& tmp) {
  std::ostringstream gp;
  gp << "set terminal pngcairo noenhanced size 1400,560 font ',10'\nset output " << quote(png.string()) << "\n"
     << "set multiplot layout 1,2\nset grid\nset key top right\nset xlabel 'step'\n";
  std::string loss_plot, eval_plot;
  for (size_t i = 0; i < runs.size(); ++i) {
    const fs::path lf = tmp / ("loss" + std::to_string(i) + ".dat"), ef = tmp / ("eval" + std::to_string(i) + ".dat");
    const bool has_eval = write_curves(runs[i], mf.metric, lf, ef);
    const std::string title = quote(runs[i].label + " (" + name_of(runs[i]) + ")");
    loss_plot += (i ? ", " : "") + quote(lf.string()) + " with lines lw 2 title " + title;
    if (has_eval)
      eval_plot += (eval_plot.empty() ? "" : ", ") + quote(ef.string()) + " with linespoints lw 2 title " + title;
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
  recipe_table(t, runs, base, mf);
  out.table = t.str();

  if (opt.plot == "-") return out;
  const fs::path png = opt.plot.empty() ? fs::path(runs[0].dir).parent_path() / "compare.png" : fs::path(opt.plot);
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    out.plot_note = "gnuplot not found (apt-get install gnuplot-nox); no plot drawn";
    return out;
  }
  draw_plot(runs, mf, png);
  out.plot = png.string();
  return out;
}

}  // namespace fp4lab::train
