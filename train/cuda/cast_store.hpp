// The cuda backend's CastStores (train/param_storage.hpp): the NVFP4 cast of
// the nvfp4_2d-stored tensors on the device (cuda/shard_cast.hpp's
// DeviceShardCast), and each tensor's stored form for its linear layer; the
// bf16 and fp8_e4m3 casts (cuda/element_cast.hpp's DeviceElementCast), whose
// layers read the dequantized FP32 values (stored() null).
#pragma once

#include <memory>
#include <span>

#include "cuda/shard_cast.hpp"
#include "train/backend.hpp"
#include "train/param_storage.hpp"

namespace fp4lab::train {

// A tensor's packed NVFP4 cast in device memory (LayerPlan::w_stored on the
// cuda backend): CudaLinear decodes it into the exact BF16 W operand
// (cuda::cast_operand_device) where its plan takes W as it is, or, on its
// native-operand route (train/cuda/linear_native.hpp), takes the packed codes
// as they are. `form` is read at each use, never cached by the layer.
struct StoredNvfp4 final : StoredWeight {
  cuda::PackedNvfp4 form;
};

// The store of storage `s` (nvfp4_2d, bf16 or fp8_e4m3) over `tensors`; its packed buffer and kept window
// come from `be`'s pool (be: the cuda backend, which outlives the store).
std::unique_ptr<CastStore> make_device_cast_store(Storage s, std::span<const FlatTensor> tensors, Backend& be);

}  // namespace fp4lab::train
