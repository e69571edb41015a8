// `fp4lab train`, `fp4lab compare`, `fp4lab sweep` and `fp4lab bench train`.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/commands.hpp"
#include "train/compare.hpp"
#include "train/config.hpp"
#include "train/optim.hpp"
#include "train/process.hpp"
#include "train/dist/launch.hpp"
#include "train/run.hpp"
#include "train/tokens.hpp"
#include "core/error.hpp"
#ifdef FP4LAB_WITH_CUDA
#include "cuda/device.hpp"
#endif

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
  if (!j.is_object())
    throw Error(path + ": the config is " + std::string(j.type_name()) + ", expected a JSON object ({\"model\": ...})");
  for (const auto& s : sets) apply_set(j, s);
  if (!recipe.empty()) j["recipe"] = recipe;
  return j;
}

void print_compare(const CompareResult& c) {
  std::cout << c.table;
  if (!c.plot.empty()) std::cout << "loss curves: " << c.plot << "\n";
  if (!c.forest.empty()) std::cout << "paired differences (forest plot): " << c.forest << "\n";
  if (!c.plot_note.empty()) std::cout << c.plot_note << "\n";
  if (!c.stats.empty()) std::cout << "statistics: " << c.stats << "\n";
}

struct TrainArgs {
  std::string config, recipe, plot, baseline, title;
  std::string by, metric = "final";  // compare --by, --metric
  std::vector<std::string> sets;
  bool resume = false, force = false, quiet = false;
  std::string recipes = "fp32", seeds;
  LaunchOptions launch;  // train: data-parallel ranks (train/dist/launch.hpp)
};

struct BenchArgs {
  std::string config, recipes = "fp32,mx_baseline,nvfp4", backend, pytorch = "auto", pytorch_dir = "scripts";
  std::string vs_config;  // --vs-config: a second model timed in the same rounds (its ratio printed)
  int64_t steps = 10;
  int repeats = 3;
  int threads = 0;
  double peak_tflops = 0;  // --peak-tflops: the MFU's denominator (0: the device's, cuda::dense_bf16_peak_tflops)
  std::vector<std::string> sets;
  std::vector<std::string> config_sets;  // --config-set: --config's model only (not --vs-config's)
};

// Median and range of a round's figures.
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread spread_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

// What a bench row's throughput is measured against: the training flops of one item (token or image) and
// the peak in TFLOP/s (0: unknown, MFU not printed).
struct FlopRate {
  double flops_per_item = 0, peak_tflops = 0;
};

void print_bench_row(const std::string& name, const Spread& s, double items_per_ms, double first_ms,
                     const FlopRate& f) {
  const double tflops = f.flops_per_item * items_per_ms / s.median * 1e-12;
  char tf[16] = "-", mfu[16] = "-";
  if (f.flops_per_item > 0) std::snprintf(tf, sizeof tf, "%.4g", tflops);
  if (f.flops_per_item > 0 && f.peak_tflops > 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * tflops / f.peak_tflops);
  std::printf("%-44s %9.2f %9.2f %9.2f %14.0f %9.2fx %9s %7s\n", name.c_str(), s.median, s.min, s.max,
              items_per_ms / s.median, s.median / first_ms, tf, mfu);
  std::fflush(stdout);
}

// Training flops of one token of the GPT (dense or MoE), nanoGPT's estimate_mfu (PaLM, appendix B):
// 6 N + 12 L C T. N: the parameters a token's matrix products use: every parameter but the position
// embedding (the token embedding counts once, as the tied output layer's product), and of a MoE layer's
// experts the top_k / experts share a token is routed to; 6 = 2 flops a parameter forward, 4 backward.
// 12 L C T: attention's two products (q k^T, p v) of 2 C T flops each a token and layer, forward and
// backward (x 3), the causal half not discounted, as nanoGPT and PyTorch count it. L layers, C width
// (heads x head width), T context. 0 for the ViT (not counted).
double gpt_flops_per_token(const ModelConfig& m, const ParamStore& ps) {
  if (m.type != "gpt") return 0.0;
  double n = 0;
  for (const ParamInfo& p : ps.infos()) {
    if (p.name == "transformer.wpe.weight") continue;
    const bool expert = p.name.find(".experts.") != std::string::npos;
    n += double(p.size()) * (expert ? double(m.moe.top_k) / double(m.moe.experts) : 1.0);
  }
  return 6.0 * n + 12.0 * double(m.layers) * double(m.width) * double(m.context);
}

// One recipe's model, optimizer and synthetic batch, kept across the rounds.
struct BenchRun {
  std::string name;
  const RunConfig* cfg = nullptr;  // the model's config and synthetic batch (bench_train's)
  const Batch* batch = nullptr;
  Recipe recipe;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<AdamW> opt;
  int64_t step = 0;
  std::vector<double> ms;
};

// `steps` training steps of r, each synchronised; returns ms per step.
double time_steps(BenchRun& r, const Batch& b, const RunConfig& cfg, int64_t steps, int64_t total_steps) {
  double total = 0.0;
  for (int64_t s = 0; s < steps; ++s, ++r.step) {
    const auto t0 = std::chrono::steady_clock::now();
    r.be->fill(r.model->params().grads, 0.0f);
    StepContext sc{&r.recipe, cfg.seed, uint64_t(r.step), true};
    sc.activations = cfg.activations;
    r.model->forward_backward(b, sc, nullptr);
    r.opt->step(learning_rate(cfg.training.schedule, r.step, total_steps));
    r.be->synchronize();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return 1000.0 * total / double(steps);
}

// Runs argv without a shell (train/process.hpp: a path or argument is never
// shell syntax), its stderr dropped; its stdout lines, or nullopt if the program
// is not found or exits non-zero.
std::optional<std::vector<std::string>> run_command(const std::vector<std::string>& argv) {
  ProcessOptions o;
  o.capture_stdout = true;
  ProcessResult r;
  try {
    r = run_process(argv, o);
  } catch (const ProgramNotFound&) {
    return std::nullopt;
  }
  if (r.status != 0) return std::nullopt;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    lines.push_back(l);
  }
  return lines;
}

// The PyTorch rows of bench train (scripts/bench_pytorch_gpt.py or bench_pytorch_vit.py: the same model
// shape, batch, steps and rounds). GPT on the CPU: eager FP32 with our thread count; on CUDA: eager BF16
// autocast and its faster forms up to torch.compile with CUDA graphs + fused AdamW + TF32 (a user's best
// with two lines), and eager FP32 where an fp32 recipe is benchmarked. ViT: eager FP32 and
// torch.compile FP32 (the ViT runs FP32 in both).
void bench_pytorch(const BenchArgs& a, const RunConfig& cfg, int threads, bool with_fp32, double first_ms,
                   const FlopRate& rate) {
  if (a.pytorch == "off") return;
  const bool need = a.pytorch == "on";
  auto skip = [&](const std::string& why) {
    if (need) throw Error("bench train --pytorch on: " + why);
    std::printf("pytorch: skipped (%s; --pytorch on makes this an error)\n", why.c_str());
  };
  const ModelConfig& m = cfg.model;
  const bool vit = m.type == "vit";
  if (m.moe.experts > 0) return skip("the PyTorch reference has no mixture of experts");
  const std::string script = a.pytorch_dir + (vit ? "/bench_pytorch_vit.py" : "/bench_pytorch_gpt.py");
  if (!std::filesystem::exists(script))
    return skip("no " + script + " (run from the repository root, or give --pytorch-dir)");
  if (!run_command({"python3", "-c", "import torch"})) return skip("python3 cannot import torch");
  // The baselines use nn.LayerNorm(bias=False) (torch 2.1), scaled_dot_product_attention and torch.compile (2.0).
  if (!run_command({"python3", "-c",
                    "import sys, torch; v = torch.__version__.split(\"+\")[0].split(\".\"); "
                    "sys.exit(0 if (int(v[0]), int(v[1])) >= (2, 1) else 1)"}))
    return skip("python3's torch is older than 2.1 (the baselines need nn.LayerNorm(bias=False), "
                "scaled_dot_product_attention and torch.compile)");
  const bool cuda = cfg.backend == "cuda";
  // One argument per element (no shell): the script path goes through as it is ("./" before a
  // relative path that starts with '-', which python3 would take for an option).
  std::vector<std::string> base = {"python3", script.front() == '-' ? "./" + script : script};
  const auto opt = [&base](const char* flag, const auto& value) {
    std::ostringstream v;
    v << value;
    base.insert(base.end(), {flag, v.str()});
  };
  opt("--device", cuda ? "cuda" : "cpu");
  opt("--threads", threads);
  opt("--steps", a.steps);
  opt("--repeats", a.repeats);
  opt("--batch", cfg.training.batch_size);
  opt("--dropout", m.dropout);
  opt("--layers", m.layers);
  opt("--heads", m.heads);
  opt("--width", m.width);
  std::vector<std::string> variants;  // each: space-separated flags
  if (vit) {
    opt("--image", m.image_size);
    opt("--patch", m.patch_size);
    opt("--channels", m.channels);
    opt("--classes", m.classes);
    opt("--mlp-ratio", m.mlp_ratio);
    opt("--attn-scale", m.attn_scale);
    opt("--grad-clip", cfg.training.adamw.grad_clip);
    if (cfg.training.optimizer == "adamw") opt("--weight-decay", cfg.training.adamw.weight_decay);
    variants = {"", "--compile"};
  } else {
    opt("--context", m.context);
    opt("--vocab", m.vocab_size);
    if (cuda) {
      if (with_fp32) variants.push_back("--dtype fp32");
      variants.push_back("--dtype bf16");
      variants.push_back("--dtype bf16 --fused-adamw");
      variants.push_back("--dtype bf16 --fused-adamw --compile");
      variants.push_back("--dtype bf16 --fused-adamw --cuda-graphs --tf32");
    } else {
      variants.push_back("--dtype fp32");
    }
  }
  const double items_per_ms = double(cfg.training.batch_size * (vit ? 1 : m.context)) * 1000.0;
  for (const std::string& v : variants) {
    std::vector<std::string> argv = base;
    std::istringstream flags(v);
    for (std::string w; flags >> w;) argv.push_back(w);
    const auto lines = run_command(argv);
    std::istringstream last(lines && !lines->empty() ? lines->back() : "");
    std::string tag, name;
    Spread s;
    if (!(last >> tag >> name >> s.median >> s.min >> s.max) || tag != "RESULT") {
      std::string shown;  // the command for the reader (its arguments were passed one by one, unquoted)
      for (const std::string& w : argv) shown += (shown.empty() ? "" : " ") + w;
      std::printf("pytorch %s failed: %s\n", v.empty() ? "eager" : v.c_str(), terminal_text(shown).c_str());
      continue;
    }
    print_bench_row("pytorch " + name, s, items_per_ms, first_ms, rate);
  }
}

// Training steps on synthetic data (no dataset needed): every recipe's model
// built first, 2 warm-up steps each, then `repeats` rounds of `steps` steps
// with the recipes interleaved; median and range over the rounds. Then
// PyTorch's GPT of the same shape beside them (bench_pytorch).
// One bench model's config: the file (none: the baby GPT) with the --set (and, for --config's, the
// --config-set), --threads and --backend options.
RunConfig bench_config(const BenchArgs& a, const std::string& path, bool first) {
  json j;
  if (path.empty()) {
    j = {{"name", "gpt_baby"}, {"model", {{"type", "gpt"}}}, {"data", {{"type", "char"}}}};
  } else {
    j = read_json_file(path);
    if (!j.is_object()) throw Error(path + ": the config is " + std::string(j.type_name()) + ", expected a JSON object");
  }
  for (const auto& s : a.sets) apply_set(j, s);
  if (first)
    for (const auto& s : a.config_sets) apply_set(j, s);
  if (a.threads > 0) j["threads"] = a.threads;
  if (!a.backend.empty()) j["backend"] = a.backend;
  RunConfig cfg = config_from_json(j);
  // Batches are synthetic (no data is read), but the model is the run's: token data sets its vocabulary.
  if (cfg.data.type == "tokens") cfg.model.vocab_size = token_model_vocab(cfg.data);
  return cfg;
}

// A synthetic batch of cfg's shape (seeded: the same batch every time).
Batch synthetic_batch(const RunConfig& cfg) {
  Batch b;
  b.size = cfg.training.batch_size;
  std::mt19937 rng(1234);
  if (cfg.model.type == "vit") {
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
  return b;
}

// MFU: the model's training flops a token against the device's dense BF16 peak (every recipe's GEMMs run on
// the BF16 tensor cores on Hopper: the FP4/FP8 recipes emulate theirs exactly there).
FlopRate flop_rate(const BenchArgs& a, const RunConfig& cfg, const ParamStore& ps, std::string* peak_from) {
  FlopRate rate;
  rate.flops_per_item = gpt_flops_per_token(cfg.model, ps);
  rate.peak_tflops = a.peak_tflops;
  *peak_from = "--peak-tflops";
#ifdef FP4LAB_WITH_CUDA
  if (rate.peak_tflops <= 0 && cfg.backend == "cuda") {
    rate.peak_tflops = cuda::dense_bf16_peak_tflops();
    *peak_from = cuda::device_description() + ", dense BF16 datasheet figure";
  }
#endif
  return rate;
}

// Training steps on synthetic data (no dataset needed): every recipe's model
// built first (and, with --vs-config, the second model's per recipe), 2
// warm-up steps each, then `repeats` rounds of `steps` steps with the models
// interleaved; median and range over the rounds. With --vs-config, each
// recipe's ratio of the two models' medians from those same rounds. Then
// PyTorch's GPT of the first config's shape beside them (bench_pytorch).
void bench_train(const BenchArgs& a) {
  if (a.repeats <= 0) throw Error("--repeats must be positive, got " + std::to_string(a.repeats));
  if (a.pytorch != "auto" && a.pytorch != "on" && a.pytorch != "off")
    throw Error("--pytorch '" + a.pytorch + "': valid: auto, on, off");
  const bool vs = !a.vs_config.empty();
  std::vector<RunConfig> cfgs{bench_config(a, a.config, true)};
  if (vs) cfgs.push_back(bench_config(a, a.vs_config, false));
  for (const RunConfig& c : cfgs)
    if (c.distributed.expert_parallel != 1)
      throw Error("bench train times one process: distributed.expert_parallel " +
                  std::to_string(c.distributed.expert_parallel) +
                  " needs that many ranks (time it with `fp4lab train` under mpirun; ms_per_step in summary.json)");
  std::vector<Batch> batches;
  for (const RunConfig& c : cfgs) batches.push_back(synthetic_batch(c));
  const RunConfig& cfg = cfgs[0];
  const bool vit = cfg.model.type == "vit";
  if (vs && (cfgs[1].model.type == "vit") != vit)
    throw Error("--vs-config " + a.vs_config + ": a " + cfgs[1].model.type + " model, but --config's is " +
                cfg.model.type + " (the rows are per token or per image: both must be of one kind)");
  const int threads = cfg.threads > 0 ? cfg.threads : std::max(1, int(std::thread::hardware_concurrency()));
  std::printf("bench train: %s model, batch %lld%s, backend %s%s; %d rounds of %lld timed steps after 2 warm-up "
              "steps, %s interleaved; ms/iter: median, min, max over the rounds\n",
              cfg.model.type.c_str(), (long long)cfg.training.batch_size,
              vit ? "" : (" x context " + std::to_string(cfg.model.context)).c_str(), cfg.backend.c_str(),
              cfg.backend == "cpu" ? (", " + std::to_string(threads) + " threads").c_str() : "", a.repeats,
              (long long)a.steps, vs ? "models and recipes" : "recipes");
  const std::string vs_tag = vs ? " @" + std::filesystem::path(a.vs_config).stem().string() : "";
  std::vector<BenchRun> runs;  // with --vs-config: each recipe's two models in turn
  bool with_fp32 = false;
  for (const auto& rname : split_list(a.recipes, "--recipes")) {
    with_fp32 = with_fp32 || rname == "fp32";
    for (size_t c = 0; c < cfgs.size(); ++c) {
      RunConfig rc = cfgs[c];
      rc.recipe = rname;
      BenchRun r;
      r.name = rname + (c == 1 ? vs_tag : "");
      r.cfg = &cfgs[c];
      r.batch = &batches[c];
      r.recipe = resolve_recipe(rc);
      r.be = make_backend(rc.backend, rc.threads);
      r.model = make_model(rc.model, *r.be, rc.seed);
      AdamWConfig ac = rc.training.adamw;
      if (rc.training.optimizer == "adam") ac.weight_decay = 0.0;
      r.opt = std::make_unique<AdamW>(ac, r.model->params(), *r.be);
      runs.push_back(std::move(r));
    }
  }
  std::string peak_from;
  std::vector<FlopRate> rates;
  for (size_t c = 0; c < cfgs.size(); ++c) rates.push_back(flop_rate(a, cfgs[c], runs[c].model->params(), &peak_from));
  const FlopRate& rate = rates[0];
  if (rate.flops_per_item <= 0)
    std::printf("TFLOP/s and MFU: not counted for this model (only the GPT's flops are: 6N + 12LCT a token)\n");
  else if (rate.peak_tflops <= 0)
    std::printf("TFLOP/s: %.4g flops a token (6N + 12LCT, nanoGPT's estimate_mfu); MFU: no peak known for this "
                "device (--peak-tflops gives one)\n", rate.flops_per_item);
  else
    std::printf("TFLOP/s: %.4g flops a token (6N + 12LCT, nanoGPT's estimate_mfu); MFU against %.4g TFLOP/s (%s)\n",
                rate.flops_per_item, rate.peak_tflops, peak_from.c_str());
  if (vs && rates[1].flops_per_item > 0)
    std::printf("%s: %.4g flops a token\n", a.vs_config.c_str(), rates[1].flops_per_item);
  std::printf("%-44s %9s %9s %9s %14s %10s %9s %7s\n", "recipe", "ms/iter", "min", "max", vit ? "images/s" : "tokens/s",
              "vs first", "TFLOP/s", "MFU");
  const int64_t total_steps = 2 + a.steps * a.repeats;
  for (BenchRun& r : runs) time_steps(r, *r.batch, *r.cfg, 2, total_steps);
  for (int round = 0; round < a.repeats; ++round)
    for (BenchRun& r : runs) r.ms.push_back(time_steps(r, *r.batch, *r.cfg, a.steps, total_steps));
  const double first_ms = spread_of(runs.front().ms).median;
  for (size_t i = 0; i < runs.size(); ++i) {
    const BenchRun& r = runs[i];
    const size_t c = vs ? i % 2 : 0;
    const double items_per_ms = double(r.batch->size * r.model->items_per_sample()) * 1000.0;
    print_bench_row(r.name, spread_of(r.ms), items_per_ms, first_ms, rates[c]);
  }
  if (vs) {
    std::printf("%s against %s, same rounds (ms/iter ratio of the medians; max/median of each):\n",
                a.config.empty() ? "gpt_baby" : a.config.c_str(), a.vs_config.c_str());
    for (size_t i = 0; i + 1 < runs.size(); i += 2) {
      const Spread m = spread_of(runs[i].ms), d = spread_of(runs[i + 1].ms);
      std::printf("  %-20s %7.2fx   max/median %.2f and %.2f\n", runs[i].name.c_str(), m.median / d.median,
                  m.max / m.median, d.max / d.median);
    }
  }
  runs.clear();  // free the GPU before PyTorch runs on it
  bench_pytorch(a, cfg, threads, with_fp32, first_ms, rate);
}

// One rank of `fp4lab train` (the whole run in a world of one): rank 0 prints the header and the result line.
void train_rank(const TrainArgs& args, const RunConfig& cfg, Communicator& comm,
                const volatile std::sig_atomic_t* interrupt) {
  const bool rank0 = comm.rank() == 0;
  RunOptions o;
  o.resume = args.resume;
  o.force = args.force;
  o.progress = !args.quiet;
  o.comm = &comm;
  o.interrupt = interrupt;
  if (rank0)
    std::cerr << "fp4lab train: " << cfg.name << " (" << cfg.model.type << "), recipe " << recipe_label(cfg)
              << ", seed " << cfg.seed << " -> " << run_directory(cfg)
              << (comm.world() > 1 ? ", " + std::to_string(comm.world()) + " ranks (" + comm.name() + ")" : "")
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
                    "Data-parallel ranks without mpirun: threads:N (N ranks in this process, one thread each), "
                    "file:PATH (NCCL, backend cuda; with --rank, --world) or mpi (the default under mpirun)");
  train->add_option("--rank", args->launch.rank, "This process's rank (with --rendezvous file:PATH)");
  train->add_option("--world", args->launch.world, "The number of ranks (with --rendezvous file:PATH)");
  train->callback([args] {
    const RunConfig cfg = config_from_json(load_config(args->config, args->sets, args->recipe));
    const volatile std::sig_atomic_t* interrupt = install_interrupt_handlers();
    const int threads = thread_ranks(args->launch);
    if (threads == 0) {
      std::unique_ptr<Communicator> comm = join_world(args->launch, cfg.backend);
      return train_rank(*args, cfg, *comm, interrupt);
    }
    // `--rendezvous threads:N`: N ranks in this process, one thread each; rank 0 reports, as under mpirun.
    // Rank 0's error is the one thrown (else the first rank's): the ranks fail together (comm.hpp's timeout).
    std::vector<std::unique_ptr<Communicator>> comms = make_thread_comms(threads);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
    std::vector<std::thread> ranks;
    for (int r = 0; r < threads; ++r)
      ranks.emplace_back([&, r] {
        try {
          train_rank(*args, cfg, *comms[size_t(r)], interrupt);
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    for (std::thread& t : ranks) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  });
}

// compare's and sweep's --metric (one definition; parsed by parse_compare_metric).
void add_metric_option(CLI::App& app, std::string& metric) {
  app.add_option("--metric", metric,
                 "final (default): the last evaluation; best: the best evaluation (lowest loss, highest "
                 "accuracy), as summary.json's best")
      ->check(CLI::IsMember({"final", "best"}));
}

void add_compare(CLI::App& app, const std::shared_ptr<TrainArgs>& args) {
  CLI::App* compare = app.add_subcommand(
      "compare", "Compare finished runs by recipe or config keys (--by): table, statistics, loss-curve PNG (gnuplot)");
  auto dirs = std::make_shared<std::vector<std::string>>();
  compare->add_option("run_dirs", *dirs, "Run directories")->required()->check(CLI::ExistingDirectory);
  compare->add_option("--plot", args->plot,
                      "PNG path (default: <parent of the first run>/compare.png; '-' = none); the statistics go to the "
                      "same path with .json (with '-': <parent of the first run>/compare.json)");
  compare->add_option("--by", args->by,
                      "KEY[,KEY...]: the arms are the distinct values of these dotted keys in each run's "
                      "config.json, e.g. model.attention or recipe,precision.activations ('recipe': the recipe "
                      "label; a key a run lacks: the value it stood for, e.g. model.attention fp32, else "
                      "'missing'). Default: the recipe label");
  add_metric_option(*compare, args->metric);
  compare->add_option("--baseline", args->baseline,
                      "Arm of the reference (a recipe, or the --by values joined by ','; default: the fp32/bf16 "
                      "arm, else the first run's)");
  compare->add_option("--title", args->title,
                      "Overall title of the plot, e.g. the config, epochs and seeds (printable ASCII; other "
                      "characters become '?')");
  compare->callback([args, dirs] {
    std::vector<std::string> by;  // empty items kept: compare names them as invalid keys
    for (size_t at = 0; !args->by.empty() && at <= args->by.size();) {
      const size_t comma = std::min(args->by.find(',', at), args->by.size());
      by.push_back(args->by.substr(at, comma - at));
      at = comma + 1;
    }
    print_compare(compare_runs(
        *dirs, CompareOptions{args->plot, args->baseline, args->title, by, parse_compare_metric(args->metric)}));
  });
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
  o.interrupt = install_interrupt_handlers();
  // Every run directory is checked and locked before any trains (the plans hold the locks to the end).
  std::vector<RunPlan> plans;
  for (size_t i = 0; i < cfgs.size(); ++i) {
    plans.push_back(plan_run(cfgs[i], o));
    const std::string dir = plans.back().dir;
    if (rank0 && !plans.back().note.empty()) std::cerr << plans.back().note;
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
  if (rank0)
    print_compare(compare_runs(
        run_dirs, CompareOptions{args.plot, args.baseline, args.title, {}, parse_compare_metric(args.metric)}));
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
  add_metric_option(*sweep, args->metric);
  sweep->add_option("--baseline", args->baseline,
                    "Recipe of the reference runs (gaps, paired differences); default: fp32/bf16, else the first");
  sweep->add_option("--title", args->title,
                    "Overall title of the plot, e.g. the config, epochs and seeds (printable ASCII; other "
                    "characters become '?')");
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
  auto a = std::make_shared<BenchArgs>();
  CLI::App* c = bench.add_subcommand("train", "ms/iteration and tokens/s (images/s) of training steps per recipe");
  c->add_option("--config", a->config, "Experiment config (default: the baby GPT, configs/gpt_baby.json's model)");
  c->add_option("--recipes", a->recipes, "Comma-separated recipes (default fp32,mx_baseline,nvfp4)");
  c->add_option("--steps", a->steps, "Timed steps per round and recipe (default 10)")->check(CLI::PositiveNumber);
  c->add_option("--repeats", a->repeats, "Timed rounds (median and range reported; default 3)")
      ->check(CLI::PositiveNumber);
  c->add_option("--vs-config", a->vs_config,
                "A second config timed in the same rounds, each recipe's ratio printed (e.g. a mixture of experts "
                "against the dense model of equal active parameters)")
      ->check(CLI::ExistingFile);
  c->add_option("--threads", a->threads, "OpenMP threads (default: all)");
  c->add_option("--backend", a->backend, "cpu or cuda (default: the config's backend)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  c->add_option("--set", a->sets, "Override a config key: dotted.key=value (both configs)");
  c->add_option("--config-set", a->config_sets,
                "Override a key of --config's model only, after --set: dotted.key=value (e.g. "
                "model.moe.dispatch=capacity against a dense --vs-config)");
  c->add_option("--peak-tflops", a->peak_tflops,
                "The peak (TFLOP/s) MFU is measured against (default: the GPU's dense BF16 datasheet figure; none on "
                "the CPU)")
      ->check(CLI::PositiveNumber);
  c->add_option("--pytorch", a->pytorch,
                "PyTorch's model of the same shape beside ours (bench_pytorch_gpt.py / bench_pytorch_vit.py): auto "
                "(when python3 imports torch), on, off")
      ->capture_default_str();
  c->add_option("--pytorch-dir", a->pytorch_dir,
                "Directory of bench_pytorch_gpt.py, bench_pytorch_vit.py and their bench_pytorch_common.py")
      ->capture_default_str();
  c->callback([a] { bench_train(*a); });
}

}  // namespace fp4lab
