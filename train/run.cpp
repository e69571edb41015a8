#include "train/run.hpp"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "train/capture.hpp"
#include "train/numerics.hpp"
#include "train/checkpoint.hpp"
#include "train/checksum.hpp"
#include "train/run_files.hpp"
#include "train/data.hpp"
#include "train/dist/agreement.hpp"
#include "train/dist/counting_comm.hpp"
#include "train/dist/data_parallel.hpp"
#include "train/dist/expert_parallel.hpp"
#include "train/task.hpp"
#include "core/error.hpp"
#include "core/json.hpp"

namespace fp4lab::train {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string fmt_duration(double s) {
  char b[32];
  if (s < 60)
    std::snprintf(b, sizeof b, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  else
    std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, (int(s) / 60) % 60);
  return b;
}

// ---- the run directory -------------------------------------------------------------

// A directory a failed start left: only config.json, an empty metrics.jsonl and
// temporary files. It holds nothing of a run, so it counts as absent.
bool failed_start_only(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n.find(".tmp.") != std::string::npos) continue;
    if (n == "metrics.jsonl" && e.is_regular_file() && e.file_size() == 0) continue;
    return false;
  }
  return true;
}

struct Plan {
  RunAction action = RunAction::start;
  std::string notes;  // lines to log, each ending in '\n'
  std::string done;   // action none: "<dir>: already completed ...; nothing to do"
  json summary;       // action none: summary.json (null if missing)
};

// What to do with `dir` for the resolved config `resolved` of a run of `total`
// steps (-1: unknown yet) under `opt`; throws where the run cannot go on.
Plan plan_directory(const fs::path& dir, const json& resolved, int64_t total, const RunOptions& opt, bool data_loaded) {
  if (opt.resume && opt.force)
    throw Error("--resume and --force exclude each other: --resume continues " + dir.string() +
                ", --force replaces it");
  Plan p;
  const fs::path ckpt = dir / "checkpoint.bin", sum = dir / "summary.json";
  const bool exists = fs::exists(dir);
  if (exists && !fs::is_directory(dir)) throw Error(dir.string() + ": exists and is not a directory");
  const bool stale = exists && !fs::is_empty(dir) && failed_start_only(dir);
  if (!exists || fs::is_empty(dir) || stale) {
    if (opt.resume && !opt.reuse)
      throw Error(
          "cannot resume: " + ckpt.string() + " does not exist" +
          (stale ? " (" + dir.string() + " holds only the config.json of a start that failed; run without --resume)"
                 : ""));
    if (stale)
      p.notes += "note: " + dir.string() + " holds only the config.json of a start that failed; starting anew\n";
    p.action = RunAction::start;
    return p;
  }
  if (const std::string why = not_a_run(dir); !why.empty()) {
    if (opt.force)
      throw Error("--force replaces only fp4lab runs, and " + dir.string() + " is not an fp4lab run directory: " + why +
                  "; move it away or choose another output.name");
    throw Error(dir.string() + " exists and is not an fp4lab run directory: " + why +
                "; choose another output.name (--set output.name=NEW) or move it away");
  }
  if (opt.force) {
    p.action = RunAction::replace;
    return p;
  }
  const json saved = read_json_file((dir / "config.json").string());
  const std::string diff = config_difference(run_identity(saved, data_loaded), run_identity(resolved, data_loaded));
  if (!diff.empty()) {
    if (opt.resume)
      throw Error(
          "cannot resume " + dir.string() +
          ": its config.json differs from this config (resume with the same config and --set options): " + diff);
    throw Error(dir.string() + ": exists with a different config: " + diff +
                "; use --force to replace it, or --set output.name=NEW to keep both");
  }
  // Finished: summary.json written (completed or diverged), or the checkpoint at the last step.
  if (fs::exists(sum)) p.summary = read_json_file(sum.string());
  const std::string hash = config_hash(saved);  // = the config's (no difference above), also without the data
  if (p.summary.is_object() && p.summary.value("config_hash", hash) != hash)
    throw Error(sum.string() + ": its config_hash " + p.summary.value("config_hash", "") + " is not config.json's " +
                hash + " (files of two runs mixed in " + dir.string() + "); --force starts the run anew");
  if (!p.summary.is_object() && !fs::exists(ckpt)) {
    // Stopped before its first checkpoint (killed, or an older fp4lab interrupted): nothing to resume.
    p.notes += "note: " + dir.string() +
               " holds a run stopped before its first checkpoint (nothing to resume); starting it anew\n";
    p.action = RunAction::start;
    return p;
  }
  const json head = fs::exists(ckpt) ? read_checkpoint_header(ckpt) : json::object();
  if (head.contains("config_hash") && head["config_hash"] != hash)
    throw Error(ckpt.string() + ": written by a run with config_hash " + head["config_hash"].get<std::string>() +
                ", not config.json's " + hash + " (files of two runs mixed in " + dir.string() +
                "); --force starts the run anew");
  const int64_t at = p.summary.is_object() ? p.summary.value("steps", int64_t(-1)) : head.value("step", int64_t(-1));
  if (!p.summary.is_object() && total > 0 && at == total && (opt.resume || opt.reuse)) {
    // Killed between its last checkpoint and summary.json: resuming runs no step and writes the summary.
    p.notes += "note: " + dir.string() + " stopped after its last checkpoint, before summary.json; finishing it\n";
    p.action = RunAction::resume;
    return p;
  }
  if (p.summary.is_object() || (total > 0 && at == total)) {
    if (!opt.resume && !opt.reuse)
      throw Error("run directory " + dir.string() +
                  " already exists; pass --resume to continue it, --force to overwrite it, or --set output.name=NEW");
    // Here summary.json exists: a checkpoint at the last step without it was finished above (resume) or refused.
    char best[64];
    std::snprintf(best, sizeof best, "%.4f", p.summary.value("best", std::nan("")));
    const std::string status = p.summary.value("status", "completed");
    p.done = dir.string() + ": " + (status == "diverged" ? "diverged" : "already completed") + " at step " +
             std::to_string(at) + " (best " + p.summary.value("metric", "") + " " + best + "); nothing to do";
    if (status == "diverged" && !opt.reuse)
      throw Error("cannot resume " + dir.string() + ": it diverged at step " + std::to_string(at) +
                  " (summary.json); --force runs it again");
    p.action = RunAction::none;
    return p;
  }
  if (!opt.resume)
    throw Error(
        "run directory " + dir.string() + " already exists (unfinished" +
        (head.contains("step") ? ", checkpoint at step " + head["step"].dump() : std::string(", no checkpoint")) +
        "); pass --resume to continue it, --force to overwrite it, or --set output.name=NEW");
  if (!fs::exists(ckpt)) throw Error("cannot resume: " + ckpt.string() + " does not exist");
  p.action = RunAction::resume;
  return p;
}

fs::path sibling(const fs::path& dir, const std::string& tag) {
  return dir.string() + "." + tag + "." + std::to_string(::getpid());
}

// A fresh run directory with config.json and an empty metrics.jsonl, made as
// <dir>.tmp.<pid> and renamed into place; `aside` (non-empty: force) first
// receives the existing directory, a failed start's directory is removed.
void create_run_directory(const fs::path& dir, const json& resolved, const fs::path& aside) {
  const fs::path tmp = sibling(dir, "tmp");
  fs::remove_all(tmp);
  fault_point("create the directory", tmp);
  fs::create_directories(tmp);
  try {
    write_atomic(tmp / "config.json", resolved.dump(2) + "\n");
    write_atomic(tmp / "metrics.jsonl", "");
    if (!aside.empty()) {
      fault_point("set aside the replaced run", dir);
      fs::rename(dir, aside);
    } else if (fs::exists(dir)) {
      fault_point("remove the stopped start", dir);
      fs::remove_all(dir);  // empty, a failed start's config.json, or a run stopped before its first checkpoint
    }
    fault_point("rename into place", dir);
    fs::rename(tmp, dir);
    sync_directory(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    if (!aside.empty() && fs::exists(aside) && !fs::exists(dir)) fs::rename(aside, dir, ec);
    throw;
  }
}

// Drops the metric lines written after `step` (a resumed run recomputes them)
// and a torn last line (warned about on `log`); returns the records kept.
std::vector<json> truncate_metrics(const fs::path& metrics_path, int64_t step, std::ostream& log) {
  std::string torn;
  std::vector<json> lines = read_metrics(metrics_path.string(), &torn);
  if (!torn.empty()) log << "warning: " << torn << "\n";
  std::string keep;
  std::vector<json> kept;
  for (auto& l : lines)
    if (l.is_object() && l.value("step", int64_t(0)) <= step) keep += l.dump() + "\n", kept.push_back(std::move(l));
  write_atomic(metrics_path, keep);
  return kept;
}

// ---- progress output -------------------------------------------------------------------

// A bar on a terminal; elsewhere a line every log_interval steps or 5% of the run.
class Progress {
 public:
  Progress() = default;
  Progress(std::ostream& log, bool on, int64_t total, int64_t log_interval)
      : log_(&log),
        on_(on),
        tty_(on && ::isatty(STDERR_FILENO) && &log == &std::cerr),
        total_(total),
        plain_every_(std::max<int64_t>(log_interval, total / 20)) {}

  // After `done` steps; ms: time per step so far.
  void step(int64_t done, double loss, double lr, double ms) const {
    if (!on_) return;
    const double eta = ms / 1000.0 * double(total_ - done);
    char b[256];
    if (tty_) {
      const int width = 30, fill = int(double(width) * double(done) / double(total_));
      std::snprintf(b, sizeof b, "\r\033[K[%s%s] %lld/%lld loss %.4f %.1f ms/step ETA %s",
                    std::string(size_t(fill), '#').c_str(), std::string(size_t(width - fill), '.').c_str(),
                    (long long)done, (long long)total_, loss, ms, fmt_duration(eta).c_str());
      *log_ << b << std::flush;
    } else if (done % plain_every_ == 0 || done == total_) {
      std::snprintf(b, sizeof b, "step %lld/%lld loss %.4f lr %.3g %.1f ms/step ETA %s\n", (long long)done,
                    (long long)total_, loss, lr, ms, fmt_duration(eta).c_str());
      *log_ << b << std::flush;
    }
  }
  void eval(const std::string& line) const {
    if (!on_) return;
    if (tty_) *log_ << "\r\033[K";
    *log_ << line << std::flush;
  }
  void end() const {
    if (tty_) *log_ << "\n";
  }

 private:
  std::ostream* log_ = nullptr;
  bool on_ = false, tty_ = false;
  int64_t total_ = 0, plain_every_ = 1;
};

// ---- a training run -----------------------------------------------------------------------

class Training {
 public:
  // Config -> task (data), step counts, the plan for the run directory (nothing written yet).
  Training(const RunConfig& cfg, const RunOptions& opt);
  // The directory holds a finished run with this config: nothing to do.
  bool finished() const { return plan_.action == RunAction::none; }
  RunResult unchanged() const;
  // Backend, model and optimiser; then the run directory (fresh, replacing, or resumed from its checkpoint).
  void start();
  // Trains from the first step not yet done to the end (or a stop or a divergence).
  void train();
  // Writes summary.json; throws if the run diverged.
  RunResult finish();

 private:
  void build_model();
  void resume();
  void abandon();
  [[noreturn]] void interrupted(int signo);
  StepContext context(int64_t step, bool train) const;
  bool train_step(int64_t step);
  void record_eval(int64_t step);
  void checkpoint(int64_t step);
  json summary() const;

  const RunOptions& opt_;
  std::ostream& log_;
  RunConfig cfg_;
  const fs::path dir_, ckpt_path_, metrics_path_;
  const Recipe recipe_;
  const std::string label_;
  const LayerRecipes layer_recipes_;  // every linear layer's recipe (config layer_recipes, eval_recipe)
  // Per-layer tables (StepContext::layer_recipes): the training step's (only
  // with layer_recipes; else every layer runs sc.recipe) and the evaluation's
  // (only with eval_recipe; else evaluation runs the training step's).
  mutable std::vector<const Recipe*> train_table_;
  std::vector<const Recipe*> eval_table_;
  mutable std::vector<std::optional<Recipe>> switch_store_;
  std::unique_ptr<Task> task_;
  int64_t total_ = 0, eval_interval_ = 0;
  json resolved_;
  std::string hash_;
  Plan plan_;
  fs::path aside_;             // replace: where the old run waits until the first checkpoint
  bool created_ = false;       // this invocation created the directory
  bool checkpointed_ = false;  // this invocation wrote a checkpoint
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Communicator> local_comm_;
  std::unique_ptr<CountingComm> counting_;           // wraps opt.comm / local_comm_: summary's distributed.collectives
  Communicator* comm_ = nullptr;                     // counting_, over opt.comm or local_comm_
  std::unique_ptr<CommExpertExchange> ep_exchange_;  // distributed.expert_parallel > 1 (outlives model_)
  std::unique_ptr<Model> model_;
  bool rank0_ = true;  // rank 0 writes the directory, metrics, checkpoints and evaluates
  std::unique_ptr<DataParallel> dp_;
  std::optional<Recipe> switched_;  // the recipe from switch_at_ on
  uint64_t switch_at_ = 0;
  int64_t items_ = 0;                       // items (images, tokens) per step
  std::unique_ptr<CaptureWriter> capture_;  // output.capture_step

  RunLock lock_;  // rank 0: held from planning to the end
  int64_t start_ = 0, step_ = 0;
  double best_ = 0.0, last_loss_ = 0.0, last_eval_metric_ = std::nan("");
  std::string status_ = "completed", error_;
  LineLog metrics_;   // rank 0's metrics.jsonl
  LineLog numerics_;  // rank 0's numerics.jsonl (output.numerics_interval > 0)
  Progress progress_;
  std::chrono::steady_clock::time_point t_run_;
  double train_seconds_ = 0.0, warmup_seconds_ = 0.0;  // steps after / among the first two of this invocation
  int64_t timed_steps_ = 0;
  double resumed_ms_ = std::nan("");  // ms_per_step of the last metrics record before a resume
  int64_t after_step_bytes_ = 0;      // the backend's tensors in use right after the last optimiser step
  int64_t last_checkpoint_ = -1;      // the step of the checkpoint on disk (-1: none)
  RunResult res_;
};

Training::Training(const RunConfig& cfg, const RunOptions& opt)
    : opt_(opt),
      log_(opt.log ? *opt.log : std::cerr),
      cfg_(cfg),
      dir_(run_directory(cfg_)),
      ckpt_path_(dir_ / "checkpoint.bin"),
      metrics_path_(dir_ / "metrics.jsonl"),
      recipe_(resolve_recipe(cfg_)),
      label_(recipe_label(cfg_)),
      layer_recipes_(resolve_layer_recipes(cfg_)) {
  const TrainingConfig& tc = cfg_.training;
  if (!opt.comm) local_comm_ = make_local_comm();
  counting_ = std::make_unique<CountingComm>(opt.comm ? *opt.comm : *local_comm_);
  comm_ = counting_.get();
  rank0_ = comm_->rank() == 0;
  if (const int R = cfg_.distributed.expert_parallel; R > 1 && R != comm_->world())
    throw Error("config.distributed.expert_parallel " + std::to_string(R) + " must equal the number of ranks, " +
                std::to_string(comm_->world()) +
                ", for now: expert parallelism over a part of the ranks (data parallelism over expert replicas) is "
                "not built yet (plan step 9)");
  task_ = make_task(cfg_);
  const int64_t spe = task_->steps_per_epoch();
  total_ = tc.steps > 0 ? tc.steps : int64_t(std::llround(tc.epochs * double(spe)));
  eval_interval_ = tc.eval_interval > 0 ? tc.eval_interval : task_->default_eval_interval();
  if (total_ <= 0) throw Error("config.training: the run has no steps");

  resolved_ = config_to_json(cfg_);
  resolved_["recipe_resolved"] = recipe_to_json(recipe_);
  add_resolved_layer_recipes(resolved_, cfg_);
  eval_table_ = layer_recipes_.eval_table();
  hash_ = config_hash(resolved_);
  // Every rank runs the same config and steps before any rank plans or sizes a collective (issue 42).
  agree_on_run(*comm_, RunAgreement{hash_, total_, cfg_.distributed.timeout_s});
  // One process at a time on a run directory (rank 0 holds the lock); then what killed processes left is
  // cleared, and the other ranks plan from the recovered directory.
  std::string lock_error;
  if (rank0_) {
    try {
      lock_ = RunLock(dir_);
      log_ << remove_stale_temporaries(dir_) << recover_set_aside(dir_);
    } catch (const std::exception& e) {
      if (comm_->world() == 1) throw;
      lock_error = e.what();
    }
  }
  if (comm_->world() > 1) {
    const uint8_t ok = lock_error.empty() ? 1 : 0;
    if (comm_->allgather_bytes(std::span<const uint8_t>(&ok, 1)).at(0).at(0) == 0)
      throw EnvironmentError(
          rank0_ ? lock_error : "rank 0 could not take the run directory " + dir_.string() + " (its message says why)");
  }
  plan_ = plan_directory(dir_, resolved_, total_, opt, true);
  if (rank0_) log_ << plan_.notes;
  if (finished()) return;
  if (rank0_)
    for (const auto& w : config_warnings(cfg_, total_)) log_ << w << "\n";
  best_ = task_->worst;
}

RunResult Training::unchanged() const {
  RunResult r;
  r.dir = dir_.string();
  r.summary = plan_.summary;
  r.status = plan_.summary.is_object() ? plan_.summary.value("status", "completed") : "completed";
  r.note = plan_.done;
  r.first_step = r.summary.is_object() ? r.summary.value("steps", total_) : total_;
  return r;
}

void Training::start() {
  build_model();
  comm_->barrier();  // every rank has planned from the directory as it was
  if (plan_.action == RunAction::resume) return resume();
  if (!rank0_) return;
  if (plan_.action == RunAction::replace) {
    aside_ = sibling(dir_, "old");
    log_ << "replacing " << dir_.string() << ": the old run waits in " << aside_.string()
         << " until this run's first checkpoint\n";
  }
  create_run_directory(dir_, resolved_, aside_);
  created_ = true;
}

// A failure before this invocation's first checkpoint: the directory it created goes, and a replaced run comes back.
void Training::abandon() {
  if (!created_ || checkpointed_) return;
  std::error_code ec;
  try {
    if (metrics_.is_open()) metrics_.close();
    if (numerics_.is_open()) numerics_.close();
  } catch (const Error&) {
  }
  fs::remove_all(dir_, ec);
  if (!aside_.empty()) {
    fs::rename(aside_, dir_, ec);
    if (ec)
      log_ << "warning: could not move " << aside_.string() << " back to " << dir_.string() << ": " << ec.message()
           << "\n";
    else
      aside_.clear();
  }
  created_ = false;
}

// A SIGINT/SIGTERM between steps: one process writes a checkpoint at step_ (unless it has one there) and
// the run can be resumed from it; a replacement without a checkpoint yet gives the replaced run back; a
// data-parallel rank stops at its last checkpoint (a checkpoint is a collective the other ranks may not reach).
void Training::interrupted(int signo) {
  const std::string sig = signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : "signal " + std::to_string(signo);
  std::string state;
  if (!aside_.empty()) {
    abandon();
    state = "the replacement had no checkpoint yet, so " + dir_.string() + " holds the run it was to replace again";
  } else if (comm_->world() == 1 && step_ == 0 && created_) {
    abandon();  // nothing trained: the fresh directory goes (a checkpoint at step 0 would evaluate step 0 twice)
    state = "no step was trained, and " + dir_.string() + " was removed; start the run again";
  } else if (comm_->world() == 1) {
    if (last_checkpoint_ != step_) checkpoint(step_);
    state = "checkpoint at step " + std::to_string(step_) + "/" + std::to_string(total_) + " in " +
            ckpt_path_.string() + "; `fp4lab train ... --resume` continues it bit-exactly";
  } else {
    state = "rank " + std::to_string(comm_->rank()) + " stopped at step " + std::to_string(step_) +
            "; --resume continues from the last checkpoint" +
            (fs::exists(ckpt_path_) ? "" : " (none yet: the run starts anew)");
  }
  if (rank0_) metrics_.close();
  if (numerics_.is_open()) numerics_.close();
  progress_.end();
  throw InterruptedError(signo, "interrupted by " + sig + ": " + state);
}

void Training::build_model() {
  const TrainingConfig& tc = cfg_.training;
  be_ = make_backend(cfg_.backend, cfg_.threads);
  be_->reset_device_memory_peaks();  // the summary's device_memory: this run's peaks
  if (cfg_.distributed.expert_parallel > 1) ep_exchange_ = std::make_unique<CommExpertExchange>(*comm_);
  model_ = make_model(cfg_.model, *be_, cfg_.seed, ep_exchange_.get());
  AdamWConfig ac = tc.adamw;
  if (tc.optimizer == "adam") ac.weight_decay = 0.0;
  ParamStore& ps = model_->params();
  if (cfg_.distributed.primary_weights != Storage::fp32)
    ps.set_storage(layer_recipes_.low_precision_weight_params(model_->linear_layers()), cfg_.distributed.primary_weights,
                   *be_);
  dp_ = std::make_unique<DataParallel>(*comm_, *be_, ps, ac, cfg_.distributed,
                                       model_->param_units());  // casts the stored weights
  if (cfg_.capture_step >= 0) capture_ = std::make_unique<CaptureWriter>(*be_, dir_ / "capture", cfg_.capture_step);
  if (capture_) model_->set_capture(capture_->hook());
  switch_at_ = uint64_t(total_);
  if (recipe_.switch_to) {
    switch_at_ = switch_step(recipe_, uint64_t(total_));
    switched_ = effective_recipe(recipe_, uint64_t(total_) - 1, uint64_t(total_));
  }
  items_ = tc.batch_size * model_->items_per_sample();
}

StepContext Training::context(int64_t step, bool train) const {
  StepContext sc{&recipe_, cfg_.seed, uint64_t(step), train, true, float(cfg_.training.loss_scale)};
  sc.activations = cfg_.activations;
  if (switched_ && uint64_t(step) >= switch_at_) sc.recipe = &*switched_;
  if (!train && layer_recipes_.eval) {
    sc.recipe = &*layer_recipes_.eval;
    sc.layer_recipes = &eval_table_;
  } else if (!cfg_.layer_recipes.empty()) {
    train_table_ = layer_recipes_.training_table(uint64_t(step), uint64_t(total_), switch_store_);
    sc.layer_recipes = &train_table_;
  }
  return sc;
}

void Training::resume() {
  ParamStore& ps = model_->params();
  Checkpoint c = load_checkpoint(ckpt_path_, CheckpointExpect{ps.global_size(), total_, hash_});
  const int64_t world = c.header.value("world", int64_t(1));
  if (world != comm_->world())
    throw Error(ckpt_path_.string() + ": written by " + std::to_string(world) +
                " data-parallel ranks; resume it with " + std::to_string(world) + ", not " +
                std::to_string(comm_->world()));
  const std::string data_keys = cfg_.data.type == "tokens"
                                    ? "data.train " + cfg_.data.train + " / data.val " + cfg_.data.val
                                    : "data.path " + cfg_.data.path;
  if (c.header.contains("data") && c.header["data"] != task_->fingerprint)
    throw Error("cannot resume " + dir_.string() + ": " + data_keys + " changed since the run began (" +
                c.header["data"].get<std::string>() + " then, " + task_->fingerprint +
                " now); restore it, or train on it as a new run (--set output.name=NEW)");
  start_ = last_checkpoint_ = c.header.at("step").get<int64_t>();
  dp_->load_state(c.values, c.m, c.v, c.header.at("adam_t").get<int64_t>());
  best_ = c.header["best"].is_number() ? c.header["best"].get<double>() : std::nan("");
  if (!rank0_) return;
  // The records up to the checkpoint stay; the summary's final metric and last loss come from them when
  // this invocation runs no evaluation or step (a run killed before summary.json).
  if (cfg_.numerics_interval > 0 && fs::exists(dir_ / "numerics.jsonl"))
    truncate_metrics(dir_ / "numerics.jsonl", start_, log_);  // its lines after the checkpoint are recomputed
  for (const json& r : truncate_metrics(metrics_path_, start_, log_)) {
    if (r.value("eval", false) && r.contains(task_->metric) && r[task_->metric].is_number())
      last_eval_metric_ = r[task_->metric].get<double>();
    else if (r.contains("loss") && r["loss"].is_number())
      last_loss_ = r["loss"].get<double>(), resumed_ms_ = r.value("ms_per_step", std::nan(""));
  }
  log_ << (start_ == total_ ? "finishing " : "resuming ") << dir_.string() << " at step " << start_ << "/" << total_
       << "\n";
}

void Training::train() {
  const TrainingConfig& tc = cfg_.training;
  if (rank0_) metrics_.open(metrics_path_);
  if (rank0_ && cfg_.numerics_interval > 0) numerics_.open(dir_ / "numerics.jsonl");
  res_.dir = dir_.string();
  res_.first_step = start_;
  progress_ = Progress(log_, opt_.progress && rank0_, total_, tc.log_interval);
  t_run_ = std::chrono::steady_clock::now();

  try {
    if (start_ == 0 && task_->eval_at_start) record_eval(0);
    for (step_ = start_; step_ < total_; ++step_) {
      if (opt_.stop_after >= 0 && step_ >= opt_.stop_after) {
        status_ = "stopped";
        break;
      }
      if (opt_.interrupt && *opt_.interrupt) interrupted(int(*opt_.interrupt));
      if (!train_step(step_)) break;
      const int64_t done = step_ + 1;
      const bool eval_now = done % eval_interval_ == 0 || done == total_;
      if (eval_now) record_eval(done);
      if ((tc.checkpoint_interval > 0 ? done % tc.checkpoint_interval == 0 : eval_now) || done == total_)
        checkpoint(done);
    }
  } catch (...) {
    abandon();
    throw;
  }
  progress_.end();
  if (rank0_) metrics_.sync(), metrics_.close();
  if (numerics_.is_open()) numerics_.sync(), numerics_.close();
}

// One optimiser step (0-based `step`) and its metrics line and progress; false
// (status "diverged", an error line in metrics.jsonl) on a NaN/Inf loss or gradient.
bool Training::train_step(int64_t step) {
  const TrainingConfig& tc = cfg_.training;
  const auto t0 = std::chrono::steady_clock::now();
  Batch b = task_->train_batch(step);
  const int64_t global_batch = b.size;
  if (comm_->world() > 1) {
    const ShardRange share = batch_share(b.size, comm_->rank(), comm_->world());
    if (share.end == share.begin)
      throw Error("step " + std::to_string(step) + ": a batch of " + std::to_string(b.size) + " samples leaves rank " +
                  std::to_string(comm_->rank()) + " of " + std::to_string(comm_->world()) +
                  " without samples; use a batch_size of at least the number of ranks");
    b = slice_batch(b, share.begin, share.end);
  }
  const double weight = double(b.size) / double(global_batch);
  const StepContext sc = context(step, true);
  comm_->set_step(step);  // for a timeout's message: expert parallelism's first collective is in the forward
  dp_->begin_step(float(1.0 / tc.loss_scale), weight);  // gradients zeroed; 1/loss_scale and weight for their sum
  int64_t hits = 0;
  // output.numerics_interval: this step's operands measured (train/numerics.hpp); the line's step is `done`.
  std::unique_ptr<NumericsRecorder> numerics;
  if (rank0_ && cfg_.numerics_interval > 0 && (step + 1) % cfg_.numerics_interval == 0)
    numerics = std::make_unique<NumericsRecorder>(step + 1);
  double fb_loss;
  {
    const NumericsScope scope(numerics.get());
    fb_loss = model_->forward_backward(b, sc, &hits);
  }
  const double loss = dp_->global_loss(fb_loss, weight);
  if (numerics)
    for (const std::string& l : numerics->lines()) numerics_.append(l);
  if (capture_ && step == cfg_.capture_step) capture_->write(log_);
  const double lr = learning_rate(tc.schedule, step, total_);
  if (!std::isfinite(loss)) error_ = "loss is " + std::string(std::isnan(loss) ? "NaN" : "Inf");
  double gnorm = 0.0;
  if (error_.empty()) {
    gnorm = dp_->step(lr);
    if (const std::optional<Backend::DeviceMemory> m = be_->device_memory()) after_step_bytes_ = m->tensors_in_use;
    if (!std::isfinite(gnorm)) error_ = "gradient norm is " + std::string(std::isnan(gnorm) ? "NaN" : "Inf");
  }
  if (!error_.empty()) {
    status_ = "diverged";
    if (rank0_) metrics_.append(json{{"step", step}, {"error", error_}}.dump());
    return false;
  }
  be_->synchronize();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (step - start_ >= 2)
    train_seconds_ += dt, ++timed_steps_;  // skip warm-up steps
  else
    warmup_seconds_ += dt;
  res_.step_losses.push_back(loss);
  last_loss_ = loss;
  const int64_t done = step + 1;
  const double ms = timed_steps_ ? 1000.0 * train_seconds_ / double(timed_steps_) : 1000.0 * dt;
  if (done % tc.log_interval == 0 || done == total_) {
    json line{{"step", done},       {"loss", loss},      {"lr", lr},
              {"grad_norm", gnorm}, {"ms_per_step", ms}, {"items_per_s", double(items_) * 1000.0 / ms}};
    line.update(model_->step_metrics());  // the MoE GPT's auxiliary losses and expert load (this rank's)
    if (rank0_) metrics_.append(line.dump());
  }
  progress_.step(done, loss, lr, ms);
  return true;
}

// Evaluates after `step` steps: a metrics.jsonl record, the best metric, a progress line.
void Training::record_eval(int64_t step) {
  if (!rank0_ && !ep_exchange_ && cfg_.distributed.zero != 3) return;
  json rec = {{"step", step}, {"eval", true}};
  if (ep_exchange_) {  // the MoE layers exchange tokens: every rank evaluates its share
    ShareEvaluator shares(*model_, *dp_);
    task_->evaluate(shares, context(step, false), step, rec);
    if (!rank0_) return;
  } else {  // ZeRO-3: every rank evaluates the whole batch (the units are gathered collectively), rank 0 records
    task_->evaluate(*model_, context(step, false), step, rec);
    if (!rank0_) return;
  }
  const double v = rec[task_->metric].get<double>();
  last_eval_metric_ = v;
  best_ = task_->better(best_, v);
  metrics_.append(rec.dump());
  progress_.eval(task_->eval_line(step, rec));
}

// checkpoint.bin after `step` steps: parameters, AdamW moments, step, best.
void Training::checkpoint(int64_t step) {
  ParamStore& ps = model_->params();
  Checkpoint c;
  c.header = {{"step", step},
              {"adam_t", dp_->steps_taken()},
              {"best", best_},
              {"params", ps.global_size()},
              {"recipe", label_},
              {"config_hash", hash_},
              {"data", task_->fingerprint}};
  if (comm_->world() > 1) c.header["world"] = comm_->world();
  dp_->state(c.values, c.m, c.v);  // collective: every rank takes part
  if (!rank0_) return;
  metrics_.sync();  // the records up to this step are durable before the checkpoint that counts on them
  if (numerics_.is_open()) numerics_.sync();
  save_checkpoint(ckpt_path_, c);
  checkpointed_ = true;
  last_checkpoint_ = step;
  if (!aside_.empty()) {  // the new run is under way: the replaced one goes
    std::error_code ec;
    fault_point("remove the replaced run", aside_);
    fs::remove_all(aside_, ec);
    if (ec) log_ << "warning: could not remove the replaced run " << aside_.string() << ": " << ec.message() << "\n";
    aside_.clear();
  }
}

json Training::summary() const {
  // With fewer than 3 steps in this invocation, the warm-up steps are all there is to time.
  const int64_t ran = int64_t(res_.step_losses.size());
  const double ms = timed_steps_ ? 1000.0 * train_seconds_ / double(timed_steps_)
                    : ran        ? 1000.0 * warmup_seconds_ / double(ran)
                                 : resumed_ms_;
  json s = {{"name", cfg_.name},
            {"recipe", label_},
            {"model", cfg_.model.type},
            {"seed", cfg_.seed},
            {"status", status_},
            {"steps", step_},
            {"total_steps", total_},
            {"metric", task_->metric},
            {"higher_is_better", task_->higher_is_better},
            {"final", last_eval_metric_},
            {"best", best_},
            {"final_train_loss", last_loss_},
            {"ms_per_step", ms},
            {"items_per_s", double(items_) * 1000.0 / ms},
            {"item", task_->item},
            {"params", model_->params().global_size()},
            {"backend", cfg_.backend},
            {"config_hash", hash_},
            {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run_).count()}};
  if (!error_.empty()) s["error"] = error_;
  if (const std::optional<Backend::DeviceMemory> m = be_ ? be_->device_memory() : std::nullopt)
    s["device_memory"] = {{"tensors_in_use_peak_bytes", m->tensors_in_use_peak},
                          {"tensors_reserved_peak_bytes", m->tensors_reserved_peak},
                          {"tensors_in_use_after_step_bytes", after_step_bytes_}};
  layer_recipes_.add_to_summary(s, uint64_t(total_));
  if (comm_->world() > 1 || cfg_.distributed != DistributedConfig{}) {
    s["distributed"] = dp_->memory();
    s["distributed"]["collectives"] = counting_->summary();
  }
  return s;
}

RunResult Training::finish() {
  json s = summary();
  const bool restore = !aside_.empty();  // replacing, and no checkpoint yet: the old run comes back
  if (restore) {
    abandon();
  } else if (status_ != "stopped" && rank0_) {
    // What the summary is the summary of: the data and the two files it was computed from (compare
    // checks them: a file changed or swapped since is an error naming it).
    s["data"] = task_->fingerprint;
    for (const char* f : {"config.json", "metrics.jsonl"}) {
      const FileSum fs_ = file_crc32(dir_ / f);
      s["checksums"][f] = {{"bytes", fs_.bytes}, {"crc32", crc_hex(fs_.crc)}};
    }
    write_atomic(dir_ / "summary.json", s.dump(2) + "\n");
  }
  res_.status = status_;
  res_.summary = s;
  res_.final_params = dp_->model_values();  // one process's layout
  if (status_ == "diverged") {
    const std::string msg =
        "run " + dir_.string() + " diverged at step " + std::to_string(step_) + ": " + error_ + "; stopped. ";
    if (restore)
      throw Error(msg + "No checkpoint was written; " + dir_.string() + " holds the run it was to replace again");
    throw DivergedError(msg + "The last good checkpoint is kept in " + ckpt_path_.string() +
                        (fs::exists(ckpt_path_) ? "" : " (none was written yet)"));
  }
  return std::move(res_);
}

}  // namespace

// File system errors (permissions, a full disk, a name taken meanwhile) as one line naming the path(s)
// and the OS's reason: EnvironmentError where the environment failed (core/error.hpp), else Error.
template <class F>
auto fs_errors(F&& f) {
  try {
    return f();
  } catch (const fs::filesystem_error& e) {
    std::string what = e.path1().string();
    if (!e.path2().empty()) what += " -> " + e.path2().string();
    const std::string msg = (what.empty() ? std::string("run directory") : what) + ": " + e.code().message();
    if (environment_errno(e.code().value())) throw EnvironmentError(msg);
    throw Error(msg);
  }
}

RunPlan plan_run(const RunConfig& cfg, const RunOptions& opt) {
  json resolved = config_to_json(cfg);
  resolved["recipe_resolved"] = recipe_to_json(resolve_recipe(cfg));
  add_resolved_layer_recipes(resolved, cfg);
  const fs::path dir = run_directory(cfg);
  return fs_errors([&] {
    RunPlan r;
    std::string recovered;
    if (!opt.comm || opt.comm->rank() == 0) {
      r.lock = RunLock(dir);
      recovered = remove_stale_temporaries(dir) + recover_set_aside(dir);
    }
    Plan p = plan_directory(dir, resolved, cfg.training.steps > 0 ? cfg.training.steps : -1, opt, false);
    r.action = p.action, r.dir = dir.string(), r.note = recovered + p.notes + p.done;
    return r;
  });
}

RunResult run_training(const RunConfig& cfg, const RunOptions& opt) {
  return fs_errors([&] {
    Training t(cfg, opt);
    if (t.finished()) return t.unchanged();
    t.start();
    t.train();
    return t.finish();
  });
}

}  // namespace fp4lab::train
