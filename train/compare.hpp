// Comparing finished runs: a table (final/best metric, gap to the
// high-precision run, throughput) and a loss-curve PNG drawn by gnuplot.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4lab::train {

struct CompareOptions {
  std::string plot;      // PNG path; empty: <parent of the first run>/compare.png; "-" = no plot
  std::string baseline;  // recipe label of the reference run; empty: the first fp32/bf16 run, else the first run
};

struct CompareResult {
  std::string table;      // the formatted table (also per-recipe means when a recipe has several seeds)
  nlohmann::json rows;    // one object per run (the table's numbers)
  std::string plot;       // the PNG written ("" if none)
  std::string plot_note;  // why no plot was drawn, if so
};

// Throws fp4lab::Error naming the directory whose summary.json/metrics.jsonl
// is missing or invalid.
CompareResult compare_runs(const std::vector<std::string>& dirs, const CompareOptions& opt = {});

}  // namespace fp4lab::train
