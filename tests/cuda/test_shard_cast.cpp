// The GPU NVFP4 primary-weight cast (cuda/shard_cast.hpp) against sim's host
// protocol (sim/shard_cast.hpp) and against quantize(nvfp4_2d, W) itself, the
// independent oracle: N simulated ranks on one GPU with boundaries at odd,
// mid-byte, mid-tile and cross-tensor offsets, empty shards, gaps between
// tensors, NaN/Inf/zero tensors. Codes and scales bit for bit; the dequantized
// floats too, except that NaN equals NaN whatever its payload (FP32 arithmetic's
// NaN payload is the hardware's: tests/gpu_test_util.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda/shard_cast.hpp"
#include "gpu_test_util.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

namespace {

struct Model {
  std::vector<FlatTensor> tensors;
  std::vector<float> flat;
};

// Odd shapes, a gap between two tensors, a row vector, a zero tensor, NaN and Inf in two tiles,
// and a last tensor whose rows are multiples of 8 columns at 16-byte aligned values and
// 4-byte aligned packed bytes (the decode's vector form; the others take its scalar form).
Model make_model(uint32_t seed) {
  Model m;
  m.tensors = {{37, 45, 0},   {16, 16, 1665}, {50, 33, 1931}, {1, 7, 3581},
               {3, 17, 3588}, {20, 18, 3639}, {48, 64, 4000}};
  m.flat.assign(4000 + 48 * 64, 0.0f);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const FlatTensor& ft = m.tensors[t];
    if (t == 4) continue;  // all zeros
    const float s = t == 3 ? 3e4f : 0.02f;
    for (int64_t i = 0; i < ft.rows * ft.cols; ++i) m.flat[size_t(ft.offset + i)] = nd(g) * s;
  }
  m.flat[size_t(1931 + 5 * 33 + 20)] = std::numeric_limits<float>::quiet_NaN();
  m.flat[size_t(3639 + 3)] = std::numeric_limits<float>::infinity();
  return m;
}

std::vector<uint8_t> reference_packed(const Model& m) {
  std::vector<uint8_t> ref;
  for (const FlatTensor& t : m.tensors) {
    const QuantizedTensor q =
        quantize(quantizer_by_name("nvfp4_2d"), MatrixView<const float>(m.flat.data() + t.offset, t.rows, t.cols));
    const auto p = pack_fp4(q.codes.data(), t.rows, t.cols);
    ref.insert(ref.end(), p.begin(), p.end());
  }
  return ref;
}

}  // namespace

TEST_CASE("cuda shard cast: N ranks on one GPU equal quantize(nvfp4_2d) and sim's protocol, bit for bit") {
  const Model m = make_model(5);
  const int64_t total = int64_t(m.flat.size());
  const std::vector<uint8_t> ref = reference_packed(m);
  DeviceBuffer<float> dflat;
  dflat.upload(m.flat);
  std::vector<std::vector<int64_t>> splits = {{0, total},
                                              {0, 1, total},
                                              {0, 15, 16, 17, total},
                                              {0, 33, 33, 1666, 1931, total},  // an empty shard, a cut in a gap
                                              {0, 1000, 2001, 3001, 3600, total},
                                              {0, 3999, 4000 + 17 * 64 + 9, total}};  // mid-row, mid-tile
  for (int n : {2, 3, 8}) {                                                           // even shards
    std::vector<int64_t> b;
    for (const ShardRange& s : even_shards(total, n)) b.push_back(s.begin);
    b.push_back(total);
    splits.push_back(b);
  }
  for (const auto& b : splits) {
    const int n = int(b.size()) - 1;
    CAPTURE(n);
    CAPTURE(b[1]);
    DeviceShardCast cast(m.tensors);
    // Steps 1-2: every rank's partial maxima (equal to sim's), MAX-reduced on the host.
    ShardAmax global;
    std::vector<uint32_t> reduced(size_t(cast.amax_count()), 0u);
    for (int r = 0; r < n; ++r) {
      const ShardRange s{b[size_t(r)], b[size_t(r) + 1]};
      cast.partial_amax(dflat.data(), s);
      std::vector<uint32_t> a(size_t(cast.amax_count()));
      check(cudaMemcpy(a.data(), cast.amax(), a.size() * 4, cudaMemcpyDeviceToHost), "amax");
      const ShardAmax want = shard_partial_amax(m.tensors, m.flat.data(), s);
      CHECK(std::vector<uint32_t>(a.begin(), a.begin() + std::ptrdiff_t(m.tensors.size())) == want.tensor);
      CHECK(std::vector<uint32_t>(a.begin() + std::ptrdiff_t(m.tensors.size()), a.end()) == want.tile);
      for (size_t i = 0; i < a.size(); ++i) reduced[i] = std::max(reduced[i], a[i]);
    }
    check(cudaMemcpy(cast.amax(), reduced.data(), reduced.size() * 4, cudaMemcpyHostToDevice), "amax");
    cast.compute_scales();
    {  // Step 3 on the device: sim's shard_scales of the reduced maxima, bit for bit.
      ShardAmax g;
      g.tensor.assign(reduced.begin(), reduced.begin() + std::ptrdiff_t(m.tensors.size()));
      g.tile.assign(reduced.begin() + std::ptrdiff_t(m.tensors.size()), reduced.end());
      const ShardScales want = shard_scales(m.tensors, g), got = cast.scales();
      CHECK(got.tile_code == want.tile_code);
      CHECK(test::same_bits("tile multipliers", got.tile_mult, want.tile_mult));
      CHECK(test::same_bits("g_dec", got.g_dec, want.g_dec));
    }
    // Steps 4-5: every rank's span (equal to sim's), assembled; and its window (sim's packed_windows) of the
    // device buffer, ORed in on the device (or_windows, as over NCCL) into the last rank's cast.
    std::vector<ShardRange> shards;
    for (int r = 0; r < n; ++r) shards.push_back({b[size_t(r)], b[size_t(r) + 1]});
    const PackedWindows w = packed_windows(m.tensors, shards);
    std::vector<uint8_t> windows;
    std::vector<ShardBytes> spans;
    for (int r = 0; r < n; ++r) {
      const ShardRange s{b[size_t(r)], b[size_t(r) + 1]};
      cast.cast(dflat.data(), s);
      std::vector<uint8_t> window(size_t(w.size));
      check(cudaMemcpy(window.data(), cast.packed() + w.at[size_t(r)], window.size(), cudaMemcpyDeviceToHost),
            "window");
      windows.insert(windows.end(), window.begin(), window.end());
      spans.push_back(cast.span());
      const ShardBytes want = shard_cast(m.tensors, m.flat.data(), s, cast.scales());
      CHECK(spans.back().first_byte == want.first_byte);
      CHECK(test::same_bytes("span", spans.back().bytes, want.bytes));
    }
    const std::vector<uint8_t> packed = assemble_packed(m.tensors, spans);
    CHECK(test::same_bytes("assembled packed vs quantize(nvfp4_2d)", packed, ref));
    {
      DeviceBuffer<uint8_t> dw;
      dw.upload(windows);
      cast.or_windows({dw.data(), windows.size()}, w);
      std::vector<uint8_t> by_windows(size_t(cast.packed_bytes()));
      check(cudaMemcpy(by_windows.data(), cast.packed(), by_windows.size(), cudaMemcpyDeviceToHost), "packed");
      CHECK(test::same_bytes("device or_windows vs quantize(nvfp4_2d)", by_windows, ref));
    }
    // Step 6: the dequantized weights equal sim's, and quantize(nvfp4_2d).dequant per tensor.
    cast.set_packed(packed);
    DeviceBuffer<float> out;
    out.upload(m.flat);
    cast.dequantize(out.data());
    std::vector<float> want = m.flat;
    dequantize_packed(m.tensors, packed, cast.scales(), want.data());
    CHECK(test::same_bits("dequantized weights vs sim", out.download(), want));  // NaN = NaN, any payload
    // The linear layers' operand: decode(code) * tile scale in BF16, times g_dec the dequantized weight, bit for bit.
    const std::vector<float> g_dec = cast.scales().g_dec;
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      const FlatTensor& ft = m.tensors[t];
      CAPTURE(t);
      DeviceBuffer<uint16_t> op(size_t(ft.rows * ft.cols));
      cast_operand_device(cast.packed_tensor(t), ft.rows, ft.cols, op.data(), nullptr);
      const std::vector<uint16_t> h = op.download();
      std::vector<float> got(h.size());
      for (size_t i = 0; i < h.size(); ++i) {
        float v;
        const uint32_t bits = uint32_t(h[i]) << 16;
        std::memcpy(&v, &bits, 4);
        got[i] = v * g_dec[t];
      }
      CHECK(
          test::same_bits("cast operand * g_dec vs the dequantized weight", got,
                          std::vector<float>(want.begin() + ft.offset, want.begin() + ft.offset + ft.rows * ft.cols)));
    }
    // The column-wise copy: the nibble-packed transpose of every tensor, as sim's.
    DeviceBuffer<uint8_t> tr(static_cast<size_t>(cast.packed_bytes_transposed()));
    tr.fill_bytes(0xEE);
    cast.transpose(tr.data());
    CHECK(test::same_bytes("column-wise copy vs sim", tr.download(), transpose_packed(m.tensors, packed)));
    for (const FlatTensor& t : m.tensors) {
      const QuantizedTensor q =
          quantize(quantizer_by_name("nvfp4_2d"), MatrixView<const float>(m.flat.data() + t.offset, t.rows, t.cols));
      CHECK(std::memcmp(q.dequant.data(), want.data() + t.offset, size_t(t.rows * t.cols) * 4) == 0);
    }
  }
}
