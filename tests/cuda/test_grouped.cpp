// Grouped quantization and grouped GEMMs on the GPU (cuda/grouped.hpp):
// quantize_grouped_device bit for bit against sim's quantize_grouped (empty
// groups, 1-row groups, sizes not multiples of the block, SR, RHT, f32 and
// bf16 inputs, packed codes and the BF16 GEMM operand, group slices and
// outputs at any element offset), and the three grouped
// GEMMs (one cuBLAS call and the per-group loop) against a float64 product of
// the same exact BF16 operands, per expert.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/format.hpp"
#include "cuda/grouped.hpp"
#include "gpu_test_util.hpp"
#include "sim/grouped.hpp"
#include "sim/packing.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

namespace {

// Every output of a grouped quantization, bit for bit (NaN = NaN).
bool same_grouped(const GroupedQuantizedTensor& gpu, const GroupedQuantizedTensor& cpu, const std::vector<float>& x) {
  bool ok = gpu.scale_cols == cpu.scale_cols && gpu.scale_row_offset == cpu.scale_row_offset;
  if (!ok) std::printf("scale layout differs (scale_cols gpu %lld cpu %lld)\n", (long long)gpu.scale_cols,
                       (long long)cpu.scale_cols);
  ok = test::same_bytes("codes", gpu.codes, cpu.codes, &x) && ok;
  ok = test::same_bytes("scale codes", gpu.scale_codes, cpu.scale_codes) && ok;
  ok = test::same_bits("scales", gpu.scales, cpu.scales) && ok;
  ok = test::same_bits("global decode", gpu.global_decode, cpu.global_decode) && ok;
  ok = test::same_bits("dequant", gpu.dequant, cpu.dequant, &x) && ok;
  return ok;
}

// Data whose magnitude differs per group (2^(3g - 9) times varied normals), so
// that each group's own global scale matters.
std::vector<float> grouped_data(const std::vector<int64_t>& sizes, int64_t cols, uint32_t seed, bool bf16) {
  int64_t rows = 0;
  for (int64_t n : sizes) rows += n;
  std::vector<float> x = test::varied_randn(rows, cols, seed, 12);
  int64_t r = 0;
  for (size_t g = 0; g < sizes.size(); ++g)
    for (int64_t i = 0; i < sizes[g]; ++i, ++r)
      for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] *= std::ldexp(1.0f, 3 * int(g % 7) - 9);
  if (bf16) test::round_to_bf16(x);
  return x;
}

struct NamedSpec {
  std::string name;
  QuantizerSpec q;
};

std::vector<NamedSpec> grouped_specs() {
  std::vector<NamedSpec> v;
  for (const char* n : {"nvfp4", "nvfp4_2d", "nvfp4_col", "mxfp4", "mxfp8_e4m3"})
    for (Round r : {Round::rn, Round::rs}) {
      QuantizerSpec q = quantizer_by_name(n);
      q.round = r;
      v.push_back({std::string(n) + (r == Round::rs ? " rs" : ""), q});
    }
  // The NVFP4 recipe's wgrad operand: RHT down 16-row chunks of each group, RN and SR.
  for (Round r : {Round::rn, Round::rs}) {
    QuantizerSpec q = quantizer_by_name("nvfp4_col");
    q.rht = true;
    q.rht_seed = 17;
    q.round = r;
    v.push_back({std::string("nvfp4_col rht") + (r == Round::rs ? " rs" : ""), q});
  }
  // The one-launch form's other kernels: PTX cvt.rs's random-bit contract,
  // the runtime kind of row blocks ([1,32] E5M2 / E2M3), SR on 16x16 tiles.
  for (const char* n : {"nvfp4", "mxfp4"}) {
    QuantizerSpec q = quantizer_by_name(n);
    q.round = Round::rs;
    q.sr_bits = SrBits::ptx_x4;
    v.push_back({std::string(n) + " rs ptx_x4", q});
  }
  v.push_back({"mxfp8_e5m2", quantizer_by_name("mxfp8_e5m2")});
  v.push_back({"mxfp6_e2m3", quantizer_by_name("mxfp6_e2m3")});
  // The MX recipes' wgrad operands (and mxfp8's dgrad W): [32,1] blocks down each group's columns.
  for (const char* n : {"mxfp4", "mxfp8_e4m3"})
    for (Round r : {Round::rn, Round::rs}) {
      QuantizerSpec q = quantizer_by_name(n);
      q.block_rows = 32;
      q.block_cols = 1;
      q.round = r;
      v.push_back({std::string(n) + " [32,1]" + (r == Round::rs ? " rs" : ""), q});
    }
  // Column blocks in PTX cvt.rs's random-bit contract, with and without the RHT.
  for (bool rht : {false, true}) {
    QuantizerSpec q = quantizer_by_name("nvfp4_col");
    q.round = Round::rs;
    q.sr_bits = SrBits::ptx_x4;
    q.rht = rht;
    q.rht_seed = 9;
    v.push_back({std::string("nvfp4_col rs ptx_x4") + (rht ? " rht" : ""), q});
  }
  return v;
}

// Empty groups (first, middle, last), 1-row groups, sizes not multiples of 16,
// 32 or 128 (15, 16, 17: a partial RHT chunk or none); one group; every group
// empty; a large group (several column-kernel blocks).
const std::vector<std::vector<int64_t>> kGroupSizes = {
    {0, 1, 37, 0, 16, 130, 5, 0}, {64}, {3, 1, 1, 17, 33}, {0, 0}, {200, 0, 48}, {15, 16, 17, 0, 31, 1100}};

// The (path, launch form) pairs a spec runs on: the automatic path per group
// and, where it applies, in one launch; the generic path (per group).
struct PathLaunch {
  QuantPath path;
  GroupedLaunch launch;
};
std::vector<PathLaunch> path_launches(const QuantizerSpec& q) {
  std::vector<PathLaunch> v{{QuantPath::automatic, GroupedLaunch::per_group}};
  if (grouped_one_launch_applies(q)) v.push_back({QuantPath::automatic, GroupedLaunch::one_launch});
  if (!q.rht) v.push_back({QuantPath::generic, GroupedLaunch::per_group});
  return v;
}

}  // namespace

TEST_CASE("cuda grouped quantize: the one-launch form applies to fused row blocks, tiles and column blocks" *
          doctest::test_suite("host")) {
  for (const char* n : {"nvfp4", "nvfp4_2d", "nvfp4_col", "mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3"})
    CHECK_MESSAGE(grouped_one_launch_applies(quantizer_by_name(n)), n);
  CHECK_FALSE(grouped_one_launch_applies(quantizer_by_name("nvfp4"), QuantPath::generic));
  QuantizerSpec col_rht = quantizer_by_name("nvfp4_col");  // the wgrad operand: RHT folded into [16,1] blocks
  col_rht.rht = true;
  CHECK(grouped_one_launch_applies(col_rht));
  QuantizerSpec mx_col = quantizer_by_name("mxfp8_e4m3");
  mx_col.block_rows = 32;
  mx_col.block_cols = 1;
  CHECK(grouped_one_launch_applies(mx_col));
  QuantizerSpec rht = quantizer_by_name("nvfp4");  // row blocks with RHT: per group
  rht.rht = true;
  CHECK_FALSE(grouped_one_launch_applies(rht));
  GroupedQuantWorkspace ws;
  GroupedQuantOutputs o;
  const std::vector<int64_t> sizes{3, 4};
  CHECK_THROWS_WITH_AS(quantize_grouped_device(rht, nullptr, InputType::f32, 7, 16, sizes, {}, o, ws, nullptr,
                                               QuantPath::automatic, GroupedLaunch::one_launch),
                       doctest::Contains("use GroupedLaunch::per_group"), Error);
}

TEST_CASE("cuda grouped quantize: bit-exact with sim's quantize_grouped") {
  int cases = 0, failures = 0;
  for (const NamedSpec& s : grouped_specs()) {
    for (size_t si = 0; si < kGroupSizes.size(); ++si) {
      const std::vector<int64_t>& sizes = kGroupSizes[si];
      for (int64_t cols : {int64_t(64), int64_t(53)}) {
        for (bool bf16 : {false, true}) {
          const std::vector<float> x = grouped_data(sizes, cols, uint32_t(31 + si + cols), bf16);
          int64_t rows = 0;
          for (int64_t n : sizes) rows += n;
          const MatrixView<const float> v(x.data(), rows, cols);
          const std::vector<RandomStream> streams = consecutive_streams(1234, 10, sizes.size());
          const GroupedQuantizedTensor cpu = quantize_grouped(s.q, v, sizes, streams);
          for (const PathLaunch& pl : path_launches(s.q)) {
            ++cases;
            const GroupedQuantizedTensor gpu = quantize_grouped_gpu(s.q, v, sizes, streams, pl.path, bf16, pl.launch);
            if (!same_grouped(gpu, cpu, x)) {
              ++failures;
              std::printf("  case: %s, sizes #%zu, cols %lld, %s input, path %s, %s\n", s.name.c_str(), si,
                          (long long)cols, bf16 ? "bf16" : "f32", pl.path == QuantPath::generic ? "generic" : "auto",
                          pl.launch == GroupedLaunch::one_launch ? "one launch" : "per group");
            }
          }
        }
      }
    }
  }
  MESSAGE(cases << " grouped cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda grouped quantize: without streams every group draws from RandomStream{} (as sim)") {
  QuantizerSpec q = quantizer_by_name("nvfp4");
  q.round = Round::rs;
  const std::vector<int64_t> sizes{5, 0, 20};
  const std::vector<float> x = grouped_data(sizes, 48, 3, false);
  const MatrixView<const float> v(x.data(), 25, 48);
  CHECK(same_grouped(quantize_grouped_gpu(q, v, sizes), quantize_grouped(q, v, sizes), x));
}

TEST_CASE("cuda grouped quantize: packed FP4 codes and the BF16 GEMM operand in the concatenated layout") {
  int failures = 0;
  for (const char* n : {"nvfp4", "nvfp4_2d", "nvfp4_col", "mxfp4", "mxfp8_e4m3"}) {
    const QuantizerSpec q = quantizer_by_name(n);
    REQUIRE(bf16_exact(q));
    for (const std::vector<int64_t>& sizes : kGroupSizes) {
      for (int64_t cols : {int64_t(64), int64_t(53)}) {
        for (bool bf16 : {false, true}) {
          const std::vector<float> x = grouped_data(sizes, cols, 77, bf16);
          const int64_t rows = int64_t(x.size()) / cols;
          const MatrixView<const float> v(x.data(), rows, cols);
          const GroupedQuantizedTensor cpu = quantize_grouped(q, v, sizes);
          DeviceBuffer<float> dx;
          DeviceBuffer<uint16_t> dx16;
          if (bf16 && !x.empty()) {
            std::vector<uint16_t> h(x.size());
            for (size_t i = 0; i < x.size(); ++i) h[i] = uint16_t(float_bits(x[i]) >> 16);
            dx16.upload(h);
          } else if (!x.empty()) {
            dx.upload(x);
          }
          const bool packed = q.element->bits() == 4;
          DeviceBuffer<uint8_t> codes(static_cast<size_t>(packed ? rows * ((cols + 1) / 2) : rows * cols));
          DeviceBuffer<uint16_t> op16(static_cast<size_t>(rows * cols));
          DeviceBuffer<float> gdec(sizes.size());
          codes.fill_bytes(0xEE);
          op16.fill_bytes(0xEE);
          gdec.fill_bytes(0xEE);
          GroupedQuantOutputs o;
          o.codes = codes.data();
          o.code_layout = packed ? CodeLayout::packed4 : CodeLayout::bytes;
          o.dequant_bf16 = op16.data();
          o.bf16_gemm_operand = true;
          o.global_decode = gdec.data();
          GroupedQuantWorkspace ws;
          quantize_grouped_device(q, bf16 ? static_cast<const void*>(dx16.data()) : dx.data(),
                                  bf16 ? InputType::bf16 : InputType::f32, rows, cols, sizes, {}, o, ws);
          check(cudaDeviceSynchronize(), "test");
          bool ok = test::same_bytes(
              "codes", codes.download(),
              packed ? pack_codes(*q.element, cpu.codes.data(), rows, cols) : cpu.codes);
          ok = test::same_bits("global decode", gdec.download(), cpu.global_decode) && ok;
          // The operand: decode(code) * the block scale of the row's group, exact in BF16.
          const std::vector<uint16_t> got = op16.download();
          int64_t bad = 0, row = 0;
          for (size_t g = 0; g < sizes.size(); ++g) {
            for (int64_t i = 0; i < sizes[g]; ++i, ++row)
              for (int64_t c = 0; c < cols; ++c) {
                const int64_t srow = cpu.scale_row_offset[g] + i / q.block_rows;
                const float s = cpu.scales[size_t(srow * cpu.scale_cols + c / q.block_cols)];
                const float want = decode(*q.element, cpu.codes[size_t(row * cols + c)]) * s;
                const uint32_t wb = float_bits(want);
                if ((wb & 0xFFFFu) != 0 || uint32_t(got[size_t(row * cols + c)]) << 16 != wb) ++bad;
              }
          }
          if (bad) std::printf("  BF16 operand: %lld elements differ\n", (long long)bad);
          if (!ok || bad) {
            ++failures;
            std::printf("  case: %s, %zu groups, cols %lld, %s input\n", n, sizes.size(), (long long)cols,
                        bf16 ? "bf16" : "f32");
          }
        }
      }
    }
  }
  CHECK(failures == 0);
}

namespace {

// A device copy of `bytes` bytes at offset `at` of a fresh (256-byte aligned)
// buffer, the bytes around it poison (0xA5) that must stay so.
struct Slot {
  DeviceBuffer<uint8_t> buf;
  size_t at, bytes;
  Slot(size_t bytes_, size_t at_, const void* data = nullptr) : buf(at_ + bytes_ + 64), at(at_), bytes(bytes_) {
    std::vector<uint8_t> h(buf.size(), 0xA5);
    if (data && bytes) std::memcpy(h.data() + at, data, bytes);
    buf.upload(h);
  }
  template <class T>
  T* ptr() const {
    return reinterpret_cast<T*>(buf.data() + at);
  }
  template <class T>
  std::vector<T> get() const {
    const std::vector<uint8_t> h = buf.download();
    std::vector<T> v(bytes / sizeof(T));
    if (bytes) std::memcpy(v.data(), h.data() + at, bytes);
    return v;
  }
  bool guards_intact() const {
    const std::vector<uint8_t> h = buf.download();
    for (size_t i = 0; i < h.size(); ++i)
      if ((i < at || i >= at + bytes) && h[i] != 0xA5) return false;
    return true;
  }
};

}  // namespace

// Group slices at every alignment: with cols 53 (and 53 x 4 / 53 x 2 bytes a
// row) the groups start at all offsets mod 16; the tensor and every output
// also at odd element offsets from their buffers' aligned bases. Every output
// against sim, nothing written around them, and QuantWorkspace::staging
// grown only where a group's amax pass needs an aligned copy of its slice
// (never for aligned slices).
TEST_CASE("cuda grouped quantize: slices at any element offset, every output, staging only where needed") {
  std::vector<NamedSpec> specs;
  for (const char* n : {"nvfp4", "nvfp4_col", "nvfp4_2d", "mxfp4", "mxfp8_e4m3"}) specs.push_back({n, quantizer_by_name(n)});
  specs[2].q.round = Round::rs;  // tiles' amax pre-pass (rn's may be the cooperative one-launch form)
  specs[2].name += " rs";
  QuantizerSpec rht = quantizer_by_name("nvfp4_col");
  rht.rht = true;
  rht.rht_seed = 5;
  specs.push_back({"nvfp4_col rht", rht});
  const std::vector<int64_t> sizes{3, 1, 17, 0, 33, 6, 2};
  int failures = 0;
  for (const NamedSpec& ns : specs) {
    const QuantizerSpec& q = ns.q;
    for (int64_t cols : {int64_t(53), int64_t(64)}) {
      for (bool bf16 : {false, true}) {
        for (int64_t off : {0, 1})
         for (GroupedLaunch launch : {GroupedLaunch::per_group, GroupedLaunch::one_launch}) {
          if (launch == GroupedLaunch::one_launch && !grouped_one_launch_applies(q)) continue;
          const std::vector<float> x = grouped_data(sizes, cols, 91u + uint32_t(cols), bf16);
          const int64_t rows = int64_t(x.size()) / cols, n = rows * cols;
          const std::vector<RandomStream> streams = consecutive_streams(55, 2, sizes.size());
          const MatrixView<const float> v(x.data(), rows, cols);
          const GroupedQuantizedTensor cpu = quantize_grouped(q, v, sizes, streams);
          const size_t elem = bf16 ? 2 : 4;
          std::vector<uint16_t> h16(x.size());
          for (size_t i = 0; i < x.size(); ++i) h16[i] = uint16_t(float_bits(x[i]) >> 16);
          const Slot in(size_t(n) * elem, size_t(off) * elem, bf16 ? static_cast<const void*>(h16.data()) : x.data());
          const int64_t out_off = 2 * off + 1;  // odd
          const bool has_codes = q.scale != &float32;
          const size_t nsc = cpu.scales.size();
          const Slot codes{size_t(n), size_t(out_off)}, scodes{has_codes ? nsc : 0, size_t(out_off)},
              scales{nsc * 4, size_t(out_off) * 4}, dq{size_t(n) * 4, size_t(out_off) * 4},
              b16{size_t(n) * 2, size_t(out_off) * 2}, gdec{sizes.size() * 4, size_t(out_off) * 4};
          GroupedQuantOutputs o;
          o.codes = codes.ptr<uint8_t>();
          o.scale_codes = has_codes ? scodes.ptr<uint8_t>() : nullptr;
          o.scales = scales.ptr<float>();
          o.dequant = dq.ptr<float>();
          o.dequant_bf16 = b16.ptr<uint16_t>();
          o.global_decode = gdec.ptr<float>();
          const InputType it = bf16 ? InputType::bf16 : InputType::f32;
          GroupedQuantWorkspace ws;
          quantize_grouped_device(q, in.ptr<void>(), it, rows, cols, sizes, streams, o, ws, nullptr,
                                  QuantPath::automatic, launch);
          check(cudaDeviceSynchronize(), "test");
          bool ok = test::same_bytes("codes", codes.get<uint8_t>(), cpu.codes, &x);
          if (has_codes) ok = test::same_bytes("scale codes", scodes.get<uint8_t>(), cpu.scale_codes) && ok;
          ok = test::same_bits("scales", scales.get<float>(), cpu.scales) && ok;
          ok = test::same_bits("global decode", gdec.get<float>(), cpu.global_decode) && ok;
          ok = test::same_bits("dequant", dq.get<float>(), cpu.dequant, &x) && ok;
          // BF16: sim's FP32 dequant rounded to nearest even (a NaN any NaN).
          const std::vector<uint16_t> got16 = b16.get<uint16_t>();
          int64_t bad16 = 0;
          for (size_t i = 0; i < got16.size(); ++i) {
            const uint32_t b = float_bits(cpu.dequant[i]);
            const bool nan = std::isnan(cpu.dequant[i]);
            const uint16_t want = uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
            bad16 += !(nan ? (got16[i] & 0x7FFF) > 0x7F80 : got16[i] == want);
          }
          if (bad16) std::printf("  BF16 dequant: %lld elements differ\n", (long long)bad16);
          ok = bad16 == 0 && ok;
          for (const Slot* sl : {&in, &codes, &scodes, &scales, &dq, &b16, &gdec}) ok = sl->guards_intact() && ok;
          // The staging buffer: the largest group copy quantize_device makes, none where every slice is aligned
          // (the one-launch form's loads check alignment per access: none at all).
          size_t want_staging = 0;
          bool all_aligned = true;
          for (size_t g = 0, row = 0; g < sizes.size(); row += size_t(sizes[g]), ++g) {
            if (sizes[g] == 0) continue;
            const char* slice = in.ptr<char>() + row * size_t(cols) * elem;
            all_aligned = all_aligned && (reinterpret_cast<uintptr_t>(slice) & 15) == 0;
            if (launch == GroupedLaunch::per_group)
              want_staging = std::max(want_staging, quantize_staging_bytes(q, slice, it, sizes[g], cols));
          }
          if (ws.quant.staging.size() != want_staging || (all_aligned && want_staging != 0)) {
            std::printf("  staging: %zu bytes, want %zu\n", ws.quant.staging.size(), want_staging);
            ok = false;
          }
          if (!ok) {
            ++failures;
            std::printf("  case: %s, cols %lld, %s input at +%lld elements, outputs at +%lld, %s\n",
                        ns.name.c_str(), (long long)cols, bf16 ? "bf16" : "f32", (long long)off, (long long)out_off,
                        launch == GroupedLaunch::one_launch ? "one launch" : "per group");
          }
        }
      }
    }
  }
  CHECK(failures == 0);
  // The unaligned groups of nvfp4 (its tensor-amax pass) are staged: f32 rows
  // of 53 elements put group 1 (row 3) at byte 636.
  const QuantizerSpec nv = quantizer_by_name("nvfp4");
  DeviceBuffer<float> d(size_t(10 * 53));
  CHECK(quantize_staging_bytes(nv, d.data() + 3 * 53, InputType::f32, 1, 53) == 53 * 4);
  CHECK(quantize_staging_bytes(nv, d.data() + 4 * 53, InputType::f32, 1, 53) == 0);
  CHECK(quantize_staging_bytes(quantizer_by_name("mxfp4"), d.data() + 3 * 53, InputType::f32, 1, 53) == 0);
}

// E2 (the grouped linear's expert weights): each group's input at its own
// element offset (a constant stride with an odd gap, as the experts' W in the
// flat parameters), each group's values at a 256-byte-aligned start. One
// launch and per group against (1) sim's quantize_grouped on the
// concatenated data (codes, scales, g_dec, FP32 dequant gathered from the
// value offsets) and (2) quantize_device on each group's slice alone with
// the trainer's outputs (the BF16 GEMM operand, g_dec, the GEMM alpha
// g_dec * other[g]): bit for bit, and nothing written between the groups.
TEST_CASE("cuda grouped quantize: per-group input offsets and aligned value starts") {
  std::vector<NamedSpec> specs;
  for (const char* n : {"nvfp4", "nvfp4_2d", "nvfp4_col", "mxfp8_e4m3"}) specs.push_back({n, quantizer_by_name(n)});
  for (Round r : {Round::rn, Round::rs}) {
    QuantizerSpec q = quantizer_by_name("nvfp4_col");
    q.rht = true;
    q.rht_seed = 3;
    q.round = r;
    specs.push_back({std::string("nvfp4_col rht") + (r == Round::rs ? " rs" : ""), q});
  }
  for (const char* n : {"mxfp8_e4m3", "mxfp4"}) {
    QuantizerSpec q = quantizer_by_name(n);
    q.block_rows = 32;
    q.block_cols = 1;
    specs.push_back({std::string(n) + " [32,1]", q});
  }
  // The second layout: every group whole 16-row tiles, which with cols 64 would let 16x16 tiles take their
  // unchecked form, were the groups' starts (+3 elements) not misaligned.
  const std::vector<std::vector<int64_t>> layouts{{0, 1, 15, 16, 17, 0, 37, 130}, {16, 0, 32, 48}};
  int failures = 0, cases = 0;
  for (const std::vector<int64_t>& sizes : layouts)
    for (const NamedSpec& ns : specs) {
      const QuantizerSpec& q = ns.q;
      const size_t G = sizes.size();
      for (int64_t cols : {int64_t(64), int64_t(53)}) {
        for (bool bf16 : {false, true}) {
          const std::vector<float> x = grouped_data(sizes, cols, 501u + uint32_t(cols), bf16);
          const int64_t rows = int64_t(x.size()) / cols, n = rows * cols;
          const std::vector<RandomStream> streams = consecutive_streams(808, 4, G);
          const GroupedQuantizedTensor cpu =
              quantize_grouped(q, MatrixView<const float>(x.data(), rows, cols), sizes, streams);
          // Inputs at g * stride + 3 (stride: the largest group and an odd gap), poison between them.
          int64_t maxn = 0;
          for (int64_t v : sizes) maxn = std::max(maxn, v);
          const int64_t stride = maxn * cols + 37;
          std::vector<int64_t> xoff(G), voff(G + 1, 0);
          for (size_t g = 0; g < G; ++g) {
            xoff[g] = int64_t(g) * stride + 3;
            voff[g + 1] = voff[g] + (sizes[g] * cols + 127) / 128 * 128;  // 128 elements: 256 bytes of BF16
          }
          const int64_t in_elems = int64_t(G) * stride + 3;
          std::vector<float> hx(size_t(in_elems), std::nanf(""));
          std::vector<uint16_t> hx16(size_t(in_elems), 0x7FC1);
          for (size_t g = 0, row = 0; g < G; row += size_t(sizes[g]), ++g)
            for (int64_t i = 0; i < sizes[g] * cols; ++i) {
              hx[size_t(xoff[g] + i)] = x[row * size_t(cols) + size_t(i)];
              hx16[size_t(xoff[g] + i)] = uint16_t(float_bits(x[row * size_t(cols) + size_t(i)]) >> 16);
            }
          DeviceBuffer<float> dx32;
          DeviceBuffer<uint16_t> dx16;
          if (bf16)
            dx16.upload(hx16);
          else
            dx32.upload(hx);
          const void* in = bf16 ? static_cast<const void*>(dx16.data()) : dx32.data();
          const InputType it = bf16 ? InputType::bf16 : InputType::f32;
          const std::vector<float> other = test::varied_randn(1, int64_t(G), 7, 2);
          DeviceBuffer<float> d_other;
          d_other.upload(other);
          // (2)'s reference: quantize_device on a contiguous copy of each group's slice.
          const size_t nv = size_t(std::max<int64_t>(voff[G], 1));
          std::vector<uint16_t> want16(nv, 0xEEEE);
          std::vector<float> want_gdec(G, 1.0f), want_alpha(G, -5.0f);
          {
            QuantWorkspace qws;
            for (size_t g = 0, row = 0; g < G; row += size_t(sizes[g]), ++g) {
              if (sizes[g] == 0) continue;
              const int64_t ne = sizes[g] * cols;
              DeviceBuffer<uint16_t> o16{size_t(ne)};
              DeviceBuffer<float> og(2);
              QuantOutputs o;
              o.dequant_bf16 = o16.data();
              o.bf16_gemm_operand = true;
              o.global_decode = og.data();
              o.gemm_alpha = og.data() + 1;
              o.gemm_alpha_other = d_other.data() + g;
              DeviceBuffer<float> s32;
              DeviceBuffer<uint16_t> s16;
              if (bf16)
                s16.upload(std::vector<uint16_t>(hx16.begin() + xoff[g], hx16.begin() + xoff[g] + ne));
              else
                s32.upload(std::vector<float>(hx.begin() + xoff[g], hx.begin() + xoff[g] + ne));
              quantize_device(q, bf16 ? static_cast<const void*>(s16.data()) : s32.data(), it, sizes[g], cols,
                              streams[g], o, qws);
              const std::vector<uint16_t> h = o16.download();
              std::copy(h.begin(), h.end(), want16.begin() + voff[g]);
              const std::vector<float> hg = og.download();
              want_gdec[g] = hg[0];
              want_alpha[g] = hg[1];
            }
          }
          std::vector<GroupedLaunch> launches{GroupedLaunch::per_group};
          if (grouped_one_launch_applies(q)) launches.push_back(GroupedLaunch::one_launch);
          for (GroupedLaunch launch : launches) {
            ++cases;
            GroupedQuantWorkspace ws;
            bool ok = true;
            {  // (1) against sim
              DeviceBuffer<uint8_t> codes(size_t(std::max<int64_t>(n, 1)));
              DeviceBuffer<uint8_t> scodes(std::max<size_t>(cpu.scale_codes.size(), 1));
              DeviceBuffer<float> scales(std::max<size_t>(cpu.scales.size(), 1)), dq(nv), gdec(G);
              dq.fill_bytes(0xA5);
              GroupedQuantOutputs o;
              o.codes = codes.data();
              o.scale_codes = cpu.scale_codes.empty() ? nullptr : scodes.data();
              o.scales = scales.data();
              o.dequant = dq.data();
              o.global_decode = gdec.data();
              o.value_offsets = std::span<const int64_t>(voff.data(), G);
              quantize_grouped_device(q, in, it, rows, cols, sizes, streams, o, ws, nullptr, QuantPath::automatic,
                                      launch, xoff);
              check(cudaDeviceSynchronize(), "test");
              std::vector<uint8_t> got_codes = codes.download();
              got_codes.resize(size_t(n));
              ok = test::same_bytes("codes", got_codes, cpu.codes, &x) && ok;
              if (!cpu.scale_codes.empty()) {
                std::vector<uint8_t> sc = scodes.download();
                sc.resize(cpu.scale_codes.size());
                ok = test::same_bytes("scale codes", sc, cpu.scale_codes) && ok;
              }
              std::vector<float> scl = scales.download();
              scl.resize(cpu.scales.size());
              ok = test::same_bits("scales", scl, cpu.scales) && ok;
              ok = test::same_bits("global decode", gdec.download(), cpu.global_decode) && ok;
              const std::vector<float> all = dq.download();
              std::vector<float> got(static_cast<size_t>(n));
              int64_t poisoned = 0;
              for (size_t g = 0, row = 0; g < G; row += size_t(sizes[g]), ++g) {
                const int64_t ne = sizes[g] * cols;
                std::copy(all.begin() + voff[g], all.begin() + voff[g] + ne, got.begin() + row * size_t(cols));
                for (int64_t i = voff[g] + ne; i < voff[g + 1]; ++i)
                  poisoned += float_bits(all[size_t(i)]) != 0xA5A5A5A5u;
              }
              ok = test::same_bits("dequant", got, cpu.dequant, &x) && ok;
              if (poisoned) std::printf("  %lld dequant elements written between the groups\n", (long long)poisoned);
              ok = poisoned == 0 && ok;
            }
            {  // (2) against quantize_device on each slice: the trainer's outputs
              DeviceBuffer<uint16_t> o16(nv);
              DeviceBuffer<float> gdec(G), alpha(G);
              o16.fill_bytes(0xEE);
              alpha.upload(std::vector<float>(G, -5.0f));
              GroupedQuantOutputs o;
              o.dequant_bf16 = o16.data();
              o.bf16_gemm_operand = true;
              o.global_decode = gdec.data();
              o.gemm_alpha = alpha.data();
              o.gemm_alpha_other = d_other.data();
              o.value_offsets = std::span<const int64_t>(voff.data(), G);
              quantize_grouped_device(q, in, it, rows, cols, sizes, streams, o, ws, nullptr, QuantPath::automatic,
                                      launch, xoff);
              check(cudaDeviceSynchronize(), "test");
              const std::vector<uint16_t> got16 = o16.download();
              int64_t bad = 0;
              for (size_t i = 0; i < nv; ++i) bad += got16[i] != want16[i];
              if (bad) std::printf("  BF16 operand: %lld elements differ from quantize_device's\n", (long long)bad);
              ok = bad == 0 && ok;
              ok = test::same_bits("global decode (slices)", gdec.download(), want_gdec) && ok;
              ok = test::same_bits("gemm alpha (slices)", alpha.download(), want_alpha) && ok;
            }
            if (!ok) {
              ++failures;
              std::printf("  case: %s, %zu groups, cols %lld, %s input, %s\n", ns.name.c_str(), G, (long long)cols,
                          bf16 ? "bf16" : "f32", launch == GroupedLaunch::one_launch ? "one launch" : "per group");
            }
          }
        }
      }
    }
  MESSAGE(cases << " offset cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda grouped quantize: argument errors before any device work" * doctest::test_suite("host")) {
  const QuantizerSpec q = quantizer_by_name("nvfp4");
  GroupedQuantWorkspace ws;
  GroupedQuantOutputs o;
  const std::vector<int64_t> sizes{3, 4};
  CHECK_THROWS_WITH_AS(quantize_grouped_device(q, nullptr, InputType::f32, 10, 16, sizes, {}, o, ws),
                       doctest::Contains("sum to 7 but the tensor has 10 rows"), Error);
  const std::vector<int64_t> negative{3, -1, 8};
  CHECK_THROWS_WITH_AS(quantize_grouped_device(q, nullptr, InputType::f32, 10, 16, negative, {}, o, ws),
                       doctest::Contains("sizes must be >= 0"), Error);
  const std::vector<RandomStream> one{RandomStream{1, 2}};
  CHECK_THROWS_WITH_AS(quantize_grouped_device(q, nullptr, InputType::f32, 7, 16, sizes, one, o, ws),
                       doctest::Contains("1 random streams for 2 groups"), Error);
  CHECK_THROWS_WITH_AS(
      quantize_grouped_device(quantizer_by_name("fp8_e4m3_tensor"), nullptr, InputType::f32, 7, 16, sizes, {}, o, ws),
      doctest::Contains("per-tensor scaling"), Error);
  const std::vector<int64_t> three_offsets{0, 64, 128}, negative_offset{0, -16};
  CHECK_THROWS_WITH_AS(quantize_grouped_device(q, nullptr, InputType::f32, 7, 16, sizes, {}, o, ws, nullptr,
                                               QuantPath::automatic, GroupedLaunch::automatic, three_offsets),
                       doctest::Contains("3 input offsets for 2 groups"), Error);
  CHECK_THROWS_WITH_AS(quantize_grouped_device(q, nullptr, InputType::f32, 7, 16, sizes, {}, o, ws, nullptr,
                                               QuantPath::automatic, GroupedLaunch::automatic, negative_offset),
                       doctest::Contains("group 1's input offsets entry is -16"), Error);
  GroupedQuantOutputs bad_values;
  bad_values.value_offsets = three_offsets;
  CHECK_THROWS_WITH_AS(quantize_grouped_device(q, nullptr, InputType::f32, 7, 16, sizes, {}, bad_values, ws),
                       doctest::Contains("3 value offsets for 2 groups"), Error);
  GroupedQuantOutputs packed;
  packed.code_layout = CodeLayout::packed4;
  CHECK_THROWS_WITH_AS(
      quantize_grouped_device(quantizer_by_name("mxfp8_e4m3"), nullptr, InputType::f32, 7, 16, sizes, {}, packed, ws),
      doctest::Contains("packed4 codes need a 4-bit element"), Error);
  // The scale layout of sim/grouped.hpp: ceil(rows_g / block_rows) rows per group.
  int64_t sc = 0;
  CHECK(grouped_scale_row_offsets(quantizer_by_name("nvfp4_2d"), std::vector<int64_t>{0, 1, 17, 32}, 40, &sc) ==
        std::vector<int64_t>{0, 0, 1, 3, 5});
  CHECK(sc == 3);
  CHECK(grouped_scale_row_offsets(quantizer_by_name("nvfp4"), std::vector<int64_t>{2, 0, 5}, 16) ==
        std::vector<int64_t>{0, 2, 2, 7});
}

// ---- grouped GEMMs ----------------------------------------------------------

namespace {

std::vector<float> bf16_values(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> v = test::varied_randn(rows, cols, seed, 3);
  test::round_to_bf16(v);
  return v;
}

DeviceBuffer<uint16_t> upload_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = uint16_t(float_bits(v[i]) >> 16);
  DeviceBuffer<uint16_t> d;
  if (!h.empty()) d.upload(h);
  return d;
}

float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

enum class GOp { forward, dgrad, wgrad };
const char* op_name(GOp op) { return op == GOp::forward ? "forward" : op == GOp::dgrad ? "dgrad" : "wgrad"; }

// The float64 reference of one grouped product from host operands (x [M, K],
// dy [M, N], W [E, N, K]) and its per-element magnitude |alpha| sum |a||b|.
struct Ref {
  std::vector<double> val, mag;
};
Ref reference(GOp op, const std::vector<int64_t>& sizes, int64_t N, int64_t K, const std::vector<float>& x,
              const std::vector<float>& dy, const std::vector<float>& w, const std::vector<float>& alpha) {
  int64_t M = 0;
  for (int64_t m : sizes) M += m;
  const int64_t E = int64_t(sizes.size());
  Ref r;
  const size_t n_out = size_t(op == GOp::forward ? M * N : op == GOp::dgrad ? M * K : E * N * K);
  r.val.assign(n_out, 0.0);
  r.mag.assign(n_out, 0.0);
  int64_t row = 0;
  for (int64_t g = 0; g < E; ++g) {
    const int64_t mg = sizes[size_t(g)];
    const double al = alpha.empty() ? 1.0 : double(alpha[size_t(g)]);
    const float* wg = w.data() + g * N * K;
    if (op == GOp::forward) {
      for (int64_t i = 0; i < mg; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double s = 0, a = 0;
          for (int64_t t = 0; t < K; ++t) {
            const double p = double(x[size_t((row + i) * K + t)]) * double(wg[j * K + t]);
            s += p, a += std::fabs(p);
          }
          r.val[size_t((row + i) * N + j)] = al * s;
          r.mag[size_t((row + i) * N + j)] = std::fabs(al) * a;
        }
    } else if (op == GOp::dgrad) {
      for (int64_t i = 0; i < mg; ++i)
        for (int64_t t = 0; t < K; ++t) {
          double s = 0, a = 0;
          for (int64_t j = 0; j < N; ++j) {
            const double p = double(dy[size_t((row + i) * N + j)]) * double(wg[j * K + t]);
            s += p, a += std::fabs(p);
          }
          r.val[size_t((row + i) * K + t)] = al * s;
          r.mag[size_t((row + i) * K + t)] = std::fabs(al) * a;
        }
    } else {
      for (int64_t j = 0; j < N; ++j)
        for (int64_t t = 0; t < K; ++t) {
          double s = 0, a = 0;
          for (int64_t i = 0; i < mg; ++i) {
            const double p = double(dy[size_t((row + i) * N + j)]) * double(x[size_t((row + i) * K + t)]);
            s += p, a += std::fabs(p);
          }
          r.val[size_t(g * N * K + j * K + t)] = al * s;
          r.mag[size_t(g * N * K + j * K + t)] = std::fabs(al) * a;
        }
    }
    row += mg;
  }
  return r;
}

struct GemmCase {
  std::vector<int64_t> sizes;
  int64_t n, k;
};

}  // namespace

TEST_CASE("cuda grouped gemm: forward / dgrad / wgrad against a float64 per-expert product, both forms") {
  const GemmCase cases[] = {
      {{5, 0, 1, 33, 0, 64, 17}, 48, 40},  // empty and 1-row groups, m_g not multiples of 16
      {{16, 16, 16, 16}, 24, 36},          // balanced (one cuBLAS group of 4 problems without alpha); K % 8 != 0
      {{0, 0, 0}, 32, 16},                 // nothing to multiply: forward / dgrad write nothing, wgrad zeros
      {{130}, 64, 128}};                   // one expert
  int failures = 0;
  for (size_t ci = 0; ci < std::size(cases); ++ci) {
    const GemmCase& gc = cases[ci];
    const int64_t E = int64_t(gc.sizes.size()), N = gc.n, K = gc.k;
    int64_t M = 0;
    for (int64_t m : gc.sizes) M += m;
    const std::vector<float> x = bf16_values(M, K, 5), dy = bf16_values(M, N, 6), w = bf16_values(E * N, K, 7);
    DeviceBuffer<uint16_t> dx16 = upload_bf16(x), ddy16 = upload_bf16(dy), dw16 = upload_bf16(w);
    std::vector<float> alphas;
    for (int64_t g = 0; g < E; ++g) alphas.push_back(std::ldexp(0.75f + 0.1f * float(g), int(g % 5) - 2));
    Blas blas;
    GroupedGemmWorkspace ws;
    for (GOp op : {GOp::forward, GOp::dgrad, GOp::wgrad}) {
      for (bool with_alpha : {false, true}) {
        const std::vector<float> al = with_alpha ? alphas : std::vector<float>{};
        const Ref ref = reference(op, gc.sizes, N, K, x, dy, w, al);
        const size_t n_out = ref.val.size();
        // Earlier contents of dW for the accumulating wgrad.
        const std::vector<float> prior = test::varied_randn(1, int64_t(std::max<size_t>(n_out, 1)), 9, 2);
        for (GroupedImpl impl : {GroupedImpl::one_call, GroupedImpl::loop}) {
          for (OutType out : {OutType::f32, OutType::bf16}) {
            for (bool accumulate : {false, true}) {
              if (accumulate && op != GOp::wgrad) continue;
              DeviceBuffer<float> y32(n_out);
              DeviceBuffer<uint16_t> y16(n_out);
              std::vector<float> before(n_out);
              if (accumulate) {
                before.assign(prior.begin(), prior.begin() + int64_t(n_out));
                if (out == OutType::bf16) test::round_to_bf16(before);
                if (out == OutType::f32) {
                  y32.upload(before.data(), n_out);
                } else {
                  std::vector<uint16_t> h(n_out);
                  for (size_t i = 0; i < n_out; ++i) h[i] = uint16_t(float_bits(before[i]) >> 16);
                  y16.upload(h.data(), n_out);
                }
              } else {
                y32.fill_bytes(0xFF);  // NaN: whatever is not written shows
                y16.fill_bytes(0xFF);
              }
              void* yp = out == OutType::f32 ? static_cast<void*>(y32.data()) : static_cast<void*>(y16.data());
              if (op == GOp::forward)
                grouped_gemm_forward(blas, ws, gc.sizes, N, K, dx16.data(), dw16.data(), yp, out, al, impl);
              else if (op == GOp::dgrad)
                grouped_gemm_dgrad(blas, ws, gc.sizes, N, K, ddy16.data(), dw16.data(), yp, out, al, impl);
              else
                grouped_gemm_wgrad(blas, ws, gc.sizes, N, K, ddy16.data(), dx16.data(), yp, out, accumulate, al, impl);
              check(cudaDeviceSynchronize(), "grouped gemm");
              std::vector<float> got(n_out);
              if (out == OutType::f32) {
                got = y32.download();
              } else {
                const std::vector<uint16_t> h = y16.download();
                for (size_t i = 0; i < n_out; ++i) got[i] = bf16_to_float(h[i]);
              }
              // Empty groups of wgrad: +0 exactly, or untouched when accumulating.
              int64_t bad = 0, bad_empty = 0;
              double worst = 0;
              for (size_t i = 0; i < n_out; ++i) {
                if (op == GOp::wgrad && gc.sizes[i / size_t(N * K)] == 0) {
                  const uint32_t want = accumulate ? float_bits(before[i]) : 0u;
                  if (float_bits(got[i]) != want) ++bad_empty;
                  continue;
                }
                const double want = ref.val[i] + (accumulate ? double(before[i]) : 0.0);
                const double mag = ref.mag[i] + (accumulate ? std::fabs(double(before[i])) : 0.0);
                // FP32 accumulation of exact products (k <= 130 terms), then the
                // output's rounding (BF16: half an ulp, 2^-9 relative). cuBLAS's
                // BF16 epilogue with beta = 1 rounds more than once (seen on an
                // H100: |err| up to 0.7% of |alpha acc| + |C|, in both forms):
                // 2^-6 of the magnitudes there.
                double tol = 1e-5 * mag + 1e-30;
                if (out == OutType::bf16) tol += std::ldexp(std::fabs(want), -8) + (accumulate ? std::ldexp(mag, -6) : 0.0);
                const double err = std::fabs(double(got[i]) - want);
                if (!(err <= tol)) ++bad;
                if (mag > 0) worst = std::max(worst, err / mag);
              }
              if (bad || bad_empty) {
                ++failures;
                std::printf("  grouped %s case %zu, %s, %s out, %s alpha%s: %lld beyond tolerance, %lld wrong in "
                            "empty groups (worst |err|/mag %g)\n",
                            op_name(op), ci, impl == GroupedImpl::one_call ? "one call" : "loop",
                            out == OutType::f32 ? "f32" : "bf16", with_alpha ? "per-group" : "unit",
                            accumulate ? ", accumulate" : "", (long long)bad, (long long)bad_empty, worst);
              }
            }
          }
        }
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("cuda grouped gemm: one call and the loop agree, f32 output") {
  const std::vector<int64_t> sizes{7, 0, 40, 1, 0, 23};
  const int64_t E = int64_t(sizes.size()), N = 56, K = 72, M = 71;
  const std::vector<float> x = bf16_values(M, K, 15), w = bf16_values(E * N, K, 16);
  DeviceBuffer<uint16_t> dx = upload_bf16(x), dw = upload_bf16(w);
  const std::vector<float> alpha{0.5f, 3.0f, 0.0123f, 1.0f, 2.0f, 0.75f};
  Blas blas;
  GroupedGemmWorkspace ws;
  DeviceBuffer<float> a(size_t(M * N)), b(size_t(M * N));
  // Twice: the second call reuses the uploaded pointer arrays.
  for (int rep = 0; rep < 2; ++rep) {
    a.fill_bytes(0xFF);
    b.fill_bytes(0xFF);
    grouped_gemm_forward(blas, ws, sizes, N, K, dx.data(), dw.data(), a.data(), OutType::f32, alpha,
                         GroupedImpl::one_call);
    grouped_gemm_forward(blas, ws, sizes, N, K, dx.data(), dw.data(), b.data(), OutType::f32, alpha,
                         GroupedImpl::loop);
    check(cudaDeviceSynchronize(), "grouped gemm");
    const Ref ref = reference(GOp::forward, sizes, N, K, x, {}, w, alpha);
    const std::vector<float> ga = a.download(), gb = b.download();
    int64_t bad = 0;
    for (size_t i = 0; i < ga.size(); ++i)
      if (!(std::fabs(double(ga[i]) - double(gb[i])) <= 2e-5 * ref.mag[i] + 1e-30)) ++bad;
    CHECK_MESSAGE(bad == 0, bad << " elements of one call and loop differ beyond the accumulation bound");
  }
}

TEST_CASE("cuda grouped gemm: device alphas written by the grouped quantization, read by the loop on the device") {
  // x's quantization (both launch forms) writes alpha_g = g_dec(x_g) * g_dec(W_g)
  // for the non-empty groups, and the loop reading it in device pointer mode
  // gives the bits of the loop with the same alphas from the host.
  const std::vector<int64_t> sizes{9, 0, 33, 1, 16};
  const int64_t E = int64_t(sizes.size()), N = 40, K = 48;
  int64_t M = 0;
  for (int64_t m : sizes) M += m;
  const std::vector<float> x = grouped_data(sizes, K, 5, true), w = test::varied_randn(E * N, K, 6, 4);
  const std::vector<int64_t> wsizes(size_t(E), N);
  const QuantizerSpec qx = quantizer_by_name("nvfp4"), qw = quantizer_by_name("nvfp4_2d");
  DeviceBuffer<float> dw;
  dw.upload(w);
  DeviceBuffer<uint16_t> dx = upload_bf16(x);
  DeviceBuffer<uint16_t> xop(static_cast<size_t>(M * K)), wop(static_cast<size_t>(E * N * K));
  DeviceBuffer<float> gx(static_cast<size_t>(E)), gw(static_cast<size_t>(E)), alpha(static_cast<size_t>(E));
  GroupedQuantWorkspace qws;
  Blas blas;
  GroupedGemmWorkspace ws;
  for (GroupedLaunch launch : {GroupedLaunch::per_group, GroupedLaunch::one_launch}) {
    alpha.fill_bytes(0xA5);
    GroupedQuantOutputs ow, ox;
    ow.dequant_bf16 = wop.data();
    ow.bf16_gemm_operand = true;
    ow.global_decode = gw.data();
    quantize_grouped_device(qw, dw.data(), InputType::f32, E * N, K, wsizes, {}, ow, qws, nullptr,
                            QuantPath::automatic, launch);
    ox.dequant_bf16 = xop.data();
    ox.bf16_gemm_operand = true;
    ox.global_decode = gx.data();
    ox.gemm_alpha = alpha.data();
    ox.gemm_alpha_other = gw.data();
    quantize_grouped_device(qx, dx.data(), InputType::bf16, M, K, sizes, {}, ox, qws, nullptr, QuantPath::automatic,
                            launch);
    const std::vector<float> want = grouped_alpha_host(gx.data(), gw.data(), size_t(E));
    const std::vector<float> got = alpha.download();
    for (int64_t g = 0; g < E; ++g)
      if (sizes[size_t(g)] > 0) CHECK(float_bits(got[size_t(g)]) == float_bits(want[size_t(g)]));
    std::vector<float> host_alpha = want;
    for (int64_t g = 0; g < E; ++g)
      if (sizes[size_t(g)] == 0) host_alpha[size_t(g)] = got[size_t(g)];  // never used: no rows
    for (OutType out : {OutType::f32, OutType::bf16}) {
      const size_t bytes = size_t(M * N) * (out == OutType::f32 ? 4 : 2);
      DeviceBuffer<uint8_t> a(bytes), b(bytes);
      a.fill_bytes(0x7F);
      b.fill_bytes(0x7F);
      grouped_gemm_forward(blas, ws, sizes, N, K, xop.data(), wop.data(), a.data(), out, host_alpha,
                           GroupedImpl::loop);
      grouped_gemm_forward(blas, ws, sizes, N, K, xop.data(), wop.data(), b.data(), out, {}, GroupedImpl::loop,
                           alpha.data());
      check(cudaDeviceSynchronize(), "grouped gemm");
      CHECK(a.download() == b.download());
    }
  }
  // Device alphas go with the loop only, and not with host alphas.
  const std::vector<float> one(size_t(E), 1.0f);
  DeviceBuffer<float> y(size_t(M * N));
  CHECK_THROWS_WITH_AS(grouped_gemm_forward(blas, ws, sizes, N, K, xop.data(), wop.data(), y.data(), OutType::f32, {},
                                            GroupedImpl::one_call, alpha.data()),
                       doctest::Contains("device alphas need the loop form"), Error);
  CHECK_THROWS_WITH_AS(grouped_gemm_forward(blas, ws, sizes, N, K, xop.data(), wop.data(), y.data(), OutType::f32, one,
                                            GroupedImpl::loop, alpha.data()),
                       doctest::Contains("not both"), Error);
}

TEST_CASE("cuda grouped gemm: NVFP4 grouped quantize + grouped GEMM equal sim per expert up to accumulation order") {
  // x: tokens by expert, nvfp4 [1,16] per group; W [E, N, K]: nvfp4_2d [16,16]
  // per expert; forward y_g = alpha_g dq(x_g) dq(W_g)^T with alpha_g the
  // product of the two groups' g_dec. wgrad: dy and x with [16,1] blocks down
  // each group's tokens (nvfp4_col, SR on dy).
  const std::vector<int64_t> sizes{19, 0, 1, 64, 37, 0, 16};
  const int64_t E = int64_t(sizes.size()), N = 48, K = 64;
  int64_t M = 0;
  for (int64_t m : sizes) M += m;
  const std::vector<float> x = grouped_data(sizes, K, 21, false), dy = grouped_data(sizes, N, 22, false);
  const std::vector<float> w = test::varied_randn(E * N, K, 23, 4);
  const std::vector<int64_t> wsizes(size_t(E), N);
  const QuantizerSpec qx = quantizer_by_name("nvfp4"), qw = quantizer_by_name("nvfp4_2d");
  QuantizerSpec qcol = quantizer_by_name("nvfp4_col"), qcol_sr = qcol;
  qcol_sr.round = Round::rs;
  const std::vector<RandomStream> dy_streams = consecutive_streams(7, 100, sizes.size());
  // sim: each group alone.
  const GroupedQuantizedTensor cx = quantize_grouped(qx, MatrixView<const float>(x.data(), M, K), sizes);
  const GroupedQuantizedTensor cw = quantize_grouped(qw, MatrixView<const float>(w.data(), E * N, K), wsizes);
  const GroupedQuantizedTensor cxc = quantize_grouped(qcol, MatrixView<const float>(x.data(), M, K), sizes);
  const GroupedQuantizedTensor cdy =
      quantize_grouped(qcol_sr, MatrixView<const float>(dy.data(), M, N), sizes, dy_streams);
  // GPU: grouped quantization to the exact BF16 operands and g_dec per group.
  DeviceBuffer<float> dxf, dwf, ddyf;
  dxf.upload(x);
  dwf.upload(w);
  ddyf.upload(dy);
  struct Q {
    DeviceBuffer<uint16_t> op;
    DeviceBuffer<float> gdec;
  };
  GroupedQuantWorkspace qws;
  auto run_q = [&](Q& q, const QuantizerSpec& spec, const float* src, int64_t rows, int64_t cols,
                   const std::vector<int64_t>& sz, std::span<const RandomStream> st) {
    q.op.resize(size_t(rows * cols));
    q.gdec.resize(sz.size());
    GroupedQuantOutputs o;
    o.dequant_bf16 = q.op.data();
    o.bf16_gemm_operand = true;
    o.global_decode = q.gdec.data();
    quantize_grouped_device(spec, src, InputType::f32, rows, cols, sz, st, o, qws);
  };
  Q gx, gw, gxc, gdy;
  run_q(gx, qx, dxf.data(), M, K, sizes, {});
  run_q(gw, qw, dwf.data(), E * N, K, wsizes, {});
  run_q(gxc, qcol, dxf.data(), M, K, sizes, {});
  run_q(gdy, qcol_sr, ddyf.data(), M, N, sizes, dy_streams);
  const std::vector<float> alpha_f = grouped_alpha_host(gx.gdec.data(), gw.gdec.data(), size_t(E));
  const std::vector<float> alpha_w = grouped_alpha_host(gdy.gdec.data(), gxc.gdec.data(), size_t(E));
  for (int64_t g = 0; g < E; ++g) {
    CHECK(float_bits(alpha_f[size_t(g)]) == float_bits(cx.global_decode[size_t(g)] * cw.global_decode[size_t(g)]));
    CHECK(float_bits(alpha_w[size_t(g)]) == float_bits(cdy.global_decode[size_t(g)] * cxc.global_decode[size_t(g)]));
  }
  Blas blas;
  GroupedGemmWorkspace ws;
  DeviceBuffer<float> y(size_t(M * N)), dwt(size_t(E * N * K));
  // The references: sim's dequantized operands (g_dec included) in float64.
  const Ref rf = reference(GOp::forward, sizes, N, K, cx.dequant, {}, cw.dequant, {});
  const Ref rw = reference(GOp::wgrad, sizes, N, K, cxc.dequant, cdy.dequant, std::vector<float>(size_t(E * N * K)), {});
  for (GroupedImpl impl : {GroupedImpl::one_call, GroupedImpl::loop}) {
    y.fill_bytes(0xFF);
    dwt.fill_bytes(0xFF);
    grouped_gemm_forward(blas, ws, sizes, N, K, gx.op.data(), gw.op.data(), y.data(), OutType::f32, alpha_f, impl);
    grouped_gemm_wgrad(blas, ws, sizes, N, K, gdy.op.data(), gxc.op.data(), dwt.data(), OutType::f32, false, alpha_w,
                       impl);
    check(cudaDeviceSynchronize(), "grouped NVFP4");
    auto count_bad = [](const std::vector<float>& got, const Ref& r) {
      int64_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(double(got[i]) - r.val[i]) <= 1e-5 * r.mag[i] + 1e-30)) ++bad;
      return bad;
    };
    const std::string name = impl == GroupedImpl::one_call ? "one call" : "loop";
    CHECK_MESSAGE(count_bad(y.download(), rf) == 0, "forward, " << name);
    CHECK_MESSAGE(count_bad(dwt.download(), rw) == 0, "wgrad, " << name);
  }
}

TEST_CASE("cuda grouped gemm: argument errors") {
  Blas blas;
  GroupedGemmWorkspace ws;
  const std::vector<int64_t> sizes{2, 3};
  const std::vector<float> three{1.0f, 2.0f, 3.0f};
  CHECK_THROWS_WITH_AS(grouped_gemm_forward(blas, ws, sizes, 16, 16, nullptr, nullptr, nullptr, OutType::f32, three),
                       doctest::Contains("3 alphas for 2 groups"), Error);
  const std::vector<int64_t> negative{2, -3};
  CHECK_THROWS_WITH_AS(grouped_gemm_dgrad(blas, ws, negative, 16, 16, nullptr, nullptr, nullptr, OutType::f32),
                       doctest::Contains("sizes must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(grouped_gemm_wgrad(blas, ws, sizes, 0, 16, nullptr, nullptr, nullptr, OutType::f32, false),
                       doctest::Contains("n and k must be positive"), Error);
}
