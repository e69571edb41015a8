// GPU packing kernels (cuda/packing.hpp) against sim/packing's CPU versions,
// plus the swizzle example worked by hand in sim/packing.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/packing.hpp"
#include "gpu_test_util.hpp"
#include "sim/grouped.hpp"
#include "sim/packing.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

namespace {
std::vector<uint8_t> random_bytes(size_t n, uint32_t seed, int mask) {
  std::mt19937 g(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(g() & unsigned(mask));
  return v;
}
}  // namespace

TEST_CASE("cuda packing: FP4 pack and nibble-packed transpose equal sim's") {
  const int64_t sizes[][2] = {{1, 1}, {3, 5}, {37, 53}, {64, 64}, {130, 257}, {128, 96}, {65, 1}};
  for (const auto& s : sizes) {
    const int64_t rows = s[0], cols = s[1];
    const auto codes = random_bytes(size_t(rows * cols), uint32_t(rows * 1000 + cols), 0xF);
    DeviceBuffer<uint8_t> dcodes;
    dcodes.upload(codes);
    DeviceBuffer<uint8_t> packed(static_cast<size_t>(rows * ((cols + 1) / 2))),
        tr(static_cast<size_t>(cols * ((rows + 1) / 2)));
    packed.fill_bytes(0xEE);
    tr.fill_bytes(0xEE);
    pack_fp4_device(dcodes.data(), rows, cols, packed.data());
    transpose_fp4_packed_device(packed.data(), rows, cols, tr.data());
    check(cudaDeviceSynchronize(), "packing");
    CHECK_MESSAGE(test::same_bytes("pack_fp4", packed.download(), pack_fp4(codes.data(), rows, cols)),
                  rows << "x" << cols);
    CHECK_MESSAGE(test::same_bytes("transpose", tr.download(), pack_fp4_transposed(codes.data(), rows, cols)),
                  rows << "x" << cols);
  }
  // Hand-worked: codes [1, 2, 3] -> bytes [0x21, 0x03] (sim/packing.hpp's example).
  DeviceBuffer<uint8_t> c3, p3(2);
  c3.upload(std::vector<uint8_t>{1, 2, 3});
  pack_fp4_device(c3.data(), 1, 3, p3.data());
  CHECK(p3.download() == std::vector<uint8_t>{0x21, 0x03});
}

TEST_CASE("cuda packing: cuBLASLt swizzled scales equal sim's, hand-worked offset") {
  const int64_t sizes[][2] = {{256, 8}, {1, 1}, {130, 5}, {512, 512}, {37, 4}, {128, 3}};
  for (const auto& s : sizes) {
    const int64_t rows = s[0], cols = s[1];
    const auto sc = random_bytes(size_t(rows * cols), uint32_t(rows + cols), 0xFF);
    DeviceBuffer<uint8_t> d, out(static_cast<size_t>(swizzled_scale_bytes(rows, cols)));
    d.upload(sc);
    out.fill_bytes(0xEE);
    swizzle_scales_device(d.data(), rows, cols, out.data());
    check(cudaDeviceSynchronize(), "swizzle");
    CHECK_MESSAGE(test::same_bytes("swizzle", out.download(), swizzle_scales(sc.data(), rows, cols)),
                  rows << "x" << cols);
  }
  // row_block 16 (NVFP4 [16,16] tiles for cuBLASLt's [1,16] layout): sim's
  // swizzle of the scales with each tile row repeated for its 16 rows.
  for (const auto& s : sizes) {
    const int64_t rows = s[0], cols = s[1], tile_rows = (rows + 15) / 16;
    const auto tiles = random_bytes(size_t(tile_rows * cols), uint32_t(3 * rows + cols), 0xFF);
    std::vector<uint8_t> expanded(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) expanded[size_t(r * cols + c)] = tiles[size_t((r / 16) * cols + c)];
    DeviceBuffer<uint8_t> d, out(static_cast<size_t>(swizzled_scale_bytes(rows, cols)));
    d.upload(tiles);
    out.fill_bytes(0xEE);
    swizzle_scales_device(d.data(), rows, cols, out.data(), nullptr, 16);
    check(cudaDeviceSynchronize(), "swizzle");
    CHECK_MESSAGE(test::same_bytes("swizzle 16x16", out.download(), swizzle_scales(expanded.data(), rows, cols)),
                  rows << "x" << cols);
  }
  CHECK_THROWS_AS(swizzle_scales_device(nullptr, 1, 1, nullptr, nullptr, 0), Error);
  // sim/packing.hpp's hand-checked example: R = 256, C = 8, scale (37, 6) lands at 598.
  std::vector<uint8_t> sc(256 * 8, 0);
  sc[37 * 8 + 6] = 0x5A;
  DeviceBuffer<uint8_t> d, out(static_cast<size_t>(swizzled_scale_bytes(256, 8)));
  d.upload(sc);
  swizzle_scales_device(d.data(), 256, 8, out.data());
  const auto o = out.download();
  CHECK(o[598] == 0x5A);
  int nonzero = 0;
  for (uint8_t b : o) nonzero += b != 0;
  CHECK(nonzero == 1);
}

// Blackwell's grouped block-scaled GEMM layout: each group's scales swizzled
// alone at its offset, against sim's swizzle_scales_grouped (itself tested
// against dense swizzles placed at their offsets, tests/sim/test_grouped.cpp).
TEST_CASE("cuda packing: grouped swizzled scales equal sim's, empty and partial groups, [16,16] tiles") {
  const std::vector<std::vector<int64_t>> cases = {{0, 1, 17, 0, 130, 5}, {256}, {0, 0}, {128, 129, 0, 1}, {}};
  for (const int64_t cols : {1, 4, 7, 64}) {
    for (const auto& sizes : cases) {
      int64_t rows = 0, tile_rows = 0;
      for (int64_t n : sizes) rows += n, tile_rows += (n + 15) / 16;
      const int64_t bytes = swizzled_group_offsets(sizes, cols).back();
      // [1,16] scales: one row per operand row.
      const auto sc = random_bytes(size_t(rows * cols), uint32_t(rows * 7 + cols), 0xFF);
      DeviceBuffer<uint8_t> d, out(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
      if (!sc.empty()) d.upload(sc);
      out.fill_bytes(0xEE);
      // Prefilled 0xEE: the device must write every byte, padding 0 as sim's.
      swizzle_scales_grouped_device(d.data(), sizes, cols, out.data());
      check(cudaDeviceSynchronize(), "grouped swizzle");
      auto got = out.download();
      got.resize(size_t(bytes));
      CHECK_MESSAGE(test::same_bytes("grouped swizzle", got, swizzle_scales_grouped(sc.data(), sizes, cols)),
                    "cols " << cols << " groups " << sizes.size());
      // [16,16] tiles: each tile row repeated for its 16 rows of its group.
      const auto tiles = random_bytes(size_t(tile_rows * cols), uint32_t(rows * 3 + cols), 0xFF);
      std::vector<uint8_t> expanded(size_t(rows * cols));
      int64_t r0 = 0, t0 = 0;
      for (int64_t n : sizes) {
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < cols; ++c)
            expanded[size_t((r0 + r) * cols + c)] = tiles[size_t((t0 + r / 16) * cols + c)];
        r0 += n, t0 += (n + 15) / 16;
      }
      DeviceBuffer<uint8_t> dt;
      if (!tiles.empty()) dt.upload(tiles);
      out.fill_bytes(0xEE);
      swizzle_scales_grouped_device(dt.data(), sizes, cols, out.data(), nullptr, 16);
      check(cudaDeviceSynchronize(), "grouped swizzle 16x16");
      got = out.download();
      got.resize(size_t(bytes));
      CHECK_MESSAGE(test::same_bytes("grouped swizzle 16x16", got, swizzle_scales_grouped(expanded.data(), sizes, cols)),
                    "cols " << cols << " groups " << sizes.size());
    }
  }
  const std::vector<int64_t> bad = {3, -1};
  CHECK_THROWS_AS(swizzle_scales_grouped_device(nullptr, bad, 4, nullptr), Error);
}
