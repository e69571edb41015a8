// GPU GEMMs (cuda/gemm.hpp): cuBLAS BF16 against a float64 CPU product, and the
// simulated block-scaled GEMMs against sim's quantized_gemm (same exact
// dequantized operands; only the accumulation order differs, so a tolerance).
#include <doctest/doctest.h>

#include <cmath>
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
  FP4LAB_REQUIRE_GPU();
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
  FP4LAB_REQUIRE_GPU();
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

TEST_CASE("cuda gemm: the Blackwell block-scaled path is refused below sm_100") {
  FP4LAB_REQUIRE_GPU();
  CHECK(blackwell_native_supported(quantizer_by_name("nvfp4"), quantizer_by_name("nvfp4")));
  CHECK(blackwell_native_supported(quantizer_by_name("mxfp8_e4m3"), quantizer_by_name("mxfp8_e4m3")));
  CHECK(!blackwell_native_supported(quantizer_by_name("nvfp4"), quantizer_by_name("nvfp4_2d")));
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
