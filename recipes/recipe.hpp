// Recipes (DESIGN.md sec. 4): which quantizer each of the six GEMM operands of
// a linear layer y = x W^T + b uses.
//
//   forward   y  = x  W^T : fwd_x  (x  [B, in],  reduction over in)
//                           fwd_w  (W  [out, in], reduction over in)
//   dgrad     dx = dy W   : dgrad_grad_y (dy [B, out], reduction over out)
//                           dgrad_w      (W  [out, in], reduction over out)
//   wgrad     dW = dy^T x : wgrad_grad_y (dy [B, out], reduction over B)
//                           wgrad_x      (x  [B, in],  reduction over B)
// Each operand's quantizer is stated with its block along the GEMM's
// reduction axis in the operand's own row-major layout (so fwd_x uses [1,N],
// dgrad_w and the wgrad operands [N,1]; 2-D tiles [N,N] are the same either
// way). An empty optional = that operand stays in high precision.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sim/quantizer.hpp"

namespace fp4lab {

enum class Operand : uint8_t { fwd_x, fwd_w, dgrad_grad_y, dgrad_w, wgrad_grad_y, wgrad_x };
inline constexpr int kOperandCount = 6;
const char* operand_name(Operand op);

enum class HighPrecision : uint8_t { fp32, bf16 };

// TransformerEngine's backward_override (NVTE_BACKWARD_OVERRIDE, TE PR #2644):
// the backward's GEMMs run in the high-precision mode and no gradient is
// quantized. high_precision: from the original x and W. dequantized: from the
// forward's quantized x and W (Q_fwd_x(x), Q_fwd_w(W) with the forward's
// streams: the forward's bits), so that the backward sees the quantization the
// forward (and inference) used. The backward's own quantizers, the wgrad RHT
// and double quantization are then unused (recipes/linear_plan.cpp).
enum class BackwardOverride : uint8_t { none, high_precision, dequantized };

// When the recipe's rotations (wgrad_rht, dgrad_rht) draw their signs: fixed, the signs of rht_seed at every
// step (TransformerEngine's fixed sign vector plays this role); per_step, fresh signs for each layer and step
// (Quartet II's re-randomised rotation: rotation_seed in recipes/linear_plan.hpp).
enum class RhtSchedule : uint8_t { fixed, per_step };

struct Recipe {
  std::string name;
  std::string source;  // citation
  std::array<std::optional<QuantizerSpec>, kOperandCount> operands;
  bool double_quantization = false;  // TetraJet: re-quantize dq(W) along the other axis for dgrad etc.
  // With double_quantization: false re-quantizes only W (wgrad's x is the raw
  // x), as fp4-trainkit's tetrajet does (its backward saves x, not Q(x)).
  // JSON: "double_quantization": "weights".
  bool double_quantization_x = true;
  // False: quantized layers compute y = Q(x) Q(W)^T without adding their bias
  // (fp4-trainkit's FP4MatMul never adds it; the bias still gets its gradient
  // and its optimizer step). Layers kept in high precision keep their bias.
  bool forward_bias = true;
  // True: every block-scaled operand's block is one the hardware's GEMMs take
  // (MX: 32, NVFP4-style E4M3: 16, FP8 block scaling: 128; recipe.cpp's
  // validate_operand). False (JSON "hardware_blocks": false): any run of K >= 2
  // elements along the reduction axis, [1,K]/[K,1] or [K,K], for ablations
  // such as MX with blocks of 16 or E4M3 scales on blocks of 32; the operands
  // are then simulated exactly as ever (BF16-exact operands, a BF16 GEMM), and
  // no native block-scaled GEMM runs them.
  bool hardware_blocks = true;
  bool wgrad_rht = false;            // a rotation of both wgrad operands along B
  bool dgrad_rht = false;            // a rotation of both dgrad operands along out (Quartet II's backward)
  RhtKind rht_kind = RhtKind::rht16;  // the rotations' transform (sim/rht.hpp): 16-point RHT or Quartet II's 128
  RhtSchedule rht_schedule = RhtSchedule::fixed;
  uint64_t rht_seed = 0;
  HighPrecision high_precision = HighPrecision::fp32;  // arithmetic of the unquantized parts
  BackwardOverride backward_override = BackwardOverride::none;
  std::vector<std::string> keep_high_precision;        // layer-name patterns ('*' wildcard) left unquantized
  std::optional<std::string> switch_to;                // recipe to use for the last `switch_fraction` of training
  double switch_fraction = 0.0;

  const std::optional<QuantizerSpec>& operand(Operand op) const { return operands[size_t(op)]; }
  bool keeps_high_precision(const std::string& layer_name) const;
  bool operator==(const Recipe&) const = default;
};

std::vector<std::string> recipe_names();
Recipe recipe_by_name(const std::string& name);
// JSON: {"extends": "nvfp4", "fwd_x": {...} | "mxfp4" | null, ...}. Errors name
// the JSON path (`where`) and the valid choices.
Recipe recipe_from_json(const nlohmann::json& j, const std::string& where = "recipe");
nlohmann::json recipe_to_json(const Recipe& r);
// A canned name, a JSON file path, or a JSON object text.
Recipe parse_recipe(const std::string& name_or_path);
// Throws fp4lab::Error (prefixed by `where`) if the recipe is impossible: an
// operand's quantizer invalid (sim validate) or not blocked along its GEMM's
// reduction axis, a 16-point wgrad_rht / dgrad_rht with blocks not 16 long along the rotated axis,
// double_quantization without fwd quantizers, a bad switch.
void validate(const Recipe& r, const std::string& where = "recipe");

// Glob match of a layer name against one pattern: '*' matches any run of
// characters (also empty), everything else literally; the whole name must match.
bool name_matches(const std::string& pattern, const std::string& name);

// The precision switch: the first step that uses `switch_to` is
// total_steps - round(switch_fraction * total_steps).
uint64_t switch_step(const Recipe& r, uint64_t total_steps);
// The recipe in force at `step` of a run of `total_steps`: r itself, or the
// recipe named by r.switch_to (parse_recipe) from switch_step() on.
Recipe effective_recipe(const Recipe& r, uint64_t step, uint64_t total_steps);

// Operand by name ("fwd_x" ...); throws naming the valid names.
Operand operand_by_name(const std::string& name);
// fp4-trainkit's listing: "Q0..Q5" per operand plus the other fields, one per line.
std::string describe(const Recipe& r);

}  // namespace fp4lab
