// checkpoint.bin (train/run.hpp), format FP4LCK02:
//   the magic "FP4LCK02" | the JSON header's length (uint64, little endian as the hosts are) | the header |
//   the header's CRC-32 (uint32) | three float32 arrays of `params` elements: the FP32 master values, AdamW's
//   first and second moments.
// The header: step, adam_t, best, params, recipe, config_hash, payload_bytes, payload_crc32 (train/checksum.hpp,
// 8 hex digits, over the three arrays), data (the data fingerprint, run.cpp), and world for data-parallel runs.
// Every field is checked on reading: its type and range, the CRCs, and a file size of exactly the header's
// account (no trailing bytes). FP4LCK01 files (older runs: no CRCs, no data) are still read, with their header
// checked the same way. Written atomically (run_files.hpp: tmp, fsync, rename).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4lab::train {

struct Checkpoint {
  nlohmann::json header;  // step, adam_t, best, params, recipe, config_hash, world?, data? (save adds the CRC fields)
  std::vector<float> values, m, v;
};

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& c);

// The header alone, its CRC and every field's type and range checked (errors name the file and the field).
nlohmann::json read_checkpoint_header(const std::filesystem::path& path);

// What the run that resumes expects of its checkpoint; a difference is an Error naming the file and field.
struct CheckpointExpect {
  int64_t params = 0;       // the model's parameter count
  int64_t total_steps = 0;  // step must be in [0, total_steps]
  std::string config_hash;  // config.json's and the config's (train/config.hpp); "" = not checked
};
// The whole checkpoint, every check above and the payload's CRC included.
Checkpoint load_checkpoint(const std::filesystem::path& path, const CheckpointExpect& expect);
// The same for a model of n parameters, whichever run wrote it (tests, tools that read a checkpoint's content).
Checkpoint load_checkpoint(const std::filesystem::path& path, int64_t n);

}  // namespace fp4lab::train
