// CRC-32 of the run files (checkpoint.bin's payload, config.json and
// metrics.jsonl as summary.json records them, the data fingerprint): the
// IEEE 802.3 / zlib CRC (reflected polynomial 0xEDB88320, initial value and
// final XOR 0xFFFFFFFF), so Python's zlib.crc32 computes the same value
// (tests/cli/test_run_faults.py checks checkpoint.bin with it). Catalogue
// check value: crc32("123456789") = 0xCBF43926.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace fp4lab::train {

// The CRC-32 of bytes [p, p+n) continuing from `crc` (0 for a fresh start):
// crc32(b, crc32(a)) = crc32(a followed by b).
uint32_t crc32(const void* p, size_t n, uint32_t crc = 0);

// The CRC-32 and size of a whole file; throws fp4lab::EnvironmentError/Error naming it if unreadable.
struct FileSum {
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
FileSum file_crc32(const std::filesystem::path& path);

// "cbf43926": 8 lowercase hex digits, as run files record a CRC.
std::string crc_hex(uint32_t crc);

}  // namespace fp4lab::train
