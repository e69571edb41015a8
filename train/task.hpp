// What a model family brings to a training run (train/run.hpp): its data set, the training batch of
// each step, the evaluation and the metric a run reports. vit: MNIST classification scored by test-set
// accuracy; gpt: next-character prediction scored by the validation loss (nanoGPT).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "train/config.hpp"
#include "train/model.hpp"

namespace fp4lab::train {

// The data, training batches, evaluation and reported metric of one model
// family. A task owns its data set (its samplers point into it).
class Task {
 public:
  Task() = default;
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  virtual ~Task() = default;

  virtual Batch train_batch(int64_t step) const = 0;
  // Adds the evaluation's figures to `rec`, the record after `step` steps.
  virtual void evaluate(BatchEvaluator& model, const StepContext& sc, int64_t step, nlohmann::json& rec) const = 0;
  // The progress line of an evaluation record.
  virtual std::string eval_line(int64_t step, const nlohmann::json& rec) const = 0;
  // Steps of one pass over the training data (0: the task counts no epochs).
  virtual int64_t steps_per_epoch() const = 0;
  // Steps between evaluations when the config gives none.
  virtual int64_t default_eval_interval() const = 0;

  double better(double best, double v) const { return higher_is_better ? std::max(best, v) : std::min(best, v); }

  std::string metric;  // summary.json's "metric": a field of the evaluation records
  bool higher_is_better = false;
  double worst = 0.0;          // "best" before the first evaluation
  std::string item;            // what items_per_s counts
  bool eval_at_start = false;  // evaluate before the first step
  // The data the run trains and evaluates on, as loaded: "crc32:<8 hex> bytes:<n>" (checkpoint header and
  // summary.json's "data"); a resume on other data is an error naming data.path.
  std::string fingerprint;
};

// Loads the data of cfg's model family; char text sets cfg.model.vocab_size.
std::unique_ptr<Task> make_task(RunConfig& cfg);

}  // namespace fp4lab::train
