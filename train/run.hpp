// A training run: one directory holding
//   config.json     the resolved config (defaults filled in) + "recipe_resolved" (the full recipe JSON)
//   metrics.jsonl   one JSON object per line: training records
//                     {"step": s, "loss": loss of step s (the s-th step, 1-based), "lr", "grad_norm",
//                      "ms_per_step", "items_per_s"}
//                   and evaluation records (after s completed steps)
//                     {"step": s, "eval": true, "test_acc", "test_loss"}        (vit)
//                     {"step": s, "eval": true, "val_loss", "train_loss"}       (gpt)
//   summary.json    status ("completed" | "diverged"), metric name and direction, final and
//                   best metric, ms/step and items/s (images or tokens), wall time, and
//                   config_hash (train/config.hpp: FNV-1a 64 of config.json without threads and output)
//   checkpoint.bin  parameters + AdamW moments + step (+ config_hash), written atomically (tmp + rename)
//                   at every evaluation (or every training.checkpoint_interval steps) and at the end.
// Everything random (init, data order, dropout, stochastic rounding) is a pure
// function of (seed, step), so `resume` continues bit-exactly: the resumed run
// computes the same losses and parameters as an uninterrupted one.
// A NaN/Inf loss or gradient stops the run with an fp4lab::Error naming the
// step; the last good checkpoint stays in place and summary.json says "diverged".
//
// Lifecycle (nothing finished is modified or deleted unless the command's success is certain):
// - The data, the backend, the model and the optimiser are set up before the
//   directory is touched; a fresh directory appears whole (written as
//   <dir>.tmp.<pid>, then renamed). A failure before the run's first
//   checkpoint removes the directory it created.
// - An existing directory is compared with the new resolved config (threads and
//   output aside); a difference is an error naming the differing keys.
// - A directory holding only config.json (and an empty metrics.jsonl), left by a
//   start that failed, counts as absent (a one-line note says so).
// - resume of a finished run (summary.json exists, or the checkpoint is at the
//   last step) is a no-op: RunResult::note says so and no file changes.
// - force moves the old directory aside to <dir>.old.<pid>, removes it once the
//   new run has written its first checkpoint, and moves it back if the new run
//   fails (or stops, or diverges) before that.
// - A torn last line of metrics.jsonl (a run killed mid-write) is dropped on
//   resume with a warning.
#pragma once

#include <csignal>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/dist/comm.hpp"
#include "train/run_files.hpp"

namespace fp4lab::train {

struct RunOptions {
  bool resume = false;          // continue from <dir>/checkpoint.bin (a finished run: a no-op)
  bool force = false;           // replace an existing run directory (see the lifecycle above)
  bool reuse = false;           // sweep: an absent directory starts (also with resume), and a finished
                                // run with the same config is kept as it is (a no-op) without resume too
  int64_t stop_after = -1;      // stop (as if interrupted) once this many steps are done; -1 = run to the end
  bool progress = true;         // progress bar on a TTY / log lines otherwise
  std::ostream* log = nullptr;  // nullptr: std::cerr
  // Set to a signal number (by a SIGINT/SIGTERM handler, apps/main.cpp) to stop the run at the next step
  // boundary: it writes a checkpoint there and throws InterruptedError saying how to continue.
  const volatile std::sig_atomic_t* interrupt = nullptr;
  // Data-parallel training (train/dist/data_parallel.hpp): this process's
  // rank; nullptr = one process. Every rank calls run_training with the same
  // config; rank 0 alone writes the run directory, evaluates and logs.
  Communicator* comm = nullptr;
};

struct RunResult {
  std::string dir;
  std::string status;               // "completed", "stopped" (stop_after), "diverged"
  std::vector<double> step_losses;  // losses of the steps run in this invocation
  int64_t first_step = 0;           // step index of step_losses[0]
  std::vector<float> final_params;  // host copy of the parameters at the end (empty if nothing ran)
  nlohmann::json summary;
  std::string note;  // nothing ran: "<dir>: already completed at step N (best M X); nothing to do"
};

// A run that diverged; its directory keeps summary.json with status "diverged".
class DivergedError : public Error {
 public:
  using Error::Error;
};

// A run stopped by a signal (RunOptions::interrupt); the message says what state the run is in and how to
// continue. `fp4lab` exits 128 + signo, as a shell does for a process a signal ended.
class InterruptedError : public EnvironmentError {
 public:
  InterruptedError(int signo, const std::string& what) : EnvironmentError(what), signo(signo) {}
  int signo;
};

RunResult run_training(const RunConfig& cfg, const RunOptions& opt = {});

// What run_training(cfg, opt) will do with cfg's run directory, decided from the
// directory alone (no data loaded, nothing allocated or written). Throws the
// fp4lab::Error run_training would throw there (a different config, naming the
// keys; an existing run without resume/force; resume without a checkpoint; ...).
enum class RunAction { start, resume, replace, none };
struct RunPlan {
  RunAction action = RunAction::start;
  std::string dir;
  std::string note;  // one line per note (a finished run kept, a failed start's directory ignored, ...), or ""
  RunLock lock;      // the directory's lock (train/run_files.hpp), held while the plan lives (not on ranks > 0)
};
RunPlan plan_run(const RunConfig& cfg, const RunOptions& opt = {});

}  // namespace fp4lab::train
