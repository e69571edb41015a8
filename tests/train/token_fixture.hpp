// Token files for the trainer tests, written byte by byte (not through train/tokens.hpp, which they test):
// llm.c's GPT-2 shard (dev/data/data_common.py write_datafile: 256 little-endian int32, header[0] = magic
// 20240520, header[1] = version 1, header[2] = token count, then little-endian uint16 tokens) and raw uint16.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fp4lab::train::test {

inline void put_le32(std::vector<uint8_t>& b, int32_t v) {
  const auto u = uint32_t(v);
  for (int k = 0; k < 4; ++k) b.push_back(uint8_t(u >> (8 * k)));
}
inline void put_le16(std::vector<uint8_t>& b, uint16_t v) {
  b.push_back(uint8_t(v & 0xFF));
  b.push_back(uint8_t(v >> 8));
}

// An llm.c shard of `tokens`; magic, version and the header's count can be set wrong on purpose (count -1:
// the true count).
inline std::vector<uint8_t> llmc_shard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                                       int32_t version = 1, int32_t count = -1) {
  std::vector<uint8_t> b;
  put_le32(b, magic);
  put_le32(b, version);
  put_le32(b, count < 0 ? int32_t(tokens.size()) : count);
  for (int i = 3; i < 256; ++i) put_le32(b, 0);
  for (uint16_t t : tokens) put_le16(b, t);
  return b;
}
inline std::vector<uint8_t> raw_tokens(const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> b;
  for (uint16_t t : tokens) put_le16(b, t);
  return b;
}
inline void write_bytes(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// A learnable token stream for training tests: n tokens < vocab in a repeating pattern with some variety.
inline std::vector<uint16_t> token_stream(int64_t n, uint16_t vocab, uint32_t salt = 0) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = uint16_t((i % 7 * 13 + (i / 7 + salt) % 3 * 5) % vocab);
  return t;
}

}  // namespace fp4lab::train::test
