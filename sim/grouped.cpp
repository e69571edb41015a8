// Grouped quantization and the grouped swizzled scale layout (grouped.hpp).
#include "sim/grouped.hpp"

#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "sim/packing.hpp"

namespace fp4lab {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t m) { return ceil_div(a, m) * m; }

}  // namespace

void check_group_sizes(const char* what, std::span<const int64_t> sizes, int64_t rows) {
  int64_t sum = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] < 0)
      throw Error(std::string(what) + ": group " + std::to_string(g) + " has " + std::to_string(sizes[g]) +
                  " rows; sizes must be >= 0");
    if (sizes[g] > INT64_MAX - sum)  // the sum would wrap (and could wrap back onto `rows`)
      throw Error(std::string(what) + ": group sizes sum past 2^63 - 1 (at group " + std::to_string(g) +
                  ") but the tensor has " + std::to_string(rows) + " rows; they must sum to the row count");
    sum += sizes[g];
  }
  if (sum != rows)
    throw Error(std::string(what) + ": group sizes sum to " + std::to_string(sum) + " but the tensor has " +
                std::to_string(rows) + " rows; they must sum to the row count");
}

GroupedQuantizedTensor quantize_grouped(const QuantizerSpec& q, MatrixView<const float> x,
                                        std::span<const int64_t> sizes, std::span<const RandomStream> streams) {
  validate(q, "quantize_grouped");
  check_group_sizes("quantize_grouped", sizes, x.rows);
  if (!streams.empty() && streams.size() != sizes.size())
    throw Error("quantize_grouped: " + std::to_string(streams.size()) + " random streams for " +
                std::to_string(sizes.size()) + " groups; give one per group or none");
  if (q.block_rows == 0)
    throw Error("quantize_grouped: per-tensor scaling (block [0,0]) has no grouped form; use the group's own "
                "quantize()");
  GroupedQuantizedTensor out;
  out.spec = q;
  out.rows = x.rows;
  out.cols = x.cols;
  out.group_rows.assign(sizes.begin(), sizes.end());
  out.scale_cols = ceil_div(x.cols, q.block_cols);
  out.codes.reserve(size_t(x.rows * x.cols));
  out.dequant.reserve(size_t(x.rows * x.cols));
  out.scale_row_offset.push_back(0);
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const int64_t n = sizes[g];
    if (n == 0) {
      out.scale_row_offset.push_back(out.scale_row_offset.back());
      out.global_decode.push_back(1.0f);
      continue;
    }
    const MatrixView<const float> slice(x.data + row * x.stride, n, x.cols, x.stride);
    const QuantizedTensor t = quantize(q, slice, streams.empty() ? RandomStream{} : streams[g]);
    out.codes.insert(out.codes.end(), t.codes.begin(), t.codes.end());
    out.dequant.insert(out.dequant.end(), t.dequant.begin(), t.dequant.end());
    out.scale_codes.insert(out.scale_codes.end(), t.scale_codes.begin(), t.scale_codes.end());
    out.scales.insert(out.scales.end(), t.scales.begin(), t.scales.end());
    out.scale_row_offset.push_back(out.scale_row_offset.back() + t.scale_rows);
    out.global_decode.push_back(t.global_decode);
    row += n;
  }
  return out;
}

std::vector<RandomStream> consecutive_streams(uint64_t seed, uint64_t stream, size_t groups) {
  std::vector<RandomStream> s(groups);
  for (size_t g = 0; g < groups; ++g) s[g] = RandomStream{seed, stream + g, nullptr};
  return s;
}

std::vector<int64_t> swizzled_group_offsets(std::span<const int64_t> sizes, int64_t cols) {
  std::vector<int64_t> off{0};
  for (size_t g = 0; g < sizes.size(); ++g)
    if (sizes[g] < 0)
      throw Error("swizzle_scales_grouped: group " + std::to_string(g) + " has " + std::to_string(sizes[g]) +
                  " scale rows; sizes must be >= 0");
  for (int64_t n : sizes) off.push_back(off.back() + (n == 0 ? 0 : round_up(n, 128) * round_up(cols, 4)));
  return off;
}

std::vector<uint8_t> swizzle_scales_grouped(const uint8_t* scales, std::span<const int64_t> sizes, int64_t cols) {
  const std::vector<int64_t> off = swizzled_group_offsets(sizes, cols);
  std::vector<uint8_t> out(size_t(off.back()), 0);
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    for (int64_t i = 0; i < sizes[g]; ++i)
      for (int64_t j = 0; j < cols; ++j)
        out[size_t(off[g] + swizzled_scale_offset(i, j, cols))] = scales[(row + i) * cols + j];
    row += sizes[g];
  }
  return out;
}

std::string swizzle_refusal(const QuantizerSpec& q) {
  const std::string what = describe(q) + ": ";
  if (q.element->bits() != 4)
    return what + "the swizzled scale layout is written for 4-bit elements (NVFP4, MXFP4); the element is " +
           std::string(short_format_name(*q.element));
  if (q.block_rows == 0 || q.scale == &float32) return what + "per-tensor scaling has no block scales to swizzle";
  if (q.block_cols == 1)
    return what + "block [" + std::to_string(q.block_rows) +
           ",1] runs down the columns (a wgrad operand, K along the rows); the swizzled layout is for blocks "
           "along a row ([1,bc], or [br,bc] tiles)";
  return "";
}

std::vector<uint8_t> swizzled_scales(const GroupedQuantizedTensor& g) {
  if (const std::string why = swizzle_refusal(g.spec); !why.empty()) throw Error(why);
  const int64_t br = g.spec.block_rows, sc = g.scale_cols;
  if (br == 1) return swizzle_scales_grouped(g.scale_codes.data(), g.group_rows, sc);
  std::vector<uint8_t> rows_scales(size_t(g.rows * sc));
  int64_t row = 0;
  for (size_t k = 0; k < g.group_rows.size(); ++k) {
    for (int64_t i = 0; i < g.group_rows[k]; ++i)
      std::memcpy(rows_scales.data() + (row + i) * sc, g.scale_codes.data() + (g.scale_row_offset[k] + i / br) * sc,
                  size_t(sc));
    row += g.group_rows[k];
  }
  return swizzle_scales_grouped(rows_scales.data(), g.group_rows, sc);
}

std::vector<uint8_t> swizzled_scales(const QuantizedTensor& q) {
  GroupedQuantizedTensor g;
  g.spec = q.spec, g.rows = q.rows, g.cols = q.cols, g.group_rows = {q.rows}, g.scale_cols = q.scale_cols;
  g.scale_row_offset = {0, q.scale_rows};
  g.scale_codes = q.scale_codes;
  return swizzled_scales(g);
}

}  // namespace fp4lab
