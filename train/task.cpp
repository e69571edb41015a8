// The model families' tasks (task.hpp).
#include "train/task.hpp"

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <utility>

#include "core/error.hpp"
#include "train/checksum.hpp"
#include "train/data.hpp"
#include "train/tokens.hpp"

namespace fp4lab::train {

using nlohmann::json;

namespace {

constexpr uint64_t kEvalStream = uint64_t(0xF) << 60;

std::string data_fingerprint(std::initializer_list<std::pair<const void*, size_t>> parts) {
  uint32_t crc = 0;
  uint64_t bytes = 0;
  for (const auto& [p, n] : parts) crc = crc32(p, n, crc), bytes += n;
  return "crc32:" + crc_hex(crc) + " bytes:" + std::to_string(bytes);
}

// vit: MNIST classification, scored by test-set accuracy.
class ImageTask final : public Task {
 public:
  explicit ImageTask(const RunConfig& cfg)
      : test_limit_(cfg.data.test_limit), eval_batch_size_(cfg.training.eval_batch_size) {
    metric = "test_acc", higher_is_better = true, worst = -1.0, item = "images";
    train_ = load_mnist(cfg.data.path, true);
    test_ = load_mnist(cfg.data.path, false);
    if (train_.rows != cfg.model.image_size || train_.cols != cfg.model.image_size)
      throw Error(cfg.data.path + ": images are " + std::to_string(train_.rows) + "x" + std::to_string(train_.cols) +
                  " but model.image_size is " + std::to_string(cfg.model.image_size));
    sampler_.set = &train_;
    sampler_.batch_size = cfg.training.batch_size;
    sampler_.limit = cfg.data.train_limit;
    sampler_.mean = float(cfg.data.mean);
    sampler_.std = float(cfg.data.std);
    sampler_.seed = cfg.seed;
    fingerprint = data_fingerprint({{train_.pixels.data(), train_.pixels.size()},
                                    {train_.labels.data(), train_.labels.size()},
                                    {test_.pixels.data(), test_.pixels.size()},
                                    {test_.labels.data(), test_.labels.size()}});
  }
  Batch train_batch(int64_t step) const override { return sampler_.train_batch(step); }
  // One sequential pass over the (first test_limit) test images.
  void evaluate(BatchEvaluator& model, const StepContext& sc, int64_t, json& rec) const override {
    ImageSampler ts = sampler_;
    ts.set = &test_;
    ts.limit = test_limit_;
    const int64_t n = ts.size(), nb = (n + eval_batch_size_ - 1) / eval_batch_size_;
    double loss = 0.0;
    int64_t hits = 0;
    for (int64_t k = 0; k < nb; ++k) {
      Batch b = ts.eval_batch(k, eval_batch_size_);
      int64_t c = 0;
      loss += model.evaluate(b, sc, &c) * double(b.size);
      hits += c;
    }
    rec["test_acc"] = 100.0 * double(hits) / double(n);
    rec["test_loss"] = loss / double(n);
  }
  std::string eval_line(int64_t step, const json& rec) const override {
    char b[200];
    std::snprintf(b, sizeof b, "eval step %lld: test_acc %.2f%% test_loss %.4f\n", (long long)step,
                  rec.at("test_acc").get<double>(), rec.at("test_loss").get<double>());
    return b;
  }
  int64_t steps_per_epoch() const override { return sampler_.steps_per_epoch(); }
  int64_t default_eval_interval() const override { return steps_per_epoch(); }

 private:
  ImageSet train_, test_;
  ImageSampler sampler_;
  int64_t test_limit_, eval_batch_size_;
};

// gpt: next-token prediction, scored by the validation loss (nanoGPT): eval_iters random batches of each
// split, drawn from streams of their own. The two data sources below say only where a batch comes from.
class LanguageModelTask : public Task {
 public:
  explicit LanguageModelTask(const RunConfig& cfg) : eval_iters_(cfg.training.eval_iters) {
    metric = "val_loss", higher_is_better = false, worst = 1e30, item = "tokens", eval_at_start = true;
  }
  Batch train_batch(int64_t step) const override { return batch(0, kTrainStream, step); }
  void evaluate(BatchEvaluator& model, const StepContext& sc, int64_t step, json& rec) const override {
    for (int split = 0; split < 2; ++split) {
      const uint64_t stream = kEvalStream | uint64_t(split) << 56 | uint64_t(step);
      double sum = 0.0;
      for (int64_t k = 0; k < eval_iters_; ++k) sum += model.evaluate(batch(split, stream, k), sc, nullptr);
      rec[split == 0 ? "train_loss" : "val_loss"] = sum / double(eval_iters_);
    }
  }
  std::string eval_line(int64_t step, const json& rec) const override {
    char b[200];
    std::snprintf(b, sizeof b, "eval step %lld: train_loss %.4f val_loss %.4f\n", (long long)step,
                  rec.at("train_loss").get<double>(), rec.at("val_loss").get<double>());
    return b;
  }
  int64_t steps_per_epoch() const override { return 0; }
  int64_t default_eval_interval() const override { return 250; }

 protected:
  static constexpr uint64_t kTrainStream = uint64_t(0xC) << 60;
  // Batch k of the random stream `stream` over split 0 (train) or 1 (validation).
  virtual Batch batch(int split, uint64_t stream, int64_t k) const = 0;

 private:
  int64_t eval_iters_;
};

// Characters of one text file (train/text.hpp), its vocabulary the text's characters.
class CharTextTask final : public LanguageModelTask {
 public:
  explicit CharTextTask(const RunConfig& cfg) : LanguageModelTask(cfg), text_(load_char_text(cfg.data.path)) {
    sampler_.batch_size = cfg.training.batch_size;
    sampler_.context = cfg.model.context;
    sampler_.seed = cfg.seed;
    fingerprint = data_fingerprint({{text_.vocab.data(), text_.vocab.size()},
                                    {text_.train.data(), text_.train.size() * sizeof(int32_t)},
                                    {text_.val.data(), text_.val.size() * sizeof(int32_t)}});
  }
  int64_t vocab_size() const { return int64_t(text_.vocab.size()); }

 private:
  Batch batch(int split, uint64_t stream, int64_t k) const override {
    TextSampler s = sampler_;
    s.data = split == 0 ? &text_.train : &text_.val;
    s.stream = stream;
    return s.batch(k);
  }
  CharText text_;
  TextSampler sampler_;
};

// Token files (train/tokens.hpp): llm.c shards or raw uint16.
class TokenTask final : public LanguageModelTask {
 public:
  explicit TokenTask(const RunConfig& cfg)
      : LanguageModelTask(cfg),
        train_(TokenSet::open(cfg.data.train, "config.data.train", cfg.data.format, cfg.data.vocab_size,
                              cfg.model.context + 1)),
        val_(TokenSet::open(cfg.data.val, "config.data.val", cfg.data.format, cfg.data.vocab_size,
                            cfg.model.context + 1)) {
    sampler_.batch_size = cfg.training.batch_size;
    sampler_.context = cfg.model.context;
    sampler_.seed = cfg.seed;
    fingerprint = token_fingerprint({&train_, &val_});
  }

 private:
  Batch batch(int split, uint64_t stream, int64_t k) const override {
    TokenSampler s = sampler_;
    s.set = split == 0 ? &train_ : &val_;
    s.stream = stream;
    return s.batch(k);
  }
  TokenSet train_, val_;
  TokenSampler sampler_;
};

}  // namespace

std::unique_ptr<Task> make_task(RunConfig& cfg) {
  if (cfg.model.type == "vit") return std::make_unique<ImageTask>(cfg);
  if (cfg.data.type == "tokens") {
    auto t = std::make_unique<TokenTask>(cfg);
    // The model's vocabulary: the tokenizer's, or llm.c's padded size (rows no token uses; see DataConfig).
    cfg.model.vocab_size = token_model_vocab(cfg.data);
    return t;
  }
  auto t = std::make_unique<CharTextTask>(cfg);
  cfg.model.vocab_size = t->vocab_size();
  return t;
}

}  // namespace fp4lab::train
