// fp4-trainkit's quantizers (fp4tk.hpp), on the scalar steps of core/fp4tk.hpp.
#include "sim/fp4tk.hpp"

#include <algorithm>
#include <vector>

#include "core/encode.hpp"
#include "core/error.hpp"
#include "core/fp4tk.hpp"
#include "core/philox.hpp"

namespace fp4lab {

void validate_fp4tk(const QuantizerSpec& q, const std::string& where) {
  auto fail = [&](const std::string& m) { throw Error(where + ": emulate 'fp4tk': " + m); };
  if (q.element != &float4_e2m1fn)
    fail("fp4-trainkit quantizes to e2m1 only; element must be e2m1, got '" + std::string(q.element->name) + "'");
  const bool mx = q.scale_rule == ScaleRule::ocp || q.scale_rule == ScaleRule::ceil ||
                  q.scale_rule == ScaleRule::tetrajet;
  if (!mx && q.scale_rule != ScaleRule::nv_noglobal)
    fail("scale_rule must be ocp, ceil or tetrajet (MXFP4) or nv_noglobal (NVFP4), got '" +
         std::string(scale_rule_name(q.scale_rule)) + "'");
  if (q.block_rows != 1 && q.block_cols != 1)
    fail("fp4-trainkit's blocks are 1-D: block must be [1,K] or [K,1], got [" + std::to_string(q.block_rows) + "," +
         std::to_string(q.block_cols) + "]");
  if (q.block_rows == 0 || q.block_cols == 0) fail("per-tensor blocks ([0,0]) are not fp4-trainkit's");
  if (q.global_scale != GlobalScale::none) fail("fp4-trainkit has no global scale; global_scale must be none");
  if (q.rht) fail("fp4-trainkit has no RHT; rht must be false");
  if (q.round != Round::rn && q.round != Round::rs)
    fail("round must be rn or rs (fp4-trainkit's Nearest and Stochastic), got '" + std::string(round_name(q.round)) +
         "'");
  if (q.sr_bits != SrBits::per_element) fail("sr_bits must be per_element");
  if (q.overflow != Overflow::saturate) fail("fp4-trainkit saturates; overflow must be saturate");
}

namespace {

Fp4tkMxRule mx_rule(ScaleRule r) {
  return r == ScaleRule::ocp ? Fp4tkMxRule::ocp : r == ScaleRule::ceil ? Fp4tkMxRule::ceil : Fp4tkMxRule::tetrajet;
}

}  // namespace

BlockScales fp4tk_block_scales(const QuantizerSpec& q, MatrixView<const float> x) {
  BlockScales b;
  b.grid = block_grid(q, x.rows, x.cols);
  const std::vector<uint32_t> amax = block_amax_bits(b.grid, x);
  const size_t n = amax.size();
  b.has_codes = true;
  b.divide = true;
  b.pow2 = q.scale_rule != ScaleRule::nv_noglobal;
  b.scale_codes.assign(n, 0);
  b.scales.assign(n, 0.0f);
  b.mult.assign(n, 0.0f);
  b.flags.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const float a = bits_float(amax[i]);
    const bool nan = amax[i] > 0x7F800000u, inf = amax[i] == 0x7F800000u;
    float s;
    uint8_t flags = nan ? flag_nan : 0;
    if (b.pow2) {
      s = fp4tk_mx_scale(a, mx_rule(q.scale_rule));
      // 2^e with e in [-23, 127] is normal: its E8M0 code is its exponent field.
      b.scale_codes[i] = nan ? 0xFF : uint8_t(float_bits(s) >> 23);
      const float lead = q.scale_rule == ScaleRule::ocp ? a / 4.0f : a / 6.0f;
      if (a > 0.0f && lead < fp4tk_eps) flags |= flag_underflow;
      if (inf) flags |= flag_overflow;
    } else {
      const float sf = fp4tk_nv_scale_f(a);
      const uint32_t code = nan ? float8_e4m3fn.nan_code() : encode_rn_f32<float8_e4m3fn>(sf, Overflow::saturate);
      s = nan ? quiet_nan_f() : decode_f32<float8_e4m3fn>(code);
      b.scale_codes[i] = uint8_t(code);
      if (a > 0.0f && a / 6.0f < 0.001953125f) flags |= flag_underflow;
      if (!nan && a / 6.0f > 448.0f) flags |= flag_overflow;
    }
    b.scales[i] = s;
    b.mult[i] = s;
    b.flags[i] = flags;
  }
  return b;
}

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
void encode_row_any(bool sr, const float* sc, int64_t bc, const float* x, int64_t cols, const uint32_t* w,
                    float* dq, uint8_t* codes) {
  if (sr && codes) encode_row<true, true>(sc, bc, x, cols, w, dq, codes);
  if (sr && !codes) encode_row<true, false>(sc, bc, x, cols, w, dq, codes);
  if (!sr && codes) encode_row<false, true>(sc, bc, x, cols, w, dq, codes);
  if (!sr && !codes) encode_row<false, false>(sc, bc, x, cols, w, dq, codes);
}

}  // namespace

void fp4tk_encode(const QuantizerSpec& q, const BlockScales& b, MatrixView<const float> x, RandomStream rs,
                  float* dq_out, int64_t out_stride, uint8_t* codes_out) {
  const bool sr = q.round == Round::rs;
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
