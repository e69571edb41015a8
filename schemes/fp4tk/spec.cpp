// fp4-trainkit's quantizer specs (schemes/fp4tk/rule.hpp): validate()'s checks of emulate 'fp4tk'.
#include <string>

#include "core/error.hpp"
#include "schemes/fp4tk/rule.hpp"

namespace fp4lab {

void validate_fp4tk(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'fp4tk': " + m); };
  if (q.element != &float4_e2m1fn)
    fail("fp4-trainkit quantizes to e2m1 only; element must be e2m1, got '" + std::string(q.element->name) + "'");
  const bool mx =
      q.scale_rule == ScaleRule::ocp || q.scale_rule == ScaleRule::ceil || q.scale_rule == ScaleRule::tetrajet;
  if (!mx && q.scale_rule != ScaleRule::nv_noglobal)
    fail("scale_rule must be ocp, ceil or tetrajet (MXFP4) or nv_noglobal (NVFP4), got '" +
         std::string(scale_rule_name(q.scale_rule)) + "'");
  if (q.block_rows != 1 && q.block_cols != 1)
    fail("fp4-trainkit's blocks are 1-D: block must be [1,K] or [K,1], got [" + std::to_string(q.block_rows) + "," +
         std::to_string(q.block_cols) + "]");
  if (q.block_rows == 0 || q.block_cols == 0) fail("per-tensor blocks ([0,0]) are not fp4-trainkit's");
  if (q.global_scale != GlobalScale::none) fail("fp4-trainkit has no global scale; global_scale must be none");
  if (q.rht) fail("fp4-trainkit has no RHT; rht must be false");
  if (q.round != Round::rn && q.round != Round::rs)
    fail("round must be rn or rs (fp4-trainkit's Nearest and Stochastic), got '" + std::string(round_name(q.round)) +
         "'");
  if (q.sr_bits != SrBits::per_element) fail("sr_bits must be per_element");
  if (q.overflow != Overflow::saturate) fail("fp4-trainkit saturates; overflow must be saturate");
}

}  // namespace fp4lab
