// A packed NVFP4 cast as a quantized GEMM operand (cuda/packed_operand.hpp):
// the row-wise view and the column-wise copy against the independent oracle,
// sim's quantize(nvfp4_2d, W) and quantize(nvfp4_2d, W^T) from the FP32
// masters, and against quantize_device's nvfp4_2d operand (the same codes and
// scale codes, byte for byte: no layout conversion), and the hopper_bf16 GEMM
// on them against the GEMM on quantize_device's operands (the same bits).
// Shapes with rows / cols not multiples of 2, 16 or 32 (partial tiles, an odd
// last column's nibble, odd rows in the transpose), and codes at unaligned
// addresses in the store's packed buffer (the 16x16 tensor's start at byte
// 851: dequant_operand_bf16's element-by-element form where its vector loads
// would be misaligned). The "host" cases check the operand's fields without a GPU.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "cuda/gemm.hpp"
#include "cuda/packed_operand.hpp"
#include "cuda/quantize.hpp"
#include "cuda/shard_cast.hpp"
#include "gpu_test_util.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

namespace {

// Odd shapes (partial tiles both ways, odd rows and columns), a tile-aligned one, a row vector, a zero
// tensor, and one whose rows are multiples of 8 columns (the decode's vector form).
struct Model {
  std::vector<FlatTensor> tensors;
  std::vector<float> flat;
};
Model make_model(uint32_t seed) {
  Model m;
  const int64_t shapes[][2] = {{37, 45}, {16, 16}, {50, 33}, {1, 7}, {3, 17}, {20, 18}, {48, 64}, {33, 1}};
  int64_t at = 0;
  for (const auto& s : shapes) {
    m.tensors.push_back({s[0], s[1], at});
    at += s[0] * s[1] + 3;  // gaps: offsets that are not 16-byte aligned
  }
  m.flat.assign(size_t(at), 0.0f);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    if (t == 4) continue;  // all zeros
    const FlatTensor& ft = m.tensors[t];
    const float s = t == 3 ? 3e4f : 0.02f;
    for (int64_t i = 0; i < ft.rows * ft.cols; ++i) m.flat[size_t(ft.offset + i)] = nd(g) * s;
  }
  return m;
}

std::vector<float> transposed(const Model& m, const FlatTensor& t) {
  std::vector<float> wt(size_t(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) wt[size_t(c * t.rows + r)] = m.flat[size_t(t.offset + r * t.cols + c)];
  return wt;
}

// dequant_operand_bf16(q) times q's g_dec in one FP32 multiply: the operand's value.
std::vector<float> operand_values(const QuantOperand& q) {
  DeviceBuffer<uint16_t> h(size_t(q.rows * q.cols));
  dequant_operand_bf16(q, h.data(), nullptr);
  float g = 1.0f;
  check(cudaMemcpy(&g, q.global_decode, 4, cudaMemcpyDeviceToHost), "g_dec");
  const std::vector<uint16_t> bits = h.download();
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t b = uint32_t(bits[i]) << 16;
    float x;
    std::memcpy(&x, &b, 4);
    v[i] = x * g;
  }
  return v;
}

std::vector<uint8_t> download_bytes(const uint8_t* p, int64_t n) {
  std::vector<uint8_t> h(static_cast<size_t>(n));
  if (n) check(cudaMemcpy(h.data(), p, size_t(n), cudaMemcpyDeviceToHost), "download");
  return h;
}

// An operand made by quantize_device from FP32 x [rows, cols] (host), as quantized_gemm_gpu makes one.
struct Quantized {
  DeviceBuffer<float> x, g;
  DeviceBuffer<uint8_t> codes, scodes;
  QuantOperand op;
  Quantized(const QuantizerSpec& q, const std::vector<float>& h, int64_t rows, int64_t cols) {
    x.upload(h);
    int64_t sr = 0, sc = 0;
    scale_grid(q, rows, cols, sr, sc);
    codes.resize(size_t(rows * ((cols + 1) / 2)));
    scodes.resize(size_t(sr * sc));
    g.resize(1);
    QuantOutputs o;
    o.codes = codes.data();
    o.code_layout = CodeLayout::packed4;
    o.scale_codes = scodes.data();
    o.global_decode = g.data();
    QuantWorkspace ws;
    quantize_device(q, x.data(), InputType::f32, rows, cols, {}, o, ws);
    check(cudaDeviceSynchronize(), "quantize");
    op.spec = q;
    op.rows = rows;
    op.cols = cols;
    op.codes = codes.data();
    op.layout = CodeLayout::packed4;
    op.scale_codes = scodes.data();
    op.global_decode = g.data();
  }
};

std::vector<float> gemm_hopper(Blas& blas, const QuantOperand& a, const QuantOperand& b) {
  GemmWorkspace ws;
  DeviceBuffer<float> y(size_t(a.rows * b.rows));
  CHECK(quantized_gemm_device(blas, a, b, y.data(), OutType::f32, ws, GemmPath::hopper_bf16) ==
        GemmPath::hopper_bf16);
  check(cudaDeviceSynchronize(), "gemm");
  return y.download();
}

// Every element of m cast by one rank (the store's protocol over the whole buffer; each step is complete on
// return but compute_scales, whose results only the cast reads, in stream order).
void cast_whole(DeviceShardCast& cast, const Model& m) {
  DeviceBuffer<float> flat;
  flat.upload(m.flat);
  const ShardRange all{0, int64_t(m.flat.size())};
  cast.partial_amax(flat.data(), all);
  cast.compute_scales();
  cast.cast(flat.data(), all);
}

}  // namespace

TEST_CASE("packed_operand: an nvfp4_2d operand's fields, the layout quantize_device writes" *
          doctest::test_suite("host")) {
  // Fake device addresses: packed_operand only fills fields (no device work).
  const auto* codes = reinterpret_cast<const uint8_t*>(uintptr_t(0x1000));
  const auto* tiles = reinterpret_cast<const uint8_t*>(uintptr_t(0x2000));
  const auto* g = reinterpret_cast<const float*>(uintptr_t(0x3000));
  const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{37, 45}, {16, 16}, {1, 7}, {48, 64}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    const QuantOperand q = packed_operand(PackedNvfp4{codes, tiles, g}, rows, cols);
    CHECK(q.spec == nvfp4_2d);
    CHECK(q.rows == rows);
    CHECK(q.cols == cols);
    CHECK(q.layout == CodeLayout::packed4);
    CHECK(q.codes == codes);
    CHECK(q.scale_codes == tiles);
    CHECK(q.scales == nullptr);
    CHECK(q.global_decode == g);
    // The GEMM reads [16,16] blocks' scale codes as a [ceil(rows/16), ceil(cols/16)] grid: the cast's tiles.
    int64_t sr = 0, sc = 0;
    scale_grid(q.spec, rows, cols, sr, sc);
    CHECK(sr == (rows + 15) / 16);
    CHECK(sc == (cols + 15) / 16);
    CHECK(q.spec.block_rows == 16);
    CHECK(q.spec.block_cols == 16);
    // Exact as a BF16 operand (hopper_bf16), and a native operand with NVFP4 activations (blackwell_native).
    CHECK(bf16_exact(q.spec));
    CHECK(blackwell_native_supported(quantizer_by_name("nvfp4"), q.spec));
    CHECK(blackwell_native_supported(q.spec, quantizer_by_name("nvfp4")));
  }
  CHECK_THROWS_AS(packed_operand(PackedNvfp4{codes, nullptr, g}, 3, 5), Error);
  CHECK_THROWS_AS(packed_operand(PackedNvfp4{codes, tiles, g}, -1, 5), Error);
  // An empty tensor: no device memory, and none needed (no device work either way).
  CHECK_NOTHROW(packed_operand(PackedNvfp4{}, 0, 5));
  ColumnwiseScratch s;
  const QuantOperand t = packed_operand_columnwise(PackedNvfp4{}, 0, 5, s);
  CHECK(t.rows == 5);
  CHECK(t.cols == 0);
  CHECK(t.layout == CodeLayout::packed4);
}

TEST_CASE("packed_operand: row-wise and column-wise operands equal quantize(nvfp4_2d, W) and (W^T), bit for bit") {
  const Model m = make_model(3);
  const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");
  DeviceShardCast cast(m.tensors);
  cast_whole(cast, m);
  DeviceBuffer<float> deq;
  deq.upload(m.flat);
  cast.dequantize(deq.data());
  const std::vector<float> store_values = deq.download();
  // The store's column-wise copy (all tensors) and sim's transposed tile codes: what each W^T operand holds.
  DeviceBuffer<uint8_t> tr(size_t(cast.packed_bytes_transposed()));
  cast.transpose(tr.data());
  const std::vector<uint8_t> tr_host = tr.download();
  const ShardScales scales = cast.scales();
  const std::vector<uint8_t> tiles_t = transpose_tile_codes(m.tensors, scales.tile_code);
  const FlatLayout layout = flat_layout(m.tensors);
  ColumnwiseScratch scratch;
  int64_t tr_at = 0;
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const FlatTensor& ft = m.tensors[t];
    CAPTURE(ft.rows);
    CAPTURE(ft.cols);
    const int64_t n = ft.rows * ft.cols;
    const PackedNvfp4 c = cast.packed_tensor(t);

    // Row-wise: W [rows, cols].
    const QuantOperand row = packed_operand(c, ft.rows, ft.cols);
    const std::vector<float> row_v = operand_values(row);
    CHECK(test::same_bits("row-wise operand vs the store's dequantize", row_v,
                          std::vector<float>(store_values.begin() + ft.offset, store_values.begin() + ft.offset + n)));
    const QuantizedTensor qw = quantize(nvfp4_2d, MatrixView<const float>(m.flat.data() + ft.offset, ft.rows, ft.cols));
    CHECK(test::same_bits("row-wise operand vs quantize(nvfp4_2d, W)", row_v, qw.dequant));
    const Quantized dw(nvfp4_2d, std::vector<float>(m.flat.begin() + ft.offset, m.flat.begin() + ft.offset + n),
                       ft.rows, ft.cols);
    // quantize_device's nvfp4_2d operand has the same codes and scale codes in the same layout: no conversion.
    CHECK(test::same_bytes("row-wise codes vs quantize_device", download_bytes(row.codes, ft.rows * ((ft.cols + 1) / 2)),
                           dw.codes.download()));
    CHECK(test::same_bytes("row-wise tile codes vs quantize_device",
                           download_bytes(row.scale_codes, int64_t(dw.scodes.size())), dw.scodes.download()));

    // Column-wise: W^T [cols, rows], from the row-wise codes.
    const QuantOperand col = packed_operand_columnwise(c, ft.rows, ft.cols, scratch, nullptr);
    check(cudaDeviceSynchronize(), "columnwise");
    CHECK(col.rows == ft.cols);
    CHECK(col.cols == ft.rows);
    const int64_t col_bytes = ft.cols * ((ft.rows + 1) / 2);
    const std::vector<uint8_t> col_codes = download_bytes(col.codes, col_bytes);
    CHECK(test::same_bytes("column-wise codes vs the store's transpose", col_codes,
                           std::vector<uint8_t>(tr_host.begin() + tr_at, tr_host.begin() + tr_at + col_bytes)));
    tr_at += col_bytes;
    const int64_t ntiles = layout.tile_offset[t + 1] - layout.tile_offset[t];
    CHECK(test::same_bytes("column-wise tile codes vs sim's transpose_tile_codes", download_bytes(col.scale_codes, ntiles),
                           std::vector<uint8_t>(tiles_t.begin() + layout.tile_offset[t],
                                                tiles_t.begin() + layout.tile_offset[t + 1])));
    const std::vector<float> wt = transposed(m, ft);
    const QuantizedTensor qwt = quantize(nvfp4_2d, MatrixView<const float>(wt.data(), ft.cols, ft.rows));
    const std::vector<float> col_v = operand_values(col);
    CHECK(test::same_bits("column-wise operand vs quantize(nvfp4_2d, W^T)", col_v, qwt.dequant));
    const Quantized dwt(nvfp4_2d, wt, ft.cols, ft.rows);
    CHECK(test::same_bytes("column-wise codes vs quantize_device(W^T)", col_codes, dwt.codes.download()));
    CHECK(test::same_bytes("column-wise tile codes vs quantize_device(W^T)", download_bytes(col.scale_codes, ntiles),
                           dwt.scodes.download()));
  }
}

TEST_CASE("packed_operand: the hopper_bf16 GEMM on the packed operands equals it on quantize_device's, same bits") {
  const Model m = make_model(7);
  const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d"), nvfp4 = quantizer_by_name("nvfp4");
  DeviceShardCast cast(m.tensors);
  cast_whole(cast, m);
  Blas blas;
  ColumnwiseScratch scratch;
  const int64_t batch = 19;  // odd: partial tiles of the activations too
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const FlatTensor& ft = m.tensors[t];
    CAPTURE(ft.rows);
    CAPTURE(ft.cols);
    const int64_t out = ft.rows, in = ft.cols, n = out * in;
    const std::vector<float> w(m.flat.begin() + ft.offset, m.flat.begin() + ft.offset + n);
    // fprop: y [batch, out] = x [batch, in] W^T: B = W, k = in.
    const Quantized x(nvfp4, test::varied_randn(batch, in, 11 + uint32_t(t), 4), batch, in);
    const Quantized qw(nvfp4_2d, w, out, in);
    const std::vector<float> y_packed = gemm_hopper(blas, x.op, packed_operand(cast.packed_tensor(t), out, in));
    CHECK(test::same_bits("fprop: packed W vs quantize_device(W)", y_packed, gemm_hopper(blas, x.op, qw.op)));
    // dgrad: dx [batch, in] = dy [batch, out] W: B = W^T [in, out], k = out.
    const Quantized dy(nvfp4, test::varied_randn(batch, out, 23 + uint32_t(t), 4), batch, out);
    const Quantized qwt(nvfp4_2d, transposed(m, ft), in, out);
    const QuantOperand col = packed_operand_columnwise(cast.packed_tensor(t), out, in, scratch, nullptr);
    const std::vector<float> dx_packed = gemm_hopper(blas, dy.op, col);
    CHECK(test::same_bits("dgrad: column-wise W^T vs quantize_device(W^T)", dx_packed, gemm_hopper(blas, dy.op, qwt.op)));
  }
}
