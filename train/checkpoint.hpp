// checkpoint.bin (train/run.hpp): the magic "FP4LCK01", the JSON header's
// length (uint64, little endian as the hosts are) and the header (step,
// adam_t, best, params, recipe, config_hash, and world for data-parallel
// runs), then three float32 arrays of `params` elements: the FP32 master
// values, AdamW's first and second moments. Written atomically.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4lab::train {

// Writes `bytes` to path.tmp.<pid>, then renames it over `path`.
void write_atomic(const std::filesystem::path& path, const std::string& bytes);

struct Checkpoint {
  nlohmann::json header;
  std::vector<float> values, m, v;
};

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& c);
// The header alone (errors name the file: not a checkpoint, corrupt header).
nlohmann::json read_checkpoint_header(const std::filesystem::path& path);
// The whole checkpoint of a model of n parameters (errors name the file: missing, a
// different parameter count, truncated).
Checkpoint load_checkpoint(const std::filesystem::path& path, int64_t n);

}  // namespace fp4lab::train
