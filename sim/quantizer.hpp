// The quantizer value (DESIGN.md sec. 3) and the bit-exact block quantizer.
//
// A QuantizerSpec says how to turn a 2-D row-major float32 tensor [rows, cols]
// into element codes + block scales (+ an optional per-tensor global scale):
//   element      element format (e2m1, e2m3, e3m2, e4m3, e5m2, int8 ...)
//   scale        block-scale format (e8m0 for MX, ue4m3 for NVFP4, float32 for
//                per-tensor FP8 current scaling)
//   block        [block_rows, block_cols]: [1,32] = 32 consecutive elements of
//                a row, [16,1] = 16 of a column, [16,16] a tile; [0,0] = the
//                whole tensor (per-tensor scaling)
//   scale_rule   how a block's scale is derived from its amax (scale_rules.hpp)
//   round        element rounding mode; overflow: element overflow policy
//   global_scale none | tensor_amax (NVFP4's second level, FP32) | row_amax
//                (TransformerEngine's row-scaled NVFP4: one FP32 amax per tensor
//                row behind the second level; [1,16] blocks; schemes/te_nvfp4/rule.hpp)
//   scale_select max (the block scale maps the block amax to the element's
//                max) | four_over_six (TransformerEngine's "4/6": per block the
//                better of that and a 1.5x scale, by select_error; e2m1/ue4m3
//                nv, rn, no rht; schemes/te_nvfp4/rule.hpp)
//   select_error mae | mse | mae_fp16 | mse_fp16: the error four_over_six
//                minimises (_fp16: TE's fast-math error path)
//   e4m3_max     448 | 256: E4M3_MAX of four_over_six's global scale (TE's
//                default for 4/6 tensors is 256; 448 otherwise)
//   rht          16-point Random Hadamard Transform along the block's axis
//                before quantization (1-D blocks of 16 only), signs from rht_seed
//   rht_signs    philox (from rht_seed) | te: TransformerEngine's fixed signs (sim/rht.hpp)
//   rht_output   f32 | bf16: the transformed values rounded to BF16 (RN) before the
//                amaxes and the cast, as TransformerEngine's RHT kernels (default build) do
//   rht_kind     rht16 | quartet2_128: Quartet II's 128-point rotation in place of the 16-point
//                RHT (sim/rht.hpp; BF16 operand and constant; philox signs, rht_output f32)
//   sr_bits      the random-bit contract of round "rs" (core/sr.hpp):
//                per_element (32 bits an element) | ptx_x4 (PTX cvt.rs: one
//                word per 4 elements of a row, 8 bits an element)
//   emulate      none | te_fast_math: TransformerEngine's NVFP4 kernels under NVTE_USE_FAST_MATH
//                (schemes/te_nvfp4/fast_math.hpp: the BF16 coefficient S_enc / sdec; e2m1, ue4m3,
//                nv, tensor_amax, [1,16] or [16,1], rn or rs with ptx_x4) |
//                te_reference: TransformerEngine's Python reference quantizer (schemes/te_nvfp4/
//                reference.hpp: the nv rule but an all-zero tensor's global scale 2^-128 and -0 as
//                code 0; e2m1, ue4m3, tensor_amax, [1,16], [16,1] or [16,16], rn) |
//                te_fused_fast_math: TransformerEngine's fused RHT-cast kernels under fast math
//                (schemes/te_nvfp4/fused_fast_math.hpp: rcp.approx.ftz element factor; rht optional,
//                rht_output f32) |
//                tetrajet2_source | tetrajet2_triton | tetrajet2_kernel: TetraJet-v2's 1x16 E4M3 /
//                1x128 FP32 double-block quantizer in IEEE, its Triton baseline's or its fast-math
//                CUDA kernels' arithmetic (schemes/tetrajet2/scalar.hpp; e2m1, ue4m3, nv without a
//                global scale, [1,16], rn) |
//                quartet2_triton: Quartet II's Triton simulation of that quantizer, round to nearest
//                (schemes/quartet2/triton.hpp: div.full, ties away; e2m1, ue4m3, nv, tensor_amax,
//                [1,16], rna) |
//                quartet2_eden_triton: Quartet II's Triton simulation of its backward MS-EDEN
//                quantizer (schemes/quartet2/eden_triton.hpp: EDEN-corrected, stochastically rounded
//                scales; e2m1, ue4m3, nv, tensor_amax, [1,16] or [16,1], rna; rht_kind
//                quartet2_128 or no rht) |
//                quartet2: Quartet II's forward NVFP4 kernels (schemes/quartet2/scalar.hpp:
//                rcp.approx.ftz reciprocals, its 4/6 score; e2m1, ue4m3, nv, tensor_amax,
//                [1,16], rn, scale_select max with e4m3_max 448 or four_over_six with 256) |
//                fp4tk: fp4-trainkit's own arithmetic (schemes/fp4tk/scalar.hpp:
//                its scale floors and log2, its E2M1 rounding without carry
//                into the next binade, its two-step-wide SR noise); e2m1
//                elements, 1-D blocks, rules ocp/ceil/tetrajet (e8m0) or
//                nv_noglobal (e4m3/ue4m3), no global scale, rht or sr_bits
// JSON form (the same object in recipes, configs and the CLI):
//   {"element": "e2m1", "scale": "ue4m3", "block": [1,16], "scale_rule": "nv",
//    "round": "rn", "overflow": "saturate", "global_scale": "tensor_amax",
//    "rht": false, "rht_seed": 0, "sr_bits": "per_element", "emulate": "none",
//    "scale_select": "max", "select_error": "mae", "e4m3_max": 448}
// Missing keys take the defaults below; unknown keys are errors naming the key.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "schemes/te_nvfp4/scalar.hpp"
#include "core/sr.hpp"
#include "core/tensor.hpp"
#include "sim/rht.hpp"

namespace fp4lab {

// fp4lab's rules (sim/scale_rules.hpp), then the schemes' (schemes/mx_scale_modes/scalar.hpp: torchao_floor,
// torchao_ceil, torchao_even, torchao_rceil, te_mxfp8; schemes/fp8_block/scalar.hpp: deepgemm, te_fp8_block,
// amax_div).
enum class ScaleRule : uint8_t {
  ocp,
  ceil,
  tetrajet,
  nv,
  nv_noglobal,
  tensor_amax,
  torchao_floor,
  torchao_ceil,
  torchao_even,
  torchao_rceil,
  te_mxfp8,
  deepgemm,
  te_fp8_block,
  amax_div,
};
// The rule's JSON name (its enumerator's name) and back (fp4lab::Error naming the valid choices otherwise).
std::string_view scale_rule_name(ScaleRule r);
ScaleRule parse_scale_rule(std::string_view s);
// rht_kind's JSON name (rht16, quartet2_128) and back (the quantizer key and the recipe key share them).
std::string_view rht_kind_name(RhtKind k);
RhtKind parse_rht_kind(std::string_view s);
enum class GlobalScale : uint8_t { none, tensor_amax, row_amax };
enum class ScaleSelect : uint8_t { max, four_over_six };
enum class Emulation : uint8_t {
  none,
  fp4tk,
  te_fast_math,
  quartet2,
  te_fused_fast_math,
  tetrajet2_source,
  tetrajet2_triton,
  tetrajet2_kernel,
  quartet2_triton,
  quartet2_eden_triton,
  te_reference
};

struct QuantizerSpec {
  const Format* element = &float4_e2m1fn;
  const Format* scale = &float8_e8m0fnu;
  int block_rows = 1, block_cols = 32;
  ScaleRule scale_rule = ScaleRule::ocp;
  Round round = Round::rn;
  Overflow overflow = Overflow::saturate;
  GlobalScale global_scale = GlobalScale::none;
  bool rht = false;
  uint64_t rht_seed = 0;
  RhtSigns rht_signs = RhtSigns::philox;
  RhtOutput rht_output = RhtOutput::f32;
  RhtKind rht_kind = RhtKind::rht16;
  SrBits sr_bits = SrBits::per_element;
  Emulation emulate = Emulation::none;
  ScaleSelect scale_select = ScaleSelect::max;
  SelectError select_error = SelectError::mae;  // (schemes/te_nvfp4/scalar.hpp)
  int e4m3_max = 448;

  bool operator==(const QuantizerSpec&) const = default;
};

// Canned quantizers: mxfp4, mxfp6_e2m3, mxfp6_e3m2, mxfp8_e4m3, mxfp8_e5m2,
// mxint8, nvfp4, nvfp4_2d, nvfp4_col, fp8_e4m3_tensor, fp8_e5m2_tensor, and
// fp4-trainkit's fp4tk_mxfp4 ([1,32], ocp) and fp4tk_nvfp4 ([1,16], nv_noglobal),
// and TransformerEngine's nvfp4_4over6 ([1,16], four_over_six, mae, e4m3_max
// 256), nvfp4_2d_4over6 (the same in [16,16] tiles), nvfp4_row_scaled ([1,16],
// row_amax); FP8 block scaling (E4M3): fp8_block_1x128 and fp8_block_128x128
// (DeepSeek-V3's blocks in DeepGEMM's arithmetic, FP32 scales),
// te_fp8_block_1x128 and te_fp8_block_128x128 (TransformerEngine's
// Float8BlockScaling, power-of-two scales as e8m0); mxfp8_te_32x32 (TE's MXFP8
// 32x32 weight blocks).
QuantizerSpec quantizer_by_name(const std::string& name);
std::vector<std::string> quantizer_names();
// From a canned name, a JSON object, or the path of a JSON file.
QuantizerSpec parse_quantizer(const std::string& name_json_or_path);
// `where` names the JSON path for error messages, e.g. "recipe.fwd_x".
QuantizerSpec quantizer_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json quantizer_to_json(const QuantizerSpec& q);
// Throws fp4lab::Error (prefixed by `where`) if the combination is impossible.
void validate(const QuantizerSpec& q, const std::string& where);
std::string describe(const QuantizerSpec& q);  // one line, e.g. "e2m1 [1,16] ue4m3 nv rn sat global"

// Where the random bits of stochastic rounding come from: word w of the
// tensor (core/sr.hpp: w = r * cols + c per element, r * ceil(cols / G) + c / G
// under ptx_x4) is random_bits(seed, stream, w) (core/philox.hpp), or, when
// `words` is set (host memory, CPU quantizer only), words[w]: the random words
// of a kernel under test, rows * sr_words_per_row(...) of them.
struct RandomStream {
  uint64_t seed = 0;
  uint64_t stream = 0;
  const uint32_t* words = nullptr;
};

struct QuantStats {
  double sqnr_db = 0;            // 10 log10(sum x^2 / sum (x - dq)^2); +inf if exact
  double max_abs_error = 0;      // NaN when any input or output is NaN (never a claim of exactness then)
  double flushed_to_zero = 0;    // fraction of non-zero inputs whose dequantized value is 0
  double saturated = 0;          // fraction of elements clamped to +-max of the element format
                                 // (flushed and saturated: sim/element_stats.hpp's definitions)
  int64_t scale_underflows = 0;  // blocks whose scale underflowed the scale format
  int64_t scale_overflows = 0;   // blocks whose scale overflowed the scale format
};

struct QuantizedTensor {
  QuantizerSpec spec;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;              // [rows*cols], one element code per byte, row-major
  int64_t scale_rows = 0, scale_cols = 0;  // ceil(rows/block_rows) x ceil(cols/block_cols)
  std::vector<uint8_t> scale_codes;        // [scale_rows*scale_cols] codes of spec.scale (empty for float32 scales)
  std::vector<float> scales;               // decoded block scales (what multiplies an element code's value)
  float global_decode = 1.0f;              // g_dec of the nv rule (1 when there is no global scale, and with
                                           // four_over_six / row_amax, whose scales are TE's final
                                           // dequantization scales: schemes/te_nvfp4/rule.hpp)
  std::vector<float> dequant;              // [rows*cols]: decode(code) * scale * global_decode
};

// Quantizes x (row-major [rows, cols], float32) bit-exactly. The result does
// not depend on the number of OpenMP threads.
// Semantics (details and sources in sim/scale_rules.hpp):
//  - edge blocks are partial: their amax is over their valid elements only and
//    every output has exactly the input's shape (no padding);
//  - element encoding is core's encode() (encode_rn_f32 for rn) of x * 2^-e
//    (MX), x * e (nv), x / s (nv_noglobal), x * enc (tensor_amax); SR bits of
//    element (r, c) are random_bits(rs.seed, rs.stream, r * cols + c);
//  - NaN/Inf in an MX block: scale NaN (E8M0 0xFF), the block dequantizes to
//    NaN; NaN anywhere under nv with a global scale: everything NaN;
//  - with rht, x is first transformed along the block axis (sim/rht.hpp):
//    codes, scales and dequant are in the transformed domain (what a GEMM of
//    two transformed operands consumes); quant_stats compares there too; a
//    partial last chunk (axis length not a multiple of 16) is left
//    untransformed and quantized as the partial block it is;
//  - -0.0 input gives the element's -0 code (0x8 for e2m1); TE's Python
//    reference writes 0x0 there (same value).
// Throws fp4lab::Error for an invalid spec.
QuantizedTensor quantize(const QuantizerSpec& q, MatrixView<const float> x, RandomStream rs = {});
// Replaces x by its dequantized value (what fake quantization in training
// uses); same bits as quantize(...).dequant, without keeping codes. With rht
// the dequantized tensor is transformed back (inverse RHT, FP32) so that the
// result approximates x in x's own domain.
void fake_quantize(const QuantizerSpec& q, MatrixView<float> x, RandomStream rs = {});
QuantStats quant_stats(const QuantizedTensor& qt, MatrixView<const float> x);
// x as the quantizer's codes see it (the domain of quantize's dequant and of
// quant_stats): a contiguous row-major copy, RHT-transformed when q.rht.
std::vector<float> quantizer_domain(const QuantizerSpec& q, MatrixView<const float> x);

}  // namespace fp4lab
