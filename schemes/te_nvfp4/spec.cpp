// TransformerEngine's 2026 NVFP4 options (schemes/te_nvfp4/rule.hpp): their JSON names and validate()'s
// checks.
#include <string>

#include "core/error.hpp"
#include "sim/nvfp4_checks.hpp"
#include "schemes/te_nvfp4/reference.hpp"
#include "schemes/te_nvfp4/rule.hpp"

namespace fp4lab {

std::string_view scale_select_name(ScaleSelect s) { return s == ScaleSelect::four_over_six ? "four_over_six" : "max"; }

std::string_view select_error_name(SelectError e) {
  switch (e) {
    case SelectError::mae: return "mae";
    case SelectError::mse: return "mse";
    case SelectError::mae_fp16: return "mae_fp16";
    case SelectError::mse_fp16: return "mse_fp16";
  }
  return "?";
}

ScaleSelect parse_scale_select(std::string_view s) {
  for (ScaleSelect v : {ScaleSelect::max, ScaleSelect::four_over_six})
    if (scale_select_name(v) == s) return v;
  throw Error("unknown scale_select '" + std::string(s) + "'; valid: max, four_over_six");
}

SelectError parse_select_error(std::string_view s) {
  for (SelectError v : {SelectError::mae, SelectError::mse, SelectError::mae_fp16, SelectError::mse_fp16})
    if (select_error_name(v) == s) return v;
  throw Error("unknown select_error '" + std::string(s) + "'; valid: mae, mse, mae_fp16, mse_fp16");
}

void validate_nvfp4_options(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": " + m); };
  const bool fos = q.scale_select == ScaleSelect::four_over_six, row = q.global_scale == GlobalScale::row_amax;
  if (q.e4m3_max != 448 && q.e4m3_max != 256) fail("e4m3_max must be 448 or 256, got " + std::to_string(q.e4m3_max));
  if (!fos && q.select_error != SelectError::mae)
    fail("select_error '" + std::string(select_error_name(q.select_error)) +
         "' applies to scale_select 'four_over_six' only; with scale_select 'max' it stays 'mae'");
  if (!fos && q.e4m3_max != 448)
    fail("e4m3_max " + std::to_string(q.e4m3_max) +
         " applies to scale_select 'four_over_six' only (TE's bound of 4/6 tensors); with scale_select 'max' it "
         "stays 448");
  if (!fos && !row) return;
  const std::string what = fos ? "scale_select 'four_over_six'" : "global_scale 'row_amax'";
  if (q.element != &float4_e2m1fn)
    fail(what + " is an NVFP4 option: element must be e2m1, got '" + std::string(q.element->name) + "'");
  if (q.scale_rule != ScaleRule::nv)
    fail(what + " is an NVFP4 option: scale_rule must be 'nv', got '" + std::string(scale_rule_name(q.scale_rule)) +
         "'");
  if (q.rht) fail(what + " does not take an RHT (TransformerEngine rejects it): rht must be false");
  if (q.round == Round::rs)
    fail(what + " does not take stochastic rounding (TransformerEngine rejects it): round must not be 'rs'");
  if (fos && q.round != Round::rn)
    fail("scale_select 'four_over_six' compares candidates rounded to nearest even: round must be 'rn', got '" +
         std::string(round_name(q.round)) + "'");
  if (fos && q.global_scale == GlobalScale::none)
    fail(
        "scale_select 'four_over_six' needs a global scale: global_scale must be 'tensor_amax' or 'row_amax', got "
        "'none'");
  if (q.emulate != Emulation::none && !(fos && q.emulate == Emulation::quartet2))
    fail(what + " has no emulation but Quartet II's 4/6: emulate must be 'none' or 'quartet2'");
  std::string blk = "[";  // (built by appends: GCC 12's -Wrestrict misfires on "[" + std::string)
  blk += std::to_string(q.block_rows) + "," + std::to_string(q.block_cols) + "]";
  const bool b116 = q.block_rows == 1 && q.block_cols == 16;
  if (row && !b116)
    fail("global_scale 'row_amax' scales [1,16] row blocks by their row's amax: block must be [1,16], got " + blk);
  if (fos && !(b116 || (q.block_rows == 16 && q.block_cols == 1) || (q.block_rows == 16 && q.block_cols == 16)))
    fail("scale_select 'four_over_six' works on NVFP4 blocks: block must be [1,16], [16,1] or [16,16], got " + blk);
}

namespace {

// The checks TE's NVFP4 kernels share (the tuned 1-D and the fused RHT-cast ones): e2m1 under a ue4m3 block scale
// and the tensor's scale, 1-D blocks of 16, cvt.rn or cvt.rs (ptx_x4), satfinite, no 4/6. `blocks`: why the
// kernel writes [1,16] or [16,1]; `no_fos`: why it takes no 4/6.
template <class Fail>
void check_te_nvfp4_kernel(const QuantizerSpec& q, const Fail& fail, const char* blocks, const char* no_fos) {
  check_nvfp4_formats(q, fail, "TE's NVFP4 kernels", true);
  if (!((q.block_rows == 1 && q.block_cols == 16) || (q.block_rows == 16 && q.block_cols == 1)))
    fail(std::string(blocks) + ": block must be [1,16] or [16,1], got [" + std::to_string(q.block_rows) + "," +
         std::to_string(q.block_cols) + "]");
  if (q.round != Round::rn && q.round != Round::rs)
    fail("the kernel rounds with cvt.rn or cvt.rs: round must be rn or rs, got '" + std::string(round_name(q.round)) +
         "'");
  if (q.round == Round::rs && q.sr_bits != SrBits::ptx_x4)
    fail("the kernel's SR is cvt.rs.satfinite.e2m1x4 (one 32-bit word per 4 elements): sr_bits must be ptx_x4");
  if (q.overflow != Overflow::saturate) fail("the kernel's casts are satfinite: overflow must be saturate");
  if (q.scale_select != ScaleSelect::max) fail(std::string(no_fos) + ": scale_select must be max");
}

}  // namespace

void validate_te_fast_math(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'te_fast_math': " + m); };
  check_te_nvfp4_kernel(q, fail, "the fast-math coefficient is the tuned 1-D kernel's",
                        "TE ignores fast math for 4/6 quantizers");
  if (q.rht && q.rht_output != RhtOutput::bf16)
    fail(
        "the tuned 1-D kernel casts TE's BF16 RHT output (its unfused path): with rht, rht_output must be 'bf16' "
        "(the fused RHT-cast kernels' FP32 sums are emulate 'te_fused_fast_math')");
}

void validate_te_fused_fast_math(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'te_fused_fast_math': " + m); };
  check_te_nvfp4_kernel(q, fail, "the fused kernels write 1x16 blocks of x and of its transpose",
                        "TE's RHT kernels take no 4/6");
  if (q.rht && q.rht_output != RhtOutput::f32)
    fail("under fast math the fused kernel casts the RHT's FP32 sums: rht_output must be 'f32'");
}

void validate_te_reference(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'te_reference': " + m); };
  check_nvfp4_formats(q, fail, "TE's NVFP4 reference", true);
  const int br = q.block_rows, bc = q.block_cols;
  if (!((br == 1 && bc == 16) || (br == 16 && bc == 1) || (br == 16 && bc == 16)))
    fail("TE's reference quantizes 1x16 or 16x16 tiles: block must be [1,16], [16,1] or [16,16], got [" +
         std::to_string(br) + "," + std::to_string(bc) + "]");
  if (q.round != Round::rn)
    fail("the reference's cast rounds to nearest even: round must be rn, got '" + std::string(round_name(q.round)) +
         "'");
  if (q.overflow != Overflow::saturate) fail("the reference clamps to +-6: overflow must be saturate");
  if (q.scale_select != ScaleSelect::max)
    fail("its 4/6 form is TE's option (scale_select four_over_six without emulate): scale_select must be max");
}

}  // namespace fp4lab
