// validate()'s checks of emulate 'tetrajet2_source' / '_triton' / '_kernel' (schemes/tetrajet2/scalar.hpp).
#include <string>

#include "core/error.hpp"
#include "schemes/tetrajet2/rule.hpp"
#include "sim/nvfp4_checks.hpp"

namespace fp4lab {

void validate_tetrajet2(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'tetrajet2_*': " + m); };
  check_nvfp4_formats(q, fail, "TetraJet-v2", false);
  if (q.scale_rule != ScaleRule::nv || q.global_scale != GlobalScale::none)
    fail("the rule brings its own 1x128 outer scale: scale_rule must be 'nv' with global_scale 'none'");
  if (q.block_rows != 1 || q.block_cols != 16)
    fail("its inner blocks are 16 consecutive elements of a row: block must be [1,16], got [" +
         std::to_string(q.block_rows) + "," + std::to_string(q.block_cols) + "]");
  if (q.rht) fail("the forward quantizer takes no transform (its backward's RHT is a recipe step): rht must be false");
  if (q.round != Round::rn)
    fail(
        "the forward quantizer rounds to nearest even (its stochastic backward is not modelled yet): round must be "
        "rn, got '" +
        std::string(round_name(q.round)) + "'");
  if (q.overflow != Overflow::saturate) fail("its casts saturate: overflow must be saturate");
  if (q.scale_select != ScaleSelect::max) fail("scale_select must be max");
}

}  // namespace fp4lab
