// Run-time Format -> compile-time Format dispatch for the formats that have
// core's branch-free encoders (encode_rn_f32 / encode_rs_f32 in encode.hpp).
//
//   with_fast_element_format(f, fn): the seven FP4/FP6/FP8 element formats
//     (e2m1, e2m3, e3m2, e4m3fn, e5m2, e4m3fnuz, e5m2fnuz);
//   with_fast_format(f, fn): those plus bfloat16 and float16.
//
// Each calls fn.template operator()<F>() with F the global Format that `f` is
// (formats are compared by address, as everywhere in fp4lab) and returns true,
// or returns false without calling fn for any other format (e8m0, ue4m3,
// int8, custom formats): those take the generic encode(). Usage:
//   with_fast_element_format(f, [&]<const Format& F>() { run<F>(...); });
#pragma once

#include "core/format.hpp"

namespace fp4lab {

template <class Fn>
bool with_fast_element_format(const Format& f, Fn&& fn) {
  if (&f == &float4_e2m1fn) return fn.template operator()<float4_e2m1fn>(), true;
  if (&f == &float6_e2m3fn) return fn.template operator()<float6_e2m3fn>(), true;
  if (&f == &float6_e3m2fn) return fn.template operator()<float6_e3m2fn>(), true;
  if (&f == &float8_e4m3fn) return fn.template operator()<float8_e4m3fn>(), true;
  if (&f == &float8_e5m2) return fn.template operator()<float8_e5m2>(), true;
  if (&f == &float8_e4m3fnuz) return fn.template operator()<float8_e4m3fnuz>(), true;
  if (&f == &float8_e5m2fnuz) return fn.template operator()<float8_e5m2fnuz>(), true;
  return false;
}

template <class Fn>
bool with_fast_format(const Format& f, Fn&& fn) {
  if (with_fast_element_format(f, fn)) return true;
  if (&f == &bfloat16) return fn.template operator()<bfloat16>(), true;
  if (&f == &float16) return fn.template operator()<float16>(), true;
  return false;
}

}  // namespace fp4lab
