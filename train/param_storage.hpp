// How a parameter is stored: the precision every reader of its values sees
// (the model's layers, evaluation, final_params), recorded per parameter in
// the ParamStore (train/params.hpp). The optimiser's FP32 master values are
// apart from it (train/dist/data_parallel.hpp keeps them); after every step a
// parameter's values are storage_cast(storage) of its master, exactly.
//
// The NVFP4 form of the nvfp4_2d-stored tensors lives in a CastStore, which
// the backend makes (Backend::make_cast_store): the host protocol of
// sim/shard_cast.hpp on the CPU, its device kernels (cuda/shard_cast.hpp)
// on the GPU. A layer gets its tensor's form as an opaque StoredWeight
// (LayerPlan::w_stored) and hands it back to the backend that made it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/quantizer.hpp"
#include "sim/shard_cast.hpp"

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

// One tensor's stored form in a backend's memory, as that backend defines it
// (the cuda backend: its packed NVFP4 codes, tile codes and g_dec,
// train/cuda/cast_store.hpp). Other code passes it on untouched.
class StoredWeight {
 public:
  virtual ~StoredWeight() = default;
};

// The NVFP4 cast of a set of tensors of a flat FP32 buffer (the nvfp4_2d
// storage), in one backend's memory: the steps of sim/shard_cast.hpp's
// protocol, which train/dist/primary_weights.hpp's run_cast drives over a
// communicator. `flat` is the whole flat buffer in the backend's memory
// (device() says which); a shard is a range of its elements.
class CastStore {
 public:
  virtual ~CastStore() = default;
  // The tensors, in the order of the packed layout (increasing offsets).
  virtual std::span<const FlatTensor> tensors() const = 0;
  // amax() and packed() are device memory (else host memory).
  virtual bool device() const = 0;
  // Step 1: this shard's maxima into amax(): the tensors' maxima, then every tile's (tile_offset order).
  virtual void partial_amax(const float* flat, ShardRange shard) = 0;
  // Step 2 is the caller's: amax() MAX-reduced in place over the ranks.
  virtual std::span<uint32_t> amax() = 0;
  // Step 3: the tile and tensor scales from amax().
  virtual void compute_scales() = 0;
  // Step 4: packed() zeroed, then this shard's codes written (the bytes that hold its elements).
  virtual void cast(const float* flat, ShardRange shard) = 0;
  // The full packed buffer (flat_layout(tensors()).packed_offset.back() bytes).
  virtual std::span<uint8_t> packed() = 0;
  // The byte span the last cast wrote (what a rank sends), on the host.
  virtual ShardBytes span() const = 0;
  // Step 5 done elsewhere: the assembled full packed buffer (host memory) put back.
  virtual void set_packed(const std::vector<uint8_t>& full) = 0;
  // Step 5 from every rank's window (sim's packed_windows), `windows` in the
  // store's memory: ORed into packed() (sim's or_windows).
  virtual void or_windows(std::span<const uint8_t> windows, const PackedWindows& w) = 0;
  // Step 6: every tensor element of `flat` set to its dequantized cast; other elements unchanged.
  virtual void dequantize(float* flat) const = 0;
  // What compute_scales wrote, on the host (for checks).
  virtual ShardScales scales() const = 0;
  // Tensor t's stored form for the layers (valid while the store lives; each cast rewrites what it
  // names), or null where the layers take the dequantized values (the host store).
  virtual const StoredWeight* stored(size_t t) const = 0;
};

// The CastStore of a backend whose tensors are host memory (the cpu backend):
// sim/shard_cast.hpp's functions. stored() is null: the layers read the
// dequantized values.
std::unique_ptr<CastStore> make_host_cast_store(std::span<const FlatTensor> tensors);

}  // namespace fp4lab::train
