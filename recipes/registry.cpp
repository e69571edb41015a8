// The canned recipes (DESIGN.md sec. 4), each with its source.
//
// Axis convention (recipe.hpp): every quantizer is blocked along its GEMM's
// reduction axis in the operand's own row-major layout:
//   fwd_x x[B,in], fwd_w W[out,in], dgrad_grad_y dy[B,out]  -> row blocks [1,K]
//   dgrad_w W[out,in], wgrad_grad_y dy[B,out], wgrad_x x[B,in] -> column blocks [K,1]
// fp4-trainkit (github.com/vuiseng9/fp4-trainkit, src/fp4tk/recipe.py) names
// the same six quantizers Q0..Q5 = fwd_x, fwd_wt, bwd_grad_y, bwd_w,
// bwd_grad_yt, bwd_x and blocks W^T column-wise / dy^T row-wise, i.e. the same
// axes as here.
//
// fp4-trainkit's rounding table (README.md, "Supported Recipes and Very Early
// Results", and recipe.py's create_*_recipe), reproduced exactly below:
//
//   operand              mx_baseline  nvidia_round_to_infinity  tetrajet  fp4_all_the_way
//   Q0 fwd_x      Q(X)      RTN           RTN                    RTN        RTN
//   Q1 fwd_w      Q(W^T)    RTN           RTN                    RTN        RTN
//   Q2 dgrad_grad_y Q(dY)   RTN           RTN                    SR         SR
//   Q3 dgrad_w    Q(W)      RTN           RTN                    SR         RTN
//   Q4 wgrad_grad_y Q(dY^T) RTN           RTN                    SR         SR
//   Q5 wgrad_x    Q(X)      RTN           RTN                    SR         SR
//   format               MXFP4 (e2m1, E8M0 scale, block 32)              NVFP4 (e2m1, E4M3 scale, block 16)
//   scale                eq.1 (OCP)   eq.2 (ceil)            eq.2* (TetraJet) eq.3 (amax/6 in E4M3, no global)
//   double quantization  no           no                     yes        no
#include <array>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "recipes/recipe.hpp"

namespace fp4lab {

namespace {

enum class Axis { row, col };  // blocks along a row ([1,K]) or along a column ([K,1])

QuantizerSpec along(QuantizerSpec q, Axis a, int k) {
  q.block_rows = a == Axis::row ? 1 : k;
  q.block_cols = a == Axis::row ? k : 1;
  return q;
}

QuantizerSpec with_round(QuantizerSpec q, Round r) {
  q.round = r;
  return q;
}

// MX: e8m0 power-of-two scale per 32 elements (OCP MX v1.0).
QuantizerSpec mx_spec(const Format& element, ScaleRule rule, Axis a, Round r) {
  QuantizerSpec q;
  q.element = &element;
  q.scale = &float8_e8m0fnu;
  q.scale_rule = rule;
  q.round = r;
  q.overflow = Overflow::saturate;
  q.global_scale = GlobalScale::none;
  return along(q, a, 32);
}

// NVFP4: e2m1 elements, E4M3 scale per 16 elements, FP32 per-tensor second level.
QuantizerSpec nvfp4_spec(Axis a, Round r) {
  QuantizerSpec q;
  q.element = &float4_e2m1fn;
  q.scale = &ufloat8_e4m3;
  q.scale_rule = ScaleRule::nv;
  q.global_scale = GlobalScale::tensor_amax;
  q.round = r;
  q.overflow = Overflow::saturate;
  return along(q, a, 16);
}

QuantizerSpec nvfp4_tile_spec(Round r) {
  QuantizerSpec q = nvfp4_spec(Axis::row, r);
  q.block_rows = 16;
  q.block_cols = 16;
  return q;
}

// The six axes, in operand order.
constexpr Axis kAxis[kOperandCount] = {Axis::row, Axis::row, Axis::row, Axis::col, Axis::col, Axis::col};

// A recipe whose six quantizers differ only in axis and rounding.
Recipe uniform(const std::string& name, const std::string& source, QuantizerSpec base, int k,
               const std::array<Round, kOperandCount>& rounds) {
  Recipe r;
  r.name = name;
  r.source = source;
  for (int i = 0; i < kOperandCount; ++i)
    r.operands[size_t(i)] = with_round(along(base, kAxis[i], k), rounds[size_t(i)]);
  return r;
}

constexpr Round RN = Round::rn;
constexpr Round SR = Round::rs;

std::vector<Recipe> build() {
  std::vector<Recipe> v;

  {  // FP32 everywhere: the reference.
    Recipe r;
    r.name = "fp32";
    r.source = "FP32 reference: every GEMM operand in FP32, FP32 accumulation";
    v.push_back(r);
  }
  {  // BF16 mixed precision: operands rounded to bf16 (RN), FP32 accumulation.
    Recipe r;
    r.name = "bf16";
    r.source =
        "BF16 mixed precision (Kalamkar et al. 2019, arXiv:1905.12322): bf16 GEMM operands (RN), FP32 accumulate";
    r.high_precision = HighPrecision::bf16;
    v.push_back(r);
  }
  {  // MXFP8, Mishra et al. 2025 (arXiv:2506.08027, "Recipes for Pre-training
     // LLMs with MXFP8"): E4M3 for weights, activations AND gradients, 32-element
     // blocks, E8M0 scale rounded up (ceil(log2(amax/448))), RN elements.
    QuantizerSpec b = mx_spec(float8_e4m3fn, ScaleRule::ceil, Axis::row, RN);
    v.push_back(uniform("mxfp8",
                        "Mishra et al. 2025, Recipes for Pre-training LLMs with MXFP8 (arXiv:2506.08027): E4M3 "
                        "everywhere, block 32, E8M0 scale rounded up",
                        b, 32, {RN, RN, RN, RN, RN, RN}));
  }
  {  // fp4-trainkit mx_baseline: OCP MX v1.0 MXFP4 (eq.1 scale), RTN everywhere.
    QuantizerSpec b = mx_spec(float4_e2m1fn, ScaleRule::ocp, Axis::row, RN);
    v.push_back(uniform("mx_baseline",
                        "OCP Microscaling Formats (MX) v1.0 MXFP4; as fp4-trainkit's mx_baseline "
                        "(github.com/vuiseng9/fp4-trainkit src/fp4tk/recipe.py): eq.1 scale, RTN everywhere",
                        b, 32, {RN, RN, RN, RN, RN, RN}));
  }
  {  // fp4-trainkit nvidia_round_to_infinity: MXFP4 with Mishra et al.'s ceil scale (eq.2), RTN everywhere.
    QuantizerSpec b = mx_spec(float4_e2m1fn, ScaleRule::ceil, Axis::row, RN);
    v.push_back(uniform("nvidia_round_to_infinity",
                        "Mishra et al. 2025 (arXiv:2506.08027) round-to-infinity scale on MXFP4; as fp4-trainkit's "
                        "nvidia_round_to_infinity: eq.2 scale, RTN everywhere",
                        b, 32, {RN, RN, RN, RN, RN, RN}));
  }
  {  // fp4-trainkit tetrajet: TetraJet (Chen et al. 2025, arXiv:2502.20853):
     // truncation-free scale (eq.2*), RTN forward, SR on all four backward
     // operands, double quantization.
    QuantizerSpec b = mx_spec(float4_e2m1fn, ScaleRule::tetrajet, Axis::row, RN);
    Recipe r = uniform("tetrajet",
                       "TetraJet, Chen et al. 2025, Oscillation-Reduced MXFP4 Training for Vision Transformers "
                       "(arXiv:2502.20853); as fp4-trainkit's tetrajet: eq.2* scale, RTN forward, SR backward, "
                       "double quantization",
                       b, 32, {RN, RN, SR, SR, SR, SR});
    r.double_quantization = true;
    v.push_back(r);
  }
  {  // fp4-trainkit fp4_all_the_way: Chmiel et al. 2025 (arXiv:2505.19115):
     // NVFP4 blocks of 16 with an E4M3 scale of amax/6 and NO per-tensor scale
     // (eq.3, nv_noglobal); SR on dY (both GEMMs) and on X in wgrad, RTN on
     // X and W forward and on W in dgrad.
    QuantizerSpec b;
    b.element = &float4_e2m1fn;
    b.scale = &ufloat8_e4m3;
    b.scale_rule = ScaleRule::nv_noglobal;
    b.global_scale = GlobalScale::none;
    v.push_back(uniform("fp4_all_the_way",
                        "Chmiel et al. 2025, FP4 All the Way (arXiv:2505.19115); as fp4-trainkit's fp4_all_the_way: "
                        "NVFP4 blocks of 16, eq.3 E4M3 scale with no global scale, SR on gradients and wgrad X",
                        b, 16, {RN, RN, SR, RN, SR, SR}));
  }
  // fp4-trainkit's four recipes as its code computes them (emulate fp4tk,
  // schemes/fp4tk/scalar.hpp; docs/log/research_fp4trainkit.md): its element rounding
  // without carry, its two-step-wide SR noise, its scale floors, its tetrajet
  // double quantization of W only, and no bias in the quantized layers'
  // forward (its FP4MatMul drops it). Same per-operand rounding as above.
  for (const auto& [name, rule, k, rounds, dq_w] :
       {std::tuple{"mx_baseline", ScaleRule::ocp, 32, std::array{RN, RN, RN, RN, RN, RN}, false},
        std::tuple{"nvidia_round_to_infinity", ScaleRule::ceil, 32, std::array{RN, RN, RN, RN, RN, RN}, false},
        std::tuple{"tetrajet", ScaleRule::tetrajet, 32, std::array{RN, RN, SR, SR, SR, SR}, true},
        std::tuple{"fp4_all_the_way", ScaleRule::nv_noglobal, 16, std::array{RN, RN, SR, RN, SR, SR}, false}}) {
    QuantizerSpec b = quantizer_by_name(rule == ScaleRule::nv_noglobal ? "fp4tk_nvfp4" : "fp4tk_mxfp4");
    b.scale_rule = rule;
    Recipe r = uniform(std::string("fp4tk_") + name,
                       std::string("fp4-trainkit's ") + name +
                           " exactly as its code computes it (github.com/vuiseng9/fp4-trainkit a50163221f49, "
                           "src/fp4tk): emulate fp4tk quantizers, no forward bias in quantized layers" +
                           (dq_w ? ", double quantization of W only" : ""),
                       b, k, rounds);
    r.double_quantization = dq_w;
    r.double_quantization_x = !dq_w;  // W only (true is the neutral value without double quantization)
    r.forward_bias = false;
    v.push_back(r);
  }
  {  // Hybrid (fp4lab): the NVFP4 forward of arXiv:2509.25149 (1x16 blocks, RN,
     // two-level scale) with the MXFP8 backward of Mishra et al. 2025
     // (arXiv:2506.08027: E4M3, block 32, ceil scale, RN).
    Recipe r;
    r.name = "nvfp4_fwd_mxfp8_bwd";
    r.source =
        "fp4lab hybrid: NVFP4 forward GEMM as NVIDIA arXiv:2509.25149 (1x16, RN, two-level scale), MXFP8 backward "
        "GEMMs as Mishra et al. 2025 (arXiv:2506.08027: E4M3, block 32, ceil scale, RN)";
    r.operands[size_t(Operand::fwd_x)] = nvfp4_spec(Axis::row, RN);
    r.operands[size_t(Operand::fwd_w)] = nvfp4_spec(Axis::row, RN);
    for (Operand op : {Operand::dgrad_grad_y, Operand::dgrad_w, Operand::wgrad_grad_y, Operand::wgrad_x})
      r.operands[size_t(op)] = mx_spec(float8_e4m3fn, ScaleRule::ceil, kAxis[size_t(op)], RN);
    v.push_back(r);
  }
  {  // NVIDIA, "Pretraining Large Language Models with NVFP4" (arXiv:2509.25149),
     // sec. 4 / TransformerEngine's NVFP4BlockScaling recipe:
     //  - two-level scale: E4M3 per 16-element block + FP32 per-tensor (amax) scale;
     //  - weights in 16x16 2-D blocks, so the quantized W of the forward and the
     //    quantized W^T of dgrad are transposes of each other;
     //  - activations and gradients in 1x16 blocks along the reduction axis;
     //  - stochastic rounding on gradients (dY in dgrad and wgrad), RN elsewhere;
     //  - 16-point Random Hadamard Transform on both wgrad operands;
     //  - a few linear layers (the last ones) kept in BF16: here layers whose
     //    name matches "*head*".
    Recipe r;
    r.name = "nvfp4";
    r.source =
        "NVIDIA 2025, Pretraining Large Language Models with NVFP4 (arXiv:2509.25149): 16x16 weight blocks, 1x16 "
        "activations/gradients, SR on gradients, RHT(16) on wgrad, two-level scale, last layers in BF16";
    r.operands[size_t(Operand::fwd_x)] = nvfp4_spec(Axis::row, RN);
    r.operands[size_t(Operand::fwd_w)] = nvfp4_tile_spec(RN);
    r.operands[size_t(Operand::dgrad_grad_y)] = nvfp4_spec(Axis::row, SR);
    r.operands[size_t(Operand::dgrad_w)] = nvfp4_tile_spec(RN);
    r.operands[size_t(Operand::wgrad_grad_y)] = nvfp4_spec(Axis::col, SR);
    r.operands[size_t(Operand::wgrad_x)] = nvfp4_spec(Axis::col, RN);
    r.wgrad_rht = true;
    r.rht_seed = 0;
    r.high_precision = HighPrecision::bf16;
    r.keep_high_precision = {"*head*"};
    v.push_back(r);
  }
  // TransformerEngine's 2026 NVFP4 options (schemes/te_nvfp4/rule.hpp) on `nvfp4`.
  auto named = [&](const std::string& n) {
    for (const Recipe& r : v)
      if (r.name == n) return r;
    throw Error("registry: no recipe '" + n + "' to derive from");
  };
  {  // 4/6 (TE PR #2972; Cook et al. 2025, "Four Over Six", arXiv:2512.02010) as
     // TE's tests' make_recipe("nvfp4_4over6"): nvfp4_4over6 "all" (TE's scope:
     // the non-gradient tensors x and W, whose one quantizer also makes the
     // columnwise copy that dgrad / wgrad use), MAE, E4M3_MAX 256, 2-D weights,
     // disable_rht (TE rejects 4/6 with an RHT, and the wgrad GEMM needs both
     // operands rotated or neither). The gradients as `nvfp4` (SR), without RHT.
    Recipe r = named("nvfp4");
    r.name = "nvfp4_4over6";
    r.source =
        "TransformerEngine NVFP4BlockScaling with nvfp4_4over6 \"all\" (PR #2972; Cook et al. 2025, Four Over Six, "
        "arXiv:2512.02010) as TE's make_recipe(\"nvfp4_4over6\"): 4/6 scales (MAE, E4M3 max 256) on x (1x16 along "
        "the reduction axis) and W (16x16) in every GEMM, no RHT; gradients as nvfp4 (SR)";
    const QuantizerSpec x = quantizer_by_name("nvfp4_4over6"), w = quantizer_by_name("nvfp4_2d_4over6");
    r.operands[size_t(Operand::fwd_x)] = along(x, Axis::row, 16);
    r.operands[size_t(Operand::fwd_w)] = w;
    r.operands[size_t(Operand::dgrad_w)] = w;
    r.operands[size_t(Operand::wgrad_x)] = along(x, Axis::col, 16);
    r.wgrad_rht = false;
    v.push_back(r);
  }
  {  // Row-scaled NVFP4 (TE PR #2931, row_scaled_activation): one amax per row of
     // x in the forward GEMM; the other operands as `nvfp4`.
    Recipe r = named("nvfp4");
    r.name = "nvfp4_row_scaled";
    r.source =
        "TransformerEngine NVFP4BlockScaling with row_scaled_activation (PR #2931): the forward x with one FP32 "
        "amax per row (1x16 blocks); every other operand as nvfp4";
    r.operands[size_t(Operand::fwd_x)] = quantizer_by_name("nvfp4_row_scaled");
    v.push_back(r);
  }
  // FP8 block scaling, DeepSeek-V3 (arXiv:2412.19437, sec. 3.3): E4M3 for every GEMM operand, activations and
  // gradients in 1x128 tiles along the reduction axis, weights in 128x128 blocks (so W and W^T share one
  // quantization), FP32 scales, RN; the embedding, the output head, norms and attention stay in higher
  // precision (here: layers matching "*head*" in BF16). Two arithmetics of the same recipe:
  //  - fp8_blockwise: DeepGEMM's reference casts (schemes/fp8_block/scalar.hpp: amax clamped at 1e-4,
  //    sf = amax * fl(1/448), x * fl(1/sf)), what DeepGEMM's FP8 GEMMs are tested with;
  //  - te_fp8_blockwise: TransformerEngine's Float8BlockScaling defaults (x * fl(448/amax) rounded down to a
  //    power of two, stored as e8m0; NaN left out of the amax).
  for (const auto& [name, rule, scale, source] :
       {std::tuple{"fp8_blockwise", ScaleRule::deepgemm, &float32,
                   "DeepSeek-V3 (arXiv:2412.19437, sec. 3.3): FP8 E4M3 for all GEMM operands, 1x128 activation and "
                   "gradient tiles, 128x128 weight blocks, FP32 scales; DeepGEMM's reference casts "
                   "(per_token_cast_to_fp8 / per_block_cast_to_fp8); output head in BF16"},
        std::tuple{"te_fp8_blockwise", ScaleRule::te_fp8_block, &float8_e8m0fnu,
                   "TransformerEngine Float8BlockScaling (defaults): E4M3, x and dY in 1x128, W in 128x128, "
                   "power-of-two scales (compute_scale_from_amax); output head in BF16"}}) {
    QuantizerSpec tile;
    tile.element = &float8_e4m3fn;
    tile.scale = scale;
    tile.scale_rule = rule;
    tile.block_rows = 128;
    tile.block_cols = 128;
    Recipe r;
    r.name = name;
    r.source = source;
    for (int i = 0; i < kOperandCount; ++i) r.operands[size_t(i)] = along(tile, kAxis[i], 128);
    r.operands[size_t(Operand::fwd_w)] = tile;
    r.operands[size_t(Operand::dgrad_w)] = tile;
    r.high_precision = HighPrecision::bf16;
    r.keep_high_precision = {"*head*"};
    v.push_back(r);
  }
  {  // Quartet II (IST-DASLab 2025; code 8776a90b, src/models/quantization/schemes/quartet_2.py, the simulation
     // of the paper's runs): the forward's x and W by its Triton round-to-nearest NVFP4 quantizer (1x16 along
     // the reduction axis, scale_override 1); the backward re-quantizes the forward's quantized x and W (double
     // quantization) and dy, each with MS-EDEN (EDEN-corrected, stochastically rounded E4M3 scales) after a
     // 128-point rotation along the GEMM's reduction axis, dgrad's along out, wgrad's along B, whose signs are
     // drawn afresh at every backward call and shared by that call's four operands. Its rotation has 32 points
     // by default (Quartet_II_Linear's hadamard_dim); the paper's sweep runs 128. The output head in BF16.
    QuantizerSpec fwd = nvfp4_spec(Axis::row, Round::rna);
    fwd.emulate = Emulation::quartet2_triton;
    QuantizerSpec eden = nvfp4_spec(Axis::row, Round::rna);
    eden.emulate = Emulation::quartet2_eden_triton;
    Recipe r;
    r.name = "quartet2";
    r.source =
        "Quartet II (IST-DASLab 2025, code 8776a90b): RTN NVFP4 forward (its Triton simulation), MS-EDEN backward "
        "(EDEN-corrected scales rounded stochastically) after a 128-point rotation re-drawn every step, on the "
        "forward's quantized x and W; output head in BF16";
    r.operands[size_t(Operand::fwd_x)] = fwd;
    r.operands[size_t(Operand::fwd_w)] = fwd;
    for (int i = 2; i < kOperandCount; ++i) r.operands[size_t(i)] = along(eden, kAxis[i], 16);
    r.double_quantization = true;
    r.wgrad_rht = true;
    r.dgrad_rht = true;
    r.rht_kind = RhtKind::quartet2_128;
    r.rht_schedule = RhtSchedule::per_step;
    r.high_precision = HighPrecision::bf16;
    r.keep_high_precision = {"*head*"};
    v.push_back(r);
  }
  for (const Recipe& r : v) validate(r, "canned recipe " + r.name);
  return v;
}

const std::vector<Recipe>& canned() {
  static const std::vector<Recipe> list = build();
  return list;
}

}  // namespace

std::vector<std::string> recipe_names() {
  std::vector<std::string> n;
  for (const Recipe& r : canned()) n.push_back(r.name);
  return n;
}

Recipe recipe_by_name(const std::string& name) {
  for (const Recipe& r : canned())
    if (r.name == name) return r;
  std::string names;
  for (const Recipe& r : canned()) names += (names.empty() ? "" : ", ") + r.name;
  throw Error("unknown recipe '" + name + "'; valid: " + names);
}

}  // namespace fp4lab
