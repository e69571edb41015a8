// Packed code storage and cuBLASLt's swizzled scale layout (packing.hpp).
#include "sim/packing.hpp"

#include <cstring>

namespace fp4lab {

namespace {
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

std::vector<uint8_t> pack_fp4(const uint8_t* codes, int64_t rows, int64_t cols) {
  const int64_t rb = (cols + 1) / 2;
  std::vector<uint8_t> out(static_cast<size_t>(rows * rb), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t v = codes[r * cols + c] & 0xFu;
      out[size_t(r * rb + c / 2)] |= (c & 1) ? uint8_t(v << 4) : v;
    }
  return out;
}

std::vector<uint8_t> unpack_fp4(const uint8_t* packed, int64_t rows, int64_t cols) {
  const int64_t rb = (cols + 1) / 2;
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t b = packed[r * rb + c / 2];
      out[size_t(r * cols + c)] = (c & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xFu);
    }
  return out;
}

std::vector<uint8_t> pack_fp4_transposed(const uint8_t* codes, int64_t rows, int64_t cols) {
  std::vector<uint8_t> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = codes[r * cols + c];
  return pack_fp4(t.data(), cols, rows);
}

int64_t packed_row_bytes(const Format& f, int64_t cols) { return f.bits() == 4 ? (cols + 1) / 2 : cols; }

std::vector<uint8_t> pack_codes(const Format& f, const uint8_t* codes, int64_t rows, int64_t cols) {
  if (f.bits() == 4) return pack_fp4(codes, rows, cols);
  std::vector<uint8_t> out(codes, codes + rows * cols);
  const uint8_t mask = uint8_t(f.code_count() - 1u);
  for (auto& b : out) b &= mask;
  return out;
}

std::vector<uint8_t> unpack_codes(const Format& f, const uint8_t* packed, int64_t rows, int64_t cols) {
  if (f.bits() == 4) return unpack_fp4(packed, rows, cols);
  return std::vector<uint8_t>(packed, packed + rows * cols);
}

int64_t swizzled_scale_offset(int64_t i, int64_t j, int64_t cols) {
  const int64_t tiles_per_row = round_up(cols, 4) / 4;
  return ((i / 128) * tiles_per_row + j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + (j % 4);
}

std::vector<uint8_t> swizzle_scales(const uint8_t* scales, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(round_up(rows, 128) * round_up(cols, 4)), 0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[size_t(swizzled_scale_offset(i, j, cols))] = scales[i * cols + j];
  return out;
}

std::vector<uint8_t> unswizzle_scales(const uint8_t* swizzled, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[size_t(i * cols + j)] = swizzled[swizzled_scale_offset(i, j, cols)];
  return out;
}

}  // namespace fp4lab
