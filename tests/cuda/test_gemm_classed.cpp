// ClassedGemm (cuda/gemm_classed.hpp): the shape classes (host), and on the
// GPU the product against a float64 reference within FP32 accumulation error
// for every transpose pair, odd and unaligned shapes, host and device scalars
// and beta 0 / 1; the same bits when a call repeats; one heuristic answer per
// class (m varying over 1000..3000 asks at most the octave's classes).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "core/bits.hpp"
#include "cuda/gemm_classed.hpp"

using namespace fp4lab;
using namespace fp4lab::cuda;

TEST_CASE("cuda classed gemm: shape classes, four an octave" * doctest::test_suite("host")) {
  for (int64_t v = 1; v <= 8; ++v) CHECK(gemm_shape_class(v) == v);
  CHECK(gemm_shape_class(768) == 768);
  CHECK(gemm_shape_class(384) == 384);
  CHECK(gemm_shape_class(2500) == 2560);
  CHECK(gemm_shape_class(2049) == 2560);
  CHECK(gemm_shape_class(2048) == 2048);
  CHECK(gemm_shape_class(9) == 10);
  // Every class is >= v, below v * 1.25 + 1, and a fixed point; 1 .. 2^20 in 4 * 20 + 8 classes.
  std::vector<int64_t> seen;
  for (int64_t v = 1; v <= (int64_t(1) << 20); ++v) {
    const int64_t c = gemm_shape_class(v);
    CHECK_MESSAGE((c >= v && double(c) <= 1.25 * double(v) + 1 && gemm_shape_class(c) == c), v);
    if (seen.empty() || seen.back() != c) seen.push_back(c);
  }
  CHECK(seen.size() <= 4 * 20 + 8);
}

namespace {

uint16_t bf16_of(float x) { return uint16_t(float_bits(x) >> 16); }

}  // namespace

TEST_CASE("cuda classed gemm: cublasGemmEx's semantics within FP32 accumulation error, bits repeat") {
  Blas blas;
  ClassedGemm g;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  DeviceBuffer<float> scalars;
  scalars.upload(std::vector<float>{0.75f, 1.0f});
  int cases = 0;
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{768, 1000, 384}, {53, 37, 29}, {384, 2500, 768},
                                {96, 130, 2047}, {1, 1, 1}})
    for (const cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
      for (const cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T})
        for (const bool dev : {false, true})
          for (const float beta : {0.0f, 1.0f}) {
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(int(ta));
            CAPTURE(int(tb));
            CAPTURE(dev);
            CAPTURE(beta);
            // Column-major storage: A is [m, k] (N) or [k, m] (T); B is [k, n] (N) or [n, k] (T). One element of
            // offset makes A and B 2-byte aligned only.
            const int64_t lda = ta == CUBLAS_OP_N ? m : k, ldb = tb == CUBLAS_OP_N ? k : n;
            const int64_t a_cols = ta == CUBLAS_OP_N ? k : m, b_cols = tb == CUBLAS_OP_N ? n : k;
            std::vector<float> a(size_t(lda * a_cols)), b(size_t(ldb * b_cols)), c0(size_t(m * n));
            std::vector<uint16_t> a16(a.size() + 1), b16(b.size() + 1);
            for (size_t i = 0; i < a.size(); ++i) a16[i + 1] = bf16_of(nd(rng)), a[i] = bits_float(uint32_t(a16[i + 1]) << 16);
            for (size_t i = 0; i < b.size(); ++i) b16[i + 1] = bf16_of(nd(rng)), b[i] = bits_float(uint32_t(b16[i + 1]) << 16);
            for (float& v : c0) v = nd(rng);
            DeviceBuffer<uint16_t> da, db;
            da.upload(a16);
            db.upload(b16);
            DeviceBuffer<float> dc;
            dc.upload(c0);
            const float alpha = 0.75f;
            const float* pa = dev ? scalars.data() : &alpha;
            const float* pb = dev ? (beta == 0.0f ? nullptr : scalars.data() + 1) : &beta;
            DeviceBuffer<float> zero;
            zero.upload(std::vector<float>{0.0f});
            if (dev && beta == 0.0f) pb = zero.data();
            g.bf16_f32(blas, ta, tb, m, n, k, pa, da.data() + 1, lda, db.data() + 1, ldb, pb, dc.data(), m, dev);
            const std::vector<float> got = dc.download();
            dc.upload(c0);
            g.bf16_f32(blas, ta, tb, m, n, k, pa, da.data() + 1, lda, db.data() + 1, ldb, pb, dc.data(), m, dev);
            const std::vector<float> again = dc.download();
            CHECK(std::memcmp(got.data(), again.data(), got.size() * 4) == 0);
            // float64 reference and the accumulation bound: |err| <= 2 (k + 8) 2^-24 (sum |a||b| + |beta c|).
            bool ok = true;
            for (int64_t i = 0; i < m && ok; ++i)
              for (int64_t j = 0; j < n && ok; ++j) {
                double s = 0, mag = 0;
                for (int64_t t = 0; t < k; ++t) {
                  const double av = ta == CUBLAS_OP_N ? a[size_t(t * lda + i)] : a[size_t(i * lda + t)];
                  const double bv = tb == CUBLAS_OP_N ? b[size_t(j * ldb + t)] : b[size_t(t * ldb + j)];
                  s += av * bv;
                  mag += std::abs(av * bv);
                }
                const double want = 0.75 * s + double(beta) * c0[size_t(j * m + i)];
                const double bound =
                    2.0 * double(k + 8) * 0x1p-24 * (0.75 * mag + std::abs(double(beta) * c0[size_t(j * m + i)])) +
                    1e-30;
                ok = std::abs(double(got[size_t(j * m + i)]) - want) <= bound;
                if (!ok) FAIL_CHECK("element (" << i << ", " << j << "): " << got[size_t(j * m + i)] << " vs " << want);
              }
            ++cases;
          }
  CHECK(cases == 5 * 2 * 2 * 2 * 2);
  // m over 1000..3000 in one shape family: at most the classes of two octaves (and the exact fallbacks, none here).
  ClassedGemm h;
  DeviceBuffer<uint16_t> a(size_t(3000) * 384), b(size_t(768) * 384);
  a.fill_bytes(0);
  b.fill_bytes(0);
  DeviceBuffer<float> c(size_t(3000) * 768);
  const float one = 1.0f, zero = 0.0f;
  for (int64_t m = 1000; m <= 3000; m += 7)
    h.bf16_f32(blas, CUBLAS_OP_T, CUBLAS_OP_N, 768, m, 384, &one, b.data(), 384, a.data(), 384, &zero, c.data(), 768,
               false);
  check(cudaDeviceSynchronize(), "classed gemm");
  CHECK(h.classes() <= 7);  // 1024, 1280, 1536, 1792, 2048, 2560, 3072
}
