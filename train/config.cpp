#include "train/config.hpp"
#include "train/tokens.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "core/error.hpp"
#include "core/json.hpp"
#include "train/attention_flash.hpp"
#include "train/route.hpp"

namespace fp4lab::train {

using nlohmann::json;

namespace {

// A string holding an integer literal: what apply_set makes of an integer
// that JSON's 64-bit integers cannot hold (so an error can name it as given).
bool is_integer_literal(const json& v) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  const size_t d = !s.empty() && s[0] == '-';
  return s.size() > d && s.find_first_not_of("0123456789", d) == std::string::npos;
}

// An integer key's value must fit T: "PATH: V is out of range; valid: an integer in MIN..MAX".
// A negative value for an unsigned key, or an integer beyond T (also a whole
// number written as a float, e.g. 1e20), is out of range, never clamped or wrapped.
template <class T>
void check_integer_range(const std::string& path, const json& v) {
  using L = std::numeric_limits<T>;
  bool out = is_integer_literal(v);
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>() > uint64_t(L::max());
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    out = x < int64_t(L::min()) || (x > 0 && uint64_t(x) > uint64_t(L::max()));
  } else if (v.is_number_float()) {
    const double x = v.get<double>(), end = 2.0 * double(L::max() / 2 + 1);  // L::max() + 1, exactly
    out = std::isfinite(x) && x == std::floor(x) && (x < double(L::min()) || x >= end);
  }
  if (out)
    throw Error(path + ": " + (v.is_string() ? text_excerpt(v.get<std::string>()) : json_excerpt(v)) +
                " is out of range; valid: an integer in " + std::to_string(L::min()) + ".." + std::to_string(L::max()));
}

// Strict reader of one JSON object: typed getters, then finish() rejects any
// key that was not asked for.
class Obj {
 public:
  Obj(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j.is_object()) throw Error(where_ + ": expected a JSON object, got " + std::string(j.type_name()));
  }
  template <class T>
  void get(const char* key, T& out) {
    known_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return;
    const std::string path = where_ + "." + key;
    try {
      if constexpr (std::is_same_v<T, bool>) {
        if (!it->is_boolean()) throw 0;
      } else if constexpr (std::is_integral_v<T>) {
        check_integer_range<T>(path, *it);
        if (!it->is_number_integer()) throw 0;
      } else if constexpr (std::is_floating_point_v<T>) {
        if (is_integer_literal(*it)) {  // an integer too large for JSON's integers (apply_set)
          // strtod, not stod: 400 digits become inf (a range error naming the key), not std::out_of_range.
          out = T(std::strtod(it->template get_ref<const std::string&>().c_str(), nullptr));
          return;
        }
        if (!it->is_number()) throw 0;
      } else if constexpr (std::is_same_v<T, std::string>) {
        if (!it->is_string()) throw 0;
      }
      out = it->template get<T>();
    } catch (int) {
      throw Error(path + ": " + json_excerpt(*it) + " has the wrong type; expected " + type_of<T>());
    }
  }
  void get_json(const char* key, json& out) {
    known_.insert(key);
    auto it = j_.find(key);
    if (it != j_.end()) out = *it;
  }
  const json* sub(const char* key) {
    known_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it)
      if (!known_.count(it.key())) {
        std::string valid;
        for (const auto& k : known_) valid += (valid.empty() ? "" : ", ") + k;
        throw Error(where_ + "." + it.key() + ": unknown key; valid keys here: " + valid);
      }
  }
  const std::string& where() const { return where_; }

 private:
  template <class T>
  static const char* type_of() {
    if constexpr (std::is_same_v<T, bool>)
      return "true or false";
    else if constexpr (std::is_unsigned_v<T>)
      return "a non-negative integer";
    else if constexpr (std::is_integral_v<T>)
      return "an integer";
    else if constexpr (std::is_floating_point_v<T>)
      return "a number";
    else
      return "a string";
  }
  const json& j_;
  std::string where_;
  std::set<std::string> known_;
};

void check_choice(const std::string& path, const std::string& v, std::initializer_list<const char*> valid) {
  std::string all;
  for (const char* c : valid) {
    if (v == c) return;
    all += (all.empty() ? "" : ", ") + std::string(c);
  }
  throw Error(path + ": \"" + text_excerpt(v) + "\" is not valid; valid: " + all);
}

// Upper ends of the model's sizes: generous for this trainer (GPT-3 has 96
// layers of width 12288), small enough that products of a few of them cannot
// overflow 64 bits before check_run_size compares them with the memory.
constexpr double kMaxLayers = 1024, kMaxWidth = 65536, kMaxExperts = double(kMaxRouteExperts), kMaxImageSize = 4096,
                 kMaxClasses = 65536, kMaxMlpRatio = 64, kMaxContext = 65536, kMaxVocab = 1 << 24, kMaxTopK = 64;
// Upper ends of the training's counts: a batch of 2^24 samples, 10^12 steps, 10^6 evaluation batches.
constexpr double kMaxBatch = 1 << 24, kMaxSteps = 1e12, kMaxEvalIters = 1e6, kMaxEpochs = 1e6;

// The valid values of a numeric key: lo..hi, an end excluded where it is open
// (integers: lo..hi inclusive). NaN and +-inf are never valid: "lr": 1e999
// parses as inf, and a run on it would "complete" with NaN losses.
struct Range {
  double lo, hi;
  bool lo_open = false, hi_open = false;
};
constexpr double kInf = std::numeric_limits<double>::infinity();

// A number for a message: up to 10 significant digits ("0.001", "1e+20", "inf").
std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.10g", v);
  return b;
}

// "PATH: V is out of range; valid: an integer in 1..1024" (or "a finite number
// in [0, 1)", "a finite number > 0"), then `note` if any.
template <class T>
void check_range(const std::string& path, T v, Range r, const std::string& note = "") {
  const double x = double(v);
  const bool ok = std::isfinite(x) && (r.lo_open ? x > r.lo : x >= r.lo) && (r.hi_open ? x < r.hi : x <= r.hi);
  if (ok) return;
  std::string valid;
  if constexpr (std::is_integral_v<T>) {
    valid = r.hi == kInf ? "an integer >= " + num(r.lo) : "an integer in " + num(r.lo) + ".." + num(r.hi);
  } else if (r.hi == kInf) {
    valid = std::string("a finite number ") + (r.lo_open ? "> " : ">= ") + num(r.lo);
  } else {
    valid = std::string("a finite number in ") + (r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) +
            (r.hi_open ? ")" : "]");
  }
  std::string shown = num(x);
  if constexpr (std::is_integral_v<T>) shown = std::to_string(v);
  throw Error(path + ": " + shown + " is out of range; valid: " + valid + (note.empty() ? "" : " (" + note + ")"));
}

// config.model.moe (gpt only): a mixture of experts in every block's MLP.
void parse_moe(const json& m, const std::string& where, int64_t width, MoeConfig& c) {
  Obj o(m, where);
  o.get("experts", c.experts);
  o.get("top_k", c.top_k);
  o.get("expert_hidden", c.expert_hidden);
  o.get("shared_expert", c.shared_expert);
  o.get("normalize_top_k", c.normalize_top_k);
  o.get("aux_loss", c.aux_loss);
  o.get("z_loss", c.z_loss);
  o.get("quantize_router", c.quantize_router);
  std::string dispatch = "dropless";
  o.get("dispatch", dispatch);
  check_choice(where + ".dispatch", dispatch, {"dropless", "capacity"});
  c.dispatch = dispatch == "capacity" ? MoeConfig::Dispatch::capacity : MoeConfig::Dispatch::dropless;
  o.get("capacity_factor", c.capacity_factor);
  std::string cast = "none";
  o.get("dispatch_cast", cast);
  check_choice(where + ".dispatch_cast", cast, {"none", "mxfp8"});
  c.dispatch_cast = cast == "mxfp8" ? MoeConfig::DispatchCast::mxfp8 : MoeConfig::DispatchCast::none;
  o.finish();
  if (!m.contains("experts"))
    throw Error(where + ": no \"experts\" key: a mixture of experts needs model.moe.experts (1 to " +
                std::to_string(int64_t(kMaxExperts)) + "); without model.moe the MLP is dense");
  check_range(where + ".experts", c.experts, {1, kMaxExperts});
  // top_k: routing picks each token's experts one by one (train/moe.cpp, O(top_k^2 experts) a token).
  check_range(where + ".top_k", c.top_k, {1, std::min(double(c.experts), kMaxTopK)}, "at most experts and 64");
  check_range(where + ".expert_hidden", c.expert_hidden, {0, kMaxWidth}, "0: 4 * width / top_k");
  if (c.expert_hidden == 0 && (4 * width) % c.top_k != 0)
    throw Error(where + ".expert_hidden: 0 (4 * width / top_k) needs top_k to divide 4 * width = " +
                std::to_string(4 * width) + "; give expert_hidden");
  check_range(where + ".aux_loss", c.aux_loss, {0, kInf});
  check_range(where + ".z_loss", c.z_loss, {0, kInf});
  // Above experts / top_k every slot fits (capacity >= tokens); the bound keeps the grouped tensor's size sane.
  check_range(where + ".capacity_factor", c.capacity_factor, {0, double(c.experts), true},
              "capacity dispatch's rows an expert over N k / E; at most experts");
}

// config.model: the defaults of its type, then the given keys, then checks.
void parse_model(const json& m, const std::string& where, ModelConfig& mc) {
  Obj mo(m, where + ".model");
  mo.get("type", mc.type);
  check_choice(where + ".model.type", mc.type, {"vit", "gpt"});
  if (mc.type == "vit") {
    mc.layers = 1, mc.heads = 4, mc.width = 64, mc.dropout = 0.1, mc.bias = true;
    mc.attn_scale = "sqrt_head_dim";
  } else {
    mc.layers = 4, mc.heads = 4, mc.width = 128, mc.dropout = 0.0, mc.bias = false;
  }
  mo.get("layers", mc.layers);
  mo.get("heads", mc.heads);
  mo.get("width", mc.width);
  mo.get("dropout", mc.dropout);
  mo.get("bias", mc.bias);
  mo.get("layernorm_eps", mc.layernorm_eps);
  std::string attention;  // "" = not given: the default below, once width and heads are known
  mo.get("attention", attention);
  if (!attention.empty()) check_choice(where + ".model.attention", attention, {"fp32", "bf16_flash"});
  mc.attention = attention == "bf16_flash" ? ModelConfig::Attention::bf16_flash : ModelConfig::Attention::fp32;
  if (mc.type == "vit") {
    mo.get("image_size", mc.image_size);
    mo.get("patch_size", mc.patch_size);
    mo.get("channels", mc.channels);
    mo.get("classes", mc.classes);
    mo.get("mlp_ratio", mc.mlp_ratio);
    mo.get("attn_scale", mc.attn_scale);
    check_choice(where + ".model.attn_scale", mc.attn_scale, {"inv_sqrt_head_dim", "sqrt_head_dim"});
  } else {
    mo.get("context", mc.context);
    mo.get("vocab_size", mc.vocab_size);
  }
  const json* moe = mc.type == "gpt" ? mo.sub("moe") : nullptr;
  mo.finish();
  // Each key's own range first, so that the checks between keys below never
  // divide by zero or overflow; the memory the sizes need is checked later
  // (check_run_size), with the batch.
  const std::string mp = where + ".model.";
  check_range(mp + "layers", mc.layers, {1, kMaxLayers});
  check_range(mp + "width", mc.width, {1, kMaxWidth});
  check_range(mp + "heads", mc.heads, {1, double(mc.width)}, "at most width, and a divisor of it");
  check_range(mp + "dropout", mc.dropout, {0, 1, false, true});
  check_range(mp + "layernorm_eps", mc.layernorm_eps, {0, 1, true, false});
  if (mc.type == "vit") {
    check_range(mp + "image_size", mc.image_size, {1, kMaxImageSize}, "MNIST's is 28");
    check_range(mp + "patch_size", mc.patch_size, {1, double(mc.image_size)}, "a divisor of image_size");
    check_range(mp + "channels", mc.channels, {1, 1}, "MNIST images are grayscale");
    check_range(mp + "classes", mc.classes, {10, kMaxClasses}, "MNIST's labels are 0..9");
    check_range(mp + "mlp_ratio", mc.mlp_ratio, {0, kMaxMlpRatio, true, false});
    if (int64_t(double(mc.width) * mc.mlp_ratio) < 1)
      throw Error(mp + "mlp_ratio: " + num(mc.mlp_ratio) + " x width " + std::to_string(mc.width) +
                  " leaves an MLP of no units; valid: at least 1 / width");
  } else {
    check_range(mp + "context", mc.context, {1, kMaxContext});
    check_range(mp + "vocab_size", mc.vocab_size, {1, kMaxVocab}, "char data sets it from the text");
    if (moe) parse_moe(*moe, where + ".model.moe", mc.width, mc.moe);
  }
  if (mc.width % mc.heads != 0)
    throw Error(where + ".model.width: " + std::to_string(mc.width) + " is not a multiple of heads (" +
                std::to_string(mc.heads) + ")");
  if (attention.empty() && mc.type == "gpt" && flash_head_dim_ok(mc.width / mc.heads))
    mc.attention = ModelConfig::Attention::bf16_flash;  // the default (model.hpp states where and why)
  if (mc.attention == ModelConfig::Attention::bf16_flash) {
    const int64_t hd = mc.width / mc.heads;
    if (!flash_head_dim_ok(hd))
      throw Error(where + ".model.attention: \"bf16_flash\" takes head dims 16, 32, 64 or 128, not " +
                  std::to_string(hd) + " (width " + std::to_string(mc.width) + " / heads " + std::to_string(mc.heads) +
                  ")");
  }
  if (mc.type == "vit" && mc.image_size % mc.patch_size != 0)
    throw Error(where + ".model.patch_size: " + std::to_string(mc.patch_size) + " must divide image_size " +
                std::to_string(mc.image_size));
}

// config.data, which must fit the model type.
void parse_data(const json& d, const std::string& where, const std::string& model_type, DataConfig& dc) {
  Obj dobj(d, where + ".data");
  dobj.get("type", dc.type);
  check_choice(where + ".data.type", dc.type, {"mnist", "char", "tokens"});
  if (dc.type == "tokens")  // its keys and checks: train/tokens.hpp
    return parse_token_config([&](const char* k, auto& v) { dobj.get(k, v); }, [&] { dobj.finish(); }, where,
                              model_type, dc);
  dc.path = dc.type == "mnist" ? "data/mnist" : "data/tinyshakespeare.txt";  // where scripts/get_*.sh put them
  dobj.get("path", dc.path);
  dobj.get("mean", dc.mean);
  dobj.get("std", dc.std);
  dobj.get("train_limit", dc.train_limit);
  dobj.get("test_limit", dc.test_limit);
  dobj.finish();
  if (dc.path.empty())
    throw Error(where + ".data.path: empty; valid: the " +
                std::string(dc.type == "mnist" ? "directory of the MNIST IDX files" : "text file"));
  check_range(where + ".data.mean", dc.mean, {-kInf, kInf});
  check_range(where + ".data.std", dc.std, {0, kInf, true, false}, "images are (x - mean) / std");
  check_range(where + ".data.train_limit", dc.train_limit, {0, kInf}, "0: all");
  check_range(where + ".data.test_limit", dc.test_limit, {0, kInf}, "0: all");
  if ((dc.type == "mnist") != (model_type == "vit"))
    throw Error(where + ".data.type: \"" + dc.type + "\" does not fit model.type \"" + model_type +
                "\" (vit trains on mnist, gpt on char or tokens)");
}

// The training defaults of a model type (nanoGPT's baby GPT; fp4-trainkit's ViT).
TrainingConfig training_defaults(const std::string& model_type) {
  TrainingConfig t;
  if (model_type == "gpt") {
    t.batch_size = 12, t.steps = 2000, t.schedule = ScheduleConfig{"cosine", 1e-3, 1e-4, 100, 0};
    t.adamw = AdamWConfig{0.9, 0.99, 1e-8, 0.1, 1.0};
    t.eval_interval = 250;
  } else {
    t.batch_size = 64, t.epochs = 5, t.optimizer = "adam", t.schedule = ScheduleConfig{"constant", 1e-3, 0.0, 0, 0};
    t.adamw = AdamWConfig{0.9, 0.999, 1e-8, 0.0, 0.0};
  }
  return t;
}

// The keys of config.training given in tj over t.
void read_training(const json& tj, const std::string& where, TrainingConfig& t) {
  Obj to(tj, where + ".training");
  to.get("batch_size", t.batch_size);
  to.get("steps", t.steps);
  to.get("epochs", t.epochs);
  if (tj.contains("epochs") && !tj.contains("steps")) t.steps = 0;
  to.get("optimizer", t.optimizer);
  check_choice(where + ".training.optimizer", t.optimizer, {"adamw", "adam"});
  to.get("lr", t.schedule.lr);
  to.get("min_lr", t.schedule.min_lr);
  to.get("schedule", t.schedule.kind);
  check_choice(where + ".training.schedule", t.schedule.kind, {"constant", "cosine"});
  to.get("warmup_steps", t.schedule.warmup_steps);
  to.get("decay_steps", t.schedule.decay_steps);
  to.get("beta1", t.adamw.beta1);
  to.get("beta2", t.adamw.beta2);
  to.get("eps", t.adamw.eps);
  to.get("weight_decay", t.adamw.weight_decay);
  to.get("grad_clip", t.adamw.grad_clip);
  std::string moments = moment_storage_name(t.adamw.moments);
  to.get("moments", moments);
  t.adamw.moments = parse_moment_storage(where + ".training.moments", moments);
  to.get("loss_scale", t.loss_scale);
  to.get("eval_interval", t.eval_interval);
  to.get("eval_iters", t.eval_iters);
  to.get("eval_batch_size", t.eval_batch_size);
  to.get("log_interval", t.log_interval);
  to.get("checkpoint_interval", t.checkpoint_interval);
  to.finish();
}

void check_training(const TrainingConfig& t, const std::string& where, const std::string& data_type) {
  if (t.optimizer == "adam" && t.adamw.weight_decay != 0.0)
    throw Error(where + ".training.weight_decay: " + std::to_string(t.adamw.weight_decay) +
                " with optimizer \"adam\" (plain Adam has no decoupled decay); use optimizer \"adamw\"");
  const std::string tp = where + ".training.";
  check_range(tp + "batch_size", t.batch_size, {1, kMaxBatch});
  check_range(tp + "steps", t.steps, {0, kMaxSteps}, "0: from epochs");
  check_range(tp + "epochs", t.epochs, {0, kMaxEpochs});
  if (t.steps == 0 && t.epochs == 0)
    throw Error(where + ".training: give a positive \"steps\" (or \"epochs\" for mnist)");
  if (t.epochs > 0 && data_type != "mnist" && t.steps == 0)
    throw Error(where + ".training.epochs: only for mnist; give \"steps\" for char data");
  check_range(tp + "lr", t.schedule.lr, {0, kInf, true, false});
  check_range(tp + "min_lr", t.schedule.min_lr, {0, kInf}, "the cosine schedule's floor");
  check_range(tp + "warmup_steps", t.schedule.warmup_steps, {0, kMaxSteps});
  check_range(tp + "decay_steps", t.schedule.decay_steps, {0, kMaxSteps}, "0: the run's steps");
  check_range(tp + "beta1", t.adamw.beta1, {0, 1, false, true});
  check_range(tp + "beta2", t.adamw.beta2, {0, 1, false, true});
  check_range(tp + "eps", t.adamw.eps, {0, 1, true, false}, "AdamW's denominator term");
  check_range(tp + "weight_decay", t.adamw.weight_decay, {0, kInf});
  check_range(tp + "grad_clip", t.adamw.grad_clip, {0, kInf}, "0: off");
  // float: the factor multiplies FP32 gradients, so it must be a finite float too.
  check_range(tp + "loss_scale", t.loss_scale, {0, 1e30, true, false},
              "a power of two keeps the scaling exact; 1 = off");
  check_range(tp + "eval_interval", t.eval_interval, {0, kMaxSteps}, "0: the model type's default");
  check_range(tp + "eval_iters", t.eval_iters, {1, kMaxEvalIters});
  check_range(tp + "eval_batch_size", t.eval_batch_size, {1, kMaxBatch});
  check_range(tp + "log_interval", t.log_interval, {1, kMaxSteps});
  check_range(tp + "checkpoint_interval", t.checkpoint_interval, {0, kMaxSteps}, "0: at evaluations");
}

// config.layers.keep_high_precision: an array of name patterns.
void parse_layers(const json& l, const std::string& where, std::vector<std::string>& keep) {
  Obj lo(l, where + ".layers");
  json k;
  lo.get_json("keep_high_precision", k);
  lo.finish();
  if (k.is_null()) return;
  if (!k.is_array()) throw Error(where + ".layers.keep_high_precision: expected an array of name patterns");
  for (size_t i = 0; i < k.size(); ++i) {
    if (!k[i].is_string())
      throw Error(where + ".layers.keep_high_precision[" + std::to_string(i) + "]: expected a string pattern");
    keep.push_back(k[i].get<std::string>());
  }
}

// distributed.gather against primary_weights and shard_cast (config.hpp DistributedConfig::gather); with
// low-precision storage it sets shard_cast.
void parse_gather(const json& d, const std::string& where, DistributedConfig& c) {
  if (!c.gather) return;
  const GatherFormat own = gather_format_of(c.primary_weights);
  const std::string g = gather_format_name(*c.gather), pw = primary_weights_name(c.primary_weights);
  if (*c.gather != GatherFormat::fp32 && *c.gather != own)
    throw Error(where + ".gather: \"" + g + "\" needs " + where + ".primary_weights \"" + g +
                "\" (the weights travel as their stored cast); valid with primary_weights " + pw + ": \"fp32\"" +
                (own == GatherFormat::fp32 ? "" : ", \"" + pw + "\""));
  if (c.primary_weights == Storage::fp32) return;
  const bool codes = *c.gather == own;
  if (d.contains("shard_cast") && !d["shard_cast"].is_null() && c.shard_cast != codes)
    throw Error(where + ".gather \"" + g + "\" and " + where + ".shard_cast " + (c.shard_cast ? "true" : "false") +
                " disagree (with " + pw + " primary weights gather " + pw +
                " is shard_cast true: each rank casts its part and the codes travel; gather fp32 is shard_cast "
                "false); give one of them");
  c.shard_cast = codes;
}

void parse_distributed(const json& d, const std::string& where, DistributedConfig& c) {
  Obj o(d, where + ".distributed");
  o.get("zero", c.zero);
  std::string primary = primary_weights_name(c.primary_weights), gather;
  o.get("primary_weights", primary);
  o.get("shard_cast", c.shard_cast);
  o.get("gather", gather);
  for (auto [key, to] : {std::pair{"reshard_after_forward", &c.reshard_after_forward}, {"prefetch", &c.prefetch}})
    if (bool v = false; o.get(key, v), d.contains(key) && !d[key].is_null()) *to = v;  // else -1: not given
  o.get("timeout_s", c.timeout_s);
  o.get("expert_parallel", c.expert_parallel);
  std::string reduce = grad_reduce_name(c.reduce);
  o.get("reduce", reduce);
  o.finish();
  c.reduce = parse_grad_reduce(where + ".distributed.reduce", reduce);
  if (!(c.timeout_s > 0) || !std::isfinite(c.timeout_s))
    throw Error(where + ".distributed.timeout_s: " + std::to_string(c.timeout_s) +
                " must be a positive finite number of seconds (a collective's wait for the other ranks)");
  if (c.zero == 2) throw Error(where + ".distributed.zero: 2 is not built; valid: 0, 1 (ZeRO-1), 3 (ZeRO-3)");
  check_range(where + ".distributed.zero", c.zero, {0, 3}, "1: ZeRO-1, 3: ZeRO-3");
  c.primary_weights = parse_primary_weights(where + ".distributed.primary_weights", primary);
  if (d.contains("gather") && !d["gather"].is_null()) c.gather = parse_gather_format(where + ".distributed.gather", gather);
  parse_gather(d, where + ".distributed", c);
  check_range(where + ".distributed.expert_parallel", c.expert_parallel, {1, int(kMaxRouteExperts)},
              "ranks sharing the experts; 1: none");
}

// distributed.zero 3 and expert_parallel against the rest of the config (the world is checked by the run).
void check_expert_parallel(const RunConfig& c, const std::string& where) {
  const std::string z3 = where + ".distributed.zero 3 (ZeRO-3) ";
  for (auto [key, v] : {std::pair{"reshard_after_forward", c.distributed.reshard_after_forward},
                        {"prefetch", c.distributed.prefetch}})
    if (c.distributed.zero != 3 && v >= 0)
      throw Error(where + ".distributed." + key + ": only with distributed.zero 3 (ZeRO-3), not zero " +
                  std::to_string(c.distributed.zero));
  if (c.distributed.zero == 3 && (c.distributed.expert_parallel != 1 || c.capture_step >= 0 || c.numerics_interval > 0))
    throw Error(z3 + "with expert_parallel, output.capture_step or output.numerics_interval is not built yet");
  const int R = c.distributed.expert_parallel;
  if (R == 1) return;
  const std::string key = where + ".distributed.expert_parallel " + std::to_string(R);
  if (c.model.moe.experts == 0) throw Error(key + " needs a mixture-of-experts model (model.moe.experts > 0)");
  if (c.model.moe.experts % R != 0)
    throw Error(where + ".model.moe.experts " + std::to_string(c.model.moe.experts) + " is not a multiple of " +
                key.substr(where.size() + 1) + ": every rank holds the same number of experts");
  if (c.training.batch_size % R != 0)
    throw Error(key + ": training.batch_size " + std::to_string(c.training.batch_size) +
                " leaves unequal shares over the ranks (an expert's gradient mixes every rank's tokens at one "
                "weight); use a multiple of " +
                std::to_string(R));
  if (c.distributed.primary_weights != Storage::fp32)
    throw Error(key + ": distributed.primary_weights " + std::string(primary_weights_name(c.distributed.primary_weights)) +
                " with expert parallelism is not built yet (plan step 10); use fp32");
  if (c.capture_step >= 0 || c.numerics_interval > 0)
    throw Error(key +
                ": output.capture_step and output.numerics_interval record rank 0's layers only, which "
                "hold a part of the experts; not built yet with expert parallelism (plan step 10)");
}

void parse_output(const json& out, const std::string& where, RunConfig& c) {
  Obj oo(out, where + ".output");
  oo.get("dir", c.output_dir);
  oo.get("name", c.output_name);
  oo.get("capture_step", c.capture_step);
  oo.get("numerics_interval", c.numerics_interval);
  oo.finish();
  check_range(where + ".output.capture_step", c.capture_step, {-1, kMaxSteps}, "a training step; -1: none");
  check_range(where + ".output.numerics_interval", c.numerics_interval, {0, kMaxSteps}, "steps; 0: off");
  if (c.output_dir.empty()) throw Error(where + ".output.dir: empty; valid: a directory path (default \"runs\")");
  // A file in its place would surface later as a bare "filesystem error" from creating the run directory.
  std::error_code ec;
  if (std::filesystem::exists(c.output_dir, ec) && !std::filesystem::is_directory(c.output_dir, ec))
    throw Error(where + ".output.dir: " + text_excerpt(c.output_dir) +
                " exists and is not a directory; valid: a directory path (created if missing)");
}

// config.precision: {activations}.
void parse_precision(const json& pj, const std::string& where, RunConfig& c) {
  Obj o(pj, where + ".precision");
  std::string a = activation_precision_name(c.activations);
  o.get("activations", a);
  o.finish();
  c.activations = parse_activation_precision(where + ".precision.activations", a);
}

// A name that becomes (part of) one directory name under output.dir: not
// empty, no '/', no "..", no control characters.
void check_dir_name(const std::string& path, const std::string& v, const char* what) {
  bool bad = v.empty() || v.find('/') != std::string::npos || v.find("..") != std::string::npos;
  for (unsigned char ch : v) bad = bad || ch < 0x20 || ch == 0x7f;
  if (bad)
    throw Error(path + ": \"" + text_excerpt(v) + "\" cannot name a run directory; valid: a non-empty " + what +
                " without '/', \"..\" or control characters, e.g. \"gpt_baby\"");
}

// threads: 0 (OpenMP's default) or 1..kMaxThreads, the same bound on every machine.
constexpr int kMaxThreads = 1024;

}  // namespace

ActivationPrecision parse_activation_precision(const std::string& path, const std::string& v) {
  check_choice(path, v, {"fp32", "bf16"});
  return v == "bf16" ? ActivationPrecision::bf16 : ActivationPrecision::fp32;
}

const char* activation_precision_name(ActivationPrecision a) {
  return a == ActivationPrecision::bf16 ? "bf16" : "fp32";
}

MomentStorage parse_moment_storage(const std::string& path, const std::string& v) {
  check_choice(path, v, {"fp32", "bf16"});
  return v == "bf16" ? MomentStorage::bf16 : MomentStorage::fp32;
}

const char* moment_storage_name(MomentStorage m) { return m == MomentStorage::bf16 ? "bf16" : "fp32"; }

GatherFormat parse_gather_format(const std::string& path, const std::string& v) {
  check_choice(path, v, {"fp32", "bf16", "fp8", "nvfp4"});
  for (GatherFormat g : {GatherFormat::fp32, GatherFormat::bf16, GatherFormat::fp8, GatherFormat::nvfp4})
    if (v == gather_format_name(g)) return g;
  throw InternalError("parse_gather_format: " + v);
}

Storage parse_primary_weights(const std::string& path, const std::string& v) {
  check_choice(path, v, {"fp32", "bf16", "fp8", "nvfp4"});
  for (Storage s : {Storage::fp32, Storage::bf16, Storage::fp8_e4m3, Storage::nvfp4_2d})
    if (v == primary_weights_name(s)) return s;
  throw InternalError("parse_primary_weights: " + v);
}

GradReduce parse_grad_reduce(const std::string& path, const std::string& v) {
  check_choice(path, v, {"fp32", "bf16"});
  return v == "bf16" ? GradReduce::bf16 : GradReduce::fp32;
}

const char* grad_reduce_name(GradReduce r) { return r == GradReduce::bf16 ? "bf16" : "fp32"; }

RunConfig config_from_json(const json& j, const std::string& where) {
  RunConfig c;
  Obj o(j, where);
  o.get("name", c.name);
  o.get("seed", c.seed);
  o.get("backend", c.backend);
  check_choice(where + ".backend", c.backend, {"cpu", "cuda"});
  o.get("threads", c.threads);
  if (c.threads < 0 || c.threads > kMaxThreads)
    throw Error(where + ".threads: " + std::to_string(c.threads) + " is not valid; valid: 0 (OpenMP's default) or 1.." +
                std::to_string(kMaxThreads));
  check_dir_name(where + ".name", c.name, "name");
  o.get_json("recipe", c.recipe);
  if (!c.recipe.is_string() && !c.recipe.is_object())
    throw Error(where + ".recipe: expected a recipe name, a recipe file path or an inline recipe object");

  const json* m = o.sub("model");
  if (!m) throw Error(where + ".model: missing (an object with at least \"type\": \"vit\" or \"gpt\")");
  parse_model(*m, where, c.model);
  const json* d = o.sub("data");
  if (!d) throw Error(where + ".data: missing (an object with \"type\": \"mnist\" or \"char\" and \"path\")");
  parse_data(*d, where, c.model.type, c.data);
  c.training = training_defaults(c.model.type);
  if (const json* tj = o.sub("training")) read_training(*tj, where, c.training);
  check_training(c.training, where, c.data.type);
  if (const json* l = o.sub("layers")) parse_layers(*l, where, c.keep_high_precision);
  if (const json* lr = o.sub("layer_recipes")) c.layer_recipes = parse_layer_recipes(*lr, where + ".layer_recipes");
  o.get_json("eval_recipe", c.eval_recipe);
  if (const json* out = o.sub("output")) parse_output(*out, where, c);
  if (const json* dj = o.sub("distributed")) parse_distributed(*dj, where, c.distributed);
  if (const json* pj = o.sub("precision")) parse_precision(*pj, where, c);
  o.finish();
  check_expert_parallel(c, where);
  // Check the recipe resolves now, so a typo fails before any work.
  try {
    resolve_recipe(c);
  } catch (const Error& e) {
    throw Error(where + ".recipe: " + e.what());
  }
  check_layer_recipes(c, where);  // layer_recipes and eval_recipe against the model's layers
  // The run directory's name: output.name, or <name>-<recipe label>-s<seed>.
  if (!c.output_name.empty())
    check_dir_name(where + ".output.name", c.output_name, "name");
  else
    check_dir_name(where + ".recipe", recipe_label(c), "recipe name (it names the run directory)");
  // Last: every size is in its range, so the estimate's products stay small.
  check_run_size(c, physical_memory_bytes(), where);
  return c;
}

std::vector<std::string> config_warnings(const RunConfig& c, int64_t total_steps, const std::string& where) {
  std::vector<std::string> w;
  const ScheduleConfig& s = c.training.schedule;
  if (s.warmup_steps >= total_steps) {
    char b[320];
    std::snprintf(b, sizeof b,
                  "warning: %s.training.warmup_steps %lld >= the run's %lld steps: the learning rate never reaches "
                  "its set value %g (it peaks at %g)",
                  where.c_str(), (long long)s.warmup_steps, (long long)total_steps, s.lr,
                  s.lr * double(total_steps) / double(s.warmup_steps + 1));
    w.push_back(b);
  }
  return w;
}

json config_to_json(const RunConfig& c) {
  const ModelConfig& m = c.model;
  json model = {{"type", m.type},
                {"layers", m.layers},
                {"heads", m.heads},
                {"width", m.width},
                {"dropout", m.dropout},
                {"bias", m.bias},
                {"layernorm_eps", m.layernorm_eps}};
  // Written always (its default depends on the model); run_identity drops "fp32", the value of a run
  // written before the key existed, so that those runs keep their identity.
  model["attention"] = m.attention == ModelConfig::Attention::bf16_flash ? "bf16_flash" : "fp32";
  if (m.type == "vit") {
    model.update({{"image_size", m.image_size},
                  {"patch_size", m.patch_size},
                  {"channels", m.channels},
                  {"classes", m.classes},
                  {"mlp_ratio", m.mlp_ratio},
                  {"attn_scale", m.attn_scale}});
  } else {
    model.update({{"context", m.context}, {"vocab_size", m.vocab_size}});
    if (m.moe.experts > 0)
      model["moe"] = {{"experts", m.moe.experts},
                      {"top_k", m.moe.top_k},
                      {"expert_hidden", m.moe.expert_hidden},
                      {"shared_expert", m.moe.shared_expert},
                      {"normalize_top_k", m.moe.normalize_top_k},
                      {"aux_loss", m.moe.aux_loss},
                      {"z_loss", m.moe.z_loss},
                      {"quantize_router", m.moe.quantize_router}};
    if (m.moe.experts > 0 && m.moe.dispatch == MoeConfig::Dispatch::capacity) {  // only when set: hashes stay
      model["moe"]["dispatch"] = "capacity";
      model["moe"]["capacity_factor"] = m.moe.capacity_factor;
    }
    if (m.moe.experts > 0 && m.moe.dispatch_cast == MoeConfig::DispatchCast::mxfp8) {  // only when set
      model["moe"]["dispatch_cast"] = "mxfp8";
    }
  }
  const TrainingConfig& t = c.training;
  json training = {{"batch_size", t.batch_size},
                   {"steps", t.steps},
                   {"epochs", t.epochs},
                   {"optimizer", t.optimizer},
                   {"lr", t.schedule.lr},
                   {"min_lr", t.schedule.min_lr},
                   {"schedule", t.schedule.kind},
                   {"warmup_steps", t.schedule.warmup_steps},
                   {"decay_steps", t.schedule.decay_steps},
                   {"beta1", t.adamw.beta1},
                   {"beta2", t.adamw.beta2},
                   {"eps", t.adamw.eps},
                   {"weight_decay", t.adamw.weight_decay},
                   {"grad_clip", t.adamw.grad_clip},
                   {"eval_interval", t.eval_interval},
                   {"eval_iters", t.eval_iters},
                   {"eval_batch_size", t.eval_batch_size},
                   {"log_interval", t.log_interval},
                   {"checkpoint_interval", t.checkpoint_interval}};
  // Written only when set, so that the configs (and hashes) of runs without it stay as they were.
  if (t.loss_scale != 1.0) training["loss_scale"] = t.loss_scale;
  if (t.adamw.moments != MomentStorage::fp32) training["moments"] = moment_storage_name(t.adamw.moments);
  json data = {{"type", c.data.type},
               {"path", c.data.path},
               {"train_limit", c.data.train_limit},
               {"test_limit", c.data.test_limit}};
  if (c.data.type == "mnist") data.update({{"mean", c.data.mean}, {"std", c.data.std}});
  if (c.data.type == "tokens") data = token_config_json(c.data);
  json j{{"name", c.name},
         {"model", model},
         {"data", data},
         {"training", training},
         {"recipe", c.recipe},
         {"layers", {{"keep_high_precision", c.keep_high_precision}}},
         {"seed", c.seed},
         {"backend", c.backend},
         {"threads", c.threads},
         {"output", {{"dir", c.output_dir}, {"name", c.output_name}, {"capture_step", c.capture_step}}}};
  // From here every key is written only when given or not the default, so that the configs (and hashes) of
  // earlier runs stay as they were.
  if (c.numerics_interval != 0) j["output"]["numerics_interval"] = c.numerics_interval;
  DistributedConfig plain;  // the defaults, but for the timeout (written on its own)
  plain.timeout_s = c.distributed.timeout_s;
  if (c.distributed != plain)
    j["distributed"] = {{"zero", c.distributed.zero},
                        {"primary_weights", primary_weights_name(c.distributed.primary_weights)},
                        {"shard_cast", c.distributed.shard_cast}};
  if (c.distributed.gather) j["distributed"]["gather"] = gather_format_name(*c.distributed.gather);
  for (auto [key, v] : {std::pair{"reshard_after_forward", c.distributed.reshard_after_forward},
                        {"prefetch", c.distributed.prefetch}})
    if (v >= 0) j["distributed"][key] = v == 1;
  if (c.distributed.expert_parallel != 1) j["distributed"]["expert_parallel"] = c.distributed.expert_parallel;
  if (c.distributed.reduce != GradReduce::fp32) j["distributed"]["reduce"] = grad_reduce_name(c.distributed.reduce);
  if (c.distributed.timeout_s != DistributedConfig{}.timeout_s) j["distributed"]["timeout_s"] = c.distributed.timeout_s;
  if (!c.layer_recipes.empty()) j["layer_recipes"] = layer_recipes_to_json(c.layer_recipes);
  if (!c.eval_recipe.is_null()) j["eval_recipe"] = c.eval_recipe;
  if (c.activations != ActivationPrecision::fp32)
    j["precision"] = {{"activations", activation_precision_name(c.activations)}};
  return j;
}

json read_json_file(const std::string& path) {
  reject_directory(path, "a JSON file");
  std::ifstream f(path);
  if (!f) {
    const int e = errno;
    if (e == 0) throw Error("cannot open JSON file " + path);
    throw_errno("cannot open JSON file " + path, e);
  }
  try {
    return parse_json(f, path);
  } catch (const json::parse_error& e) {
    throw Error(path + ": invalid JSON: " + json_error_text(e.what()));
  }
}

void apply_set(json& j, const std::string& a) {
  const auto eq = a.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("--set \"" + text_excerpt(a) + "\": expected key=value with a dotted key, e.g. training.lr=3e-4");
  const std::string key = a.substr(0, eq), val = a.substr(eq + 1);
  // The key's components are levels of objects: with the value's own levels
  // they must stay within kJsonMaxDepth, like a config file.
  const int levels = int(std::min<size_t>(std::count(key.begin(), key.end(), '.') + 1, size_t(kJsonMaxDepth)));
  if (levels >= kJsonMaxDepth)
    throw Error("--set \"" + text_excerpt(a) + "\": the key has " + std::to_string(levels) +
                " or more components; valid: fewer than " + std::to_string(kJsonMaxDepth));
  json v;
  try {
    v = parse_json(val, "--set " + text_excerpt(key), kJsonMaxDepth - levels);
  } catch (const json::parse_error&) {
    v = val;
  } catch (const Error&) {
    if (!is_integer_literal(json(val))) throw;
    v = val;  // an integer beyond a double: kept as given, for the key's range error
  }
  // An integer beyond 64 bits stays as given (a string), so a range error can name it.
  if (v.is_number_float() && is_integer_literal(json(val))) v = val;
  json* cur = &j;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty())
      throw Error("--set \"" + text_excerpt(a) + "\": empty component in key \"" + text_excerpt(key) + "\"");
    if (!cur->is_object()) {
      if (cur->is_null())
        *cur = json::object();
      else
        throw Error("--set \"" + text_excerpt(a) + "\": " +
                    (start == 0 ? std::string("the config") : "\"" + text_excerpt(key.substr(0, start - 1)) + "\"") +
                    " is " + json_excerpt(*cur) + ", not an object");
    }
    if (dot == std::string::npos) {
      (*cur)[part] = v;
      return;
    }
    cur = &(*cur)[part];
    start = dot + 1;
  }
}

}  // namespace fp4lab::train
