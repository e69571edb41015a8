// `fp4lab train`, `fp4lab compare`, `fp4lab sweep` and `fp4lab bench train`.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "train/compare.hpp"
#include "train/config.hpp"
#include "train/optim.hpp"
#include "train/dist/launch.hpp"
#include "train/run.hpp"
#include "core/error.hpp"

namespace fp4lab {

namespace {

using nlohmann::json;
using namespace fp4lab::train;

std::vector<std::string> split_list(const std::string& s, const char* what) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  if (out.empty()) throw Error(std::string(what) + ": empty list \"" + s + "\"");
  return out;
}

json load_config(const std::string& path, const std::vector<std::string>& sets, const std::string& recipe) {
  json j = read_json_file(path);
  for (const auto& s : sets) apply_set(j, s);
  if (!recipe.empty()) j["recipe"] = recipe;
  return j;
}

void print_compare(const CompareResult& c) {
  std::cout << c.table;
  if (!c.plot.empty()) std::cout << "loss curves: " << c.plot << "\n";
  if (!c.plot_note.empty()) std::cout << c.plot_note << "\n";
  if (!c.stats.empty()) std::cout << "statistics: " << c.stats << "\n";
}

struct TrainArgs {
  std::string config, recipe, plot, baseline;
  std::vector<std::string> sets;
  bool resume = false, force = false, quiet = false;
  std::string recipes = "fp32", seeds;
  LaunchOptions launch;  // train: data-parallel ranks (train/dist/launch.hpp)
};

// One timed training step loop on synthetic data (no dataset needed).
void bench_train(const std::string& config_path, const std::string& recipes, int64_t steps, int threads,
                 const std::string& backend, const std::vector<std::string>& sets) {
  json j;
  if (config_path.empty()) {
    j = {{"name", "gpt_baby"}, {"model", {{"type", "gpt"}}}, {"data", {{"type", "char"}}}};
  } else {
    j = read_json_file(config_path);
  }
  for (const auto& s : sets) apply_set(j, s);
  if (threads > 0) j["threads"] = threads;
  if (!backend.empty()) j["backend"] = backend;
  RunConfig cfg = config_from_json(j);
  const bool vit = cfg.model.type == "vit";
  std::printf("bench train: %s model, batch %lld%s, %lld timed steps after 2 warm-up, backend %s\n",
              cfg.model.type.c_str(), (long long)cfg.training.batch_size,
              vit ? "" : (" x context " + std::to_string(cfg.model.context)).c_str(), (long long)steps,
              cfg.backend.c_str());
  std::printf("%-28s %12s %14s %10s\n", "recipe", "ms/iter", vit ? "images/s" : "tokens/s", "vs first");
  double first_ms = 0.0;
  for (const auto& rname : split_list(recipes, "--recipes")) {
    cfg.recipe = rname;
    const Recipe recipe = resolve_recipe(cfg);
    auto be = make_backend(cfg.backend, cfg.threads);
    auto model = make_model(cfg.model, *be, cfg.seed);
    AdamWConfig ac = cfg.training.adamw;
    if (cfg.training.optimizer == "adam") ac.weight_decay = 0.0;
    AdamW opt(ac, model->params(), *be);
    std::mt19937 rng(1234);
    Batch b;
    b.size = cfg.training.batch_size;
    if (vit) {
      const int64_t px = cfg.model.channels * cfg.model.image_size * cfg.model.image_size;
      std::normal_distribution<float> nd;
      for (int64_t i = 0; i < b.size * px; ++i) b.images.push_back(nd(rng));
      for (int64_t i = 0; i < b.size; ++i) b.targets.push_back(int32_t(rng() % uint32_t(cfg.model.classes)));
    } else {
      for (int64_t i = 0; i < b.size * cfg.model.context; ++i) {
        b.tokens.push_back(int32_t(rng() % uint32_t(cfg.model.vocab_size)));
        b.targets.push_back(int32_t(rng() % uint32_t(cfg.model.vocab_size)));
      }
    }
    double total = 0.0;
    for (int64_t s = 0; s < steps + 2; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      be->fill(model->params().grads, 0.0f);
      StepContext sc{&recipe, cfg.seed, uint64_t(s), true};
      model->forward_backward(b, sc, nullptr);
      opt.step(learning_rate(cfg.training.schedule, s, steps + 2));
      be->synchronize();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s >= 2) total += dt;
    }
    const double ms = 1000.0 * total / double(steps);
    if (first_ms == 0.0) first_ms = ms;
    const double items = double(b.size * model->items_per_sample()) * 1000.0 / ms;
    std::printf("%-28s %12.2f %14.0f %9.2fx\n", rname.c_str(), ms, items, ms / first_ms);
    std::fflush(stdout);
  }
}

void add_train(CLI::App& app, const std::shared_ptr<TrainArgs>& args) {
  CLI::App* train = app.add_subcommand("train", "Train a model from a JSON experiment config (configs/*.json)");
  train->add_option("config", args->config, "Experiment config (JSON)")->required()->check(CLI::ExistingFile);
  train->add_option("--recipe", args->recipe,
                    "Recipe: canned name, recipe JSON file or inline JSON (overrides the config's)");
  train->add_option("--set", args->sets,
                    "Override a config key: dotted.key=value (value parsed as JSON if it is JSON)");
  train->add_flag(
      "--resume", args->resume,
      "Continue the run in its directory from its last checkpoint (bit-exact); a finished run: nothing to do");
  train->add_flag("--force", args->force,
                  "Replace an existing run directory (the old one is removed once the new run has a checkpoint)");
  train->add_flag("--quiet", args->quiet, "No progress output");
  train->add_option("--rendezvous", args->launch.rendezvous,
                    "Data-parallel ranks without mpirun: file:PATH (NCCL, backend cuda; with --rank, --world) or mpi "
                    "(the default under mpirun)");
  train->add_option("--rank", args->launch.rank, "This process's rank (with --rendezvous file:PATH)");
  train->add_option("--world", args->launch.world, "The number of ranks (with --rendezvous file:PATH)");
  train->callback([args] {
    RunConfig cfg = config_from_json(load_config(args->config, args->sets, args->recipe));
    std::unique_ptr<Communicator> comm = join_world(args->launch, cfg.backend);
    const bool rank0 = comm->rank() == 0;
    RunOptions o;
    o.resume = args->resume;
    o.force = args->force;
    o.progress = !args->quiet;
    o.comm = comm.get();
    if (rank0)
      std::cerr << "fp4lab train: " << cfg.name << " (" << cfg.model.type << "), recipe " << recipe_label(cfg)
                << ", seed " << cfg.seed << " -> " << run_directory(cfg)
                << (comm->world() > 1 ? ", " + std::to_string(comm->world()) + " ranks (" + comm->name() + ")" : "")
                << "\n";
    RunResult r = run_training(cfg, o);
    if (!rank0) return;
    if (!r.note.empty()) {  // a finished run, left as it is
      std::printf("%s\n", r.note.c_str());
      return;
    }
    const json& s = r.summary;
    std::printf("%s: %s, final %s %.4f (best %.4f), %.2f ms/step, %.0f %s/s\n", r.dir.c_str(),
                s["status"].get<std::string>().c_str(), s["metric"].get<std::string>().c_str(),
                s["final"].get<double>(), s["best"].get<double>(), s["ms_per_step"].get<double>(),
                s["items_per_s"].get<double>(), s["item"].get<std::string>().c_str());
  });
}

void add_compare(CLI::App& app, const std::shared_ptr<TrainArgs>& args) {
  CLI::App* compare = app.add_subcommand("compare", "Compare finished runs: table + loss-curve PNG (gnuplot)");
  auto dirs = std::make_shared<std::vector<std::string>>();
  compare->add_option("run_dirs", *dirs, "Run directories")->required()->check(CLI::ExistingDirectory);
  compare->add_option("--plot", args->plot,
                      "PNG path (default: <parent of the first run>/compare.png; '-' = none); the statistics go to the "
                      "same path with .json (with '-': <parent of the first run>/compare.json)");
  compare->add_option("--baseline", args->baseline,
                      "Recipe of the reference run (default: fp32/bf16 run, else the first)");
  compare->callback([args, dirs] { print_compare(compare_runs(*dirs, CompareOptions{args->plot, args->baseline})); });
}

// Every recipe x seed combination and its run directory are checked before
// any is trained: a directory with a different config is an error naming the
// keys, a finished run with the same config is kept (not run again), an
// unfinished one needs --resume (continue) or --force (replace). A diverged
// run is reported and the others go on.
void run_sweep(const TrainArgs& args) {
  std::vector<std::string> run_dirs;
  const auto recipes = split_list(args.recipes, "--recipes");
  std::vector<std::string> seeds;
  if (!args.seeds.empty())
    seeds = split_list(args.seeds, "--seeds");
  else
    seeds.push_back("");
  std::vector<RunConfig> cfgs;
  for (const auto& seed : seeds)
    for (const auto& r : recipes) {
      json j = load_config(args.config, args.sets, r);
      if (!seed.empty()) apply_set(j, "seed=" + seed);
      cfgs.push_back(config_from_json(j));
    }
  // Under mpirun every run is data-parallel over the ranks (train/dist/launch.hpp); rank 0 reports.
  std::unique_ptr<Communicator> comm = join_world({}, cfgs.front().backend);
  const bool rank0 = comm->rank() == 0;
  RunOptions o;
  o.resume = args.resume;
  o.force = args.force;
  o.reuse = true;
  o.progress = !args.quiet;
  o.comm = comm.get();
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const std::string dir = plan_run(cfgs[i], o).dir;
    for (size_t k = 0; k < i; ++k)
      if (run_directory(cfgs[k]) == dir)
        throw Error("sweep: " + recipe_label(cfgs[k]) + " seed " + std::to_string(cfgs[k].seed) + " and " +
                    recipe_label(cfgs[i]) + " seed " + std::to_string(cfgs[i].seed) + " would both write " + dir +
                    "; drop --set output.name so each run gets its own directory");
  }
  for (const auto& cfg : cfgs) {
    if (rank0)
      std::cerr << "fp4lab sweep: " << recipe_label(cfg) << " seed " << cfg.seed << " -> " << run_directory(cfg)
                << "\n";
    try {
      const RunResult r = run_training(cfg, o);
      if (!r.note.empty() && rank0) std::cerr << "fp4lab sweep: " << r.note << "\n";
    } catch (const DivergedError& e) {
      if (rank0) std::cerr << "fp4lab sweep: " << e.what() << "\n";
    }
    run_dirs.push_back(run_directory(cfg));
  }
  if (rank0) print_compare(compare_runs(run_dirs, CompareOptions{args.plot, args.baseline}));
}

void add_sweep(CLI::App& app, const std::shared_ptr<TrainArgs>& args) {
  CLI::App* sweep = app.add_subcommand("sweep", "Train one config under several recipes x seeds, then compare");
  sweep->add_option("config", args->config, "Experiment config (JSON)")->required()->check(CLI::ExistingFile);
  sweep->add_option("--recipes", args->recipes, "Comma-separated recipes (default fp32)");
  sweep->add_option("--seeds", args->seeds, "Comma-separated seeds (default: the config's seed)");
  sweep->add_option("--set", args->sets, "Override a config key: dotted.key=value");
  sweep->add_flag("--resume", args->resume,
                  "Continue unfinished runs from their checkpoints (finished runs with the same config are kept)");
  sweep->add_flag("--force", args->force, "Replace existing run directories (as train --force)");
  sweep->add_flag("--quiet", args->quiet, "No progress output");
  sweep->add_option("--plot", args->plot, "PNG path of the comparison (its statistics: the same path with .json)");
  sweep->add_option("--baseline", args->baseline,
                    "Recipe of the reference runs (gaps, paired differences); default: fp32/bf16, else the first");
  sweep->callback([args] { run_sweep(*args); });
}

}  // namespace

// train, compare and sweep share one TrainArgs (one of them runs).
void register_train_commands(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  add_train(app, args);
  add_compare(app, args);
  add_sweep(app, args);
}

void register_bench_train(CLI::App& bench) {
  struct BenchArgs {
    std::string config, recipes = "fp32,mx_baseline,nvfp4", backend;
    int64_t steps = 10;
    int threads = 0;
    std::vector<std::string> sets;
  };
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = bench.add_subcommand("train", "ms/iteration and tokens/s (images/s) of training steps per recipe");
  c->add_option("--config", a->config, "Experiment config (default: the baby GPT, configs/gpt_baby.json's model)");
  c->add_option("--recipes", a->recipes, "Comma-separated recipes (default fp32,mx_baseline,nvfp4)");
  c->add_option("--steps", a->steps, "Timed steps per recipe (default 10)")->check(CLI::PositiveNumber);
  c->add_option("--threads", a->threads, "OpenMP threads (default: all)");
  c->add_option("--backend", a->backend, "cpu or cuda (default: the config's backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  c->add_option("--set", a->sets, "Override a config key: dotted.key=value");
  c->callback([a] { bench_train(a->config, a->recipes, a->steps, a->threads, a->backend, a->sets); });
}

}  // namespace fp4lab
