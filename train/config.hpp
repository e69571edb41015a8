// Experiment configs (configs/*.json): one JSON object with
//   name      string
//   model     {type: "vit"|"gpt", layers, heads, width, dropout, bias, layernorm_eps,
//              image_size, patch_size, channels, classes, mlp_ratio, attn_scale,  (vit)
//              vocab_size, context}                                               (gpt; vocab_size from the data)
//   data      {type: "mnist"|"char", path, mean, std, train_limit, test_limit}
//             {type: "tokens", train, val (globs), vocab_size, padded_vocab_size, format}  (train/tokens.hpp)
//   training  {batch_size, steps | epochs, optimizer: "adamw"|"adam", lr, min_lr,
//              schedule: "constant"|"cosine", warmup_steps, decay_steps, beta1, beta2, eps,
//              weight_decay, grad_clip, moments: "fp32"|"bf16" (AdamW's m and v storage), loss_scale,
//              eval_interval, eval_iters, eval_batch_size, log_interval, checkpoint_interval}
//   recipe    a canned name ("fp32", "nvfp4", ...), a recipe JSON file path, or an inline
//             recipe object (recipes/recipe.hpp: {"extends": "nvfp4", ...})
//   layers    {keep_high_precision: [layer-name patterns]}  (added to every recipe of the run)
//   layer_recipes [{layers: pattern, recipe: name | file | object}, ...]: per-layer recipes,
//             the first matching rule wins, other layers run `recipe` (train/layer_recipes.hpp)
//   eval_recipe   the recipe of every evaluation forward (absent/null: the training recipes)
//   distributed {zero: 0|1|3, primary_weights: "fp32"|"nvfp4", shard_cast: true|false, gather: "fp32"|"nvfp4",
//             reshard_after_forward: true|false (zero 3), prefetch: true|false (zero 3), reduce: "fp32"|"bf16" (the gradients' wire format,
//             train/dist/grad_reduce.hpp), timeout_s: seconds}
//             data-parallel training (train/dist/data_parallel.hpp); one process is a world of 1
//   precision {activations: "fp32"|"bf16"}: the activations' precision (train/backend.hpp's
//             contract; docs/DESIGN.md "BF16 activations"); both backends
//   seed      integer (init, data order, dropout, stochastic rounding)
//   backend   "cpu" | "cuda"
//   threads   OpenMP threads: 0 (OpenMP's default) or 1..1024
//   output    {dir: "runs", name: run directory name (default <name>-<recipe>-s<seed>;
//              <name>-<recipe>-bf16act-s<seed> under precision.activations "bf16"),
//              capture_step: at this optimiser step (0-based) every linear layer's FP32
//              operands x, w, dy are written to <run>/capture/step_<N>/<layer>.<x|w|dy>.npy,
//              numerics_interval: every N optimiser steps, each linear layer's six operands'
//              quantization statistics go to <run>/numerics.jsonl (train/numerics.hpp); 0: off}
//             name, output.name and the recipe label must make one directory name:
//             non-empty, no '/', no "..", no control characters
//   Integers out of their type's range (seed: 0..2^64-1) are errors naming the value.
//   Every numeric key has a range (train/config.cpp; docs/DESIGN.md, "Configs"): a value
//   outside it, NaN or inf is an error naming the key and the valid range, and a config
//   whose sizes need more than the host's memory fails before anything is allocated
//   (check_run_size).
// Every key is optional except model.type and data.type; unknown keys are
// errors naming the JSON path (e.g. "config.training.lr_max: unknown key; valid: ...").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/dist/grad_reduce.hpp"
#include "train/layer_recipes.hpp"
#include "train/model.hpp"
#include "train/optim.hpp"
#include "train/storage.hpp"

namespace fp4lab::train {

struct DataConfig {
  std::string type = "mnist";  // "mnist" | "char" | "tokens"
  std::string path;            // mnist: directory of the IDX files; char: the text file
  double mean = 0.1307, std = 0.3081;
  int64_t train_limit = 0, test_limit = 0;  // use only the first N examples (0 = all)
  // tokens (train/tokens.hpp): globs of llm.c shards / raw uint16 files, the tokenizer's vocabulary (every
  // token < vocab_size; GPT-2's 50257) and the model's (rows of wte / lm_head), padded_vocab_size >=
  // vocab_size (0: vocab_size; llm.c and nanoGPT use 50304). The padded ids are never inputs or targets.
  std::string train = "data/tokens/tinyshakespeare/train_*.bin", val = "data/tokens/tinyshakespeare/val_*.bin";
  std::string format = "auto";  // "auto" | "llmc" | "raw"
  int64_t vocab_size = 50257, padded_vocab_size = 0;
};

struct TrainingConfig {
  int64_t batch_size = 64;
  int64_t steps = 0;                // total optimiser steps (0: from epochs)
  double epochs = 0.0;              // mnist: steps = round(epochs * steps_per_epoch)
  std::string optimizer = "adamw";  // "adam" = AdamW with weight_decay 0 everywhere
  ScheduleConfig schedule;
  AdamWConfig adamw;
  int64_t eval_interval = 0;       // steps between evaluations (0: once per epoch for mnist, 250 for char)
  int64_t eval_iters = 20;         // char: batches per split per evaluation
  int64_t eval_batch_size = 1000;  // mnist test pass
  int64_t log_interval = 10;
  int64_t checkpoint_interval = 0;  // 0: at evaluations and at the end
  // Static loss scaling: the loss gradient is multiplied by loss_scale before
  // the backward pass and every gradient divided by it before clipping and
  // the update (exact for a power of two away from FP32's range limits). It
  // changes what the quantized backward operands see (block scales, flushes,
  // scale floors), not the FP32 optimiser arithmetic. 1 = off.
  double loss_scale = 1.0;
};

// Data-parallel training (train/dist/data_parallel.hpp).
struct DistributedConfig {
  int zero = 0;                          // 0: every rank updates every parameter; 1: ZeRO-1 shards; 3: ZeRO-3
  // The storage of the linear weights the recipe quantizes (train/param_storage.hpp states each form):
  // "fp32" (the masters), "bf16", "fp8" (Storage::fp8_e4m3) or "nvfp4" (Storage::nvfp4_2d).
  Storage primary_weights = Storage::fp32;
  bool shard_cast = true;  // low-precision storage: each rank casts only its shard (false: all, the reference)
  // The weights' wire format: not given (the storage's, i.e. its codes with shard_cast true, else "fp32"),
  // "fp32" or the storage's ("bf16", "fp8", "nvfp4"). With low-precision storage it is shard_cast said
  // differently (the codes: each rank casts its part and the codes travel; "fp32": the masters travel and
  // every rank casts them whole), so parse_distributed sets shard_cast from it and refuses the two when they
  // disagree. Kept only for the written config (config.json and the hash hold it as given); the run reads
  // primary_weights and shard_cast.
  std::optional<GatherFormat> gather;
  // ZeRO-3: what a unit's forward gather leaves for its backward. -1: the default (0 where codes travel, 1
  // otherwise); 0: kept (the gathered codes where codes travel, the gathered FP32 values with fp32); 1: dropped
  // after the forward and gathered again in the backward (less memory, more traffic).
  int reshard_after_forward = -1;
  // ZeRO-3: the next unit's gather started on entering a unit (train/dist/sharded_params.hpp). -1: the default
  // (on); 0 off; 1 on. The bits are the same either way.
  int prefetch = -1;
  double timeout_s = 600.0;              // a collective's wait for the other ranks (comm.hpp); not in the run identity
  // Expert parallelism (train/moe.hpp; DESIGN.md "Expert parallelism"): the MoE layers' experts sharded over
  // this many ranks, tokens dispatched and combined by all-to-all. 1: every rank holds every expert. For now it
  // equals the world (no data parallelism over expert replicas).
  int expert_parallel = 1;
  // How the gradients are summed over the ranks (train/dist/grad_reduce.hpp states both): FP32 (the default) or
  // each rank's gradient rounded to BF16 once, the codes sent, summed in FP32 in rank order by the receiver.
  GradReduce reduce = GradReduce::fp32;
  bool operator==(const DistributedConfig&) const = default;
};

struct RunConfig {
  std::string name = "run";
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  nlohmann::json recipe = "fp32";  // as given (name, path or object)
  std::vector<std::string> keep_high_precision;
  std::vector<LayerRecipeRule> layer_recipes;  // per-layer recipes (first match wins)
  nlohmann::json eval_recipe;                  // null: evaluation runs the training recipes
  ActivationPrecision activations = ActivationPrecision::fp32;  // precision.activations
  uint64_t seed = 1;
  std::string backend = "cpu";
  int threads = 0;
  std::string output_dir = "runs";
  std::string output_name;  // empty: <name>-<recipe name>-s<seed>
  int64_t capture_step = -1;  // output.capture_step (-1: none)
  int64_t numerics_interval = 0;  // output.numerics_interval: numerics.jsonl every N steps (train/numerics.hpp; 0: off)
  DistributedConfig distributed;
};

// "fp32" | "bf16" (config precision.activations), and back; an Error naming
// `path`, the value and the valid ones for another string.
ActivationPrecision parse_activation_precision(const std::string& path, const std::string& v);
const char* activation_precision_name(ActivationPrecision a);
// "fp32" | "bf16" (config training.moments: how AdamW stores m and v, train/backend.hpp MomentStorage), and
// back; an Error naming `path`, the value and the valid ones for another string.
MomentStorage parse_moment_storage(const std::string& path, const std::string& v);
const char* moment_storage_name(MomentStorage m);
// "fp32" | "bf16" (config distributed.reduce, train/dist/grad_reduce.hpp GradReduce), and back; an Error naming
// `path`, the value and the valid ones for another string.
GradReduce parse_grad_reduce(const std::string& path, const std::string& v);
const char* grad_reduce_name(GradReduce r);
// "fp32" | "bf16" | "fp8" | "nvfp4" (config distributed.gather; train/storage.hpp GatherFormat; back:
// gather_format_name) and the same names as a Storage (distributed.primary_weights; back:
// primary_weights_name); an Error naming `path`, the value and the valid ones for another string.
GatherFormat parse_gather_format(const std::string& path, const std::string& v);
Storage parse_primary_weights(const std::string& path, const std::string& v);

// Parses and validates; `where` prefixes error paths.
RunConfig config_from_json(const nlohmann::json& j, const std::string& where = "config");
// The host's physical memory in bytes (sysconf; 2^64-1 where unknown).
uint64_t physical_memory_bytes();
// Throws an Error when parameters, gradients and AdamW moments plus one
// training step's activations and logits (vit: input images), a lower bound in
// overflow-checked 64-bit arithmetic, exceed `available` bytes. The message
// names the bytes needed and available, the largest part and the keys driving
// it. config_from_json calls it with physical_memory_bytes() (the host's
// memory also for the cuda backend) before anything is allocated.
void check_run_size(const RunConfig& c, uint64_t available, const std::string& where = "config");
// One-line warnings about a valid config that likely does not do what was
// meant, given the run's total steps (e.g. warmup_steps >= steps: the learning
// rate never reaches its set value).
std::vector<std::string> config_warnings(const RunConfig& c, int64_t total_steps, const std::string& where = "config");
// The resolved config (every field, defaults included; recipe as given).
nlohmann::json config_to_json(const RunConfig& c);
// The part of a resolved config (config_to_json + "recipe_resolved") that
// identifies a run: all but "threads", "output" (where the run lives) and
// "distributed.timeout_s" (how long ranks wait, not what they compute);
// without data_loaded, model.vocab_size (set from the data) is left out too.
nlohmann::json run_identity(nlohmann::json resolved, bool data_loaded = true);
// "training.lr 0.001 -> 0.01, ..." (at most 5, then "and N more"): where two
// run identities differ, the config's keys first, recipe_resolved's only when
// those agree; "" when equal.
std::string config_difference(nlohmann::json saved, nlohmann::json resolved);
// FNV-1a 64 of text, 16 lower-case hex digits (the one hash of run and recipe identities).
std::string fnv1a64_hex(std::string_view text);
// fnv1a64_hex(run_identity(resolved).dump()) (summary.json's and the checkpoint's config_hash).
std::string config_hash(const nlohmann::json& resolved);
// Reads a JSON file (errors name the file and the parse position).
nlohmann::json read_json_file(const std::string& path);
// Applies "a.b.c=value" to j: value parsed as JSON when it is valid JSON,
// else taken as a string. Intermediate objects are created; a path through a
// non-object is an error.
void apply_set(nlohmann::json& j, const std::string& assignment);

// The recipe of a config, with its layers.keep_high_precision patterns added.
Recipe resolve_recipe(const RunConfig& c);
// Short name of the config's recipe (canned name, file stem or inline "name").
std::string recipe_label(const RunConfig& c);
std::string run_directory(const RunConfig& c);

}  // namespace fp4lab::train
