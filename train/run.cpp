#include "train/run.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "train/data.hpp"
#include "core/error.hpp"

namespace fp4lab::train {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'F', 'P', '4', 'L', 'C', 'K', '0', '1'};
constexpr uint64_t kEvalStream = uint64_t(0xF) << 60;

void write_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw Error("cannot write " + tmp.string());
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.flush();
    if (!f) throw Error("writing " + tmp.string() + " failed (disk full?)");
  }
  fs::rename(tmp, path);
}

struct Checkpoint {
  json header;
  std::vector<float> values, m, v;
};

void save_checkpoint(const fs::path& path, const Checkpoint& c) {
  const std::string h = c.header.dump();
  std::string bytes(kMagic, 8);
  const uint64_t len = h.size();
  bytes.append(reinterpret_cast<const char*>(&len), 8);
  bytes += h;
  for (const auto* vec : {&c.values, &c.m, &c.v})
    bytes.append(reinterpret_cast<const char*>(vec->data()), vec->size() * sizeof(float));
  write_atomic(path, bytes);
}

Checkpoint load_checkpoint(const fs::path& path, int64_t n) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("cannot resume: no checkpoint " + path.string());
  char magic[8];
  uint64_t len = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&len), 8);
  if (!f || std::memcmp(magic, kMagic, 8) != 0 || len > (1u << 24))
    throw Error(path.string() + ": not an fp4lab checkpoint (bad magic/header)");
  std::string h(len, '\0');
  f.read(h.data(), std::streamsize(len));
  Checkpoint c;
  try {
    c.header = json::parse(h);
  } catch (const json::parse_error& e) {
    throw Error(path.string() + ": corrupt checkpoint header: " + e.what());
  }
  if (c.header.value("params", int64_t(-1)) != n)
    throw Error(path.string() + ": checkpoint holds " + c.header.value("params", json(-1)).dump() +
                " parameters but the model has " + std::to_string(n) + " (different config?)");
  for (auto* vec : {&c.values, &c.m, &c.v}) {
    vec->resize(size_t(n));
    f.read(reinterpret_cast<char*>(vec->data()), std::streamsize(size_t(n) * sizeof(float)));
  }
  if (!f) throw Error(path.string() + ": checkpoint is truncated");
  return c;
}

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

// Everything about the data a run needs.
struct DataSet {
  ImageSet train_images, test_images;
  CharText text;
  std::optional<ImageSampler> images;
  std::optional<TextSampler> text_train;
};

}  // namespace

std::vector<json> read_metrics(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error("cannot open " + path);
  std::vector<json> out;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::parse_error& e) {
      throw Error(path + ":" + std::to_string(lineno) + ": invalid JSON line: " + e.what());
    }
  }
  return out;
}

RunResult run_training(const RunConfig& cfg_in, const RunOptions& opt) {
  std::ostream& log = opt.log ? *opt.log : std::cerr;
  RunConfig cfg = cfg_in;
  const fs::path dir = run_directory(cfg);
  const fs::path ckpt_path = dir / "checkpoint.bin", metrics_path = dir / "metrics.jsonl";
  const Recipe recipe = resolve_recipe(cfg);
  const std::string label = recipe_label(cfg);

  // ---- data ----
  DataSet ds;
  const TrainingConfig& tc = cfg.training;
  const bool vit = cfg.model.type == "vit";
  if (vit) {
    ds.train_images = load_mnist(cfg.data.path, true);
    ds.test_images = load_mnist(cfg.data.path, false);
    if (ds.train_images.rows != cfg.model.image_size || ds.train_images.cols != cfg.model.image_size)
      throw Error(cfg.data.path + ": images are " + std::to_string(ds.train_images.rows) + "x" +
                  std::to_string(ds.train_images.cols) + " but model.image_size is " +
                  std::to_string(cfg.model.image_size));
    ImageSampler s;
    s.set = &ds.train_images;
    s.batch_size = tc.batch_size;
    s.limit = cfg.data.train_limit;
    s.mean = float(cfg.data.mean);
    s.std = float(cfg.data.std);
    s.seed = cfg.seed;
    ds.images = s;
  } else {
    ds.text = load_char_text(cfg.data.path);
    cfg.model.vocab_size = int64_t(ds.text.vocab.size());
    TextSampler s;
    s.data = &ds.text.train;
    s.batch_size = tc.batch_size;
    s.context = cfg.model.context;
    s.seed = cfg.seed;
    s.stream = uint64_t(0xC) << 60;
    ds.text_train = s;
  }
  const int64_t spe = vit ? ds.images->steps_per_epoch() : 0;
  const int64_t total = tc.steps > 0 ? tc.steps : int64_t(std::llround(tc.epochs * double(spe)));
  const int64_t eval_interval = tc.eval_interval > 0 ? tc.eval_interval : (vit ? spe : 250);
  if (total <= 0) throw Error("config.training: the run has no steps");

  // ---- run directory ----
  json resolved = config_to_json(cfg);
  resolved["recipe_resolved"] = recipe_to_json(recipe);
  if (opt.resume) {
    if (!fs::exists(ckpt_path)) throw Error("cannot resume: " + ckpt_path.string() + " does not exist");
    json saved = read_json_file((dir / "config.json").string());
    json a = saved, b = resolved;
    for (json* x : {&a, &b}) x->erase("threads");
    if (a != b)
      throw Error("cannot resume " + dir.string() +
                  ": its config.json differs from this config (resume with the "
                  "same config and --set options)");
  } else {
    if (fs::exists(dir) && !fs::is_empty(dir)) {
      if (!opt.force)
        throw Error("run directory " + dir.string() +
                    " already exists; pass --resume to continue it, --force to overwrite it, or --set output.name=NEW");
      fs::remove_all(dir);
    }
    fs::create_directories(dir);
    write_atomic(dir / "config.json", resolved.dump(2) + "\n");
    std::ofstream(metrics_path, std::ios::trunc);
  }

  // ---- model + optimiser ----
  auto be = make_backend(cfg.backend, cfg.threads);
  auto model = make_model(cfg.model, *be, cfg.seed);
  ParamStore& ps = model->params();
  AdamWConfig ac = tc.adamw;
  if (tc.optimizer == "adam") ac.weight_decay = 0.0;
  AdamW adam(ac, ps, *be);
  std::optional<Recipe> switched;
  uint64_t switch_at = uint64_t(total);
  if (recipe.switch_to) {
    switch_at = switch_step(recipe, uint64_t(total));
    switched = effective_recipe(recipe, uint64_t(total) - 1, uint64_t(total));
  }

  int64_t start = 0;
  double best = vit ? -1.0 : 1e30;
  if (opt.resume) {
    Checkpoint c = load_checkpoint(ckpt_path, ps.size());
    be->upload(c.values.data(), ps.values);
    be->upload(c.m.data(), adam.m());
    be->upload(c.v.data(), adam.v());
    start = c.header.at("step").get<int64_t>();
    adam.set_steps_taken(c.header.at("adam_t").get<int64_t>());
    best = c.header.at("best").get<double>();
    // Drop metric lines written after the checkpoint (they will be recomputed).
    std::vector<json> lines = read_metrics(metrics_path.string());
    std::string keep;
    for (const auto& l : lines)
      if (l.value("step", int64_t(0)) <= start) keep += l.dump() + "\n";
    write_atomic(metrics_path, keep);
    log << "resuming " << dir.string() << " at step " << start << "/" << total << "\n";
  }
  std::ofstream metrics(metrics_path, std::ios::app);

  const std::string metric = vit ? "test_acc" : "val_loss";
  auto evaluate = [&](int64_t step) {
    StepContext sc{&recipe, cfg.seed, uint64_t(step), false};
    if (switched && uint64_t(step) >= switch_at) sc.recipe = &*switched;
    json rec = {{"step", step}, {"eval", true}};
    if (vit) {
      ImageSampler ts = *ds.images;
      ts.set = &ds.test_images;
      ts.limit = cfg.data.test_limit;
      const int64_t n = ts.size(), nb = (n + tc.eval_batch_size - 1) / tc.eval_batch_size;
      double loss = 0.0;
      int64_t hits = 0;
      for (int64_t k = 0; k < nb; ++k) {
        Batch b = ts.eval_batch(k, tc.eval_batch_size);
        int64_t c = 0;
        loss += model->evaluate(b, sc, &c) * double(b.size);
        hits += c;
      }
      rec["test_acc"] = 100.0 * double(hits) / double(n);
      rec["test_loss"] = loss / double(n);
    } else {
      for (int split = 0; split < 2; ++split) {
        TextSampler s = *ds.text_train;
        s.data = split == 0 ? &ds.text.train : &ds.text.val;
        s.stream = kEvalStream | uint64_t(split) << 56 | uint64_t(step);
        double sum = 0.0;
        for (int64_t k = 0; k < tc.eval_iters; ++k) sum += model->evaluate(s.batch(k), sc, nullptr);
        rec[split == 0 ? "train_loss" : "val_loss"] = sum / double(tc.eval_iters);
      }
    }
    return rec;
  };
  auto checkpoint = [&](int64_t step) {
    Checkpoint c;
    c.header = {
        {"step", step}, {"adam_t", adam.steps_taken()}, {"best", best}, {"params", ps.size()}, {"recipe", label}};
    c.values.resize(size_t(ps.size()));
    c.m.resize(size_t(ps.size()));
    c.v.resize(size_t(ps.size()));
    be->download(ps.values, c.values.data());
    be->download(adam.m(), c.m.data());
    be->download(adam.v(), c.v.data());
    save_checkpoint(ckpt_path, c);
  };

  RunResult res;
  res.dir = dir.string();
  res.first_step = start;
  const bool tty = opt.progress && ::isatty(STDERR_FILENO) && &log == &std::cerr;
  const int64_t items = tc.batch_size * model->items_per_sample();
  const int64_t plain_every = std::max<int64_t>(tc.log_interval, total / 20);
  auto t_run = std::chrono::steady_clock::now();
  double train_seconds = 0.0;
  int64_t timed_steps = 0;
  double last_loss = 0.0, last_eval_metric = std::nan("");
  std::string status = "completed";
  std::string error;

  auto record_eval = [&](int64_t step) {
    json rec = evaluate(step);
    const double v = rec[metric].get<double>();
    last_eval_metric = v;
    best = vit ? std::max(best, v) : std::min(best, v);
    metrics << rec.dump() << "\n" << std::flush;
    if (opt.progress) {
      if (tty) log << "\r\033[K";
      char b[200];
      if (vit)
        std::snprintf(b, sizeof b, "eval step %lld: test_acc %.2f%% test_loss %.4f\n", (long long)step,
                      rec["test_acc"].get<double>(), rec["test_loss"].get<double>());
      else
        std::snprintf(b, sizeof b, "eval step %lld: train_loss %.4f val_loss %.4f\n", (long long)step,
                      rec["train_loss"].get<double>(), rec["val_loss"].get<double>());
      log << b << std::flush;
    }
  };

  if (start == 0 && !vit) record_eval(0);  // nanoGPT evaluates before the first step
  int64_t step = start;
  for (; step < total; ++step) {
    if (opt.stop_after >= 0 && step >= opt.stop_after) {
      status = "stopped";
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Batch b = vit ? ds.images->train_batch(step) : ds.text_train->batch(step);
    StepContext sc{&recipe, cfg.seed, uint64_t(step), true};
    if (switched && uint64_t(step) >= switch_at) sc.recipe = &*switched;
    be->fill(ps.grads, 0.0f);
    int64_t hits = 0;
    const double loss = model->forward_backward(b, sc, &hits);
    const double lr = learning_rate(tc.schedule, step, total);
    if (!std::isfinite(loss)) {
      error = "loss is " + std::string(std::isnan(loss) ? "NaN" : "Inf");
    }
    double gnorm = 0.0;
    if (error.empty()) {
      gnorm = adam.step(lr);
      if (!std::isfinite(gnorm)) error = "gradient norm is " + std::string(std::isnan(gnorm) ? "NaN" : "Inf");
    }
    if (!error.empty()) {
      status = "diverged";
      metrics << json{{"step", step}, {"error", error}}.dump() << "\n" << std::flush;
      break;
    }
    be->synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step - start >= 2) train_seconds += dt, ++timed_steps;  // skip warm-up steps
    res.step_losses.push_back(loss);
    last_loss = loss;
    const int64_t done = step + 1;
    const double ms = timed_steps ? 1000.0 * train_seconds / double(timed_steps) : 1000.0 * dt;
    if (done % tc.log_interval == 0 || done == total) {
      metrics << json{{"step", done},       {"loss", loss},      {"lr", lr},
                      {"grad_norm", gnorm}, {"ms_per_step", ms}, {"items_per_s", double(items) * 1000.0 / ms}}
                     .dump()
              << "\n";
    }
    if (opt.progress) {
      const double eta = ms / 1000.0 * double(total - done);
      if (tty) {
        const int width = 30, fill = int(double(width) * double(done) / double(total));
        char b2[256];
        std::snprintf(b2, sizeof b2, "\r\033[K[%s%s] %lld/%lld loss %.4f %.1f ms/step ETA %s",
                      std::string(size_t(fill), '#').c_str(), std::string(size_t(width - fill), '.').c_str(),
                      (long long)done, (long long)total, loss, ms, fmt_duration(eta).c_str());
        log << b2 << std::flush;
      } else if (done % plain_every == 0 || done == total) {
        char b2[256];
        std::snprintf(b2, sizeof b2, "step %lld/%lld loss %.4f lr %.3g %.1f ms/step ETA %s\n", (long long)done,
                      (long long)total, loss, lr, ms, fmt_duration(eta).c_str());
        log << b2 << std::flush;
      }
    }
    const bool eval_now = done % eval_interval == 0 || done == total;
    if (eval_now) record_eval(done);
    if ((tc.checkpoint_interval > 0 ? done % tc.checkpoint_interval == 0 : eval_now) || done == total) checkpoint(done);
  }
  if (tty && opt.progress) log << "\n";
  metrics.close();

  const double ms = timed_steps ? 1000.0 * train_seconds / double(timed_steps) : std::nan("");
  json summary = {{"name", cfg.name},
                  {"recipe", label},
                  {"model", cfg.model.type},
                  {"seed", cfg.seed},
                  {"status", status},
                  {"steps", step},
                  {"total_steps", total},
                  {"metric", metric},
                  {"higher_is_better", vit},
                  {"final", last_eval_metric},
                  {"best", best},
                  {"final_train_loss", last_loss},
                  {"ms_per_step", ms},
                  {"items_per_s", double(items) * 1000.0 / ms},
                  {"item", vit ? "images" : "tokens"},
                  {"params", ps.size()},
                  {"backend", cfg.backend},
                  {"wall_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count()}};
  if (!error.empty()) summary["error"] = error;
  if (status != "stopped") write_atomic(dir / "summary.json", summary.dump(2) + "\n");
  res.status = status;
  res.summary = summary;
  res.final_params.resize(size_t(ps.size()));
  be->download(ps.values, res.final_params.data());
  if (status == "diverged")
    throw Error("run " + dir.string() + " diverged at step " + std::to_string(step) + ": " + error +
                "; stopped. The last good checkpoint is kept in " + ckpt_path.string() +
                (fs::exists(ckpt_path) ? "" : " (none was written yet)"));
  return res;
}

}  // namespace fp4lab::train
