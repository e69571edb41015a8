// Parameter storage precisions (param_storage.hpp).
#include "train/param_storage.hpp"

#include "core/error.hpp"

namespace fp4lab::train {

std::string storage_name(Storage s) {
  switch (s) {
    case Storage::fp32: return "fp32";
    case Storage::nvfp4_2d: return "nvfp4_2d";
  }
  throw InternalError("storage_name: unknown Storage " + std::to_string(int(s)));
}

const QuantizerSpec* storage_cast(Storage s) {
  static const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");
  switch (s) {
    case Storage::fp32: return nullptr;
    case Storage::nvfp4_2d: return &nvfp4_2d;
  }
  throw InternalError("storage_cast: unknown Storage " + std::to_string(int(s)));
}

}  // namespace fp4lab::train
