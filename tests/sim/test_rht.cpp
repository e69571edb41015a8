// Random Hadamard Transform (sim/rht.hpp): orthonormality, inverse, dot products.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "sim/quantizer.hpp"
#include "sim/rht.hpp"

using namespace fp4lab;

TEST_CASE("RHT of a unit vector: every output is +-1/4 with the Sylvester sign pattern") {
  // H16 row i, column 0 is +1 for all i, so forward(e_0) = d_0 / 4 * (1, 1, ..., 1).
  const auto d = rht_signs(42);
  float v[16] = {};
  v[0] = 1.0f;
  rht16_forward(v, d.data());
  for (int i = 0; i < 16; ++i) CHECK(v[i] == 0.25f * d[0]);
  // e_3: H16[i][3] = (-1)^popcount(i & 3).
  float w[16] = {};
  w[3] = 1.0f;
  rht16_forward(w, d.data());
  for (int i = 0; i < 16; ++i) CHECK(w[i] == 0.25f * d[3] * ((__builtin_popcount(i & 3) & 1) ? -1.0f : 1.0f));
  // signs are +-1 and not all equal for this seed (a seed gives a sign pattern)
  int neg = 0;
  for (float s : d) {
    CHECK(std::fabs(s) == 1.0f);
    neg += s < 0;
  }
  CHECK(neg > 0);
  CHECK(neg < 16);
}

TEST_CASE("RHT is orthonormal: the transformed basis is orthonormal") {
  const auto d = rht_signs(7);
  float m[16][16];
  for (int j = 0; j < 16; ++j) {
    float v[16] = {};
    v[j] = 1.0f;
    rht16_forward(v, d.data());
    for (int i = 0; i < 16; ++i) m[j][i] = v[i];
  }
  for (int a = 0; a < 16; ++a)
    for (int b = 0; b < 16; ++b) {
      double dot = 0;
      for (int i = 0; i < 16; ++i) dot += double(m[a][i]) * m[b][i];
      CHECK(std::fabs(dot - (a == b ? 1.0 : 0.0)) < 1e-12);
    }
}

TEST_CASE("RHT inverse recovers x and x^T y is preserved, rows and columns") {
  std::mt19937 g(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int rows = 32, cols = 48;
  std::vector<float> x(rows * cols), y(rows * cols);
  for (auto& v : x) v = n(g);
  for (auto& v : y) v = n(g);
  for (RhtAxis ax : {RhtAxis::rows, RhtAxis::cols}) {
    std::vector<float> tx = x, ty = y;
    rht_forward(MatrixView<float>(tx.data(), rows, cols), ax, 99);
    rht_forward(MatrixView<float>(ty.data(), rows, cols), ax, 99);
    double d0 = 0, d1 = 0, norm0 = 0, norm1 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      d0 += double(x[i]) * y[i];
      d1 += double(tx[i]) * ty[i];
      norm0 += double(x[i]) * x[i];
      norm1 += double(tx[i]) * tx[i];
    }
    CHECK(d1 == doctest::Approx(d0).epsilon(1e-5));
    CHECK(norm1 == doctest::Approx(norm0).epsilon(1e-5));
    rht_inverse(MatrixView<float>(tx.data(), rows, cols), ax, 99);
    for (size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(tx[i] - x[i]) < 1e-5f);
  }
}

// The partial-chunk rule, built element by element from the chunk functions:
// whole chunks get rht16_forward / rht16_inverse, the len % 16 elements at a
// row's (column's) end are unchanged, bit for bit.
static std::vector<float> rht_by_chunks(std::vector<float> x, int64_t rows, int64_t cols, RhtAxis ax, uint64_t seed,
                                        bool forward) {
  const std::array<float, 16> signs = rht_signs(seed);
  const int64_t len = ax == RhtAxis::rows ? cols : rows, lines = ax == RhtAxis::rows ? rows : cols;
  for (int64_t line = 0; line < lines; ++line)
    for (int64_t k = 0; k + 16 <= len; k += 16) {
      auto at = [&](int i) -> float& {
        return ax == RhtAxis::rows ? x[size_t(line * cols + k + i)] : x[size_t((k + i) * cols + line)];
      };
      float t[16];
      for (int i = 0; i < 16; ++i) t[i] = at(i);
      if (forward)
        rht16_forward(t, signs.data());
      else
        rht16_inverse(t, signs.data());
      for (int i = 0; i < 16; ++i) at(i) = t[i];
    }
  return x;
}

TEST_CASE("RHT partial chunk: the last len % 16 elements stay untransformed; inverse and x^T y still exact") {
  std::mt19937 g(21);
  std::normal_distribution<float> n(0.0f, 1.0f);
  // (rows, cols): partial along rows, along columns, both, shorter than one chunk, empty.
  const int64_t shapes[][2] = {{3, 20}, {20, 3}, {37, 45}, {5, 7}, {17, 1}, {1, 17}, {0, 9}, {9, 0}};
  for (const auto& sh : shapes)
    for (RhtAxis ax : {RhtAxis::rows, RhtAxis::cols}) {
      const int64_t rows = sh[0], cols = sh[1];
      CAPTURE(rows);
      CAPTURE(cols);
      CAPTURE(int(ax));
      std::vector<float> x(size_t(rows * cols)), y(x.size());
      for (auto& v : x) v = n(g);
      for (auto& v : y) v = n(g);
      std::vector<float> tx = x, ty = y;
      rht_forward(MatrixView<float>(tx.data(), rows, cols), ax, 77);
      rht_forward(MatrixView<float>(ty.data(), rows, cols), ax, 77);
      const std::vector<float> want = rht_by_chunks(x, rows, cols, ax, 77, true);
      CHECK(std::memcmp(tx.data(), want.data(), x.size() * sizeof(float)) == 0);
      // The products along the transformed axis are preserved (the rows' dot
      // products for RhtAxis::rows, the columns' for RhtAxis::cols).
      const int64_t len = ax == RhtAxis::rows ? cols : rows, lines = ax == RhtAxis::rows ? rows : cols;
      for (int64_t line = 0; line < lines; ++line) {
        double d0 = 0, d1 = 0;
        for (int64_t i = 0; i < len; ++i) {
          const size_t at = ax == RhtAxis::rows ? size_t(line * cols + i) : size_t(i * cols + line);
          d0 += double(x[at]) * y[at];
          d1 += double(tx[at]) * ty[at];
        }
        CHECK(d1 == doctest::Approx(d0).epsilon(1e-5));
      }
      std::vector<float> back = tx;
      rht_inverse(MatrixView<float>(back.data(), rows, cols), ax, 77);
      const std::vector<float> want_back = rht_by_chunks(tx, rows, cols, ax, 77, false);
      CHECK(std::memcmp(back.data(), want_back.data(), x.size() * sizeof(float)) == 0);
      for (size_t i = 0; i < x.size(); ++i) CHECK(std::fabs(back[i] - x[i]) < 1e-5f);
    }
}

TEST_CASE("quantizer with RHT on a partial chunk: = the plain quantizer on the chunk-wise transformed tensor") {
  // 37 x 45 under [1,16] (2 whole chunks + 13 per row) and [16,1] (2 whole +
  // 5 per column), NVFP4 with the two-level scale and SR: the partial block
  // is quantized untransformed, under the ordinary partial-block rule.
  std::mt19937 g(22);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int64_t rows = 37, cols = 45;
  std::vector<float> x(size_t(rows * cols));
  for (auto& v : x) v = n(g);
  x[44] = 30.0f;  // an outlier in a partial [1,16] block
  for (bool along_rows : {true, false}) {
    QuantizerSpec s = quantizer_by_name("nvfp4");
    s.block_rows = along_rows ? 1 : 16;
    s.block_cols = along_rows ? 16 : 1;
    s.round = Round::rs;
    s.rht = true;
    s.rht_seed = 5;
    const RandomStream rs{17, 3};
    const QuantizedTensor q = quantize(s, MatrixView<const float>(x.data(), rows, cols), rs);
    const std::vector<float> t = rht_by_chunks(x, rows, cols, along_rows ? RhtAxis::rows : RhtAxis::cols, 5, true);
    QuantizerSpec plain = s;
    plain.rht = false;
    const QuantizedTensor p = quantize(plain, MatrixView<const float>(t.data(), rows, cols), rs);
    CHECK(q.codes == p.codes);
    CHECK(q.scale_codes == p.scale_codes);
    CHECK(std::memcmp(q.dequant.data(), p.dequant.data(), p.dequant.size() * sizeof(float)) == 0);
    std::vector<float> f = x;
    fake_quantize(s, MatrixView<float>(f.data(), rows, cols), rs);
    const std::vector<float> back =
        rht_by_chunks(p.dequant, rows, cols, along_rows ? RhtAxis::rows : RhtAxis::cols, 5, false);
    CHECK(std::memcmp(f.data(), back.data(), f.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("RHT along columns: bit-identical to rht16_forward / rht16_inverse on each gathered column") {
  // 48 rows (3 chunks) x 300 columns (tiles of 128 plus a remainder), a view
  // whose stride exceeds its width (the padding must stay untouched), values
  // of all magnitudes plus zeros, -0, subnormals, Inf and NaN.
  const int64_t rows = 48, cols = 300, stride = 307;
  std::mt19937 g(11);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_int_distribution<int> e(-60, 60);
  std::vector<float> x(size_t(rows * stride));
  for (auto& v : x) v = std::ldexp(n(g), e(g));
  const float specials[] = {0.0f, -0.0f, 1e-45f, -3e-39f, INFINITY, -INFINITY, NAN, 3.4e38f};
  for (size_t i = 0; i < std::size(specials); ++i) x[(i * 977) % x.size()] = specials[i];
  for (bool forward : {true, false}) {
    std::vector<float> got = x, want = x;
    const MatrixView<float> v(got.data(), rows, cols, stride);
    if (forward)
      rht_forward(v, RhtAxis::cols, 1234);
    else
      rht_inverse(v, RhtAxis::cols, 1234);
    const std::array<float, 16> signs = rht_signs(1234);
    for (int64_t k = 0; k < rows / 16; ++k)
      for (int64_t c = 0; c < cols; ++c) {
        float t[16];
        for (int i = 0; i < 16; ++i) t[i] = want[size_t((k * 16 + i) * stride + c)];
        if (forward)
          rht16_forward(t, signs.data());
        else
          rht16_inverse(t, signs.data());
        for (int i = 0; i < 16; ++i) want[size_t((k * 16 + i) * stride + c)] = t[i];
      }
    int64_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) bad += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    CHECK_MESSAGE(bad == 0, (forward ? "forward" : "inverse") << ": " << bad << " elements differ");
  }
}

TEST_CASE("quantizer with RHT: codes in the transformed domain, fake_quantize returns to x's domain") {
  std::mt19937 g(9);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(16 * 64);
  for (auto& v : x) v = n(g);
  x[10] = 40.0f;  // an outlier: RHT spreads it over its 16-chunk
  QuantizerSpec s = quantizer_by_name("nvfp4");
  s.rht = true;
  s.rht_seed = 3;
  MatrixView<const float> xv(x.data(), 16, 64);
  QuantizedTensor q = quantize(s, xv);
  std::vector<float> t = x;
  rht_forward(MatrixView<float>(t.data(), 16, 64), RhtAxis::rows, 3);
  QuantizerSpec plain = s;
  plain.rht = false;
  QuantizedTensor p = quantize(plain, MatrixView<const float>(t.data(), 16, 64));
  CHECK(q.codes == p.codes);  // = quantizing the transformed tensor
  std::vector<float> f = x;
  fake_quantize(s, MatrixView<float>(f.data(), 16, 64));
  std::vector<float> dq = p.dequant;
  rht_inverse(MatrixView<float>(dq.data(), 16, 64), RhtAxis::rows, 3);
  for (size_t i = 0; i < f.size(); ++i) CHECK(f[i] == dq[i]);
  // stats are taken in the transformed domain (where the codes live)
  QuantStats st = quant_stats(q, xv);
  CHECK(st.sqnr_db > 10.0);
}
