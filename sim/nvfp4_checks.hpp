// The format checks every NVFP4 emulation's validate() shares (schemes/*/spec.cpp): e2m1 elements under an E4M3
// block scale and, for the two-level forms, the nv rule with the tensor's FP32 scale. fail(message) throws.
#pragma once

#include <string>

#include "sim/quantizer.hpp"

namespace fp4lab {

// `who` names the tool in the element message ("TE's NVFP4 kernels", "Quartet II", ...).
template <class Fail>
void check_nvfp4_formats(const QuantizerSpec& q, const Fail& fail, const std::string& who, bool two_level) {
  if (q.element != &float4_e2m1fn)
    fail(who + " quantizes to e2m1: element must be e2m1, got '" + std::string(q.element->name) + "'");
  if (q.scale != &ufloat8_e4m3 && q.scale != &float8_e4m3fn)
    fail("NVFP4's block scale is E4M3: scale must be ue4m3, got '" + std::string(q.scale->name) + "'");
  if (two_level && (q.scale_rule != ScaleRule::nv || q.global_scale != GlobalScale::tensor_amax))
    fail("the two-level scale: scale_rule must be 'nv' with global_scale 'tensor_amax'");
}

}  // namespace fp4lab
