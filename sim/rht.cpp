// Random Hadamard Transform over 16-element chunks (see rht.hpp).
#include "sim/rht.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace fp4lab {

std::array<float, 16> rht_signs(uint64_t seed) {
  std::array<float, 16> s{};
  for (int i = 0; i < 16; ++i) s[size_t(i)] = rht_sign(seed, i);
  return s;
}

std::array<float, 16> rht_signs(RhtSigns kind, uint64_t seed) {
  if (kind == RhtSigns::philox) return rht_signs(seed);
  std::array<float, 16> s{};
  for (int i = 0; i < 16; ++i) s[size_t(i)] = (te_rht_sign_mask >> i) & 1u ? -1.0f : 1.0f;
  return s;
}

std::array<float, 128> rht_signs128(uint64_t seed) {
  std::array<float, 128> s{};
  for (int i = 0; i < 128; ++i) s[size_t(i)] = rht_sign(seed, i);
  return s;
}

namespace {

template <bool Forward>
void apply(MatrixView<float> x, RhtAxis axis, const std::array<float, 16>& signs) {
  if (x.rows < 0 || x.cols < 0) throw Error("RHT: negative tensor shape");
  if (axis == RhtAxis::rows) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < x.rows; ++r) {
      float* row = x.data + r * x.stride;
      for (int64_t c = 0; c + 16 <= x.cols; c += 16) {  // a partial last chunk stays as it is
        if constexpr (Forward) {
          rht16_forward(row + c, signs.data());
        } else {
          rht16_inverse(row + c, signs.data());
        }
      }
    }
  } else {
    // Each column's 16-element chunk gets exactly rht16_forward / rht16_inverse:
    // the same multiplications and butterflies in the same order per element,
    // done for a tile of columns at once (rows of the tile are contiguous, so
    // the loops over j vectorise) instead of gathering one strided column at a
    // time. Bit-identical to the per-column call (tests/sim/test_rht.cpp).
    constexpr int64_t kTile = 128;
    const int64_t chunks = x.rows / 16;  // whole chunks; the rows of a partial last chunk stay as they are
    const int64_t tiles = (x.cols + kTile - 1) / kTile;
#pragma omp parallel for schedule(static)
    for (int64_t kt = 0; kt < chunks * tiles; ++kt) {
      const int64_t k = kt / tiles, c0 = (kt % tiles) * kTile, len = std::min(kTile, x.cols - c0);
      float t[16][kTile];
      for (int i = 0; i < 16; ++i) {
        const float* src = x.data + (k * 16 + i) * x.stride + c0;
        const float s = Forward ? signs[size_t(i)] : 1.0f;
        for (int64_t j = 0; j < len; ++j) t[i][j] = Forward ? src[j] * s : src[j];
      }
      for (int h = 1; h < 16; h <<= 1)
        for (int i = 0; i < 16; ++i) {
          if (i & h) continue;
          float* u = t[i];
          float* w = t[i + h];
          for (int64_t j = 0; j < len; ++j) {
            const float a = u[j], b = w[j];
            u[j] = a + b;
            w[j] = a - b;
          }
        }
      for (int i = 0; i < 16; ++i) {
        float* dst = x.data + (k * 16 + i) * x.stride + c0;
        const float s = signs[size_t(i)];
        for (int64_t j = 0; j < len; ++j) dst[j] = Forward ? t[i][j] * 0.25f : s * (t[i][j] * 0.25f);
      }
    }
  }
}

}  // namespace

void rht128_quartet2(MatrixView<float> x, RhtAxis axis, uint64_t seed, bool forward) {
  if (x.rows < 0 || x.cols < 0) throw Error("RHT: negative tensor shape");
  const std::array<float, 128> d = rht_signs128(seed);
  const bool rows = axis == RhtAxis::rows;
  const int64_t lines = rows ? x.rows : x.cols, chunks = (rows ? x.cols : x.rows) / 128;
#pragma omp parallel for schedule(static)
  for (int64_t lc = 0; lc < lines * chunks; ++lc) {
    const int64_t line = lc / chunks, k0 = (lc % chunks) * 128;
    float v[128];
    auto at = [&](int64_t k) -> float& { return rows ? x.data[line * x.stride + k] : x.data[k * x.stride + line]; };
    for (int i = 0; i < 128; ++i) v[i] = at(k0 + i);
    if (forward) {
      rht128_quartet2_forward(v, d.data());
    } else {
      rht128_quartet2_inverse(v, d.data());
    }
    for (int i = 0; i < 128; ++i) at(k0 + i) = v[i];
  }
}

void rht_forward(MatrixView<float> x, RhtAxis axis, RhtKind kind, uint64_t seed) {
  if (kind == RhtKind::quartet2_128) return rht128_quartet2(x, axis, seed, true);
  rht_forward(x, axis, seed);
}

void rht_forward(MatrixView<float> x, RhtAxis axis, uint64_t seed) { apply<true>(x, axis, rht_signs(seed)); }
void rht_inverse(MatrixView<float> x, RhtAxis axis, uint64_t seed) { apply<false>(x, axis, rht_signs(seed)); }
void rht_forward(MatrixView<float> x, RhtAxis axis, const std::array<float, 16>& signs) { apply<true>(x, axis, signs); }
void rht_inverse(MatrixView<float> x, RhtAxis axis, const std::array<float, 16>& signs) {
  apply<false>(x, axis, signs);
}

}  // namespace fp4lab
