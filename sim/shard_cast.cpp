// NVFP4 primary weights cast shard by shard (shard_cast.hpp).
#include "sim/shard_cast.hpp"

#include <algorithm>
#include <string>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "sim/element_layout.hpp"
#include "sim/packing.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab {

namespace {

constexpr int64_t kTile = 16;

int64_t tiles_of(const FlatTensor& t) { return ((t.rows + kTile - 1) / kTile) * ((t.cols + kTile - 1) / kTile); }
int64_t row_bytes(const FlatTensor& t) { return (t.cols + 1) / 2; }

void local_range(const FlatTensor& t, ShardRange shard, int64_t& lo, int64_t& hi) {
  const ShardRange p = tensor_part(t, shard);
  lo = p.begin, hi = p.end;
}

void check_shard(std::span<const FlatTensor> tensors, ShardRange shard) {
  if (shard.begin < 0 || shard.end < shard.begin)
    throw Error("shard_cast: invalid shard [" + std::to_string(shard.begin) + ", " + std::to_string(shard.end) + ")");
  for (size_t i = 1; i < tensors.size(); ++i)
    if (tensors[i].offset < tensors[i - 1].offset + tensors[i - 1].rows * tensors[i - 1].cols)
      throw Error("shard_cast: tensor " + std::to_string(i) + " overlaps the tensor before it in the flat buffer");
}

}  // namespace

ShardRange tensor_part(const FlatTensor& t, ShardRange shard) {
  return {std::max<int64_t>(shard.begin - t.offset, 0), std::min<int64_t>(shard.end - t.offset, t.rows * t.cols)};
}

ShardRange packed_bytes_of(const FlatTensor& t, ShardRange part) {
  if (part.begin >= part.end) return {0, 0};
  const int64_t rb = row_bytes(t);
  return {(part.begin / t.cols) * rb + (part.begin % t.cols) / 2,
          ((part.end - 1) / t.cols) * rb + ((part.end - 1) % t.cols) / 2 + 1};
}

FlatLayout flat_layout(std::span<const FlatTensor> tensors) {
  FlatLayout l;
  l.tile_offset.push_back(0);
  l.packed_offset.push_back(0);
  for (const FlatTensor& t : tensors) {
    l.tile_offset.push_back(l.tile_offset.back() + tiles_of(t));
    l.packed_offset.push_back(l.packed_offset.back() + t.rows * row_bytes(t));
  }
  return l;
}

ShardAmax shard_partial_amax(std::span<const FlatTensor> tensors, const float* flat, ShardRange shard) {
  check_shard(tensors, shard);
  const FlatLayout l = flat_layout(tensors);
  ShardAmax a;
  a.tensor.assign(tensors.size(), 0u);
  a.tile.assign(size_t(l.tile_offset.back()), 0u);
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const FlatTensor& t = tensors[ti];
    int64_t lo, hi;
    local_range(t, shard, lo, hi);
    const int64_t ntc = (t.cols + kTile - 1) / kTile;
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t m = abs_bits(flat[t.offset + i]);
      const int64_t r = i / t.cols, c = i - r * t.cols;
      uint32_t& tile = a.tile[size_t(l.tile_offset[ti] + (r / kTile) * ntc + c / kTile)];
      tile = std::max(tile, m);
      a.tensor[ti] = std::max(a.tensor[ti], m);
    }
  }
  return a;
}

void max_into(ShardAmax& acc, const ShardAmax& other) {
  if (acc.tensor.size() != other.tensor.size() || acc.tile.size() != other.tile.size())
    throw Error("shard_cast: partial amaxes of different layouts");
  for (size_t i = 0; i < acc.tensor.size(); ++i) acc.tensor[i] = std::max(acc.tensor[i], other.tensor[i]);
  for (size_t i = 0; i < acc.tile.size(); ++i) acc.tile[i] = std::max(acc.tile[i], other.tile[i]);
}

ShardScales shard_scales(std::span<const FlatTensor> tensors, const ShardAmax& global) {
  const FlatLayout l = flat_layout(tensors);
  if (global.tensor.size() != tensors.size() || int64_t(global.tile.size()) != l.tile_offset.back())
    throw Error("shard_scales: the amaxes do not match the tensors");
  ShardScales s;
  s.tile_code.assign(global.tile.size(), 0);
  s.tile_mult.assign(global.tile.size(), 0.0f);
  s.g_dec.assign(tensors.size(), 1.0f);
  const float elem_max = max_finite(float4_e2m1fn), scale_max = max_finite(ufloat8_e4m3);
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    // The nv rule with global_scale tensor_amax, as sim's quantize (scale_rules.hpp).
    const NvGlobal g = nv_global(bits_float(global.tensor[ti]), scale_max, elem_max);
    s.g_dec[ti] = g.g_dec;
    for (int64_t k = l.tile_offset[ti]; k < l.tile_offset[ti + 1]; ++k) {
      const NvBlockScale b = nv_block_scale<ufloat8_e4m3>(bits_float(global.tile[size_t(k)]), g);
      s.tile_code[size_t(k)] = uint8_t(b.code);
      s.tile_mult[size_t(k)] = b.encode;
    }
  }
  return s;
}

ShardRange packed_span(std::span<const FlatTensor> tensors, ShardRange shard) {
  const FlatLayout l = flat_layout(tensors);
  int64_t first = -1, end = -1;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    int64_t lo, hi;
    local_range(tensors[ti], shard, lo, hi);
    if (lo >= hi) continue;
    const ShardRange bytes = packed_bytes_of(tensors[ti], {lo, hi});
    if (first < 0) first = l.packed_offset[ti] + bytes.begin;
    end = l.packed_offset[ti] + bytes.end;
  }
  return first < 0 ? ShardRange{0, 0} : ShardRange{first, end};
}

PackedWindows packed_windows(std::span<const FlatTensor> tensors, std::span<const ShardRange> shards) {
  std::vector<ShardRange> spans;
  for (const ShardRange& s : shards) spans.push_back(packed_span(tensors, s));
  return windows_of_spans(spans, flat_layout(tensors).packed_offset.back());
}

void or_windows(std::span<uint8_t> packed, std::span<const uint8_t> windows, const PackedWindows& w) {
  if (windows.size() != w.at.size() * size_t(w.size))
    throw Error("or_windows: " + std::to_string(windows.size()) + " bytes for " + std::to_string(w.at.size()) +
                " windows of " + std::to_string(w.size));
  for (size_t r = 0; r < w.at.size(); ++r) {
    if (w.at[r] < 0 || w.at[r] + w.size > int64_t(packed.size()))
      throw Error("or_windows: window " + std::to_string(r) + " lies outside the packed buffer");
    for (int64_t i = 0; i < w.size; ++i) packed[size_t(w.at[r] + i)] |= windows[r * size_t(w.size) + size_t(i)];
  }
}

ShardBytes shard_cast(std::span<const FlatTensor> tensors, const float* flat, ShardRange shard,
                      const ShardScales& scales) {
  check_shard(tensors, shard);
  const FlatLayout l = flat_layout(tensors);
  ShardBytes out;
  const ShardRange span = packed_span(tensors, shard);
  if (span.begin >= span.end) return out;  // no elements
  const int64_t first = span.begin;
  out.first_byte = first;
  out.bytes.assign(size_t(span.end - first), 0);
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const FlatTensor& t = tensors[ti];
    int64_t lo, hi;
    local_range(t, shard, lo, hi);
    const int64_t ntc = (t.cols + kTile - 1) / kTile, rb = row_bytes(t);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t r = i / t.cols, c = i - r * t.cols;
      const int64_t k = l.tile_offset[ti] + (r / kTile) * ntc + c / kTile;
      const uint32_t code =
          encode_rn_f32<float4_e2m1fn>(flat[t.offset + i] * scales.tile_mult[size_t(k)], Overflow::saturate);
      // The byte of (r, c) relative to the span: its global index minus the first byte's
      // (never (i - begin) >> 1: a span may start on a high nibble).
      const int64_t byte = l.packed_offset[ti] + r * rb + c / 2 - first;
      out.bytes[size_t(byte)] |= uint8_t((code & 0xFu) << ((c & 1) * 4));
    }
  }
  return out;
}

void dequantize_packed(std::span<const FlatTensor> tensors, std::span<const uint8_t> packed, const ShardScales& scales,
                       float* flat) {
  const FlatLayout l = flat_layout(tensors);
  if (int64_t(packed.size()) != l.packed_offset.back())
    throw Error("dequantize_packed: " + std::to_string(packed.size()) + " packed bytes, the tensors need " +
                std::to_string(l.packed_offset.back()));
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const FlatTensor& t = tensors[ti];
    const int64_t ntc = (t.cols + kTile - 1) / kTile, rb = row_bytes(t);
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; ++c) {
        const int64_t k = l.tile_offset[ti] + (r / kTile) * ntc + c / kTile;
        const uint32_t code = (packed[size_t(l.packed_offset[ti] + r * rb + c / 2)] >> ((c & 1) * 4)) & 0xFu;
        const float scale = decode(ufloat8_e4m3, scales.tile_code[size_t(k)]);
        flat[t.offset + r * t.cols + c] = (decode(float4_e2m1fn, code) * scale) * scales.g_dec[ti];
      }
  }
}

std::vector<uint8_t> transpose_packed(std::span<const FlatTensor> tensors, std::span<const uint8_t> packed) {
  const FlatLayout l = flat_layout(tensors);
  if (int64_t(packed.size()) != l.packed_offset.back())
    throw Error("transpose_packed: " + std::to_string(packed.size()) + " packed bytes, the tensors need " +
                std::to_string(l.packed_offset.back()));
  std::vector<uint8_t> out;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const FlatTensor& t = tensors[ti];
    const std::vector<uint8_t> codes = unpack_fp4(packed.data() + l.packed_offset[ti], t.rows, t.cols);
    const std::vector<uint8_t> tr = pack_fp4_transposed(codes.data(), t.rows, t.cols);
    out.insert(out.end(), tr.begin(), tr.end());
  }
  return out;
}

std::vector<uint8_t> transpose_tile_codes(std::span<const FlatTensor> tensors, std::span<const uint8_t> tile_code) {
  const FlatLayout l = flat_layout(tensors);
  if (int64_t(tile_code.size()) != l.tile_offset.back())
    throw Error("transpose_tile_codes: " + std::to_string(tile_code.size()) + " tile codes, the tensors have " +
                std::to_string(l.tile_offset.back()) + " tiles");
  std::vector<uint8_t> out(tile_code.size());
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const int64_t ntr = (tensors[ti].rows + kTile - 1) / kTile, ntc = (tensors[ti].cols + kTile - 1) / kTile;
    const int64_t at = l.tile_offset[ti];
    for (int64_t i = 0; i < ntr; ++i)
      for (int64_t j = 0; j < ntc; ++j) out[size_t(at + j * ntr + i)] = tile_code[size_t(at + i * ntc + j)];
  }
  return out;
}

std::vector<uint8_t> assemble_packed(std::span<const FlatTensor> tensors, std::span<const ShardBytes> parts) {
  std::vector<uint8_t> packed(size_t(flat_layout(tensors).packed_offset.back()), 0);
  for (const ShardBytes& p : parts) {
    if (p.first_byte < 0 || p.first_byte + int64_t(p.bytes.size()) > int64_t(packed.size()))
      throw Error("assemble_packed: a shard's bytes lie outside the packed buffer");
    for (size_t i = 0; i < p.bytes.size(); ++i) packed[size_t(p.first_byte) + i] |= p.bytes[i];
  }
  return packed;
}

std::vector<ShardRange> even_shards(int64_t total, int n) {
  if (n < 1 || total < 0) throw Error("even_shards: need n >= 1 and total >= 0");
  std::vector<ShardRange> s;
  int64_t at = 0;
  for (int k = 0; k < n; ++k) {
    const int64_t len = total / n + (k < total % n ? 1 : 0);
    s.push_back({at, at + len});
    at += len;
  }
  return s;
}

}  // namespace fp4lab
