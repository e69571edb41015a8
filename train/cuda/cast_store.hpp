// The cuda backend's CastStore (train/param_storage.hpp): the NVFP4 cast of
// the nvfp4_2d-stored tensors on the device (cuda/shard_cast.hpp's
// DeviceShardCast), and each tensor's stored form for its linear layer.
#pragma once

#include <memory>
#include <span>

#include "cuda/shard_cast.hpp"
#include "train/param_storage.hpp"

namespace fp4lab::train {

// A tensor's packed NVFP4 cast in device memory (LayerPlan::w_stored on the
// cuda backend): CudaLinear decodes it into the exact BF16 W operand
// (cuda::cast_operand_device) where its plan takes W as it is.
struct StoredNvfp4 final : StoredWeight {
  cuda::PackedNvfp4 form;
};

std::unique_ptr<CastStore> make_device_cast_store(std::span<const FlatTensor> tensors);

}  // namespace fp4lab::train
