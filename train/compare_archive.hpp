// `fp4lab compare`'s reading of run archives (train/compare.hpp; the tables,
// statistics and plots are train/compare.cpp's): summary.json, metrics.jsonl
// and, for --by, config.json of each run directory, each checked (sizes,
// nesting, types; docs/DESIGN.md section 5: run directories are untrusted),
// and the runs' arms and compared values. Internal to compare.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/checksum.hpp"

namespace fp4lab::train::compare_archive {

// Text from a run archive or a path, ready for a table or an error line (terminal_text).
std::string shown(const std::string& s);
std::string shown(const std::filesystem::path& p);

// What compare reads of a summary.json (run.cpp's Training::summary writes it).
struct Summary {
  std::string recipe, metric, status, item, config_hash;
  bool has_recipe = false, higher_is_better = false;
  std::optional<int64_t> seed;
  double final = 0, best = 0, final_train_loss = 0, ms_per_step = 0, items_per_s = 0;
  // "checksums": the files the summary was computed from (run.cpp's Training::finish), by name.
  std::vector<std::pair<std::string, FileSum>> checksums;
  std::vector<std::string> checksum_hex;  // the recorded CRC-32 of each, as written
};

// (step, value) pairs in step order.
using Curve = std::vector<std::pair<double, double>>;

// A finished run: its directory (as given, without trailing '/'), recipe label
// (summary "recipe", else the directory's name), arm (set_arms: the recipe
// label, or the --by keys' values), summary, raw curves and the compared value
// (set_values: the final or the best metric; NaN where it has none).
struct Run {
  std::string dir, recipe, label;
  Summary summary;
  Curve loss, eval;
  double value = 0;
};

// The run directory's name.
std::string name_of(const Run& r);

// The runs of dirs, each directory once: a directory given again (the same
// path, or another path to it: ./x and x, a symbolic link) is one run and is
// loaded once, with a note. Two directories holding the same run (equal
// config_hash and seed) are an error naming both. Each run's label is its recipe.
std::vector<Run> load_runs(const std::vector<std::string>& dirs, std::vector<std::string>& notes);

// The metric every run reports (an error if they differ).
std::string common_metric(const std::vector<Run>& runs);

// The value a key absent from a run's config.json stands for (null if none):
// the keys config_to_json (train/config.hpp) writes only when not their
// default, and model.attention, absent in runs written before the key existed,
// whose attention was "fp32" (as run_identity treats it).
nlohmann::json archived_default(const std::string& key);

// Sets each run's label to its arm (docs/DESIGN.md section 5, "What is
// compared"): with `by` empty, the recipe label; else the values of the dotted
// config keys `by` in the run's config.json, joined by ',' ("recipe": the recipe
// label; a number as JSON writes it; an absent key: archived_default, else
// "missing"). Errors (one line): a key that is not a dotted name or is given
// twice, a key no run has and without a default (naming it), a value that is
// an object, array or null or a path through a non-object (naming the file and
// key), config.json missing, not a regular file, over 1 MiB or not JSON.
void set_arms(std::vector<Run>& runs, const std::vector<std::string>& by);

// Sets each run's compared value: summary "final" (best false), or the best of
// its metrics.jsonl evaluations (lowest loss, highest accuracy: summary
// "higher_is_better"; NaN without any), which must equal summary "best" where
// that is a number (else an error naming both files).
void set_values(std::vector<Run>& runs, bool best);

}  // namespace fp4lab::train::compare_archive
