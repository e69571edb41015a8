// Comparing finished runs: a table (final/best metric, gap to the
// high-precision run, throughput) and a loss-curve PNG drawn by gnuplot.
// Run directories are untrusted input (docs/DESIGN.md section 5): nothing read
// from them reaches gnuplot as script text or the terminal as control
// characters.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/stats.hpp"

namespace fp4lab::train {

// The arms and the compared metric (docs/DESIGN.md section 5, "What is
// compared", states the contract): a run's arm is its recipe label, or with
// `by` the values of those dotted config.json keys joined by ',' (an absent key:
// compare_archive.hpp archived_default, else "missing"); `metric` "final" or
// "best" (the best evaluation in metrics.jsonl, checked against summary best).
// The value of a run compared (--metric): its final evaluation, or its best (lowest loss, highest accuracy).
enum class CompareMetric : uint8_t { final, best };
const char* compare_metric_name(CompareMetric m);  // "final" | "best"
// "final" | "best" -> the enum; an Error "compare: --metric "V": valid: final, best" otherwise.
CompareMetric parse_compare_metric(const std::string& v);

struct CompareOptions {
  std::string plot;      // PNG path; empty: <parent of the first run>/compare.png; "-" = no plot
  std::string baseline;  // the reference arm; empty: the first run whose arm is fp32 or bf16, else the first run
  std::string title;     // the plot's overall title (escaped as gnuplot_string); empty: none
  std::vector<std::string> by;   // the config keys whose values make the arms; empty: the recipe label
  CompareMetric metric = CompareMetric::final;
};

// The seed band of several runs' curves ((step, value) pairs in step order):
// at every step all curves have, {step, mean, mean - std, mean + std} with the
// sample std (n - 1; 0 for one curve), in step order. Steps some curve lacks
// are left out.
struct BandPoint {
  double step, mean, lo, hi;
};
std::vector<BandPoint> seed_band(const std::vector<std::vector<std::pair<double, double>>>& curves);

// One arm's compared metric (final or best; CompareOptions) over its runs
// (seeds; non-finite values, e.g. diverged runs, are left out; the field keeps
// the name `final` either way), and its comparison with the baseline arm
// (train/stats.hpp): the paired differences (recipe - baseline) over the seeds
// both have (diff.n = the number of such seeds) with their t test, Holm's
// adjusted p over the table's recipes, the smallest difference 80% power
// detects at n pairs, and the pairs 80% power needs at the observed mean
// difference; Welch's unpaired difference of all finals. The baseline's own
// comparison fields are NaN (pairs_needed -1).
struct RecipeStats {
  std::string recipe;  // the arm (the recipe label, or the --by values)
  SampleStats final, diff;
  PairedTest test;
  double p_holm = 0;
  double mde80 = 0;
  int pairs_needed = -1;
  WelchDiff welch;
};

struct CompareResult {
  std::string table;      // the formatted table (also per-recipe statistics when a recipe has several seeds),
                          // then a "note: ..." line per run directory given more than once; names and labels
                          // in it are terminal_text (train/process.hpp)
  nlohmann::json rows;    // one object per run (the table's numbers)
  std::string plot;       // the PNG written ("" if none)
  std::string forest;     // the forest plot written beside it (<png without extension>_forest.png): each
                          // recipe's paired difference vs the baseline with its 95% CI; "" if none (no recipe
                          // with 2 paired seeds, no plot asked, or no gnuplot)
  std::string plot_note;  // why no plot was drawn, if so
  std::string baseline;              // the baseline recipe
  std::vector<RecipeStats> recipes;  // per recipe, in order of first appearance
  std::string stats;  // the JSON written beside the plot (<png without extension>.json; with --plot -,
                      // <parent of the first run>/compare.json): metric, compared ("final"/"best"), by (the
                      // keys; ["recipe"] by default), baseline, runs (each with "arm" under --by) and recipes
                      // (one per arm: "recipe" its label, its statistics under the compared metric's name)
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
// sample, not two seeds); --metric other than final/best; --by's errors
// (compare_archive.hpp set_arms); --baseline naming no arm (listing the
// arms); with --metric best, a summary best that is not its metrics.jsonl's.
// EnvironmentError for the OS's failures (permissions, a full disk); a missing
// gnuplot is CompareResult::plot_note, not an error.
CompareResult compare_runs(const std::vector<std::string>& dirs, const CompareOptions& opt = {});

}  // namespace fp4lab::train
