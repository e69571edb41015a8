// TransformerEngine's NVFP4 options (four_over_six, row_amax: schemes/te_nvfp4/rule.hpp) on the GPU's generic
// rule kernels, bit-exact with sim in every output form, and refused by the fused and dual paths. Part of
// test_cuda (skipped without a GPU).
#include <doctest/doctest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "cuda/quantize.hpp"
#include "gpu_test_util.hpp"
#include "sim/packing.hpp"
#include "sim/quantizer.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;
using test::check_case;
using test::same_quantized;
using test::Size;

TEST_CASE("cuda quantize: TE's NVFP4 options (four_over_six, row_amax) bit-exact with sim, every form") {
  std::vector<QuantizerSpec> specs;
  for (const auto& b : {std::pair{1, 16}, std::pair{16, 1}, std::pair{16, 16}})
    for (SelectError m : {SelectError::mae, SelectError::mse, SelectError::mae_fp16, SelectError::mse_fp16})
      for (int M : {448, 256}) {
        QuantizerSpec q = quantizer_by_name("nvfp4_4over6");
        q.block_rows = b.first;
        q.block_cols = b.second;
        q.select_error = m;
        q.e4m3_max = M;
        specs.push_back(q);
      }
  for (Round r : {Round::rn, Round::rz, Round::rna}) {  // row_amax alone (TE: rn; rs refused)
    QuantizerSpec q = quantizer_by_name("nvfp4_row_scaled");
    q.round = r;
    specs.push_back(q);
  }
  for (SelectError m : {SelectError::mae, SelectError::mse_fp16})
    for (int M : {448, 256}) {  // both: 4/6 under each row's amax
      QuantizerSpec q = quantizer_by_name("nvfp4_4over6");
      q.global_scale = GlobalScale::row_amax;
      q.select_error = m;
      q.e4m3_max = M;
      specs.push_back(q);
    }
  QuantizerSpec e4m3fn = quantizer_by_name("nvfp4_2d_4over6");
  e4m3fn.scale = &float8_e4m3fn;
  specs.push_back(e4m3fn);
  // Rows and columns that are not multiples of 16, a single element, tall and wide.
  const Size sizes[] = {{37, 53}, {64, 96}, {1, 1}, {5, 200}, {48, 16}, {17, 32}, {130, 7}};
  int cases = 0, failures = 0;
  uint32_t seed = 300;
  for (const QuantizerSpec& q : specs) {
    CHECK_FALSE(fused_supported(q));
    CHECK_FALSE(bf16_exact(q));
    for (const Size s : sizes)
      for (int data = 0; data < 4; ++data) {
        // 0, 1: varied FP32 / those values in BF16; 2: adversarial (NaN, Inf,
        // zero blocks, subnormals, FLT_MAX); 3: the same in BF16.
        auto x =
            data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 12) : test::adversarial(s.rows, s.cols, seed++, true);
        const bool in16 = data % 2 == 1;
        if (in16) test::round_to_bf16(x);
        for (QuantPath p : {QuantPath::automatic, QuantPath::generic}) {
          ++cases;
          if (!check_case(q, x, s, RandomStream{}, p, in16)) ++failures;
        }
      }
  }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
  // No fused kernel: an explicit fused path is an error naming the option.
  const std::vector<float> x = test::varied_randn(32, 32, 1, 4);
  const MatrixView<const float> v(x.data(), 32, 32);
  CHECK_THROWS_WITH_AS(quantize_gpu(specs[0], v, {}, QuantPath::fused), doctest::Contains("four_over_six"), Error);
  CHECK_FALSE(dual_supported(quantizer_by_name("nvfp4_row_scaled"), quantizer_by_name("nvfp4_col"), 32, 32));
}

TEST_CASE("cuda quantize: TE's NVFP4 options' packed codes, BF16 outputs, fake quantization, reused workspace") {
  const QuantizerSpec specs[] = {quantizer_by_name("nvfp4_4over6"), quantizer_by_name("nvfp4_2d_4over6"),
                                 quantizer_by_name("nvfp4_row_scaled")};
  QuantWorkspace ws;  // one for every call: each call re-zeroes its amaxes
  for (const QuantizerSpec& q : specs) {
    for (Size s : {Size{37, 53}, Size{64, 64}, Size{3, 1}}) {
      for (bool in16 : {false, true}) {
        CAPTURE(describe(q));
        CAPTURE(s.rows);
        CAPTURE(s.cols);
        CAPTURE(in16);
        auto x = test::varied_randn(s.rows, s.cols, 21, 10);
        if (in16) test::round_to_bf16(x);
        const int64_t nel = s.rows * s.cols;
        const QuantizedTensor cpu = quantize(q, MatrixView<const float>(x.data(), s.rows, s.cols));
        DeviceBuffer<float> dx;
        DeviceBuffer<uint16_t> dx16;
        std::vector<uint16_t> h(x.size());
        for (size_t i = 0; i < x.size(); ++i) h[i] = uint16_t(float_bits(x[i]) >> 16);
        if (in16)
          dx16.upload(h);
        else
          dx.upload(x);
        const void* xin = in16 ? static_cast<const void*>(dx16.data()) : static_cast<const void*>(dx.data());
        DeviceBuffer<uint8_t> codes(static_cast<size_t>(s.rows * ((s.cols + 1) / 2)));
        DeviceBuffer<uint16_t> b16(static_cast<size_t>(nel)), op16(static_cast<size_t>(nel));
        DeviceBuffer<float> g(1), alpha(1), other(1);
        codes.fill_bytes(0xEE);
        b16.fill_bytes(0xEE);
        op16.fill_bytes(0xEE);
        other.upload(std::vector<float>{0.75f});
        QuantOutputs o;
        o.codes = codes.data();
        o.code_layout = CodeLayout::packed4;
        o.dequant_bf16 = b16.data();
        o.global_decode = g.data();
        o.gemm_alpha = alpha.data();
        o.gemm_alpha_other = other.data();
        quantize_device(q, xin, in16 ? InputType::bf16 : InputType::f32, s.rows, s.cols, {}, o, ws);
        QuantOutputs o2;
        o2.dequant_bf16 = op16.data();
        o2.bf16_gemm_operand = true;
        quantize_device(q, xin, in16 ? InputType::bf16 : InputType::f32, s.rows, s.cols, {}, o2, ws);
        check(cudaDeviceSynchronize(), "test");
        CHECK(test::same_bytes("packed codes", codes.download(),
                               pack_codes(*q.element, cpu.codes.data(), s.rows, s.cols)));
        CHECK(g.download()[0] == 1.0f);
        CHECK(alpha.download()[0] == 0.75f);  // g_dec (1) times the other operand's
        // BF16: CUDA's host converter of sim's FP32 dequant; the GEMM operand is
        // the same (g_dec 1), rounded (q * final scale is not exact in BF16).
        const auto got = b16.download(), got_op = op16.download();
        int bad = 0;
        for (int64_t i = 0; i < nel; ++i) {
          const __nv_bfloat16 w = __float2bfloat16_rn(cpu.dequant[size_t(i)]);
          uint16_t wb;
          std::memcpy(&wb, &w, 2);
          bad += got[size_t(i)] != wb || got_op[size_t(i)] != wb;
        }
        CHECK(bad == 0);
        // Fake quantization in place equals sim's.
        std::vector<float> f = x, fg = x;
        fake_quantize(q, MatrixView<float>(f.data(), s.rows, s.cols));
        fake_quantize_gpu(q, MatrixView<float>(fg.data(), s.rows, s.cols));
        CHECK(test::same_bits("fake_quantize", fg, f, &x));
      }
    }
  }
}

TEST_CASE("cuda quantize: emulate te_reference (TE's Python reference quantizer), bit-exact with sim") {
  const test::Size sizes[] = {{48, 80}, {37, 53}, {16, 16}, {1, 1}};
  int cases = 0, failures = 0;
  uint32_t seed = 7100;
  for (const char* name : {"nvfp4", "nvfp4_col", "nvfp4_2d"})
    for (const test::Size s : sizes)
      for (int data = 0; data < 4; ++data) {
        QuantizerSpec q = quantizer_by_name(name);
        q.emulate = Emulation::te_reference;
        auto x = data < 2 ? test::varied_randn(s.rows, s.cols, seed++, 12)
                          : test::adversarial(s.rows, s.cols, seed++, data == 3);
        if (data == 1) x.assign(x.size(), 0.0f);  // the all-zero tensor's 2^-128
        if (data == 0 && !x.empty()) x[0] = -0.0f;
        ++cases;
        if (!test::check_case(q, x, s, RandomStream{9, uint64_t(cases)}, QuantPath::automatic)) ++failures;
      }
  MESSAGE(cases << " cases compared");
  CHECK(failures == 0);
}
