// Recipes: operand names, layer selection, validation, JSON, the precision
// switch and the Q0..Q5 listing (recipe.hpp). The canned recipes live in
// registry.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.hpp"
#include "core/json.hpp"
#include "recipes/recipe.hpp"
#include "sim/block_rule.hpp"

namespace fp4lab {

namespace {

constexpr const char* kOperandNames[kOperandCount] = {"fwd_x",   "fwd_w",        "dgrad_grad_y",
                                                      "dgrad_w", "wgrad_grad_y", "wgrad_x"};
// What each operand is, for listings and error messages: the tensor, its
// shape, and the GEMM's reduction axis in that tensor's own layout.
struct OperandInfo {
  const char* gemm;        // "y = x W^T"
  const char* tensor;      // "x [B, in]"
  const char* reduce;      // "in"
  bool reduce_along_cols;  // reduction along a row (blocks [1,N]) or along a column ([N,1])
};
constexpr OperandInfo kOperandInfo[kOperandCount] = {
    {"y = x W^T", "x [B, in]", "in", true},     {"y = x W^T", "W [out, in]", "in", true},
    {"dx = dy W", "dy [B, out]", "out", true},  {"dx = dy W", "W [out, in]", "out", false},
    {"dW = dy^T x", "dy [B, out]", "B", false}, {"dW = dy^T x", "x [B, in]", "B", false},
};

constexpr const char* kRecipeKeys =
    "name, source, extends, fwd_x, fwd_w, dgrad_grad_y, dgrad_w, wgrad_grad_y, wgrad_x, double_quantization, "
    "wgrad_rht, dgrad_rht, rht_kind, rht_schedule, rht_seed, high_precision, backward_override, keep_high_precision, "
    "switch_to, switch_fraction, sr_bits, "
    "forward_bias, hardware_blocks";

std::string block_str(const QuantizerSpec& q) {
  std::ostringstream s;
  s << '[' << q.block_rows << ',' << q.block_cols << ']';
  return s.str();
}

bool is_nv_rule(ScaleRule r) { return r == ScaleRule::nv || r == ScaleRule::nv_noglobal; }

// Block-length rules of the formats (a recipe describes hardware GEMMs):
//   MX (E8M0 power-of-two scales, fp4lab's rules and torchao's / TE's): OCP MX v1.0 sec. 5 fixes k = 32;
//   NVFP4-style E4M3 scales: 16 (NVIDIA Blackwell block-scaled MMA);
//   FP8 block scaling (DeepSeek-V3, DeepGEMM, TE's Float8BlockScaling): 128 (the GEMM promotes each 128-long
//   run of K into FP32 with its two scales);
//   per-tensor scales: the whole tensor, [0,0].
// 2-D tiles of k x k are allowed (the scale is then constant along both GEMM
// axes, which lets W and W^T share one quantization). A recipe with
// hardware_blocks false (recipe.hpp) takes any k >= 2 instead.
void validate_operand(const QuantizerSpec& q, Operand op, bool hardware_blocks, const std::string& where) {
  validate(q, where);
  const OperandInfo& info = kOperandInfo[size_t(op)];
  const std::string blk = block_str(q);
  if (q.scale_rule == ScaleRule::tensor_amax || (q.block_rows == 0 && q.block_cols == 0)) {
    if (!(q.scale_rule == ScaleRule::tensor_amax && q.block_rows == 0 && q.block_cols == 0))
      throw Error(where + ".block: " + blk + " with scale_rule '" +
                  quantizer_to_json(q)["scale_rule"].get<std::string>() +
                  "' is impossible: per-tensor scaling is block [0,0] with scale_rule 'tensor_amax' (both or neither)");
    return;
  }
  const int along = info.reduce_along_cols ? q.block_cols : q.block_rows;
  const int across = info.reduce_along_cols ? q.block_rows : q.block_cols;
  const std::string valid_1d = info.reduce_along_cols ? "[1,K]" : "[K,1]";
  if (along == 1)
    throw Error(where + ".block: " + blk + " runs across the reduction axis of " +
                std::string(kOperandNames[size_t(op)]) + " (" + info.reduce + " in " + info.tensor + ", GEMM " +
                info.gemm + "): a block-scaled GEMM needs one scale per run of K elements along " + info.reduce +
                "; valid: " + valid_1d + ", [K,K], or [0,0] per tensor");
  int k = 0;
  std::string fmt;
  if (StandardRule::mx_rule(q.scale_rule)) {
    k = 32;
    fmt = "MX (E8M0 scales, OCP MX v1.0)";
  } else if (is_nv_rule(q.scale_rule)) {
    k = 16;
    fmt = "NVFP4-style E4M3 scales";
  } else if (StandardRule::fp8_block_rule(q.scale_rule)) {
    k = 128;
    fmt = "FP8 block scaling (DeepSeek-V3's 1x128 and 128x128 blocks)";
  }
  if (!hardware_blocks) {  // any K >= 2 along the reduction axis, 1-D or square
    if (!(along >= 2 && (across == 1 || across == along)))
      throw Error(where + ".block: " + blk + " is not a block of K >= 2 elements along " + info.reduce + " in " +
                  info.tensor + "; valid: " + (info.reduce_along_cols ? "[1,K]" : "[K,1]") + " or [K,K]");
    return;
  }
  if (k != 0 && !(along == k && (across == 1 || across == k)))
    throw Error(where + ".block: " + blk + " is not a block that " + fmt + " allow for " +
                std::string(kOperandNames[size_t(op)]) + "; valid: " +
                (info.reduce_along_cols ? "[1," + std::to_string(k) + "]" : "[" + std::to_string(k) + ",1]") + " or [" +
                std::to_string(k) + "," + std::to_string(k) + "]");
}

// --- JSON helpers -------------------------------------------------------------

bool get_bool(const nlohmann::json& v, const std::string& path) {
  if (!v.is_boolean()) throw Error(path + ": expected true or false, got " + json_excerpt(v));
  return v.get<bool>();
}
std::string get_string(const nlohmann::json& v, const std::string& path) {
  if (!v.is_string()) throw Error(path + ": expected a string, got " + json_excerpt(v));
  return v.get<std::string>();
}
uint64_t get_u64(const nlohmann::json& v, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return uint64_t(v.get<int64_t>());
  throw Error(path + ": expected a non-negative integer, got " + json_excerpt(v));
}

std::optional<QuantizerSpec> operand_from_json(const nlohmann::json& v, const std::optional<QuantizerSpec>& base,
                                               const std::string& path) {
  if (v.is_null()) return std::nullopt;
  if (v.is_object() && base) {
    // In an extending recipe an object overrides only the keys it names.
    nlohmann::json merged = quantizer_to_json(*base);
    for (auto it = v.begin(); it != v.end(); ++it) merged[it.key()] = it.value();
    // Unknown keys are reported by quantizer_from_json with this path.
    return quantizer_from_json(merged, path);
  }
  if (!v.is_object() && !v.is_string())
    throw Error(path +
                ": expected a quantizer (a canned quantizer name, a JSON object) or null (high precision), got " +
                v.dump());
  return quantizer_from_json(v, path);
}

}  // namespace

const char* operand_name(Operand op) { return kOperandNames[size_t(op)]; }

Operand operand_by_name(const std::string& name) {
  for (int i = 0; i < kOperandCount; ++i)
    if (name == kOperandNames[i]) return Operand(i);
  throw Error("unknown operand '" + name + "'; valid: fwd_x, fwd_w, dgrad_grad_y, dgrad_w, wgrad_grad_y, wgrad_x");
}

bool name_matches(const std::string& pattern, const std::string& name) {
  // Iterative glob with backtracking to the last '*'.
  size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool Recipe::keeps_high_precision(const std::string& layer_name) const {
  return std::any_of(keep_high_precision.begin(), keep_high_precision.end(),
                     [&](const std::string& pat) { return name_matches(pat, layer_name); });
}

void validate(const Recipe& r, const std::string& where) {
  for (int i = 0; i < kOperandCount; ++i)
    if (r.operands[size_t(i)])
      validate_operand(*r.operands[size_t(i)], Operand(i), r.hardware_blocks, where + "." + kOperandNames[i]);
  // The rotations: wgrad's operands along B, dgrad's along out (each operand's reduction axis).
  for (const bool dgrad : {false, true}) {
    if (!(dgrad ? r.dgrad_rht : r.wgrad_rht)) continue;
    const std::string key = dgrad ? "dgrad_rht" : "wgrad_rht", axis = dgrad ? "out" : "B";
    const Operand ops[2] = {dgrad ? Operand::dgrad_grad_y : Operand::wgrad_grad_y,
                            dgrad ? Operand::dgrad_w : Operand::wgrad_x};
    for (Operand op : ops) {
      const auto& q = r.operand(op);
      if (!q) continue;
      const int along = op == Operand::dgrad_grad_y ? q->block_cols : q->block_rows;  // the block along the axis
      const int across = op == Operand::dgrad_grad_y ? q->block_rows : q->block_cols;
      if (r.rht_kind == RhtKind::rht16 && !(along == 16 && across == 1))
        throw Error(where + "." + key + ": the RHT mixes 16-element chunks along " + axis + ", so " + where + "." +
                    operand_name(op) + ".block must be " + (op == Operand::dgrad_grad_y ? "[1,16]" : "[16,1]") +
                    " (one scale per transformed chunk), got " + block_str(*q) + "; valid: such a quantizer, null, "
                    "rht_kind 'quartet2_128', or " + key + " false");
      if (q->rht)
        throw Error(where + "." + operand_name(op) + ".rht: the recipe already rotates the " +
                    (dgrad ? "dgrad" : "wgrad") + " operands (" + where + "." + key +
                    "); a second, per-quantizer RHT is not allowed; valid: rht false");
      if (q->scale_select == ScaleSelect::four_over_six)
        throw Error(where + "." + key + ": " + where + "." + operand_name(op) +
                    " has scale_select 'four_over_six', which TransformerEngine does not combine with an RHT; "
                    "valid: " + key + " false, or scale_select 'max' there");
    }
  }
  if (r.double_quantization && !r.operand(Operand::fwd_x) && !r.operand(Operand::fwd_w))
    throw Error(where + ".double_quantization: re-quantizes the forward's quantized x and W, but " + where +
                ".fwd_x and " + where + ".fwd_w are both null; valid: set a forward quantizer or false");
  for (size_t i = 0; i < r.keep_high_precision.size(); ++i)
    if (r.keep_high_precision[i].empty())
      throw Error(where + ".keep_high_precision[" + std::to_string(i) +
                  "]: empty pattern; valid: a layer name with '*' wildcards, e.g. \"*head*\"");
  if (!(r.switch_fraction >= 0.0 && r.switch_fraction <= 1.0))
    throw Error(where + ".switch_fraction: " + std::to_string(r.switch_fraction) + " is outside [0, 1]");
  if (r.switch_to && r.switch_fraction == 0.0)
    throw Error(where +
                ".switch_fraction: must be > 0 when switch_to is set (the fraction of training, at its end, "
                "that runs `" +
                *r.switch_to + "`)");
  if (!r.switch_to && r.switch_fraction != 0.0)
    throw Error(where + ".switch_to: switch_fraction is " + std::to_string(r.switch_fraction) +
                " but no recipe to switch to is named; valid: a recipe name (" +
                [] {
                  std::string s;
                  for (const auto& n : recipe_names()) s += (s.empty() ? "" : ", ") + n;
                  return s;
                }() +
                ")");
  if (r.switch_to) {
    // Files may name each other; a depth limit stops A -> B -> A loops.
    static thread_local int depth = 0;
    if (depth > 2) throw Error(where + ".switch_to: '" + *r.switch_to + "': switch targets nest too deeply (a loop?)");
    Recipe target;
    ++depth;
    try {
      target = parse_recipe(*r.switch_to);
    } catch (const Error& e) {
      --depth;
      throw Error(where + ".switch_to: " + e.what());
    }
    --depth;
    if (target.switch_to)
      throw Error(where + ".switch_to: '" + *r.switch_to + "' itself switches to '" + *target.switch_to +
                  "'; chains of switches are not supported");
  }
}

Recipe recipe_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) {
    try {
      return recipe_by_name(j.get<std::string>());
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
  if (!j.is_object()) throw Error(where + ": a recipe must be a canned name or a JSON object, got " + json_excerpt(j));
  Recipe r;
  r.name = "custom";
  if (j.contains("extends")) {
    const std::string base = get_string(j["extends"], where + ".extends");
    try {
      r = recipe_by_name(base);
    } catch (const Error& e) {
      throw Error(where + ".extends: " + e.what());
    }
    r.name = base + "_custom";
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    const std::string path = where + "." + k;
    if (k == "extends" || k == "sr_bits") continue;  // sr_bits: after the operands, below
    if (k == "name") {
      r.name = get_string(v, path);
    } else if (k == "source") {
      r.source = get_string(v, path);
    } else if (k == "double_quantization") {
      if (v.is_string() && v.get<std::string>() == "weights") {
        r.double_quantization = true;
        r.double_quantization_x = false;
      } else if (v.is_boolean()) {
        r.double_quantization = v.get<bool>();
        r.double_quantization_x = true;
      } else {
        throw Error(path + ": expected true or false (or \"weights\": re-quantize W only), got " + json_excerpt(v));
      }
    } else if (k == "forward_bias") {
      r.forward_bias = get_bool(v, path);
    } else if (k == "hardware_blocks") {
      r.hardware_blocks = get_bool(v, path);
    } else if (k == "wgrad_rht") {
      r.wgrad_rht = get_bool(v, path);
    } else if (k == "dgrad_rht") {
      r.dgrad_rht = get_bool(v, path);
    } else if (k == "rht_kind") {
      try {
        r.rht_kind = parse_rht_kind(get_string(v, path));
      } catch (const Error& e) {
        const std::string msg = e.what();
        throw Error(msg.rfind(path, 0) == 0 ? msg : path + ": " + msg);
      }
    } else if (k == "rht_schedule") {
      const std::string s = get_string(v, path);
      if (s == "fixed") {
        r.rht_schedule = RhtSchedule::fixed;
      } else if (s == "per_step") {
        r.rht_schedule = RhtSchedule::per_step;
      } else {
        throw Error(path + ": unknown rht_schedule '" + s + "'; valid: fixed, per_step");
      }
    } else if (k == "rht_seed") {
      r.rht_seed = get_u64(v, path);
    } else if (k == "high_precision") {
      const std::string s = get_string(v, path);
      if (s == "fp32" || s == "f32" || s == "float32") {
        r.high_precision = HighPrecision::fp32;
      } else if (s == "bf16" || s == "bfloat16") {
        r.high_precision = HighPrecision::bf16;
      } else {
        throw Error(path + ": unknown high-precision mode '" + text_excerpt(s) + "'; valid: fp32, bf16");
      }
    } else if (k == "backward_override") {
      const std::string s = v.is_null() ? "none" : get_string(v, path);
      if (s == "none") {
        r.backward_override = BackwardOverride::none;
      } else if (s == "high_precision") {
        r.backward_override = BackwardOverride::high_precision;
      } else if (s == "dequantized") {
        r.backward_override = BackwardOverride::dequantized;
      } else {
        throw Error(path + ": unknown backward override '" + text_excerpt(s) +
                    "'; valid: none (or null), high_precision, dequantized");
      }
    } else if (k == "keep_high_precision") {
      if (!v.is_array()) throw Error(path + ": expected an array of layer-name patterns, got " + json_excerpt(v));
      r.keep_high_precision.clear();
      for (size_t i = 0; i < v.size(); ++i)
        r.keep_high_precision.push_back(get_string(v[i], path + "[" + std::to_string(i) + "]"));
    } else if (k == "switch_to") {
      if (v.is_null()) {
        r.switch_to.reset();
      } else {
        r.switch_to = get_string(v, path);
      }
    } else if (k == "switch_fraction") {
      if (!v.is_number()) throw Error(path + ": expected a number in [0, 1], got " + json_excerpt(v));
      r.switch_fraction = v.get<double>();
    } else {
      bool found = false;
      for (int i = 0; i < kOperandCount; ++i) {
        if (k == kOperandNames[i]) {
          r.operands[size_t(i)] = operand_from_json(v, r.operands[size_t(i)], path);
          found = true;
        }
      }
      if (!found) throw Error(path + ": unknown key '" + k + "'; valid keys: " + kRecipeKeys);
    }
  }
  // "sr_bits": the random-bit contract (core/sr.hpp) of every operand that
  // rounds stochastically, after `extends` and the operands' own keys (a
  // shorthand: the recipe stores it per operand quantizer).
  if (j.contains("sr_bits")) {
    const std::string path = where + ".sr_bits";
    const std::optional<SrBits> b = parse_sr_bits(get_string(j["sr_bits"], path));
    if (!b) throw Error(path + ": unknown sr_bits " + json_excerpt(j["sr_bits"]) + "; valid: " + sr_bits_names);
    for (auto& q : r.operands)
      if (q && q->round == Round::rs) q->sr_bits = *b;
  }
  validate(r, where);
  return r;
}

nlohmann::json recipe_to_json(const Recipe& r) {
  nlohmann::json j;
  j["name"] = r.name;
  j["source"] = r.source;
  for (int i = 0; i < kOperandCount; ++i)
    j[kOperandNames[i]] = r.operands[size_t(i)] ? quantizer_to_json(*r.operands[size_t(i)]) : nlohmann::json();
  j["double_quantization"] =
      r.double_quantization && !r.double_quantization_x ? nlohmann::json("weights") : nlohmann::json(r.double_quantization);
  j["forward_bias"] = r.forward_bias;
  if (!r.hardware_blocks)
    j["hardware_blocks"] = false;  // written only where set (older resolved recipes keep their text)
  j["wgrad_rht"] = r.wgrad_rht;
  // Written only where set (older resolved recipes keep their text).
  if (r.dgrad_rht) j["dgrad_rht"] = true;
  if (r.rht_kind != RhtKind::rht16) j["rht_kind"] = std::string(rht_kind_name(r.rht_kind));
  if (r.rht_schedule != RhtSchedule::fixed) j["rht_schedule"] = "per_step";
  j["rht_seed"] = r.rht_seed;
  j["high_precision"] = r.high_precision == HighPrecision::bf16 ? "bf16" : "fp32";
  if (r.backward_override != BackwardOverride::none)  // absent when unset: older resolved recipes keep their text
    j["backward_override"] = r.backward_override == BackwardOverride::high_precision ? "high_precision" : "dequantized";
  j["keep_high_precision"] = r.keep_high_precision;
  j["switch_to"] = r.switch_to ? nlohmann::json(*r.switch_to) : nlohmann::json();
  j["switch_fraction"] = r.switch_fraction;
  return j;
}

Recipe parse_recipe(const std::string& s) {
  for (const auto& n : recipe_names())
    if (s == n) return recipe_by_name(s);
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && s[first] == '{') {
    nlohmann::json j;
    try {
      j = parse_json(s, "recipe JSON");
    } catch (const nlohmann::json::parse_error& e) {
      throw Error("recipe JSON does not parse: " + json_error_text(e.what()));
    }
    return recipe_from_json(j, "recipe");
  }
  reject_directory(s, "a canned recipe name, a JSON object or a recipe JSON file", "recipe");
  std::ifstream f(s);
  if (!f) {
    std::string names;
    for (const auto& n : recipe_names()) names += (names.empty() ? "" : ", ") + n;
    throw Error("recipe '" + text_excerpt(s) + "' is neither a canned recipe (" + names +
                "), a JSON object, nor a readable JSON file");
  }
  nlohmann::json j;
  try {
    j = parse_json(f, s);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(s + ": not valid JSON: " + json_error_text(e.what()));
  }
  try {
    return recipe_from_json(j, "recipe");
  } catch (const Error& e) {
    throw Error(s + ": " + e.what());
  }
}

uint64_t switch_step(const Recipe& r, uint64_t total_steps) {
  if (!r.switch_to) return total_steps;
  const double tail = std::round(r.switch_fraction * double(total_steps));
  const uint64_t t = tail >= double(total_steps) ? total_steps : uint64_t(tail);
  return total_steps - t;
}

Recipe effective_recipe(const Recipe& r, uint64_t step, uint64_t total_steps) {
  if (!r.switch_to || step < switch_step(r, total_steps)) return r;
  return parse_recipe(*r.switch_to);
}

std::string describe(const Recipe& r) {
  std::ostringstream s;
  s << "recipe " << r.name << "\n";
  if (!r.source.empty()) s << "  source              : " << r.source << "\n";
  for (int i = 0; i < kOperandCount; ++i) {
    const OperandInfo& info = kOperandInfo[i];
    char head[96];
    std::snprintf(head, sizeof head, "  Q%d (%-12s) %-12s %-12s : ", i, kOperandNames[i], info.gemm, info.tensor);
    s << head;
    const auto& q = r.operands[size_t(i)];
    if (q) {
      s << describe(*q) << "  ["
        << (q->round == Round::rs                               ? "SR"
            : q->emulate == Emulation::quartet2_eden_triton ? "RTN, SR scales"
                                                             : "RTN")
        << ", reduction over " << info.reduce << "]";
    } else {
      s << (r.high_precision == HighPrecision::bf16 ? "high precision (bf16 RN operand, fp32 accumulate)"
                                                    : "high precision (fp32)");
    }
    s << "\n";
  }
  s << "  double_quantization : " << (r.double_quantization ? (r.double_quantization_x ? "yes" : "weights only") : "no")
    << "\n";
  if (!r.forward_bias) s << "  forward_bias        : no (quantized layers do not add their bias)\n";
  if (!r.hardware_blocks)
    s << "  hardware_blocks     : no (blocks outside the hardware GEMMs' sizes; simulated only)\n";
  const std::string rotation =
      std::string(r.rht_kind == RhtKind::rht16 ? "16-point RHT" : "Quartet II's 128-point rotation") +
      (r.rht_schedule == RhtSchedule::per_step ? ", fresh signs each layer and step from seed "
                                                : ", sign seed ") +
      std::to_string(r.rht_seed);
  s << "  wgrad_rht           : " << (r.wgrad_rht ? "yes (" + rotation + ", along B)" : std::string("no")) << "\n";
  if (r.dgrad_rht) s << "  dgrad_rht           : yes (" << rotation << ", along out)\n";
  s << "  high_precision      : " << (r.high_precision == HighPrecision::bf16 ? "bf16" : "fp32") << "\n";
  if (r.backward_override != BackwardOverride::none)
    s << "  backward_override   : "
      << (r.backward_override == BackwardOverride::high_precision
              ? "high_precision (dgrad and wgrad from the original x, W and dy, unquantized)"
              : "dequantized (dgrad and wgrad from Q_fwd_x(x), Q_fwd_w(W) and the unquantized dy)")
      << "; the backward quantizers above are not used\n";
  s << "  keep_high_precision : ";
  if (r.keep_high_precision.empty()) s << "(none)";
  for (size_t i = 0; i < r.keep_high_precision.size(); ++i) s << (i ? ", " : "") << r.keep_high_precision[i];
  s << "\n";
  s << "  switch              : ";
  if (r.switch_to) {
    s << "to " << *r.switch_to << " for the last " << r.switch_fraction * 100 << "% of steps";
  } else {
    s << "none";
  }
  s << "\n";
  return s.str();
}

}  // namespace fp4lab
