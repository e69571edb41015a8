// GPU quantization kernels (cuda/quantize.hpp) against sim's quantize(), bit for
// bit: every canned quantizer, every rounding mode and overflow policy, every
// block shape and scale rule, both kernel paths, RHT, SR (both random-bit
// contracts, core/sr.hpp), bf16 inputs, packed and bf16 outputs, sizes that
// are not multiples of the block, input and output pointers aligned only to
// their element type.
#include <doctest/doctest.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "core/philox.hpp"
#include "core/sr.hpp"
#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/packing.hpp"
#include "sim/block_rules.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;
using fp4lab::test::same_quantized;

using test::check_case;
using test::paths_for;
using test::Size;

namespace {

constexpr Round kRounds[] = {Round::rn, Round::rna, Round::rz, Round::rp, Round::rm, Round::rs};

}  // namespace

TEST_CASE("cuda quantize: every canned quantizer x rounding x overflow, both paths, bit-exact") {
  const Size sizes[] = {{37, 53}, {64, 96}, {1, 1}, {5, 200}};
  int cases = 0, failures = 0;
  for (const std::string& name : quantizer_names()) {
    for (Round r : kRounds) {
      for (Overflow o : {Overflow::saturate, Overflow::nonsaturate}) {
        QuantizerSpec q = quantizer_by_name(name);
        // fp4-trainkit's quantizers have its two roundings and saturation only (schemes/fp4tk/test_fp4tk_cuda.cpp).
        if (q.emulate == Emulation::fp4tk && ((r != Round::rn && r != Round::rs) || o != Overflow::saturate)) continue;
        // TE's NVFP4 options: 4/6 takes rn only, row_amax no rs (schemes/te_nvfp4/test_te_nvfp4_cuda.cpp).
        if (block_rule_id(q) == BlockRuleId::te_nvfp4 && (r == Round::rs || (q.scale_select == ScaleSelect::four_over_six && r != Round::rn)))
          continue;
        q.round = r;
        q.overflow = o;
        for (size_t si = 0; si < std::size(sizes); ++si) {
          const Size s = sizes[si];
          const auto x = test::varied_randn(s.rows, s.cols, uint32_t(100 + si + 7 * int(r)));
          for (QuantPath p : paths_for(q)) {
            ++cases;
            if (!check_case(q, x, s, RandomStream{42, 9}, p)) ++failures;
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: every block shape x scale rule x element, partial blocks") {
  struct Rule {
    ScaleRule rule;
    const Format* scale;
    GlobalScale global;
  };
  const Rule rules[] = {{ScaleRule::ocp, &float8_e8m0fnu, GlobalScale::none},
                        {ScaleRule::ceil, &float8_e8m0fnu, GlobalScale::none},
                        {ScaleRule::tetrajet, &float8_e8m0fnu, GlobalScale::none},
                        {ScaleRule::nv, &ufloat8_e4m3, GlobalScale::tensor_amax},
                        {ScaleRule::nv, &ufloat8_e4m3, GlobalScale::none},
                        {ScaleRule::nv, &float8_e4m3fn, GlobalScale::tensor_amax},
                        {ScaleRule::nv_noglobal, &ufloat8_e4m3, GlobalScale::none},
                        {ScaleRule::tensor_amax, &float32, GlobalScale::none}};
  const int shapes[][2] = {{1, 16}, {1, 32}, {16, 16}, {16, 1}, {32, 1}, {0, 0}, {4, 8}, {1, 7}, {3, 1}, {2, 64}};
  const Format* elems[] = {&float4_e2m1fn, &float6_e2m3fn,   &float6_e3m2fn,   &float8_e4m3fn,
                           &float8_e5m2,   &float8_e4m3fnuz, &float8_e5m2fnuz, &int8_mx};
  const Size sizes[] = {{37, 53}, {48, 64}};
  int cases = 0, failures = 0;
  for (const Rule& rl : rules) {
    for (const auto& sh : shapes) {
      for (size_t ei = 0; ei < std::size(elems); ++ei) {
        const Format* e = elems[ei];
        // Keep the case count moderate: all elements on the MX rules' canonical
        // shape, e2m1 / e4m3 / int8 elsewhere.
        const bool wide = (sh[0] == 1 && sh[1] == 32) || (sh[0] == 1 && sh[1] == 16);
        if (!wide && e != &float4_e2m1fn && e != &float8_e4m3fn && e != &int8_mx) continue;
        for (Round r : {Round::rn, Round::rs, Round::rm}) {
          QuantizerSpec q;
          q.element = e;
          q.scale = rl.scale;
          q.scale_rule = rl.rule;
          q.global_scale = rl.global;
          q.block_rows = sh[0];
          q.block_cols = sh[1];
          q.round = r;
          for (const Size& s : sizes) {
            const auto x = test::varied_randn(s.rows, s.cols, uint32_t(cases + 1), 30);
            for (QuantPath p : paths_for(q)) {
              ++cases;
              if (!check_case(q, x, s, RandomStream{7, uint64_t(cases)}, p)) ++failures;
            }
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: adversarial values (NaN, Inf, zero blocks, subnormals, ties, FLT_MAX)") {
  const char* names[] = {"nvfp4",      "nvfp4_2d", "nvfp4_col",  "mxfp4",          "mxfp8_e4m3",
                         "mxfp8_e5m2", "mxint8",   "mxfp6_e2m3", "fp8_e4m3_tensor"};
  std::vector<QuantizerSpec> specs;
  for (const char* n : names) specs.push_back(quantizer_by_name(n));
  // fp4_all_the_way's nv_noglobal blocks (x / scale: zero blocks divide by a
  // zero scale) along both axes, and tetrajet's MXFP4 column blocks.
  for (int axis = 0; axis < 2; ++axis) {
    QuantizerSpec q = quantizer_by_name("nvfp4");
    q.scale_rule = ScaleRule::nv_noglobal;
    q.global_scale = GlobalScale::none;
    q.block_rows = axis ? 16 : 1;
    q.block_cols = axis ? 1 : 16;
    specs.push_back(q);
  }
  {
    QuantizerSpec q = quantizer_by_name("mxfp4");
    q.scale_rule = ScaleRule::tetrajet;
    q.block_rows = 32;
    q.block_cols = 1;
    specs.push_back(q);
  }
  int failures = 0, cases = 0;
  for (bool nan_inf : {false, true}) {
    for (const QuantizerSpec& spec : specs) {
      for (Round r : kRounds) {
        for (Overflow o : {Overflow::saturate, Overflow::nonsaturate}) {
          QuantizerSpec q = spec;
          q.round = r;
          q.overflow = o;
          const Size s{45, 70};
          const auto x = test::adversarial(s.rows, s.cols, 5u + unsigned(r), nan_inf);
          for (QuantPath p : paths_for(q)) {
            ++cases;
            if (!check_case(q, x, s, RandomStream{3, 4}, p)) ++failures;
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: RHT fused with the quantization (wgrad operands), SR and RN") {
  int failures = 0;
  for (int axis = 0; axis < 2; ++axis) {
    for (Round r : {Round::rn, Round::rs}) {
      for (GlobalScale gs : {GlobalScale::tensor_amax, GlobalScale::none}) {
        for (uint64_t seed : {0ull, 12345ull}) {
          QuantizerSpec q = quantizer_by_name("nvfp4");
          q.block_rows = axis == 0 ? 1 : 16;
          q.block_cols = axis == 0 ? 16 : 1;
          q.rht = true;
          q.rht_seed = seed;
          q.round = r;
          q.global_scale = gs;
          // Rows axis: cols % 16 == 0, any rows; cols axis: rows % 16 == 0, any
          // cols (64 x 96: whole 4-column strips, the column kernels' FULL form);
          // 37 x 45, 20 x 3, 5 x 7: a partial last chunk along the RHT axis,
          // quantized untransformed as on the CPU.
          for (Size s : {axis == 0 ? Size{37, 80} : Size{48, 53}, Size{64, 96}, Size{37, 45}, Size{20, 3},
                         Size{5, 7}}) {
            // Random, adversarial (NaN / Inf blocks take the per-element encode),
            // and both as BF16 inputs.
            for (int data = 0; data < 4; ++data) {
              auto x = data % 2 ? test::adversarial(s.rows, s.cols, uint32_t(seed + 5), true)
                                : test::varied_randn(s.rows, s.cols, uint32_t(seed + 3), 10);
              const bool bf16 = data >= 2;
              if (bf16) test::round_to_bf16(x);
              if (!check_case(q, x, s, RandomStream{99, 1}, QuantPath::fused, bf16)) ++failures;
              if (!check_case(q, x, s, RandomStream{99, 1}, QuantPath::automatic, bf16)) ++failures;
            }
          }
        }
      }
    }
  }
  // Column blocks whose butterflies leave tiny outputs beside large ones
  // (cancellation; fl(h / 4) rounds in FP32's subnormal range), and whole
  // blocks scaled towards the FP32 floor or up (the fast rn form's blocks and
  // the per-element ones).
  {
    const Size s{64, 96};
    std::vector<float> x(size_t(s.rows * s.cols));
    std::mt19937 gen(2024);
    const float parts[] = {0.0f, 1.0f, 2.0f, 0x1p-130f, 0x3p-148f, 0x1.8p-126f, 1e-45f, 0x1p-125f, 1.0f, 1.0f};
    const float scales[] = {1.0f, 0x1p-85f, 0x1p-100f, 0x1p-118f, 0x1p60f, 0x1p-60f, 1.0f};
    for (int64_t c = 0; c < s.cols; ++c)
      for (int64_t b = 0; b < s.rows / 16; ++b) {
        const float sc = scales[size_t(c + 3 * b) % std::size(scales)];
        for (int64_t k = 0; k < 16; ++k) {
          const float v = parts[gen() % std::size(parts)] * sc;
          x[size_t((16 * b + k) * s.cols + c)] = (gen() & 1u) ? -v : v;
        }
      }
    for (Round r : {Round::rn, Round::rs})
      for (GlobalScale gs : {GlobalScale::tensor_amax, GlobalScale::none})
        for (bool bf16 : {false, true}) {
          QuantizerSpec q = quantizer_by_name("nvfp4");
          q.block_rows = 16;
          q.block_cols = 1;
          q.rht = true;
          q.rht_seed = 77;
          q.round = r;
          q.global_scale = gs;
          std::vector<float> xi = x;
          if (bf16) test::round_to_bf16(xi);
          if (!check_case(q, xi, s, RandomStream{7, 7}, QuantPath::fused, bf16)) ++failures;
        }
  }
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: bf16 input equals the f32 input of the same values") {
  int failures = 0;
  for (const char* n : {"nvfp4", "nvfp4_2d", "nvfp4_col", "mxfp4", "mxfp8_e4m3", "fp8_e5m2_tensor"}) {
    for (Round r : {Round::rn, Round::rs}) {
      QuantizerSpec q = quantizer_by_name(n);
      q.round = r;
      // Odd and even block counts per row, partial blocks, one block per row
      // (the fast rn kernel takes two [1,16] blocks per thread from BF16);
      // random and adversarial values (NaN/Inf blocks take the per-element path).
      for (Size s : {Size{37, 53}, Size{64, 128}, Size{9, 40}, Size{5, 16}}) {
        for (bool adversarial : {false, true}) {
          auto x =
              adversarial ? test::adversarial(s.rows, s.cols, 9u, true) : test::varied_randn(s.rows, s.cols, 77, 20);
          test::round_to_bf16(x);
          for (QuantPath p : paths_for(q))
            if (!check_case(q, x, s, RandomStream{5, 6}, p, true)) ++failures;
        }
      }
    }
  }
  CHECK(failures == 0);
}

namespace {

// quantize_device's packed FP4 codes (4-bit elements; else bytes) and BF16
// outputs on x [s] (f32, or its BF16 values as BF16 input when in16), path
// `path`, stream rs, against sim's quantize(q, x, rs): the packed codes
// against sim's packing of sim's codes, the BF16 dequantized tensor against
// CUDA's host converter of sim's FP32 dequant, and the BF16 GEMM operand (the
// value forms: the one output) against the same of decode(code) * scale.
void check_packed_bf16(const std::string& n, const QuantizerSpec& q, const std::vector<float>& x, Size s, bool in16,
                       bool adversarial, QuantPath path, RandomStream rs) {
  const int64_t nel = s.rows * s.cols;
  const QuantizedTensor cpu = quantize(q, MatrixView<const float>(x.data(), s.rows, s.cols), rs);
  DeviceBuffer<float> dx;
  DeviceBuffer<uint16_t> dx16;
  if (in16) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = uint16_t(float_bits(x[i]) >> 16);
    dx16.upload(h);
  } else {
    dx.upload(x);
  }
  const void* xin = in16 ? static_cast<const void*>(dx16.data()) : static_cast<const void*>(dx.data());
  const InputType it = in16 ? InputType::bf16 : InputType::f32;
  const bool packed = q.element->bits() == 4;
  const int64_t code_bytes = packed ? s.rows * ((s.cols + 1) / 2) : nel;
  DeviceBuffer<uint8_t> codes(static_cast<size_t>(code_bytes));
  DeviceBuffer<uint16_t> b16(static_cast<size_t>(nel)), op16(static_cast<size_t>(nel));
  codes.fill_bytes(0xEE);
  b16.fill_bytes(0xEE);
  op16.fill_bytes(0xEE);
  QuantWorkspace ws;
  QuantOutputs o;
  o.codes = codes.data();
  o.code_layout = packed ? CodeLayout::packed4 : CodeLayout::bytes;
  o.dequant_bf16 = b16.data();
  quantize_device(q, xin, it, s.rows, s.cols, rs, o, ws, nullptr, path);
  QuantOutputs o2;
  o2.dequant_bf16 = op16.data();
  o2.bf16_gemm_operand = true;
  quantize_device(q, xin, it, s.rows, s.cols, rs, o2, ws, nullptr, path);
  check(cudaDeviceSynchronize(), "test");
  // Packed codes: sim's packing of sim's codes.
  const std::vector<uint8_t> want = pack_codes(*q.element, cpu.codes.data(), s.rows, s.cols);
  CHECK(test::same_bytes("packed codes", codes.download(), want));
  // BF16 dequant: CUDA's own host converter (an independent oracle) of sim's FP32 dequant;
  // the GEMM operand: the same of decode(code) * scale without the global decode scale.
  const auto got = b16.download(), got_op = op16.download();
  int bad = 0, bad_op = 0;
  for (int64_t i = 0; i < nel; ++i) {
    const __nv_bfloat16 w = __float2bfloat16_rn(cpu.dequant[size_t(i)]);
    uint16_t wb;
    std::memcpy(&wb, &w, 2);
    const bool nan = std::isnan(cpu.dequant[size_t(i)]);
    if (!(nan ? (got[size_t(i)] & 0x7FFF) > 0x7F80 : got[size_t(i)] == wb)) ++bad;
    const int64_t r = i / s.cols, c = i % s.cols;
    const int64_t br = q.block_rows ? q.block_rows : s.rows, bc = q.block_cols ? q.block_cols : s.cols;
    const float sc = cpu.scales[size_t((r / br) * cpu.scale_cols + c / bc)];
    const float v = decode(*q.element, cpu.codes[size_t(i)]) * sc;
    const __nv_bfloat16 w2 = __float2bfloat16_rn(v);
    uint16_t wb2;
    std::memcpy(&wb2, &w2, 2);
    if (!(std::isnan(v) ? (got_op[size_t(i)] & 0x7FFF) > 0x7F80 : got_op[size_t(i)] == wb2)) ++bad_op;
    // The GEMM operand is exact (no rounding) for these quantizers and
    // data (FP8 values times an E8M0 scale may fall below BF16's
    // subnormal quantum on the adversarial data: rounded, as checked above).
    if (!std::isnan(v) && float(w2) != v && (!adversarial || packed)) ++bad_op;
  }
  const char* pn = path == QuantPath::fused ? "fused" : path == QuantPath::generic ? "generic" : "auto";
  CHECK_MESSAGE(bad == 0, n << " " << s.rows << "x" << s.cols << (adversarial ? " adversarial" : " random")
                            << (in16 ? " bf16" : " f32") << " " << pn);
  CHECK_MESSAGE(bad_op == 0, n << " " << s.rows << "x" << s.cols << (adversarial ? " adversarial" : " random")
                               << (in16 ? " bf16" : " f32") << " " << pn);
}

}  // namespace

TEST_CASE("cuda quantize: packed FP4 codes and BF16 outputs, from FP32 and BF16 input") {
  std::vector<std::pair<std::string, QuantizerSpec>> specs;
  for (const char* n : {"nvfp4", "mxfp4", "nvfp4_2d", "nvfp4_col", "mxfp8_e4m3", "mxfp8_e5m2"})
    specs.emplace_back(n, quantizer_by_name(n));
  // The MX recipes' wgrad operands: column blocks, MXFP4 RN and SR, MXFP8 RN.
  for (const char* n : {"mxfp4", "mxfp8_e4m3", "mxfp8_e5m2"})
    for (Round r : {Round::rn, Round::rs}) {
      QuantizerSpec q = quantizer_by_name(n);
      q.block_rows = 32;
      q.block_cols = 1;
      q.round = r;
      specs.emplace_back(std::string(n) + (r == Round::rn ? " [32,1]" : " [32,1] rs"), q);
    }
  // fp4_all_the_way's nv_noglobal blocks (x / scale) along both axes, RN and SR.
  for (int axis = 0; axis < 2; ++axis)
    for (Round r : {Round::rn, Round::rs}) {
      QuantizerSpec q = quantizer_by_name("nvfp4");
      q.scale_rule = ScaleRule::nv_noglobal;
      q.global_scale = GlobalScale::none;
      q.block_rows = axis ? 16 : 1;
      q.block_cols = axis ? 1 : 16;
      q.round = r;
      specs.emplace_back(std::string("nv_noglobal ") + (axis ? "[16,1]" : "[1,16]") + (r == Round::rn ? "" : " rs"), q);
    }
  // The wgrad operand with its RHT down the columns, RN and SR.
  for (Round r : {Round::rn, Round::rs}) {
    QuantizerSpec q = quantizer_by_name("nvfp4");
    q.block_rows = 16;
    q.block_cols = 1;
    q.rht = true;
    q.round = r;
    specs.emplace_back(r == Round::rn ? "nvfp4 rht [16,1]" : "nvfp4 rht [16,1] rs", q);
  }
  for (const auto& [n, q] : specs) {
    // 96 x 70: whole [32,1] strips, 105 of them: the split value form's last warp part full.
    for (Size s : {Size{37, 53}, Size{64, 128}, Size{3, 1}, Size{64, 64}, Size{96, 70}}) {
      for (int data = 0; data < 4; ++data) {
        // Data 1, 3: NaN, Inf, zero blocks, subnormals, ties (the 64 x 64 case
        // has whole 32-row blocks and 4-column strips, the value forms' kernels).
        // Data 2, 3: the same values rounded to BF16 and fed as BF16 input.
        const bool in16 = data >= 2;
        for (QuantPath path : paths_for(q)) {
          auto x = data % 2 ? test::adversarial(s.rows, s.cols, 13, true) : test::varied_randn(s.rows, s.cols, 11, 12);
          if (in16) test::round_to_bf16(x);
          check_packed_bf16(n, q, x, s, in16, data % 2 == 1, path, {});
        }
      }
    }
  }
}

TEST_CASE("cuda quantize: one workspace for many NVFP4 tensors (the amax pass re-arms its global scale)") {
  // The fused path's amax pass leaves the global scale to its grid's last block
  // and resets a counter in the workspace: a stale counter or scale shows up
  // as a wrong global decode scale or wrong codes in a later call.
  QuantWorkspace ws;
  const QuantizerSpec row = quantizer_by_name("nvfp4");
  QuantizerSpec col = row, col_rht = row;
  col.block_rows = 16;
  col.block_cols = 1;
  col_rht = col;
  col_rht.rht = true;
  col_rht.rht_seed = 3;
  col_rht.round = Round::rs;
  // 16x16 tiles: amax and quantization in one cooperative kernel where its
  // grid fits on the GPU at once, else two passes (2048 x 2304: more blocks
  // than an H100 holds); the sizes alternate between the two.
  const QuantizerSpec tile = quantizer_by_name("nvfp4_2d");
  int k = 0;
  for (int rep = 0; rep < 2; ++rep) {
    const QuantizerSpec* specs[] = {&row, &col, &col_rht, &tile};
    for (const QuantizerSpec* q : specs) {
      for (Size s : {Size{512, 768}, Size{16, 48}, Size{2048, 2304}, Size{1024, 1040}, Size{32, 16}, Size{48, 56}}) {
        ++k;
        auto x = test::varied_randn(s.rows, s.cols, 40u + uint32_t(k), 20);
        const float mag = std::ldexp(1.0f, (k * 7) % 23 - 11);  // a different amax every call
        for (float& v : x) v *= mag;
        const int64_t n = s.rows * s.cols;
        const RandomStream rs{9, uint64_t(k)};
        const QuantizedTensor cpu = quantize(*q, MatrixView<const float>(x.data(), s.rows, s.cols), rs);
        DeviceBuffer<float> dx, g(1);
        dx.upload(x);
        DeviceBuffer<uint8_t> codes(static_cast<size_t>(n));
        // The GEMM alpha written with g_dec: g_dec times another operand's
        // (odd calls) or g_dec alone.
        const float other_g = std::ldexp(1.0f, -(k % 9)) * (1.0f + float(k) / 64.0f);
        DeviceBuffer<float> alpha(1), other(1);
        other.upload(std::vector<float>{other_g});
        DeviceBuffer<uint8_t> scodes(cpu.scale_codes.size());
        QuantOutputs o;
        o.codes = codes.data();
        o.scale_codes = scodes.data();
        o.global_decode = g.data();
        o.gemm_alpha = alpha.data();
        o.gemm_alpha_other = k % 2 ? other.data() : nullptr;
        quantize_device(*q, dx.data(), InputType::f32, s.rows, s.cols, rs, o, ws, nullptr, QuantPath::fused);
        check(cudaDeviceSynchronize(), "test");
        CAPTURE(describe(*q));
        CAPTURE(s.rows);
        CAPTURE(s.cols);
        CHECK(float_bits(g.download()[0]) == float_bits(cpu.global_decode));
        CHECK(test::same_float(alpha.download()[0], k % 2 ? cpu.global_decode * other_g : cpu.global_decode));
        CHECK(test::same_bytes("codes", codes.download(), cpu.codes));
        CHECK(test::same_bytes("scale codes", scodes.download(), cpu.scale_codes));
      }
    }
  }
}

namespace {

// quantize_dual_device's outputs for one operand, downloaded as a QuantizedTensor.
struct DualOut {
  DeviceBuffer<uint8_t> codes, scodes;
  DeviceBuffer<float> scales, dq, g;
  DeviceBuffer<uint16_t> op16;
  DualOut(const QuantizerSpec& q, int64_t rows, int64_t cols)
      : codes(size_t(rows * cols)),
        scodes(size_t(rows * cols / 16)),
        scales(size_t(rows * cols / 16)),
        dq(size_t(rows * cols)),
        g(1),
        op16(size_t(rows * cols)) {
    (void)q;
    codes.fill_bytes(0xA5);
    scodes.fill_bytes(0xA5);
    scales.fill_bytes(0xA5);
    dq.fill_bytes(0xA5);
    g.fill_bytes(0xA5);
  }
  QuantOutputs outputs() {
    QuantOutputs o;
    o.codes = codes.data();
    o.scale_codes = scodes.data();
    o.scales = scales.data();
    o.dequant = dq.data();
    o.global_decode = g.data();
    return o;
  }
  QuantizedTensor get(const QuantizerSpec& q, int64_t rows, int64_t cols) const {
    QuantizedTensor t;
    t.spec = q;
    t.rows = rows;
    t.cols = cols;
    scale_grid(q, rows, cols, t.scale_rows, t.scale_cols);
    t.codes = codes.download();
    t.scale_codes = scodes.download();
    t.scales = scales.download();
    t.dequant = dq.download();
    t.global_decode = g.download()[0];
    return t;
  }
};

}  // namespace

namespace {
// The BF16 GEMM operand of a quantized tensor (E2M1 x UE4M3 is exact in BF16:
// the top half of the float), from sim's codes and decoded block scales.
std::vector<uint16_t> operand_bits(const QuantizedTensor& q) {
  std::vector<uint16_t> h(size_t(q.rows * q.cols));
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c) {
      const float scale = q.scales[size_t((r / q.spec.block_rows) * q.scale_cols + c / q.spec.block_cols)];
      const float d = decode(*q.spec.element, q.codes[size_t(r * q.cols + c)]) * scale;
      h[size_t(r * q.cols + c)] = uint16_t(float_bits(d) >> 16);
    }
  return h;
}
// Elements whose BF16 bits differ, NaNs of any payload counted equal (the GPU
// makes the canonical NaN, the CPU propagates its operand's).
int64_t operand_mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  if (got.size() != want.size()) return -1;
  auto nan = [](uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu) != 0; };
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i] && !(nan(got[i]) && nan(want[i]));
  return bad;
}
// quantize_dual_device(qr, qc) of x [s] (its values as BF16 input when bf16)
// with streams rsr, rsc: every output against sim's quantize() of each; then
// the trainer's form (BF16 GEMM operands, with the GEMM alphas) against
// quantize_device's and against sim's codes and scales.
void check_dual(const QuantizerSpec& qr, const QuantizerSpec& qc, const std::vector<float>& x, Size s, bool bf16,
                RandomStream rsr, RandomStream rsc, QuantWorkspace& ws) {
  const MatrixView<const float> view(x.data(), s.rows, s.cols);
  const QuantizedTensor cr = quantize(qr, view, rsr), cc = quantize(qc, view, rsc);
  DeviceBuffer<float> d32;
  DeviceBuffer<uint16_t> d16;
  const void* dx;
  if (bf16) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(float_bits(x[i]) >> 16);
    d16.upload(h);
    dx = d16.data();
  } else {
    d32.upload(x);
    dx = d32.data();
  }
  DualOut orow(qr, s.rows, s.cols), ocol(qc, s.rows, s.cols);
  quantize_dual_device(qr, rsr, orow.outputs(), qc, rsc, ocol.outputs(), dx,
                       bf16 ? InputType::bf16 : InputType::f32, s.rows, s.cols, ws);
  check(cudaDeviceSynchronize(), "test");
  CAPTURE(s.rows);
  CAPTURE(s.cols);
  CAPTURE(describe(qr));
  CAPTURE(describe(qc));
  CAPTURE(bf16);
  CHECK(test::same_quantized(orow.get(qr, s.rows, s.cols), cr, x));
  CHECK(test::same_quantized(ocol.get(qc, s.rows, s.cols), cc, x));
  // The trainer's form: BF16 GEMM operands, against quantize_device's.
  QuantOutputs a, b, ea, eb;
  a.dequant_bf16 = orow.op16.data();
  b.dequant_bf16 = ocol.op16.data();
  a.bf16_gemm_operand = b.bf16_gemm_operand = true;
  // With the GEMM alphas (the trainer's backward): a's times another
  // operand's g_dec, b's alone.
  DeviceBuffer<float> alphas(2), other(1);
  other.upload(std::vector<float>{0.3f});
  a.gemm_alpha = alphas.data();
  a.gemm_alpha_other = other.data();
  b.gemm_alpha = alphas.data() + 1;
  DeviceBuffer<uint16_t> want_r(size_t(s.rows * s.cols)), want_c(size_t(s.rows * s.cols));
  ea.dequant_bf16 = want_r.data();
  eb.dequant_bf16 = want_c.data();
  ea.bf16_gemm_operand = eb.bf16_gemm_operand = true;
  quantize_dual_device(qr, rsr, a, qc, rsc, b, dx, bf16 ? InputType::bf16 : InputType::f32, s.rows, s.cols,
                       ws);
  QuantWorkspace ws2;
  quantize_device(qr, dx, bf16 ? InputType::bf16 : InputType::f32, s.rows, s.cols, rsr, ea, ws2);
  quantize_device(qc, dx, bf16 ? InputType::bf16 : InputType::f32, s.rows, s.cols, rsc, eb, ws2);
  check(cudaDeviceSynchronize(), "test");
  CHECK(orow.op16.download() == want_r.download());
  CHECK(ocol.op16.download() == want_c.download());
  {
    const std::vector<float> al = alphas.download();
    // NaN (an input with a NaN) of any payload.
    CHECK(test::same_float(al[0], cr.global_decode * 0.3f));
    CHECK(test::same_float(al[1], cc.global_decode));
  }
  // And against the CPU's codes and scales: BF16(decode(code) * block scale).
  CHECK(operand_mismatches(orow.op16.download(), operand_bits(cr)) == 0);
  CHECK(operand_mismatches(ocol.op16.download(), operand_bits(cc)) == 0);
}

}  // namespace

TEST_CASE("cuda quantize: quantize_dual_device equals the two quantizations bit for bit") {
  const QuantizerSpec nv = quantizer_by_name("nvfp4");
  QuantWorkspace ws;
  int k = 0;
  for (Size s : {Size{16, 16}, Size{48, 32}, Size{256, 1152}, Size{1040, 400}}) {
    for (bool rht : {false, true}) {
      for (Round rr : {Round::rn, Round::rs}) {
        for (Round rc : {Round::rn, Round::rs}) {
          for (bool global : {true, false}) {
            ++k;
            QuantizerSpec qr = nv, qc = nv;
            qr.round = rr;
            qc.round = rc;
            qc.block_rows = 16;
            qc.block_cols = 1;
            qc.rht = rht;
            qc.rht_seed = 5 + uint64_t(k);
            if (!global) qr.global_scale = qc.global_scale = GlobalScale::none;
            REQUIRE(dual_supported(qr, qc, s.rows, s.cols));
            const bool bf16 = (k % 3) == 0;
            // Every fifth case adversarial (NaN, Inf, zero blocks, ...; each mode pair and
            // input type among them): the trainer forms' per-group NaN path too.
            auto x = k % 5 == 1 ? test::adversarial(s.rows, s.cols, 700u + uint32_t(k), true)
                                : test::varied_randn(s.rows, s.cols, 700u + uint32_t(k), 20);
            if (bf16)
              for (float& v : x) v = bits_float(float_bits(v) & 0xFFFF0000u);
            const RandomStream rsr{11, uint64_t(2 * k)}, rsc{11, uint64_t(2 * k + 1)};
            check_dual(qr, qc, x, s, bf16, rsr, rsc, ws);
          }
        }
      }
    }
  }
  // What it refuses.
  QuantizerSpec qc = nv;
  qc.block_rows = 16;
  qc.block_cols = 1;
  CHECK_FALSE(dual_supported(nv, qc, 32, 24));
  CHECK_FALSE(dual_supported(nv, quantizer_by_name("mxfp4"), 32, 32));
  CHECK_FALSE(dual_supported(qc, nv, 32, 32));
  DeviceBuffer<float> d(32 * 24);
  CHECK_THROWS_WITH_AS(quantize_dual_device(nv, {}, {}, qc, {}, {}, d.data(), InputType::f32, 32, 24, ws),
                       doctest::Contains("multiples of 16"), Error);
}

// The amax pass ahead of the dual quantization is persistent over 16-row
// strips (a grid of what fits on the GPU at once): tensors with more strips
// than resident threads (several strips a thread, the next one's loads in
// flight), and a BF16 input whose base is not 4-byte aligned (its words loaded
// as halves). The global scales follow from both amaxes (the column
// operand's of its RHT output), so the outputs show any difference.
TEST_CASE("cuda quantize: quantize_dual_device's amax pass on large and unaligned inputs") {
  const QuantizerSpec nv = quantizer_by_name("nvfp4");
  QuantizerSpec qr = nv, qc = nv;
  qc.round = Round::rs;
  qc.block_rows = 16;
  qc.block_cols = 1;
  qc.rht = true;
  qc.rht_seed = 77;
  QuantWorkspace ws;
  struct Case {
    int64_t rows, cols;
    bool bf16;
    int offset;  // elements between the buffer's start and the tensor's
  };
  int k = 0;
  for (const Case& c :
       {Case{4096, 1152, false, 0}, Case{4096, 2304, true, 0}, Case{256, 1152, true, 1}, Case{64, 48, true, 3}}) {
    ++k;
    auto x = k == 4 ? test::adversarial(c.rows, c.cols, 900u, true) : test::varied_randn(c.rows, c.cols, 900u + k, 20);
    if (c.bf16)
      for (float& v : x) v = bits_float(float_bits(v) & 0xFFFF0000u);
    const RandomStream rsr{3, uint64_t(k)}, rsc{4, uint64_t(k)};
    const MatrixView<const float> view(x.data(), c.rows, c.cols);
    const QuantizedTensor cr = quantize(qr, view, rsr), cc = quantize(qc, view, rsc);
    DeviceBuffer<float> d32;
    DeviceBuffer<uint16_t> d16;
    const void* dx;
    if (c.bf16) {
      std::vector<uint16_t> h(x.size() + size_t(c.offset));
      for (size_t i = 0; i < x.size(); ++i) h[i + size_t(c.offset)] = uint16_t(float_bits(x[i]) >> 16);
      d16.upload(h);
      dx = d16.data() + c.offset;
    } else {
      std::vector<float> h(x.size() + size_t(c.offset));
      std::copy(x.begin(), x.end(), h.begin() + c.offset);
      d32.upload(h);
      dx = d32.data() + c.offset;
    }
    DualOut orow(qr, c.rows, c.cols), ocol(qc, c.rows, c.cols);
    quantize_dual_device(qr, rsr, orow.outputs(), qc, rsc, ocol.outputs(), dx,
                         c.bf16 ? InputType::bf16 : InputType::f32, c.rows, c.cols, ws);
    check(cudaDeviceSynchronize(), "test");
    CAPTURE(c.rows);
    CAPTURE(c.cols);
    CAPTURE(c.bf16);
    CAPTURE(c.offset);
    CHECK(test::same_quantized(orow.get(qr, c.rows, c.cols), cr, x));
    CHECK(test::same_quantized(ocol.get(qc, c.rows, c.cols), cc, x));
  }
}

TEST_CASE("cuda quantize: path and argument errors") {
  std::vector<float> x(64, 1.0f);
  const MatrixView<const float> v(x.data(), 8, 8);
  QuantizerSpec q = quantizer_by_name("mxfp4");
  q.block_rows = 4;
  q.block_cols = 8;
  CHECK_THROWS_AS(quantize_gpu(q, v, {}, QuantPath::fused), Error);  // no fused kernel for [4,8]
  CHECK_NOTHROW(quantize_gpu(q, v, {}, QuantPath::generic));
  CHECK(!fused_supported(q));
  CHECK(fused_supported(quantizer_by_name("nvfp4_2d")));
}

TEST_CASE("cuda fake_quantize: in place, inverse RHT, equals sim's fake_quantize bit for bit") {
  struct Case {
    const char* name;
    Round round;
    bool rht;
    int br, bc;
    Size size;
  };
  const Case cases[] = {
      {"nvfp4", Round::rn, false, 1, 16, {37, 53}},      {"nvfp4", Round::rs, true, 1, 16, {37, 64}},
      {"nvfp4", Round::rs, true, 16, 1, {48, 53}},       {"nvfp4", Round::rn, true, 16, 1, {32, 96}},
      {"nvfp4_2d", Round::rn, false, 16, 16, {45, 70}},  {"mxfp4", Round::rs, false, 1, 32, {33, 100}},
      {"mxfp8_e4m3", Round::rm, false, 32, 1, {70, 45}}, {"fp8_e4m3_tensor", Round::rn, false, 0, 0, {20, 30}},
      {"mxint8", Round::rna, false, 4, 8, {21, 19}},
      // RHT with a partial last chunk (untransformed, then not transformed back).
      {"nvfp4", Round::rs, true, 1, 16, {37, 45}},       {"nvfp4", Round::rn, true, 16, 1, {37, 45}}};
  int failures = 0;
  for (const Case& c : cases) {
    QuantizerSpec q = quantizer_by_name(c.name);
    q.round = c.round;
    q.rht = c.rht;
    q.rht_seed = 77;
    q.block_rows = c.br;
    q.block_cols = c.bc;
    const auto x = test::varied_randn(c.size.rows, c.size.cols, 21, 15);
    std::vector<float> cpu = x, gpu = x;
    fake_quantize(q, MatrixView<float>(cpu.data(), c.size.rows, c.size.cols), {8, 9});
    fake_quantize_gpu(q, MatrixView<float>(gpu.data(), c.size.rows, c.size.cols), {8, 9});
    if (!test::same_bits("fake_quantize", gpu, cpu, &x)) {
      std::printf("  case: %s\n", describe(q).c_str());
      ++failures;
    }
  }
  CHECK(failures == 0);
}

// ---- stochastic rounding under the PTX cvt.rs random-bit contract -----------
// (SrBits::ptx_x4, core/sr.hpp: one word per 4 columns of a row, 8 bits an
// element): every kernel form against sim's quantize() under the same
// contract, bit for bit.
namespace {

QuantizerSpec x4_spec(const char* name, int br, int bc, bool rht = false) {
  QuantizerSpec q = quantizer_by_name(name);
  q.block_rows = br;
  q.block_cols = bc;
  q.rht = rht;
  q.rht_seed = 31;
  q.round = Round::rs;
  q.sr_bits = SrBits::ptx_x4;
  return q;
}
QuantizerSpec noglobal(QuantizerSpec q) {
  q.scale_rule = ScaleRule::nv_noglobal;
  q.global_scale = GlobalScale::none;
  return q;
}

// Specs whose kernels cover every SR form: the nvfp4 kind (rows, columns, RHT
// on either axis, tiles, nv_noglobal's dividing forms), the e2m1 kind
// ([16]-blocks with E8M0 scales, MXFP4 tiles), the [32]-block kinds (e2m1,
// e4m3, e5m2; saturating or not), the runtime kind (FP6), and the generic path
// alone ([4,8], one scale per tensor).
std::vector<std::pair<std::string, QuantizerSpec>> x4_specs() {
  std::vector<std::pair<std::string, QuantizerSpec>> v;
  v.emplace_back("nvfp4 [1,16]", x4_spec("nvfp4", 1, 16));
  v.emplace_back("nvfp4 rht [1,16]", x4_spec("nvfp4", 1, 16, true));
  v.emplace_back("nvfp4 [16,1]", x4_spec("nvfp4", 16, 1));
  v.emplace_back("nvfp4 rht [16,1]", x4_spec("nvfp4", 16, 1, true));
  v.emplace_back("nvfp4_2d [16,16]", x4_spec("nvfp4", 16, 16));
  v.emplace_back("nv_noglobal [1,16]", noglobal(x4_spec("nvfp4", 1, 16)));
  v.emplace_back("nv_noglobal [16,1]", noglobal(x4_spec("nvfp4", 16, 1)));
  v.emplace_back("mxfp4 [1,32]", x4_spec("mxfp4", 1, 32));
  v.emplace_back("mxfp4 [32,1]", x4_spec("mxfp4", 32, 1));
  v.emplace_back("mxfp4 [1,16]", x4_spec("mxfp4", 1, 16));
  v.emplace_back("mxfp4 [16,1]", x4_spec("mxfp4", 16, 1));
  v.emplace_back("mxfp4 [16,16]", x4_spec("mxfp4", 16, 16));
  v.emplace_back("mxfp8_e4m3 [1,32]", x4_spec("mxfp8_e4m3", 1, 32));
  v.emplace_back("mxfp8_e4m3 [32,1]", x4_spec("mxfp8_e4m3", 32, 1));
  QuantizerSpec nonsat = x4_spec("mxfp8_e4m3", 1, 32);
  nonsat.overflow = Overflow::nonsaturate;
  v.emplace_back("mxfp8_e4m3 [1,32] nonsat", nonsat);
  v.emplace_back("mxfp8_e5m2 [1,32]", x4_spec("mxfp8_e5m2", 1, 32));
  v.emplace_back("mxfp8_e5m2 [32,1]", x4_spec("mxfp8_e5m2", 32, 1));
  v.emplace_back("mxfp6_e2m3 [1,32]", x4_spec("mxfp6_e2m3", 1, 32));
  v.emplace_back("mxfp6_e2m3 [32,1]", x4_spec("mxfp6_e2m3", 32, 1));
  v.emplace_back("mxfp6_e3m2 [1,32]", x4_spec("mxfp6_e3m2", 1, 32));
  v.emplace_back("mxfp4 [4,8]", x4_spec("mxfp4", 4, 8));
  v.emplace_back("fp8_e4m3_tensor [0,0]", x4_spec("fp8_e4m3_tensor", 0, 0));
  return v;
}

// Shapes: partial groups of 4 at a row's end (cols % 4 != 0: 53, 7, 1, 70),
// rows whose words do not start a Philox group (cols % 16 != 0, so that
// ceil(cols / 4) % 4 != 0: 36, 40, 53), whole FULL-form spans (64 x 128,
// 96 x 64), partial blocks along both axes.
constexpr Size kX4Sizes[] = {{37, 53}, {5, 7}, {64, 128}, {3, 1}, {33, 36}, {48, 40}, {96, 64}};

}  // namespace

TEST_CASE("cuda quantize: SR under ptx_x4 (PTX cvt.rs words), every kernel form and path, bit-exact") {
  int cases = 0, failures = 0;
  for (const auto& [n, q] : x4_specs()) {
    REQUIRE_NOTHROW(validate(q, n));
    for (const Size& s : kX4Sizes) {
      // Random and adversarial values (NaN / Inf blocks take the per-element
      // encode), each from FP32 and as BF16 input.
      for (int data = 0; data < 4; ++data) {
        auto x = data % 2 ? test::adversarial(s.rows, s.cols, 17u + uint32_t(cases), true)
                          : test::varied_randn(s.rows, s.cols, 23u + uint32_t(cases), 20);
        const bool bf16 = data >= 2;
        if (bf16) test::round_to_bf16(x);
        const RandomStream rs{77, 1000u + uint64_t(cases)};
        for (QuantPath p : paths_for(q)) {
          ++cases;
          if (!check_case(q, x, s, rs, p, bf16)) ++failures;
        }
        if (fused_supported(q)) {
          ++cases;
          if (!check_case(q, x, s, rs, QuantPath::automatic, bf16)) ++failures;
        }
      }
    }
  }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
  // The contract matters: the same stream under per_element gives other codes.
  const Size s{64, 128};
  const auto x = test::varied_randn(s.rows, s.cols, 5, 10);
  QuantizerSpec q = x4_spec("nvfp4", 1, 16), pe = q;
  pe.sr_bits = SrBits::per_element;
  const MatrixView<const float> v(x.data(), s.rows, s.cols);
  const QuantizedTensor a = quantize_gpu(q, v, {3, 4}), b = quantize_gpu(pe, v, {3, 4});
  CHECK(a.codes != b.codes);
  CHECK(a.scale_codes == b.scale_codes);
}

TEST_CASE("cuda quantize: ptx_x4 packed FP4 codes, BF16 outputs and GEMM operands (the SR value forms)") {
  // The trainer's operands: [1,16] / [16,1] (RHT) NVFP4, nv_noglobal's
  // dividing forms, MXFP4 rows and [32,1] columns (the split value form on
  // whole 32-row strips), and FP8 (codes, no SR value form).
  std::vector<std::pair<std::string, QuantizerSpec>> specs;
  specs.emplace_back("nvfp4 [1,16]", x4_spec("nvfp4", 1, 16));
  specs.emplace_back("nvfp4 [16,1]", x4_spec("nvfp4", 16, 1));
  specs.emplace_back("nvfp4 rht [16,1]", x4_spec("nvfp4", 16, 1, true));
  specs.emplace_back("nvfp4 rht [1,16]", x4_spec("nvfp4", 1, 16, true));
  specs.emplace_back("nvfp4_2d [16,16]", x4_spec("nvfp4", 16, 16));
  specs.emplace_back("nv_noglobal [1,16]", noglobal(x4_spec("nvfp4", 1, 16)));
  specs.emplace_back("nv_noglobal [16,1]", noglobal(x4_spec("nvfp4", 16, 1)));
  specs.emplace_back("mxfp4 [1,32]", x4_spec("mxfp4", 1, 32));
  specs.emplace_back("mxfp4 [32,1]", x4_spec("mxfp4", 32, 1));
  specs.emplace_back("mxfp8_e4m3 [32,1]", x4_spec("mxfp8_e4m3", 32, 1));
  specs.emplace_back("mxfp8_e5m2 [1,32]", x4_spec("mxfp8_e5m2", 1, 32));
  int k = 0;
  for (const auto& [n, q] : specs) {
    // 96 x 70: whole [32,1] strips, 105 of them: the split value form's last
    // warp part full; 33 x 36: rows whose words start mid Philox group.
    for (Size s : {Size{37, 53}, Size{64, 128}, Size{3, 1}, Size{64, 64}, Size{96, 70}, Size{33, 36}}) {
      for (int data = 0; data < 4; ++data) {
        const bool in16 = data >= 2;
        auto x = data % 2 ? test::adversarial(s.rows, s.cols, 13, true) : test::varied_randn(s.rows, s.cols, 11, 12);
        if (in16) test::round_to_bf16(x);
        for (QuantPath path : paths_for(q)) check_packed_bf16(n, q, x, s, in16, data % 2 == 1, path, {19, uint64_t(++k)});
      }
    }
  }
}

TEST_CASE("cuda quantize: quantize_dual_device under ptx_x4, either operand or both") {
  const QuantizerSpec nv = quantizer_by_name("nvfp4");
  QuantWorkspace ws;
  int k = 0;
  for (Size s : {Size{16, 16}, Size{48, 32}, Size{256, 1152}, Size{1040, 400}}) {
    for (bool rht : {false, true}) {
      // (row, column) contracts: both ptx_x4 (the rs_x4 / rs_bf16_x4 forms),
      // mixed (the form of every mode, each operand's own words).
      for (int contracts = 0; contracts < 3; ++contracts) {
        for (Round rr : {Round::rn, Round::rs}) {
          for (bool global : {true, false}) {
            ++k;
            QuantizerSpec qr = nv, qc = nv;
            qr.round = rr;
            qc.round = Round::rs;
            qc.block_rows = 16;
            qc.block_cols = 1;
            qc.rht = rht;
            qc.rht_seed = 9 + uint64_t(k);
            qr.sr_bits = contracts != 2 ? SrBits::ptx_x4 : SrBits::per_element;
            qc.sr_bits = contracts != 1 ? SrBits::ptx_x4 : SrBits::per_element;
            if (!global) qr.global_scale = qc.global_scale = GlobalScale::none;
            REQUIRE(dual_supported(qr, qc, s.rows, s.cols));
            const bool bf16 = (k % 3) == 0;
            auto x = k % 5 == 1 ? test::adversarial(s.rows, s.cols, 800u + uint32_t(k), true)
                                : test::varied_randn(s.rows, s.cols, 800u + uint32_t(k), 20);
            if (bf16) test::round_to_bf16(x);
            check_dual(qr, qc, x, s, bf16, RandomStream{13, uint64_t(2 * k)}, RandomStream{13, uint64_t(2 * k + 1)},
                       ws);
          }
        }
      }
    }
  }
}

TEST_CASE("cuda fake_quantize: ptx_x4 SR in place, inverse RHT, equals sim's fake_quantize bit for bit") {
  struct Case {
    QuantizerSpec q;
    Size size;
  };
  const Case cases[] = {{x4_spec("nvfp4", 1, 16, true), {37, 64}},  {x4_spec("nvfp4", 16, 1, true), {48, 53}},
                        {x4_spec("nvfp4", 1, 16, true), {37, 45}},  {x4_spec("mxfp4", 1, 32), {33, 100}},
                        {x4_spec("nvfp4", 16, 16), {45, 70}},       {x4_spec("mxfp8_e4m3", 32, 1), {70, 45}},
                        {x4_spec("mxfp6_e3m2", 4, 8), {21, 19}}};
  int failures = 0;
  for (const Case& c : cases) {
    const auto x = test::varied_randn(c.size.rows, c.size.cols, 29, 15);
    std::vector<float> cpu = x, gpu = x;
    fake_quantize(c.q, MatrixView<float>(cpu.data(), c.size.rows, c.size.cols), {8, 10});
    fake_quantize_gpu(c.q, MatrixView<float>(gpu.data(), c.size.rows, c.size.cols), {8, 10});
    if (!test::same_bits("fake_quantize", gpu, cpu, &x)) {
      std::printf("  case: %s\n", describe(c.q).c_str());
      ++failures;
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: given random words (RandomStream::words) are refused, CPU-only") {
  const std::vector<uint32_t> words(4096, 0x12345678u);
  const RandomStream rs{1, 2, words.data()};
  std::vector<float> x(32 * 32, 0.5f);
  const QuantizerSpec nv = x4_spec("nvfp4", 1, 16);
  QuantizerSpec col = nv;
  col.block_rows = 16;
  col.block_cols = 1;
  CHECK_THROWS_WITH_AS(quantize_gpu(nv, MatrixView<const float>(x.data(), 32, 32), rs), doctest::Contains("CPU-only"),
                       Error);
  CHECK_THROWS_WITH_AS(fake_quantize_gpu(nv, MatrixView<float>(x.data(), 32, 32), rs), doctest::Contains("CPU-only"),
                       Error);
  DeviceBuffer<float> d(x.size());
  d.upload(x);
  QuantWorkspace ws;
  CHECK_THROWS_WITH_AS(quantize_dual_device(nv, rs, {}, col, {}, {}, d.data(), InputType::f32, 32, 32, ws),
                       doctest::Contains("CPU-only"), Error);
  CHECK_THROWS_WITH_AS(quantize_dual_device(nv, {}, {}, col, rs, {}, d.data(), InputType::f32, 32, 32, ws),
                       doctest::Contains("CPU-only"), Error);
  // The CPU takes them: words of the Philox stream give the Philox result.
  std::vector<uint32_t> philox(size_t(32 * sr_words_per_row(SrBits::ptx_x4, float4_e2m1fn, 32)));
  for (size_t i = 0; i < philox.size(); ++i) philox[i] = random_bits(1, 2, i);
  const auto xv = test::varied_randn(32, 32, 3, 10);
  const MatrixView<const float> v(xv.data(), 32, 32);
  CHECK(quantize(nv, v, RandomStream{1, 2, philox.data()}).codes == quantize_gpu(nv, v, {1, 2}).codes);
}

// ---- pointers aligned to their element type only ------------------------------
// (quantize.hpp "Alignment"): x at 1, 2, 3 elements past a 16-byte boundary
// (a row slice or view of a tensor), outputs at odd offsets, and in-place fake
// quantization at such an x. The kernels that need x 16-byte aligned (the
// tensor-amax pass) read a copy in QuantWorkspace::staging, the others the
// unaligned pointers themselves; every output the same bits as sim's and
// nothing written around them.
namespace {

// `bytes` bytes at offset `at` of a fresh device buffer (cudaMalloc: 256-byte
// aligned), with guard bytes around them: poison (0xA5) or, for an input,
// values of their own (set_guard_values), which must never change.
struct Slot {
  std::vector<uint8_t> image;  // the whole buffer as uploaded
  DeviceBuffer<uint8_t> buf;
  size_t at, bytes;
  static constexpr size_t kTail = 64;
  Slot(size_t bytes_, size_t at_) : image(at_ + bytes_ + kTail, 0xA5), buf(at_ + bytes_ + kTail), at(at_), bytes(bytes_) {
    upload();
  }
  // Every guard element (type T, from the buffer's start) set to v.
  template <class T>
  void set_guard_values(T v) {
    for (size_t i = 0; i + sizeof(T) <= image.size(); i += sizeof(T))
      if (i + sizeof(T) <= at || i >= at + bytes) std::memcpy(image.data() + i, &v, sizeof(T));
  }
  void put(const void* data) { std::memcpy(image.data() + at, data, bytes); }
  void upload() { buf.upload(image); }
  template <class T>
  T* ptr() const {
    return reinterpret_cast<T*>(buf.data() + at);
  }
  template <class T>
  std::vector<T> get() const {
    const std::vector<uint8_t> h = buf.download();
    std::vector<T> v(bytes / sizeof(T));
    std::memcpy(v.data(), h.data() + at, bytes);
    return v;
  }
  // Nothing written outside [at, at + bytes).
  bool guards_intact() const {
    const std::vector<uint8_t> h = buf.download();
    for (size_t i = 0; i < h.size(); ++i)
      if ((i < at || i >= at + bytes) && h[i] != image[i]) {
        std::printf("guard byte %zu (slice at %zu, %zu bytes) overwritten: 0x%02x\n", i, at, bytes, h[i]);
        return false;
      }
    return true;
  }
};

// x (f32, or its BF16 bits when bf16) at `off` elements past an aligned base;
// its guard elements large (-3e38: an amax that read them would change the
// global scale).
Slot input_slot(const std::vector<float>& x, bool bf16, int64_t off) {
  const size_t elem = bf16 ? 2 : 4;
  Slot s(x.size() * elem, size_t(off) * elem);
  if (bf16) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = uint16_t(float_bits(x[i]) >> 16);
    s.set_guard_values(uint16_t(float_bits(-3e38f) >> 16));
    s.put(h.data());
  } else {
    s.set_guard_values(-3e38f);
    s.put(x.data());
  }
  s.upload();
  return s;
}

// The BF16 dequantized tensor against CUDA's host converter of sim's FP32
// dequant (any NaN for a NaN): mismatching elements.
int64_t bf16_dequant_mismatches(const std::vector<uint16_t>& got, const std::vector<float>& dq) {
  if (got.size() != dq.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < dq.size(); ++i) {
    const __nv_bfloat16 w = __float2bfloat16_rn(dq[i]);
    uint16_t wb;
    std::memcpy(&wb, &w, 2);
    bad += !(std::isnan(dq[i]) ? (got[i] & 0x7FFF) > 0x7F80 : got[i] == wb);
  }
  return bad;
}

// quantize_device(q) of x [s] (BF16 input when bf16) read `in_off` elements
// past a 16-byte boundary, every output `out_off` elements (bytes for codes
// and scale codes) past its own, codes one a byte or packed, against sim's
// quantize() cpu: codes, scale codes, scales, global decode, FP32 and BF16
// dequant, nothing written around them, the input untouched; the staging
// buffer used exactly as quantize_staging_bytes says (not at all for an
// aligned x). True where every check passes.
bool check_unaligned(const std::string& name, const QuantizerSpec& q, const QuantizedTensor& cpu,
                     const std::vector<float>& x, Size s, bool bf16, int64_t in_off, int64_t out_off, bool packed,
                     QuantPath path, RandomStream rs) {
  const int64_t n = s.rows * s.cols;
  const bool has_codes = q.scale != &float32;
  const size_t nsc = size_t(cpu.scale_rows * cpu.scale_cols);
  Slot in = input_slot(x, bf16, in_off);
  Slot codes(size_t(packed ? s.rows * ((s.cols + 1) / 2) : n), size_t(out_off));
  Slot scodes(has_codes ? nsc : 0, size_t(out_off));
  Slot scales(nsc * 4, size_t(out_off) * 4), dq(size_t(n) * 4, size_t(out_off) * 4);
  Slot b16(size_t(n) * 2, size_t(out_off) * 2), g(4, size_t(out_off) * 4);
  QuantOutputs o;
  o.codes = codes.ptr<uint8_t>();
  o.code_layout = packed ? CodeLayout::packed4 : CodeLayout::bytes;
  o.scale_codes = has_codes ? scodes.ptr<uint8_t>() : nullptr;
  o.scales = scales.ptr<float>();
  o.dequant = dq.ptr<float>();
  o.dequant_bf16 = b16.ptr<uint16_t>();
  o.global_decode = g.ptr<float>();
  const InputType it = bf16 ? InputType::bf16 : InputType::f32;
  QuantWorkspace ws;
  quantize_device(q, in.ptr<void>(), it, s.rows, s.cols, rs, o, ws, nullptr, path);
  check(cudaDeviceSynchronize(), "test");
  const size_t staged = quantize_staging_bytes(q, in.ptr<void>(), it, s.rows, s.cols, path);
  bool ok = true;
  if (ws.staging.size() != staged || (in_off == 0 && staged != 0)) {
    std::printf("staging: %zu bytes allocated, quantize_staging_bytes %zu\n", ws.staging.size(), staged);
    ok = false;
  }
  ok = test::same_bytes("codes", codes.get<uint8_t>(),
                        packed ? pack_codes(*q.element, cpu.codes.data(), s.rows, s.cols) : cpu.codes, &x) &&
       ok;
  if (has_codes) ok = test::same_bytes("scale codes", scodes.get<uint8_t>(), cpu.scale_codes) && ok;
  ok = test::same_bits("scales", scales.get<float>(), cpu.scales) && ok;
  ok = test::same_bits("global decode", g.get<float>(), {cpu.global_decode}) && ok;
  ok = test::same_bits("dequant", dq.get<float>(), cpu.dequant, &x) && ok;
  if (const int64_t bad = bf16_dequant_mismatches(b16.get<uint16_t>(), cpu.dequant)) {
    std::printf("bf16 dequant: %lld elements differ\n", (long long)bad);
    ok = false;
  }
  for (const Slot* sl : {&in, &codes, &scodes, &scales, &dq, &b16, &g}) ok = sl->guards_intact() && ok;
  if (!ok)
    std::printf("  case: %s (%s), %lld x %lld, %s input at +%lld elements, outputs at +%lld, %s codes, path %s\n",
                name.c_str(), describe(q).c_str(), (long long)s.rows, (long long)s.cols, bf16 ? "bf16" : "f32",
                (long long)in_off, (long long)out_off, packed ? "packed" : "byte",
                path == QuantPath::fused ? "fused" : path == QuantPath::generic ? "generic" : "auto");
  return ok;
}

// The fused forms of the canned quantizers (RHT where the fused kernels take
// it), and a one-block tensor of the generic path (its amax is the
// tensor-amax pass's).
std::vector<std::pair<std::string, QuantizerSpec>> unaligned_specs() {
  std::vector<std::pair<std::string, QuantizerSpec>> v;
  for (const char* n : {"nvfp4", "nvfp4_2d", "nvfp4_col", "mxfp4", "mxfp8_e4m3", "mxfp6_e2m3"})
    v.emplace_back(n, quantizer_by_name(n));
  for (const char* n : {"nvfp4", "nvfp4_col"}) {
    QuantizerSpec q = quantizer_by_name(n);
    q.rht = true;
    q.rht_seed = 41;
    v.emplace_back(std::string(n) + " rht", q);
  }
  v.emplace_back("fp8_e4m3_tensor", quantizer_by_name("fp8_e4m3_tensor"));
  return v;
}

}  // namespace

TEST_CASE("cuda quantize: any element-aligned input and output pointers, bit-exact with sim") {
  int cases = 0, failures = 0;
  int k = 0;
  for (const auto& [name, base] : unaligned_specs()) {
    for (Round r : {Round::rn, Round::rs}) {
      QuantizerSpec q = base;
      q.round = r;
      REQUIRE_NOTHROW(validate(q, name));
      const std::string label = name + (r == Round::rs ? " rs" : "");
      std::vector<QuantPath> paths = paths_for(q);
      paths.push_back(QuantPath::automatic);
      // Partial blocks and chunks; whole spans (the FULL forms where every
      // pointer is aligned); rows of 40 elements (BF16 rows 80 bytes apart).
      for (Size s : {Size{37, 53}, Size{64, 128}, Size{48, 40}}) {
        for (bool bf16 : {false, true}) {
          ++k;
          auto x = k % 4 == 1 ? test::adversarial(s.rows, s.cols, 500u + uint32_t(k), true)
                              : test::varied_randn(s.rows, s.cols, 500u + uint32_t(k), 20);
          if (bf16) test::round_to_bf16(x);
          const RandomStream rs{21, uint64_t(k)};
          const QuantizedTensor cpu = quantize(q, MatrixView<const float>(x.data(), s.rows, s.cols), rs);
          for (int64_t in_off : {0, 1, 2, 3}) {
            // Odd output offsets: 1, 3, 5, 7 elements (bytes of codes).
            const int64_t out_off = 2 * in_off + 1;
            // Packed codes (4-bit elements) on every other offset, bytes on the rest.
            const bool packed = q.element->bits() == 4 && in_off % 2 == 1;
            for (QuantPath p : paths) {
              ++cases;
              if (!check_unaligned(label, q, cpu, x, s, bf16, in_off, out_off, packed, p, rs)) ++failures;
            }
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}

TEST_CASE("cuda quantize: an unaligned input is staged only where the tensor-amax pass reads it") {
  const Size s{64, 128};
  const auto x = test::varied_randn(s.rows, s.cols, 3, 10);
  auto staged = [&](const QuantizerSpec& q, bool bf16, int64_t off, QuantPath path = QuantPath::automatic,
                    bool given = false) {
    const Slot in = input_slot(x, bf16, off);
    return quantize_staging_bytes(q, in.ptr<void>(), bf16 ? InputType::bf16 : InputType::f32, s.rows, s.cols, path,
                                  given);
  };
  const size_t n = size_t(s.rows * s.cols);
  QuantizerSpec rs2d = quantizer_by_name("nvfp4_2d");
  rs2d.round = Round::rs;  // its amax in a pre-pass (the cooperative form is rn's)
  for (const char* name : {"nvfp4", "nvfp4_col"}) {
    const QuantizerSpec q = quantizer_by_name(name);
    CAPTURE(name);
    for (int64_t off : {1, 2, 3}) {
      CHECK(staged(q, false, off) == n * 4);
      CHECK(staged(q, true, off) == n * 2);
      CHECK(staged(q, false, off, QuantPath::fused, /*given=*/true) == 0);  // no amax pass
    }
    // 16-byte aligned: 4 FP32 or 8 BF16 elements past the base.
    CHECK(staged(q, false, 0) == 0);
    CHECK(staged(q, false, 4) == 0);
    CHECK(staged(q, true, 8) == 0);
  }
  CHECK(staged(rs2d, false, 1) == n * 4);
  CHECK(staged(quantizer_by_name("fp8_e4m3_tensor"), true, 1) == n * 2);  // generic, one block
  QuantizerSpec rht = quantizer_by_name("nvfp4");
  rht.rht = true;
  for (const QuantizerSpec& q : {quantizer_by_name("mxfp4"), quantizer_by_name("mxfp8_e4m3"), rht})
    for (int64_t off : {1, 2, 3}) CHECK(staged(q, false, off) == 0);  // checked loads, no tensor-amax pass
  CHECK(staged(quantizer_by_name("mxint8"), false, 1, QuantPath::generic) == 0);  // generic, many blocks
  CHECK(staged(quantizer_by_name("nvfp4_4over6"), false, 1) == 0);               // element-wise kernels
  // tensor_amax_device itself refuses an unaligned x (before any device work).
  DeviceBuffer<uint32_t> a(1);
  const Slot in = input_slot(x, false, 1);
  CHECK_THROWS_WITH_AS(tensor_amax_device(in.ptr<void>(), InputType::f32, int64_t(n), a.data()),
                       doctest::Contains("16-byte aligned"), Error);
}

TEST_CASE("cuda quantize: NVFP4 tiles too large for the one-launch amax, from an unaligned input") {
  // 2048 x 2304: more blocks than an H100 holds at once, so the amax runs as a
  // pre-pass (the tensor-amax kernel) over the staged copy.
  const Size s{2048, 2304};
  const QuantizerSpec q = quantizer_by_name("nvfp4_2d");
  int failures = 0;
  for (bool bf16 : {false, true}) {
    auto x = test::varied_randn(s.rows, s.cols, 61, 20);
    if (bf16) test::round_to_bf16(x);
    const QuantizedTensor cpu = quantize(q, MatrixView<const float>(x.data(), s.rows, s.cols));
    if (!check_unaligned("nvfp4_2d", q, cpu, x, s, bf16, bf16 ? 3 : 1, 5, bf16, QuantPath::automatic, {})) ++failures;
  }
  CHECK(failures == 0);
}

TEST_CASE("cuda fake_quantize: in place at an unaligned pointer equals sim's fake_quantize") {
  int failures = 0, k = 0;
  for (const auto& [name, base] : unaligned_specs()) {
    for (Round r : {Round::rn, Round::rs}) {
      QuantizerSpec q = base;
      q.round = r;
      for (Size s : {Size{37, 53}, Size{48, 64}}) {
        ++k;
        const auto x = test::varied_randn(s.rows, s.cols, 600u + uint32_t(k), 15);
        std::vector<float> cpu = x;
        fake_quantize(q, MatrixView<float>(cpu.data(), s.rows, s.cols), {8, uint64_t(k)});
        for (int64_t off : {1, 2, 3}) {
          Slot d = input_slot(x, false, off);
          QuantWorkspace ws;
          fake_quantize_device(q, d.ptr<float>(), s.rows, s.cols, {8, uint64_t(k)}, ws);
          check(cudaDeviceSynchronize(), "test");
          bool ok = test::same_bits("fake_quantize", d.get<float>(), cpu, &x);
          ok = d.guards_intact() && ok;
          if (!ok) {
            std::printf("  case: %s%s, %lld x %lld, x at +%lld elements\n", name.c_str(), r == Round::rs ? " rs" : "",
                        (long long)s.rows, (long long)s.cols, (long long)off);
            ++failures;
          }
        }
      }
    }
  }
  CHECK(failures == 0);
}
