// GPU GEMMs (cuda/gemm.hpp): cuBLAS BF16 against a float64 CPU product, and the
// simulated block-scaled GEMMs against sim's quantized_gemm (same exact
// dequantized operands; only the accumulation order differs, so a tolerance).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "cuda/gemm.hpp"
#include "gpu_test_util.hpp"
#include "sim/gemm.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

namespace {
double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    if (std::isnan(got[i])) return INFINITY;
    num += d * d;
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}
}  // namespace

TEST_CASE("cuda gemm: cuBLAS BF16 NT product against float64") {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{33, 47, 64}, {128, 96, 200}, {1, 1, 8}}) {
    auto a = test::varied_randn(m, k, 1, 0), b = test::varied_randn(n, k, 2, 0);
    test::round_to_bf16(a);
    test::round_to_bf16(b);
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    for (size_t i = 0; i < a.size(); ++i) a16[i] = uint16_t(float_bits(a[i]) >> 16);
    for (size_t i = 0; i < b.size(); ++i) b16[i] = uint16_t(float_bits(b[i]) >> 16);
    DeviceBuffer<uint16_t> da, db;
    da.upload(a16);
    db.upload(b16);
    DeviceBuffer<float> y(static_cast<size_t>(m * n));
    y.fill_bytes(0xFF);  // NaN poison
    Blas blas;
    gemm_bf16_nt(blas, da.data(), db.data(), y.data(), OutType::f32, m, n, k, 0.5f);
    check(cudaDeviceSynchronize(), "gemm");
    std::vector<double> ref(size_t(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t t = 0; t < k; ++t) s += double(a[size_t(i * k + t)]) * double(b[size_t(j * k + t)]);
        ref[size_t(i * n + j)] = 0.5 * s;
      }
    // Exact BF16 products, FP32 accumulation: far below 1e-5 relative.
    CHECK(rel_err(y.download(), ref) < 1e-5);
  }
}

TEST_CASE("cuda gemm: simulated NVFP4 / MXFP4 / MXFP8 GEMMs equal sim's quantized_gemm up to accumulation order") {
  struct Case {
    const char *qa, *qb;
  };
  for (Case c : {Case{"nvfp4", "nvfp4_2d"}, Case{"nvfp4", "nvfp4"}, Case{"mxfp4", "mxfp4"},
                 Case{"mxfp8_e4m3", "mxfp8_e4m3"}, Case{"mxfp8_e5m2", "mxfp8_e4m3"}}) {
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{37, 45, 96}, {64, 80, 256}, {16, 16, 40}}) {
      const auto a = test::varied_randn(m, k, 3, 6), b = test::varied_randn(n, k, 4, 6);
      const QuantizerSpec qa = quantizer_by_name(c.qa), qb = quantizer_by_name(c.qb);
      QuantizerSpec qa_sr = qa;
      qa_sr.round = Round::rs;  // SR operands too: the same bits on both sides
      for (const QuantizerSpec& qaa : {qa, qa_sr}) {
        const MatrixView<const float> va(a.data(), m, k), vb(b.data(), n, k);
        const Tensor<float> cpu = quantized_gemm(qaa, va, qb, vb, {1, 2}, {3, 4});
        const Tensor<float> gpu = quantized_gemm_gpu(qaa, va, qb, vb, {1, 2}, {3, 4}, GemmPath::hopper_bf16);
        std::vector<double> ref(cpu.data.begin(), cpu.data.end());
        const double e = rel_err(gpu.data, ref);
        CHECK_MESSAGE(e < 1e-5, c.qa << " x " << c.qb << " " << m << "x" << n << "x" << k << " rel err " << e);
      }
    }
  }
}

namespace {
// Float64 reference of dq(A) dq(B)^T from sim's dequantized operands, and the
// per-element magnitude sum |dq(a)| |dq(b)| that bounds the accumulation error.
void reference_product(const QuantizedTensor& qa, const QuantizedTensor& qb, std::vector<double>& ref,
                       std::vector<double>& mag) {
  const int64_t m = qa.rows, n = qb.rows, k = qa.cols;
  ref.assign(size_t(m * n), 0.0);
  mag.assign(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, a = 0;
      for (int64_t t = 0; t < k; ++t) {
        const double p = double(qa.dequant[size_t(i * k + t)]) * double(qb.dequant[size_t(j * k + t)]);
        s += p;
        a += std::fabs(p);
      }
      ref[size_t(i * n + j)] = s;
      mag[size_t(i * n + j)] = a;
    }
}

// The FP8 tensor-core product of a [m, k] and b [n, k] quantized with the
// named MXFP8 quantizers, with its float64 reference and magnitude sums.
struct Fp8Run {
  std::vector<float> gpu;
  std::vector<double> ref, mag;
};
Fp8Run run_fp8(const char* qa_name, const char* qb_name, const std::vector<float>& a, const std::vector<float>& b,
               int64_t m, int64_t n, int64_t k) {
  const QuantizerSpec qa = quantizer_by_name(qa_name), qb = quantizer_by_name(qb_name);
  const MatrixView<const float> va(a.data(), m, k), vb(b.data(), n, k);
  Fp8Run r;
  reference_product(quantize(qa, va), quantize(qb, vb), r.ref, r.mag);
  r.gpu = quantized_gemm_gpu(qa, va, qb, vb, {}, {}, GemmPath::hopper_fp8).data;
  return r;
}

const char* const kMxfp8Pairs[][2] = {{"mxfp8_e4m3", "mxfp8_e4m3"},
                                      {"mxfp8_e5m2", "mxfp8_e4m3"},
                                      {"mxfp8_e4m3", "mxfp8_e5m2"},
                                      {"mxfp8_e5m2", "mxfp8_e5m2"}};
// Sizes crossing the 128 x 128 CTA tile and the 128-byte k tile, with k a
// multiple of 16 but not always of 32 (a half MX block at the end).
const std::tuple<int64_t, int64_t, int64_t> kFp8Shapes[] = {{37, 45, 96}, {130, 260, 272}, {256, 128, 512},
                                                            {16, 16, 48}, {1, 3, 16},      {200, 136, 1040}};
}  // namespace

TEST_CASE("cuda gemm: MXFP8 on the FP8 tensor cores is exact where the block partials are exact") {
  if (compute_capability() < 89) {
    MESSAGE("FP8 mma needs sm_89+: test skipped");
    return;
  }
  // Integers in [-4, 4] times 2^e per MX block (32 elements of a row), e in
  // [-2, 2]: every value is exact in E4M3 and E5M2 after the block's
  // power-of-two scale; within a block all codes are integers times one power
  // of two, so a k32 partial is a sum of 32 integer products <= 16, an integer
  // below 2^10 times one power of two; and every total (products 2^-4 .. 2^4
  // apart) fits FP32's 24 bits in any order. Whatever the width of the tensor
  // cores' internal adder (>= 10 bits), the result must equal float64's
  // exactly. A fragment-layout mistake (wrong row, column, k half or scale)
  // changes the sum, so this pins the data movement bit for bit.
  for (const auto& pair : kMxfp8Pairs) {
    for (auto [m, n, k] : kFp8Shapes) {
      auto ints = [](int64_t rows, int64_t cols, uint32_t seed) {
        std::mt19937 g(seed);
        std::uniform_int_distribution<int> v(-4, 4), e(-2, 2);
        std::vector<float> x(size_t(rows * cols));
        float s = 1.0f;
        for (size_t i = 0; i < x.size(); ++i) {
          if (int64_t(i) % cols % 32 == 0) s = std::ldexp(1.0f, e(g));
          x[i] = float(v(g)) * s;
        }
        return x;
      };
      const Fp8Run r = run_fp8(pair[0], pair[1], ints(m, k, 7), ints(n, k, 8), m, n, k);
      int64_t bad = 0;
      for (size_t i = 0; i < r.ref.size(); ++i)
        if (double(r.gpu[i]) != r.ref[i]) ++bad;
      CHECK_MESSAGE(bad == 0, pair[0] << " x " << pair[1] << " " << m << "x" << n << "x" << k << ": " << bad << " of "
                                      << r.ref.size() << " elements differ from the exact product");
    }
  }
}

TEST_CASE("cuda gemm: MXFP8 on the FP8 tensor cores within the accumulation bound on general data") {
  if (compute_capability() < 89) {
    MESSAGE("FP8 mma needs sm_89+: test skipped");
    return;
  }
  // General data: the tensor cores' k32 partials may round (Hopper's FP8 adder
  // is narrower than FP32; DeepGEMM reports ~14 bits for wgmma). Bound per
  // element: 2^-7 * sum |a||b|, loose enough for a 10-bit adder that truncates
  // each of the 32 products, and far below what a misplaced fragment gives
  // (the exact test above pins those). The largest observed ratio is printed
  // so the actual width can be read off a run.
  double worst = 0;
  for (const auto& pair : kMxfp8Pairs) {
    for (auto [m, n, k] : kFp8Shapes) {
      const Fp8Run r =
          run_fp8(pair[0], pair[1], test::varied_randn(m, k, 3, 6), test::varied_randn(n, k, 4, 6), m, n, k);
      int64_t bad = 0;
      for (size_t i = 0; i < r.ref.size(); ++i) {
        const double err = std::fabs(double(r.gpu[i]) - r.ref[i]);
        const double ratio = r.mag[i] > 0 ? err / r.mag[i] : (err == 0 ? 0 : INFINITY);
        worst = std::max(worst, ratio);
        if (!(ratio <= std::ldexp(1.0, -7))) ++bad;
      }
      CHECK_MESSAGE(bad == 0, pair[0] << " x " << pair[1] << " " << m << "x" << n << "x" << k << ": " << bad
                                      << " elements beyond 2^-7 sum|ab|");
      const double e = rel_err(r.gpu, r.ref);
      CHECK_MESSAGE(e < 1e-2, pair[0] << " x " << pair[1] << " rel err " << e);
    }
  }
  MESSAGE("FP8 tensor-core MXFP8 GEMM: largest |err| / sum|ab| = " << worst << " (2^" << std::log2(worst) << ")");
}

TEST_CASE("cuda gemm: FP8 block scaling through cuBLASLt's block-scaled FP8 matmul, within the accumulation bound") {
  if (compute_capability() < 90) {
    MESSAGE("cuBLASLt's FP8 block scaling needs sm_90+: test skipped");
    return;
  }
  // Operands quantized on the GPU, the product against float64 of sim's dequantized operands: the scales'
  // layouts (VEC128_32F rows, BLK128x128_32F tiles) are wrong unless every element lands near the exact sum.
  const char* const pairs[][2] = {{"fp8_block_1x128", "fp8_block_128x128"},
                                  {"te_fp8_block_1x128", "te_fp8_block_128x128"},
                                  {"fp8_block_1x128", "fp8_block_1x128"}};
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {
      {128, 256, 512}, {200, 136, 1024}, {256, 384, 384}, {64, 64, 128}};
  double worst = 0;
  for (const auto& pair : pairs)
    for (auto [m, n, k] : shapes) {
      const QuantizerSpec qa = quantizer_by_name(pair[0]), qb = quantizer_by_name(pair[1]);
      const std::vector<float> a = test::varied_randn(m, k, 21, 6), b = test::varied_randn(n, k, 22, 6);
      const MatrixView<const float> va(a.data(), m, k), vb(b.data(), n, k);
      std::vector<double> ref, mag;
      reference_product(quantize(qa, va), quantize(qb, vb), ref, mag);
      const std::vector<float> gpu = quantized_gemm_gpu(qa, va, qb, vb, {}, {}, GemmPath::hopper_fp8_block).data;
      int64_t bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double err = std::fabs(double(gpu[i]) - ref[i]);
        const double ratio = mag[i] > 0 ? err / mag[i] : (err == 0 ? 0 : INFINITY);
        worst = std::max(worst, ratio);
        if (!(ratio <= std::ldexp(1.0, -7))) ++bad;
      }
      CHECK_MESSAGE(bad == 0, pair[0] << " x " << pair[1] << " " << m << "x" << n << "x" << k << ": " << bad
                                      << " elements beyond 2^-7 sum|ab|");
    }
  MESSAGE("FP8 block-scaled cuBLASLt GEMM: largest |err| / sum|ab| = " << worst << " (2^" << std::log2(worst) << ")");
  CHECK_FALSE(fp8_block_gemm_supported(quantizer_by_name("fp8_block_128x128"), quantizer_by_name("fp8_block_1x128")));
}

TEST_CASE("cuda gemm: the FP8 tensor-core path refuses what it cannot compute, naming why") {
  // No GPU needed: the checks come before any device work.
  CHECK(fp8_tensor_core_supported(quantizer_by_name("mxfp8_e4m3"), quantizer_by_name("mxfp8_e5m2")));
  CHECK(!fp8_tensor_core_supported(quantizer_by_name("mxfp4"), quantizer_by_name("mxfp8_e4m3")));
  CHECK(!fp8_tensor_core_supported(quantizer_by_name("nvfp4"), quantizer_by_name("nvfp4")));
  QuantOperand a, b;
  a.spec = quantizer_by_name("mxfp8_e4m3");
  b.spec = quantizer_by_name("nvfp4");
  a.rows = b.rows = 32;
  a.cols = b.cols = 64;
  const uint8_t dummy[16] = {};
  a.codes = b.codes = a.scale_codes = b.scale_codes = dummy;
  CHECK_THROWS_WITH_AS(mxfp8_gemm_fp8_tensor_cores(a, b, nullptr, OutType::f32, nullptr),
                       doctest::Contains("MX [1,32]"), Error);
  b.spec = a.spec;
  a.cols = b.cols = 40;
  CHECK_THROWS_WITH_AS(mxfp8_gemm_fp8_tensor_cores(a, b, nullptr, OutType::f32, nullptr),
                       doctest::Contains("k=40 is not a multiple of 16"), Error);
}

TEST_CASE("cuda gemm: the Blackwell block-scaled path is refused below sm_100") {
  CHECK(blackwell_native_supported(quantizer_by_name("nvfp4"), quantizer_by_name("nvfp4")));
  CHECK(blackwell_native_supported(quantizer_by_name("mxfp8_e4m3"), quantizer_by_name("mxfp8_e4m3")));
  // NVFP4 [16,16] tiles go as their rows' [1,16] scales (the NVIDIA recipe's x and W).
  CHECK(blackwell_native_supported(quantizer_by_name("nvfp4"), quantizer_by_name("nvfp4_2d")));
  CHECK(!blackwell_native_supported(quantizer_by_name("nvfp4"), quantizer_by_name("mxfp4")));
  QuantizerSpec rht = quantizer_by_name("nvfp4");
  rht.rht = true;
  CHECK(!blackwell_native_supported(rht, quantizer_by_name("nvfp4")));
  if (compute_capability() < 100) {
    std::vector<float> a(32 * 64, 1.0f);
    const MatrixView<const float> v(a.data(), 32, 64);
    CHECK_THROWS_AS(quantized_gemm_gpu(quantizer_by_name("nvfp4"), v, quantizer_by_name("nvfp4"), v, {}, {},
                                       GemmPath::blackwell_native),
                    Error);
  } else {
    MESSAGE("sm_100+: the native block-scaled path would run here; this test suite has never run on one");
  }
}
