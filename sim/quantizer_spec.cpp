// A quantizer's spec (quantizer.hpp): the canned names, the JSON form,
// validate() and describe().
#include <fstream>
#include <initializer_list>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "core/error.hpp"
#include "core/json.hpp"
#include "schemes/fp4tk/rule.hpp"
#include "schemes/quartet2/rule.hpp"
#include "sim/block_rules.hpp"
#include "schemes/te_nvfp4/rule.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab {

// ---------------------------------------------------------------------------
// names
// ---------------------------------------------------------------------------

std::string_view scale_rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::ocp: return "ocp";
    case ScaleRule::ceil: return "ceil";
    case ScaleRule::tetrajet: return "tetrajet";
    case ScaleRule::nv: return "nv";
    case ScaleRule::nv_noglobal: return "nv_noglobal";
    case ScaleRule::tensor_amax: return "tensor_amax";
    case ScaleRule::torchao_floor: return "torchao_floor";
    case ScaleRule::torchao_ceil: return "torchao_ceil";
    case ScaleRule::torchao_even: return "torchao_even";
    case ScaleRule::torchao_rceil: return "torchao_rceil";
    case ScaleRule::te_mxfp8: return "te_mxfp8";
    case ScaleRule::deepgemm: return "deepgemm";
    case ScaleRule::te_fp8_block: return "te_fp8_block";
    case ScaleRule::amax_div: return "amax_div";
  }
  return "?";
}

namespace {
constexpr ScaleRule kScaleRules[] = {
    ScaleRule::ocp,          ScaleRule::ceil,          ScaleRule::tetrajet,      ScaleRule::nv,
    ScaleRule::nv_noglobal,  ScaleRule::tensor_amax,   ScaleRule::torchao_floor, ScaleRule::torchao_ceil,
    ScaleRule::torchao_even, ScaleRule::torchao_rceil, ScaleRule::te_mxfp8,      ScaleRule::deepgemm,
    ScaleRule::te_fp8_block, ScaleRule::amax_div};
}  // namespace

std::string_view rht_kind_name(RhtKind k) { return k == RhtKind::quartet2_128 ? "quartet2_128" : "rht16"; }

RhtKind parse_rht_kind(std::string_view s) {
  for (RhtKind k : {RhtKind::rht16, RhtKind::quartet2_128})
    if (rht_kind_name(k) == s) return k;
  throw Error("unknown rht_kind '" + text_excerpt(std::string(s)) + "'; valid: rht16, quartet2_128");
}

ScaleRule parse_scale_rule(std::string_view s) {
  std::string valid;
  for (ScaleRule r : kScaleRules) {
    if (scale_rule_name(r) == s) return r;
    valid += (valid.empty() ? "" : ", ") + std::string(scale_rule_name(r));
  }
  throw Error("unknown scale_rule '" + std::string(s) + "'; valid: " + valid);
}

namespace {

QuantizerSpec mx(const Format& element) {
  QuantizerSpec q;
  q.element = &element;
  q.scale = &float8_e8m0fnu;
  q.block_rows = 1;
  q.block_cols = 32;
  q.scale_rule = ScaleRule::ocp;
  return q;
}

QuantizerSpec nv(int br, int bc) {
  QuantizerSpec q;
  q.element = &float4_e2m1fn;
  q.scale = &ufloat8_e4m3;
  q.block_rows = br;
  q.block_cols = bc;
  q.scale_rule = ScaleRule::nv;
  q.global_scale = GlobalScale::tensor_amax;
  return q;
}

// TransformerEngine's 2026 NVFP4 options (schemes/te_nvfp4/rule.hpp): 4/6 with
// TE's defaults (MAE, E4M3_MAX 256), and row-scaled NVFP4.
QuantizerSpec nv_4over6(int br, int bc) {
  QuantizerSpec q = nv(br, bc);
  q.scale_select = ScaleSelect::four_over_six;
  q.select_error = SelectError::mae;
  q.e4m3_max = 256;
  return q;
}
QuantizerSpec nv_row_scaled() {
  QuantizerSpec q = nv(1, 16);
  q.global_scale = GlobalScale::row_amax;
  return q;
}

QuantizerSpec per_tensor(const Format& element) {
  QuantizerSpec q;
  q.element = &element;
  q.scale = &float32;
  q.block_rows = 0;
  q.block_cols = 0;
  q.scale_rule = ScaleRule::tensor_amax;
  return q;
}

// fp4-trainkit's MXFP4 / NVFP4 simulators (emulate fp4tk), blocks along rows.
QuantizerSpec fp4tk(const Format& scale, int k, ScaleRule rule) {
  QuantizerSpec q;
  q.element = &float4_e2m1fn;
  q.scale = &scale;
  q.block_rows = 1;
  q.block_cols = k;
  q.scale_rule = rule;
  q.emulate = Emulation::fp4tk;
  return q;
}

// FP8 block scaling (schemes/fp8_block/scalar.hpp): E4M3 in blocks br x bc with `rule`, FP32 or E8M0 scales.
QuantizerSpec fp8_block(int br, int bc, ScaleRule rule, const Format& scale) {
  QuantizerSpec q;
  q.element = &float8_e4m3fn;
  q.scale = &scale;
  q.block_rows = br;
  q.block_cols = bc;
  q.scale_rule = rule;
  return q;
}

// TransformerEngine's MXFP8 with 32x32 weight blocks (MXFP8BlockScaling(enable_2d_quantization=True)).
QuantizerSpec mxfp8_te_32x32() {
  QuantizerSpec q = mx(float8_e4m3fn);
  q.block_rows = 32;
  q.block_cols = 32;
  q.scale_rule = ScaleRule::te_mxfp8;
  return q;
}

struct Canned {
  const char* name;
  QuantizerSpec spec;
};

const std::vector<Canned>& canned() {
  static const std::vector<Canned> list = {
      {"mxfp4", mx(float4_e2m1fn)},
      {"mxfp6_e2m3", mx(float6_e2m3fn)},
      {"mxfp6_e3m2", mx(float6_e3m2fn)},
      {"mxfp8_e4m3", mx(float8_e4m3fn)},
      {"mxfp8_e5m2", mx(float8_e5m2)},
      {"mxint8", mx(int8_mx)},
      {"nvfp4", nv(1, 16)},
      {"nvfp4_2d", nv(16, 16)},
      {"nvfp4_col", nv(16, 1)},
      {"nvfp4_4over6", nv_4over6(1, 16)},
      {"nvfp4_2d_4over6", nv_4over6(16, 16)},
      {"nvfp4_row_scaled", nv_row_scaled()},
      {"fp8_e4m3_tensor", per_tensor(float8_e4m3fn)},
      {"fp8_e5m2_tensor", per_tensor(float8_e5m2)},
      {"fp4tk_mxfp4", fp4tk(float8_e8m0fnu, 32, ScaleRule::ocp)},
      {"fp4tk_nvfp4", fp4tk(ufloat8_e4m3, 16, ScaleRule::nv_noglobal)},
      {"fp8_block_1x128", fp8_block(1, 128, ScaleRule::deepgemm, float32)},
      {"fp8_block_128x128", fp8_block(128, 128, ScaleRule::deepgemm, float32)},
      {"te_fp8_block_1x128", fp8_block(1, 128, ScaleRule::te_fp8_block, float8_e8m0fnu)},
      {"te_fp8_block_128x128", fp8_block(128, 128, ScaleRule::te_fp8_block, float8_e8m0fnu)},
      {"mxfp8_te_32x32", mxfp8_te_32x32()},
  };
  return list;
}

std::string join_names() {
  std::string s;
  for (const auto& c : canned()) s += (s.empty() ? "" : ", ") + std::string(c.name);
  return s;
}

}  // namespace

QuantizerSpec quantizer_by_name(const std::string& name) {
  for (const auto& c : canned())
    if (name == c.name) return c.spec;
  throw Error("unknown quantizer '" + name + "'; valid: " + join_names() +
              ", or a JSON object / JSON file with the keys element, scale, block, scale_rule, round, overflow, "
              "global_scale, rht, rht_seed, rht_signs, rht_output, rht_kind, sr_bits, emulate, scale_select, "
              "select_error, e4m3_max");
}

std::vector<std::string> quantizer_names() {
  std::vector<std::string> v;
  for (const auto& c : canned()) v.push_back(c.name);
  return v;
}

// ---------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------

namespace {
constexpr const char* json_keys =
    "element, scale, block, scale_rule, round, overflow, global_scale, rht, rht_seed, rht_signs, rht_output, rht_kind, "
    "sr_bits, "
    "emulate, scale_select, select_error, e4m3_max";

std::string get_string(const nlohmann::json& v, const std::string& path) {
  if (!v.is_string()) throw Error(path + ": expected a string, got " + json_excerpt(v));
  return v.get<std::string>();
}

// The enum value named s among `choices`; otherwise an error listing them.
template <class E>
E parse_named(const std::string& s, const char* key, std::initializer_list<std::pair<const char*, E>> choices) {
  std::string valid;
  for (const auto& [name, e] : choices) {
    if (s == name) return e;
    valid += (valid.empty() ? "" : ", ") + std::string(name);
  }
  throw Error("unknown " + std::string(key) + " '" + text_excerpt(s) + "'; valid: " + valid);
}
}  // namespace

QuantizerSpec quantizer_from_json(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) {
    try {
      return quantizer_by_name(j.get<std::string>());
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
  if (!j.is_object()) throw Error(where + ": a quantizer must be a canned name or a JSON object, got " + json_excerpt(j));
  QuantizerSpec q;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    const std::string path = where + "." + k;
    try {
      if (k == "element") {
        q.element = &format_by_name(get_string(v, path));
      } else if (k == "scale") {
        q.scale = &format_by_name(get_string(v, path));
      } else if (k == "block") {
        if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer())
          throw Error(path + ": expected [block_rows, block_cols] (two integers; [0,0] = per tensor), got " + json_excerpt(v));
        const int64_t br = v[0].get<int64_t>(), bc = v[1].get<int64_t>();
        if (br < 0 || bc < 0 || br > (1 << 20) || bc > (1 << 20))
          throw Error(path + ": block extents must be in [0, 2^20], got " + json_excerpt(v));
        q.block_rows = int(br);
        q.block_cols = int(bc);
      } else if (k == "scale_rule") {
        q.scale_rule = parse_scale_rule(get_string(v, path));
      } else if (k == "round") {
        q.round = parse_round(get_string(v, path));
      } else if (k == "overflow") {
        q.overflow = parse_overflow(get_string(v, path));
      } else if (k == "global_scale") {
        q.global_scale = parse_named<GlobalScale>(get_string(v, path), "global_scale",
                                                  {{"none", GlobalScale::none},
                                                   {"tensor_amax", GlobalScale::tensor_amax},
                                                   {"row_amax", GlobalScale::row_amax}});
      } else if (k == "rht") {
        if (!v.is_boolean()) throw Error(path + ": expected true or false, got " + json_excerpt(v));
        q.rht = v.get<bool>();
      } else if (k == "rht_seed") {
        if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
          throw Error(path + ": expected a non-negative integer, got " + json_excerpt(v));
        q.rht_seed = v.get<uint64_t>();
      } else if (k == "rht_signs") {
        q.rht_signs = parse_named<RhtSigns>(get_string(v, path), "rht_signs",
                                            {{"philox", RhtSigns::philox}, {"te", RhtSigns::te}});
      } else if (k == "rht_output") {
        q.rht_output = parse_named<RhtOutput>(get_string(v, path), "rht_output",
                                              {{"f32", RhtOutput::f32}, {"bf16", RhtOutput::bf16}});
      } else if (k == "rht_kind") {
        q.rht_kind = parse_rht_kind(get_string(v, path));
      } else if (k == "sr_bits") {
        const std::optional<SrBits> b = parse_sr_bits(get_string(v, path));
        if (!b) throw Error(path + ": unknown sr_bits " + json_excerpt(v) + "; valid: " + sr_bits_names);
        q.sr_bits = *b;
      } else if (k == "emulate") {
        q.emulate = parse_named<Emulation>(get_string(v, path), "emulate",
                                           {{"none", Emulation::none},
                                            {"fp4tk", Emulation::fp4tk},
                                            {"te_fast_math", Emulation::te_fast_math},
                                            {"quartet2", Emulation::quartet2},
                                            {"te_fused_fast_math", Emulation::te_fused_fast_math},
                                            {"tetrajet2_source", Emulation::tetrajet2_source},
                                            {"tetrajet2_triton", Emulation::tetrajet2_triton},
                                            {"tetrajet2_kernel", Emulation::tetrajet2_kernel},
                                            {"quartet2_triton", Emulation::quartet2_triton},
                                            {"quartet2_eden_triton", Emulation::quartet2_eden_triton},
                                            {"te_reference", Emulation::te_reference}});
      } else if (k == "scale_select") {
        q.scale_select = parse_scale_select(get_string(v, path));
      } else if (k == "select_error") {
        q.select_error = parse_select_error(get_string(v, path));
      } else if (k == "e4m3_max") {
        if (!v.is_number_integer() || (v.get<int64_t>() != 448 && v.get<int64_t>() != 256))
          throw Error(path + ": expected 448 or 256 (E4M3_MAX of four_over_six's global scale), got " + json_excerpt(v));
        q.e4m3_max = int(v.get<int64_t>());
      } else {
        throw Error("unknown key '" + k + "'; valid keys: " + json_keys);
      }
    } catch (const Error& e) {
      const std::string msg = e.what();
      throw Error(msg.rfind(path, 0) == 0 ? msg : path + ": " + msg);
    }
  }
  validate(q, where);
  return q;
}

nlohmann::json quantizer_to_json(const QuantizerSpec& q) {
  nlohmann::json j;
  j["element"] = std::string(short_format_name(*q.element));
  j["scale"] = std::string(short_format_name(*q.scale));
  j["block"] = {q.block_rows, q.block_cols};
  j["scale_rule"] = std::string(scale_rule_name(q.scale_rule));
  j["round"] = std::string(round_name(q.round));
  j["overflow"] = std::string(overflow_name(q.overflow));
  j["global_scale"] = q.global_scale == GlobalScale::none          ? "none"
                     : q.global_scale == GlobalScale::tensor_amax ? "tensor_amax"
                                                                  : "row_amax";
  j["rht"] = q.rht;
  j["rht_seed"] = q.rht_seed;
  // Written only where set, so that every quantizer written before these keys existed keeps its JSON (and the
  // hashes of configs that hold it).
  if (q.rht_signs != RhtSigns::philox) j["rht_signs"] = "te";
  if (q.rht_output != RhtOutput::f32) j["rht_output"] = "bf16";
  if (q.rht_kind != RhtKind::rht16) j["rht_kind"] = std::string(rht_kind_name(q.rht_kind));
  j["sr_bits"] = sr_bits_name(q.sr_bits);
  j["emulate"] = q.emulate == Emulation::fp4tk                  ? "fp4tk"
                 : q.emulate == Emulation::te_fast_math         ? "te_fast_math"
                 : q.emulate == Emulation::quartet2             ? "quartet2"
                 : q.emulate == Emulation::te_fused_fast_math   ? "te_fused_fast_math"
                 : q.emulate == Emulation::tetrajet2_source     ? "tetrajet2_source"
                 : q.emulate == Emulation::tetrajet2_triton     ? "tetrajet2_triton"
                 : q.emulate == Emulation::tetrajet2_kernel     ? "tetrajet2_kernel"
                 : q.emulate == Emulation::quartet2_triton      ? "quartet2_triton"
                 : q.emulate == Emulation::quartet2_eden_triton ? "quartet2_eden_triton"
                 : q.emulate == Emulation::te_reference       ? "te_reference"
                                                                : "none";
  j["scale_select"] = std::string(scale_select_name(q.scale_select));
  j["select_error"] = std::string(select_error_name(q.select_error));
  j["e4m3_max"] = q.e4m3_max;
  return j;
}

QuantizerSpec parse_quantizer(const std::string& s) {
  for (const auto& c : canned())
    if (s == c.name) return c.spec;
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && s[first] == '{') {
    nlohmann::json j;
    try {
      j = parse_json(s, "quantizer JSON");
    } catch (const nlohmann::json::parse_error& e) {
      throw Error("quantizer JSON '" + text_excerpt(s) + "' does not parse: " + json_error_text(e.what()));
    }
    return quantizer_from_json(j, "quantizer");
  }
  reject_directory(s, "a canned quantizer name, a JSON object or a quantizer JSON file", "quantizer");
  std::ifstream f(s);
  if (!f) {
    throw Error("quantizer '" + text_excerpt(s) + "' is neither a canned name (" + join_names() +
                "), a JSON object, nor a readable JSON file");
  }
  nlohmann::json j;
  try {
    j = parse_json(f, "quantizer file '" + s + "'");
  } catch (const nlohmann::json::parse_error& e) {
    throw Error("quantizer file '" + s + "' is not valid JSON: " + json_error_text(e.what()));
  }
  return quantizer_from_json(j, s);
}

void validate(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": " + m); };
  if (q.element == nullptr || q.scale == nullptr) fail("element and scale formats must be set");
  const Format& e = *q.element;
  if (e.bits() > 8 || !e.is_signed || e.special == Special::e8m0)
    fail("element format '" + std::string(e.name) +
         "' cannot be a block element; valid: e2m1, e2m3, e3m2, e4m3, e5m2, e4m3fnuz, e5m2fnuz, int8");
  if ((q.block_rows == 0) != (q.block_cols == 0))
    fail("block [" + std::to_string(q.block_rows) + "," + std::to_string(q.block_cols) +
         "] is invalid: both extents >= 1, or [0,0] for one scale per tensor");
  if (q.block_rows < 0 || q.block_cols < 0) fail("block extents must be >= 0");
  switch (q.scale_rule) {
    case ScaleRule::ocp:
    case ScaleRule::ceil:
    case ScaleRule::tetrajet:
      if (q.scale != &float8_e8m0fnu)
        fail("scale_rule '" + std::string(scale_rule_name(q.scale_rule)) +
             "' makes power-of-two scales: scale must be e8m0, got '" + std::string(q.scale->name) + "'");
      break;
    case ScaleRule::nv:
    case ScaleRule::nv_noglobal:
      if (q.scale != &ufloat8_e4m3 && q.scale != &float8_e4m3fn)
        fail("scale_rule '" + std::string(scale_rule_name(q.scale_rule)) +
             "' needs an E4M3 scale (ue4m3 or e4m3), got '" + std::string(q.scale->name) + "'");
      break;
    case ScaleRule::tensor_amax:
      if (q.scale != &float32)
        fail("scale_rule 'tensor_amax' uses float32 scales: scale must be f32, got '" + std::string(q.scale->name) +
             "'");
      break;
    case ScaleRule::torchao_floor:
    case ScaleRule::torchao_ceil:
    case ScaleRule::torchao_even:
    case ScaleRule::torchao_rceil:
    case ScaleRule::te_mxfp8: {
      const std::string rule(scale_rule_name(q.scale_rule));
      if (q.scale != &float8_e8m0fnu)
        fail("scale_rule '" + rule + "' makes power-of-two scales: scale must be e8m0, got '" +
             std::string(q.scale->name) + "'");
      const bool fp8 = &e == &float8_e4m3fn || &e == &float8_e5m2;
      const bool mx = fp8 || &e == &float4_e2m1fn || &e == &float6_e2m3fn || &e == &float6_e3m2fn;
      if (q.scale_rule == ScaleRule::te_mxfp8 ? !fp8 : !mx)
        fail("scale_rule '" + rule + "' takes " +
             (q.scale_rule == ScaleRule::te_mxfp8 ? "e4m3 or e5m2 elements (TransformerEngine's MXFP8)"
                                                  : "e2m1, e2m3, e3m2, e4m3 or e5m2 elements (torchao's MX)") +
             ", got '" + std::string(e.name) + "'");
      break;
    }
    case ScaleRule::deepgemm:
    case ScaleRule::te_fp8_block:
    case ScaleRule::amax_div: {
      const std::string rule(scale_rule_name(q.scale_rule));
      const bool e8m0_ok = q.scale_rule != ScaleRule::amax_div;
      if (q.scale != &float32 && !(e8m0_ok && q.scale == &float8_e8m0fnu))
        fail("scale_rule '" + rule + "' stores " +
             (e8m0_ok ? "float32 scales (f32) or power-of-two scales (e8m0)" : "float32 scales (f32)") +
             ": got scale '" + std::string(q.scale->name) + "'");
      if (&e != &float8_e4m3fn && &e != &float8_e5m2)
        fail("scale_rule '" + rule + "' is FP8 block scaling: element must be e4m3 or e5m2, got '" +
             std::string(e.name) + "'");
      break;
    }
  }
  if (q.global_scale == GlobalScale::tensor_amax && q.scale_rule != ScaleRule::nv)
    fail("global_scale 'tensor_amax' is the second level of the 'nv' rule only; use global_scale 'none' with '" +
         std::string(scale_rule_name(q.scale_rule)) + "'");
  if (q.rht && !((q.block_rows == 1 && q.block_cols == 16) || (q.block_rows == 16 && q.block_cols == 1)))
    fail("rht works on 1-D blocks of 16: block must be [1,16] or [16,1], got [" + std::to_string(q.block_rows) + "," +
         std::to_string(q.block_cols) + "]");
  if (!q.rht && (q.rht_signs != RhtSigns::philox || q.rht_output != RhtOutput::f32 || q.rht_kind != RhtKind::rht16))
    fail("rht_signs, rht_output and rht_kind describe the RHT: they need rht true");
  if (q.rht_kind == RhtKind::quartet2_128 && (q.rht_signs != RhtSigns::philox || q.rht_output != RhtOutput::f32))
    fail(
        "rht_kind 'quartet2_128' draws its 128 signs from rht_seed and returns FP32: rht_signs must be philox and "
        "rht_output f32");
  check_sr_bits(q.sr_bits, e, where);
  if (q.emulate == Emulation::fp4tk) validate_fp4tk(q, where);
  if (q.emulate == Emulation::te_fast_math) validate_te_fast_math(q, where);
  if (q.emulate == Emulation::quartet2) validate_quartet2(q, where);
  if (q.emulate == Emulation::te_fused_fast_math) validate_te_fused_fast_math(q, where);
  if (block_rule_id(q) == BlockRuleId::tetrajet2) validate_tetrajet2(q, where);
  if (q.emulate == Emulation::quartet2_triton) validate_quartet2_triton(q, where);
  if (q.emulate == Emulation::quartet2_eden_triton) validate_quartet2_eden_triton(q, where);
  if (q.emulate == Emulation::te_reference) validate_te_reference(q, where);
  validate_nvfp4_options(q, where);
}

std::string describe(const QuantizerSpec& q) {
  std::ostringstream s;
  s << short_format_name(*q.element) << " [" << q.block_rows << "," << q.block_cols << "] "
    << short_format_name(*q.scale) << " " << scale_rule_name(q.scale_rule) << " " << round_name(q.round) << " "
    << (q.overflow == Overflow::saturate ? "sat" : "nonsat");
  if (q.global_scale == GlobalScale::tensor_amax) s << " global";
  if (q.global_scale == GlobalScale::row_amax) s << " row_amax";
  if (q.scale_select == ScaleSelect::four_over_six)
    s << " four_over_six " << select_error_name(q.select_error) << " e4m3_max " << q.e4m3_max;
  if (q.rht && q.rht_signs == RhtSigns::te)
    s << " rht(TE signs" << (q.rht_output == RhtOutput::bf16 ? ", bf16" : "") << ")";
  else if (q.rht)
    s << (q.rht_kind == RhtKind::quartet2_128 ? " rht128(seed " : " rht(seed ") << q.rht_seed
      << (q.rht_output == RhtOutput::bf16 ? ", bf16" : "") << ")";
  if (q.sr_bits != SrBits::per_element) s << " sr " << sr_bits_name(q.sr_bits);
  if (q.emulate == Emulation::fp4tk) s << " fp4tk";
  if (q.emulate == Emulation::te_fast_math) s << " te_fast_math";
  if (q.emulate == Emulation::quartet2) s << " quartet2";
  if (q.emulate == Emulation::te_fused_fast_math) s << " te_fused_fast_math";
  if (q.emulate == Emulation::tetrajet2_source) s << " tetrajet2_source";
  if (q.emulate == Emulation::tetrajet2_triton) s << " tetrajet2_triton";
  if (q.emulate == Emulation::tetrajet2_kernel) s << " tetrajet2_kernel";
  if (q.emulate == Emulation::quartet2_triton) s << " quartet2_triton";
  if (q.emulate == Emulation::quartet2_eden_triton) s << " quartet2_eden_triton";
  if (q.emulate == Emulation::te_reference) s << " te_reference";
  return s.str();
}

}  // namespace fp4lab
