// The geometry of element-wise stored casts (train/param_storage.hpp's bf16
// and fp8_e4m3 forms, host and device alike): the tensors' codes back to
// back in tensor order, `code_bytes` bytes an element, so a shard's codes are
// one contiguous byte span and no byte holds two ranks' elements. And the
// equal windows of an allgather_equal from any byte spans (sim/shard_cast.hpp
// packed_windows uses it for NVFP4's spans).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "sim/shard_cast.hpp"

namespace fp4lab {

// Rank r's window of `spans[r]` in a buffer of `total` bytes: size = the longest span, at[r] = min(span begin,
// total - size) (inside the buffer; it holds the span).
inline PackedWindows windows_of_spans(std::span<const ShardRange> spans, int64_t total) {
  PackedWindows w;
  for (const ShardRange& sp : spans) w.size = std::max(w.size, sp.end - sp.begin);
  for (const ShardRange& sp : spans) w.at.push_back(std::min(sp.begin, total - w.size));
  return w;
}

// Tensor t's first code index (elements of the tensors before it).
inline std::vector<int64_t> element_code_at(std::span<const FlatTensor> tensors) {
  std::vector<int64_t> at;
  int64_t n = 0;
  for (const FlatTensor& t : tensors) at.push_back(n), n += t.rows * t.cols;
  return at;
}

// The bytes of every tensor's codes, back to back.
inline int64_t element_bytes(std::span<const FlatTensor> tensors, int64_t code_bytes) {
  int64_t n = 0;
  for (const FlatTensor& t : tensors) n += t.rows * t.cols;
  return n * code_bytes;
}

// The bytes [begin, end) holding `shard`'s tensor elements ({0, 0}: none); code_at: element_code_at(tensors).
inline ShardRange element_byte_span(std::span<const FlatTensor> tensors, std::span<const int64_t> code_at,
                                    int64_t code_bytes, ShardRange shard) {
  int64_t first = -1, end = -1;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const ShardRange p = tensor_part(tensors[t], shard);
    if (p.begin >= p.end) continue;
    if (first < 0) first = code_at[t] + p.begin;
    end = code_at[t] + p.end;
  }
  return first < 0 ? ShardRange{0, 0} : ShardRange{first * code_bytes, end * code_bytes};
}

// Every shard's window of the codes (what gather_windows moves).
inline PackedWindows element_windows(std::span<const FlatTensor> tensors, int64_t code_bytes,
                                     std::span<const ShardRange> shards) {
  const std::vector<int64_t> at = element_code_at(tensors);
  std::vector<ShardRange> spans;
  for (const ShardRange& s : shards) spans.push_back(element_byte_span(tensors, at, code_bytes, s));
  return windows_of_spans(spans, element_bytes(tensors, code_bytes));
}

}  // namespace fp4lab
