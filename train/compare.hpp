// Comparing finished runs: a table (final/best metric, gap to the
// high-precision run, throughput) and a loss-curve PNG drawn by gnuplot.
// Run directories are untrusted input (docs/DESIGN.md section 5): nothing read
// from them reaches gnuplot as script text or the terminal as control
// characters.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4lab::train {

struct CompareOptions {
  std::string plot;      // PNG path; empty: <parent of the first run>/compare.png; "-" = no plot
  std::string baseline;  // recipe label of the reference run; empty: the first fp32/bf16 run, else the first run
  std::string title;     // the plot's overall title (escaped as gnuplot_string); empty: none
};

// Mean, sample standard deviation (n-1) and the 95% confidence interval of
// the mean (Student's t, n-1 degrees of freedom) of n values; std/lo/hi are
// NaN when n < 2 (mean NaN when n == 0).
struct SampleStats {
  int n = 0;
  double mean = 0, std = 0, lo = 0, hi = 0;
};
SampleStats sample_stats(const std::vector<double>& v);

// t_{0.975, df}: the standard two-sided 95% Student's t quantiles for df 1..30
// (12.7062047 for df 1, ..., 2.0422725 for df 30), 1.96 beyond. df >= 1.
double t975(int df);

// The seed band of several runs' curves ((step, value) pairs in step order):
// at every step all curves have, {step, mean, mean - std, mean + std} with the
// sample std (n - 1; 0 for one curve), in step order. Steps some curve lacks
// are left out.
struct BandPoint {
  double step, mean, lo, hi;
};
std::vector<BandPoint> seed_band(const std::vector<std::vector<std::pair<double, double>>>& curves);

// One recipe's final metric over its runs (seeds; non-finite finals, e.g.
// diverged runs, are left out), and the paired differences (recipe - baseline)
// over the seeds both have (diff.n = the number of such seeds).
struct RecipeStats {
  std::string recipe;
  SampleStats final, diff;
};

struct CompareResult {
  std::string table;      // the formatted table (also per-recipe statistics when a recipe has several seeds),
                          // then a "note: ..." line per run directory given more than once; names and labels
                          // in it are terminal_text (train/process.hpp)
  nlohmann::json rows;    // one object per run (the table's numbers)
  std::string plot;       // the PNG written ("" if none)
  std::string plot_note;  // why no plot was drawn, if so
  std::string baseline;              // the baseline recipe
  std::vector<RecipeStats> recipes;  // per recipe, in order of first appearance
  std::string stats;  // the JSON written beside the plot (<png without extension>.json; with --plot -,
                      // <parent of the first run>/compare.json): baseline, metric, runs and recipes
};

// A run directory given more than once (the same path, another path to it, a
// symbolic link) is loaded once, with a note in the table. Throws fp4lab::Error
// (one line, names escaped) naming the file (summary.json, or
// metrics.jsonl:LINE) and key that is missing or invalid: not a regular file,
// summary.json over 1 MiB or a metrics line over 1 MiB, JSON nested deeper
// than 64 levels or not UTF-8, a known key of the wrong type (e.g. recipe not a
// string, best not a number or null, seed not a 64-bit integer), a metric that
// is not a name ([A-Za-z0-9_.-]), runs of different metrics; and naming both
// directories when two hold the same run (equal config_hash and seed: one
// sample, not two seeds). EnvironmentError for the OS's failures (permissions,
// a full disk); a missing gnuplot is CompareResult::plot_note, not an error.
CompareResult compare_runs(const std::vector<std::string>& dirs, const CompareOptions& opt = {});

}  // namespace fp4lab::train
