// The data-parallel tests' parameter store: odd sizes, so that even_shards cuts
// mid-row and mid-tile (two weights, a bias, a gain; ZeRO-3 units of it:
// {ln}, {a.*}, {b.weight} in test_reduce_bf16.cpp).
#pragma once

#include "train/params.hpp"

namespace fp4lab::train::test {

inline void declare_odd_store(ParamStore& ps) {
  ps.add("a.weight", 19, 37, true, Init::normal, 0.5f);
  ps.add("a.bias", 1, 19, false, Init::normal, 0.1f);
  ps.add("b.weight", 33, 17, true, Init::normal, 0.5f);
  ps.add("ln.weight", 1, 17, false, Init::ones);
}

}  // namespace fp4lab::train::test
