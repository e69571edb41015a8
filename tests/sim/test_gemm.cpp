// Dequantized GEMM simulation (sim/gemm.hpp).
#include <doctest/doctest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "sim/gemm.hpp"

using namespace fp4lab;

TEST_CASE("gemm_nt: hand-worked 2x3 * (2x3)^T") {
  // a = [[1, 2, 3], [4, 5, 6]], b = [[1, 0, -1], [0.5, 0.5, 0.5]]
  // y = [[1 - 3, 0.5 + 1 + 1.5], [4 - 6, 2 + 2.5 + 3]] = [[-2, 3], [-2, 7.5]]
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {1, 0, -1, 0.5f, 0.5f, 0.5f}, y(4);
  gemm_nt({a.data(), 2, 3}, {b.data(), 2, 3}, {y.data(), 2, 2});
  CHECK(y == std::vector<float>{-2, 3, -2, 7.5f});
  CHECK(accum_model_name(AccumModel::fp32_eigen) == "fp32_eigen");
  std::vector<float> bad(6);
  CHECK_THROWS_AS(gemm_nt({a.data(), 2, 3}, {b.data(), 3, 2}, {bad.data(), 2, 3}), Error);
}

TEST_CASE("gemm_nt: the same bits with 1 and 4 threads (fixed output tiles)") {
  // Shapes with partial tiles in both directions and a long reduction, where
  // Eigen's own multi-threaded GEMM splits k differently per thread count.
  const int64_t m = 200, n = 300, k = 1500;
  std::mt19937 g(5);
  std::normal_distribution<float> d;
  std::vector<float> a(size_t(m * k)), b(size_t(n * k)), y1(size_t(m * n)), y4(size_t(m * n));
  for (float& v : a) v = d(g);
  for (float& v : b) v = d(g);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  gemm_nt({a.data(), m, k}, {b.data(), n, k}, {y1.data(), m, n});
  omp_set_num_threads(4);
  gemm_nt({a.data(), m, k}, {b.data(), n, k}, {y4.data(), m, n});
  omp_set_num_threads(saved);
  CHECK(y1 == y4);
  double worst = 0;  // and it is the product: against float64
  for (int64_t i = 0; i < m; i += 37)
    for (int64_t j = 0; j < n; j += 41) {
      double ref = 0;
      for (int64_t t = 0; t < k; ++t) ref += double(a[size_t(i * k + t)]) * double(b[size_t(j * k + t)]);
      worst = std::max(worst, std::abs(ref - double(y1[size_t(i * n + j)])));
    }
  CHECK(worst < 1e-3);
}

TEST_CASE("quantized_gemm: representable operands are exact; random operands close to FP64") {
  // Every element a power of two times an e2m1 value with block amax 6: mxfp4 is exact.
  std::vector<float> a = {6, 1, 0.5f, 3, 4, 2, 1.5f, 6}, b = {6, -4, 2, 1, 0, 6, 3, 0.5f};
  QuantizerSpec q = quantizer_by_name("mxfp4");
  q.block_cols = 4;
  Tensor<float> y = quantized_gemm(q, {a.data(), 2, 4}, q, {b.data(), 2, 4});
  // y00 = 36 - 4 + 1 + 3 = 36; y01 = 0 + 6 + 1.5 + 1.5 = 9; y10 = 24 - 8 + 3 + 6 = 25; y11 = 0 + 12 + 4.5 + 3 = 19.5
  CHECK(y.data == std::vector<float>{36, 9, 25, 19.5f});
  // Random: relative Frobenius error of nvfp4 x nvfp4 against FP64 is small (~0.1).
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int m = 32, k = 128, nn = 16;
  std::vector<float> A(m * k), B(nn * k);
  for (auto& v : A) v = n(g);
  for (auto& v : B) v = n(g);
  Tensor<float> Y =
      quantized_gemm(quantizer_by_name("nvfp4"), {A.data(), m, k}, quantizer_by_name("nvfp4"), {B.data(), nn, k});
  double num = 0, den = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < nn; ++j) {
      double ref = 0;
      for (int t = 0; t < k; ++t) ref += double(A[size_t(i * k + t)]) * B[size_t(j * k + t)];
      num += (Y.data[size_t(i * nn + j)] - ref) * (Y.data[size_t(i * nn + j)] - ref);
      den += ref * ref;
    }
  CHECK(std::sqrt(num / den) < 0.2);
  CHECK(std::sqrt(num / den) > 0.01);  // it is quantized
}
