// A training run: one directory holding
//   config.json     the resolved config (defaults filled in) + "recipe_resolved" (the full recipe JSON)
//   metrics.jsonl   one JSON object per line: training records
//                     {"step": s, "loss": loss of step s (the s-th step, 1-based), "lr", "grad_norm",
//                      "ms_per_step", "items_per_s"}
//                   and evaluation records (after s completed steps)
//                     {"step": s, "eval": true, "test_acc", "test_loss"}        (vit)
//                     {"step": s, "eval": true, "val_loss", "train_loss"}       (gpt)
//   summary.json    status ("completed" | "diverged"), metric name and direction, final and
//                   best metric, ms/step and items/s (images or tokens), wall time
//   checkpoint.bin  parameters + AdamW moments + step, written atomically (tmp + rename)
//                   at every evaluation (or every training.checkpoint_interval steps) and at the end.
// Everything random (init, data order, dropout, stochastic rounding) is a pure
// function of (seed, step), so `resume` continues bit-exactly: the resumed run
// computes the same losses and parameters as an uninterrupted one.
// A NaN/Inf loss or gradient stops the run with an fp4lab::Error naming the
// step; the last good checkpoint stays in place and summary.json says "diverged".
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.hpp"

namespace fp4lab::train {

struct RunOptions {
  bool resume = false;          // continue from <dir>/checkpoint.bin
  bool force = false;           // overwrite an existing run directory
  int64_t stop_after = -1;      // stop (as if interrupted) once this many steps are done; -1 = run to the end
  bool progress = true;         // progress bar on a TTY / log lines otherwise
  std::ostream* log = nullptr;  // nullptr: std::cerr
};

struct RunResult {
  std::string dir;
  std::string status;               // "completed", "stopped" (stop_after), "diverged"
  std::vector<double> step_losses;  // losses of the steps run in this invocation
  int64_t first_step = 0;           // step index of step_losses[0]
  std::vector<float> final_params;  // host copy of the parameters at the end
  nlohmann::json summary;
};

RunResult run_training(const RunConfig& cfg, const RunOptions& opt = {});

// Reads metrics.jsonl (skipping nothing: every line must parse; errors name file:line).
std::vector<nlohmann::json> read_metrics(const std::string& path);

}  // namespace fp4lab::train
