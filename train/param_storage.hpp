// How a parameter is stored: the precision every reader of its values sees
// (the model's layers, evaluation, final_params), recorded per parameter in
// the ParamStore (train/params.hpp). The optimiser's FP32 master values are
// apart from it (train/dist/data_parallel.hpp keeps them); after every step a
// parameter's values are storage_cast(storage) of its master, exactly.
#pragma once

#include <cstdint>
#include <string>

#include "sim/quantizer.hpp"

namespace fp4lab::train {

enum class Storage : uint8_t {
  fp32,      // the master values themselves
  nvfp4_2d,  // NVFP4 primary weights: quantize(nvfp4_2d, master).dequant (16x16 tiles, round to nearest)
};

// The name summaries and messages use: "fp32", "nvfp4_2d".
std::string storage_name(Storage s);

// The quantizer whose output a parameter stored as `s` holds (nvfp4_2d:
// quantizer_by_name("nvfp4_2d")), or null where the values are the master's
// (fp32). A linear layer takes it as LinearContext::weight_cast. The pointer
// is valid for the program's life.
const QuantizerSpec* storage_cast(Storage s);

}  // namespace fp4lab::train
