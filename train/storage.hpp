// The storage precisions of parameters and the wire formats of their gather,
// as enums (parsed once from the config: train/config.cpp). Kept apart from
// train/param_storage.hpp (which states each form's values and holds the
// casts) so that the config header does not pull in sim/.
#pragma once

#include <cstdint>

namespace fp4lab::train {

// How a parameter is stored: what every reader of its values sees (train/param_storage.hpp states each form).
enum class Storage : uint8_t {
  fp32,      // the master values themselves
  nvfp4_2d,  // NVFP4 primary weights: quantize(nvfp4_2d, master).dequant (16x16 tiles, round to nearest)
  bf16,      // the master rounded to nearest even BF16
  fp8_e4m3,  // E4M3 with one FP32 scale a tensor from its amax: quantize(fp8_e4m3_tensor, master).dequant
};

// How the weights travel in a gather (config distributed.gather): their FP32 masters, or their stored codes
// (each format is the storage of the same name: bf16, fp8 = fp8_e4m3, nvfp4 = nvfp4_2d).
enum class GatherFormat : uint8_t { fp32, bf16, fp8, nvfp4 };

// The config's names: "fp32", "bf16", "fp8", "nvfp4" (distributed.gather's and distributed.primary_weights').
const char* gather_format_name(GatherFormat g);
// The gather format that moves `s`'s codes (fp32 for fp32).
GatherFormat gather_format_of(Storage s);
// distributed.primary_weights' name of `s` ("fp32", "bf16", "fp8", "nvfp4").
inline const char* primary_weights_name(Storage s) { return gather_format_name(gather_format_of(s)); }
// (The config's parsers of both are train/config.hpp's parse_gather_format and parse_primary_weights.)

}  // namespace fp4lab::train
