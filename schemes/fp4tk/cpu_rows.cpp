// fp4-trainkit's elements on the CPU (schemes/fp4tk/rule.hpp's Fp4tkRule::encode_rows): rows of
// fp4tk_e2m1_fast, vectorised.
#include <algorithm>
#include <vector>

#include "core/encode.hpp"
#include "core/philox.hpp"
#include "schemes/fp4tk/rule.hpp"

namespace fp4lab {

namespace {

// One element: dq = s * v with v = e2m1(x / s), and v's E2M1 code when
// kCodes (NaN -> 0x7; core's encoder, so that variant does not vectorise).
template <bool kSr, bool kCodes>
inline void encode_one(float s, float x, uint32_t word, float* dq, uint8_t* code) {
  // fp4tk_noise(word), with word >> 8 converted as a signed int (the same
  // value, < 2^24), which vectorises where an unsigned conversion does not.
  const float noise = float(int32_t(word >> 8)) * 5.9604644775390625e-08f - 0.5f;
  const float v = fp4tk_e2m1_fast(x / s, kSr, kSr ? noise : 0.0f);
  *dq = s * v;
  if constexpr (kCodes) *code = v != v ? 0x7 : uint8_t(encode_rn_f32<float4_e2m1fn>(v, Overflow::saturate));
}

// One row's elements, s the scale of c's block (bc columns per block; bc 1:
// one scale per column, [K,1] blocks). Block by block, so the inner loops have
// no division of indices and vectorise.
template <bool kSr, bool kCodes>
void encode_row(const float* sc, int64_t bc, const float* x, int64_t cols, const uint32_t* w, float* dq,
                uint8_t* codes) {
  if (bc == 1) {
    for (int64_t c = 0; c < cols; ++c) encode_one<kSr, kCodes>(sc[c], x[c], kSr ? w[c] : 0u, dq + c, codes + c);
    return;
  }
  for (int64_t c0 = 0; c0 < cols; c0 += bc) {
    const float s = sc[c0 / bc];
    const int64_t c1 = std::min(cols, c0 + bc);
    for (int64_t c = c0; c < c1; ++c) encode_one<kSr, kCodes>(s, x[c], kSr ? w[c] : 0u, dq + c, codes + c);
  }
}

// encode_row with the variant chosen at run time (codes null: no codes).
void encode_row_any(bool sr, const float* sc, int64_t bc, const float* x, int64_t cols, const uint32_t* w, float* dq,
                    uint8_t* codes) {
  if (sr && codes) encode_row<true, true>(sc, bc, x, cols, w, dq, codes);
  if (sr && !codes) encode_row<true, false>(sc, bc, x, cols, w, dq, codes);
  if (!sr && codes) encode_row<false, true>(sc, bc, x, cols, w, dq, codes);
  if (!sr && !codes) encode_row<false, false>(sc, bc, x, cols, w, dq, codes);
}

}  // namespace

void Fp4tkRule::encode_rows(const Params& p, const BlockScales& b, MatrixView<const float> x, RandomStream rs,
                            float* dq_out, int64_t out_stride, uint8_t* codes_out) {
  const bool sr = p.sr;
  const BlockGrid& g = b.grid;
  const int64_t cols = x.cols;
#pragma omp parallel
  {
    std::vector<uint32_t> words(size_t(sr ? cols : 0)), scratch(size_t(sr ? 4 * ((cols + 3) / 4 + 1) : 0));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < x.rows; ++r) {
      const uint32_t* w = nullptr;
      if (sr) {
        const uint64_t first = uint64_t(r) * uint64_t(cols);
        if (rs.words) {
          w = rs.words + first;
        } else {
          random_words(rs.seed, rs.stream, first, uint64_t(cols), words.data(), scratch.data());
          w = words.data();
        }
      }
      const float* sc = b.scales.data() + (r / g.br) * g.nbc;
      encode_row_any(sr, sc, g.bc, x.data + r * x.stride, cols, w, dq_out + r * out_stride,
                     codes_out ? codes_out + r * cols : nullptr);
    }
  }
}

}  // namespace fp4lab
