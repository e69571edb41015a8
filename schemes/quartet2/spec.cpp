// validate()'s checks of emulate 'quartet2' (schemes/quartet2/scalar.hpp).
#include <string>

#include "core/error.hpp"
#include "sim/nvfp4_checks.hpp"
#include "schemes/quartet2/eden_triton.hpp"
#include "schemes/quartet2/rule.hpp"
#include "schemes/te_nvfp4/rule.hpp"

namespace fp4lab {

void validate_quartet2(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'quartet2': " + m); };
  check_nvfp4_formats(q, fail, "Quartet II's kernels", true);
  if (q.block_rows != 1 || q.block_cols != 16)
    fail("the kernel scales 16 consecutive elements of a row: block must be [1,16], got [" +
         std::to_string(q.block_rows) + "," + std::to_string(q.block_cols) + "]");
  if (q.rht) fail("the forward kernels take no transform (the backward's MS-EDEN is not modelled): rht must be false");
  if (q.round != Round::rn)
    fail("the forward kernels round to nearest even: round must be rn, got '" + std::string(round_name(q.round)) + "'");
  if (q.overflow != Overflow::saturate) fail("the kernel's casts are satfinite: overflow must be saturate");
  const bool fos = q.scale_select == ScaleSelect::four_over_six;
  if (q.e4m3_max != (fos ? 256 : 448))
    fail(fos ? "Quartet II's 4/6 divides the tensor amax by 256: e4m3_max must be 256, got " +
                   std::to_string(q.e4m3_max)
             : "Quartet II's round-to-nearest divides the tensor amax by 448: e4m3_max must be 448, got " +
                   std::to_string(q.e4m3_max));
  if (fos && q.select_error != SelectError::mse)
    fail("Quartet II's 4/6 scores candidates by their squared errors: select_error must be 'mse', got '" +
         std::string(select_error_name(q.select_error)) + "'");
}

void validate_quartet2_triton(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'quartet2_triton': " + m); };
  check_nvfp4_formats(q, fail, "Quartet II", true);
  if (q.block_rows != 1 || q.block_cols != 16)
    fail("the kernel groups 16 consecutive elements of a row: block must be [1,16], got [" +
         std::to_string(q.block_rows) + "," + std::to_string(q.block_cols) + "]");
  if (q.rht) fail("the forward quantizer takes no transform: rht must be false");
  if (q.round != Round::rna)
    fail("its rtn_fp4 rounds ties away from zero: round must be rna, got '" + std::string(round_name(q.round)) + "'");
  if (q.overflow != Overflow::saturate) fail("rtn_fp4 saturates at 6: overflow must be saturate");
  if (q.scale_select != ScaleSelect::max)
    fail("its 4/6 sums errors in a tree the compiler picks (not modelled): scale_select must be max");
}

void validate_quartet2_eden_triton(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'quartet2_eden_triton': " + m); };
  check_nvfp4_formats(q, fail, "MS-EDEN", true);
  if (!((q.block_rows == 1 && q.block_cols == 16) || (q.block_rows == 16 && q.block_cols == 1)))
    fail("the kernel scales groups of 16 along the GEMM's reduction axis: block must be [1,16] or [16,1], got [" +
         std::to_string(q.block_rows) + "," + std::to_string(q.block_cols) + "]");
  if (q.rht && q.rht_kind != RhtKind::quartet2_128)
    fail("the kernel rotates 128-element chunks: rht needs rht_kind 'quartet2_128' (or rht false: H = I)");
  if (q.round != Round::rna)
    fail("its rtn_fp4 rounds ties away from zero: round must be rna, got '" + std::string(round_name(q.round)) + "'");
  if (q.overflow != Overflow::saturate) fail("rtn_fp4 saturates at 6: overflow must be saturate");
  if (q.scale_select != ScaleSelect::max) fail("MS-EDEN has no 4/6 choice: scale_select must be max");
}

}  // namespace fp4lab
