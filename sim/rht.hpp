// 16-point Random Hadamard Transform (RHT) over chunks of 16 elements.
//
// For a chunk v (16 consecutive elements along the block's axis: a row
// segment for [1,16] blocks, a column segment for [16,1]):
//   forward  y = (1/4) H16 D v        inverse  v = (1/4) D H16 y
// H16 is the Sylvester (natural-order) Hadamard matrix of +-1 entries, so
// (1/4) H16 is orthonormal and symmetric; D = diag(d_0..d_15), d_i = +-1 from
// the seed: d_i = -1 iff bit 0 of random_bits(seed, rht_sign_stream, i) is 1
// (core/philox.hpp), or TransformerEngine's fixed set (RhtSigns::te, below). The
// same 16 signs apply to every chunk of the tensor.
// Transforming both GEMM operands along the reduction axis preserves the
// product exactly in real arithmetic: (HDa)^T (HDb) = a^T b.
//
// FP32 operation order (bit-exact contract, the CUDA backend follows it):
//   forward: t_i = d_i * v_i (exact); then 4 butterfly stages h = 1, 2, 4, 8:
//            for each pair (i, i + h) with (i & h) == 0: (t_i, t_{i+h}) <- (t_i + t_{i+h}, t_i - t_{i+h})
//            (each one FP32 add/sub, RN); finally y_i = t_i * 0.25f (exact unless
//            the result is an FP32 subnormal).
//   inverse: the same butterflies on y, then v_i = d_i * (t_i * 0.25f).
// The butterflies compute H16 t in natural (Sylvester) order.
//
// Partial chunk: where the axis length is not a multiple of 16, the last
// len % 16 elements of each row (rows axis) or column (cols axis) are left as
// they are (the identity), in both directions. This keeps every output the
// input's shape, is its own inverse, and still preserves a GEMM's product
// exactly when both operands are transformed along their common reduction
// axis (the identity block of D H16 / 4 is orthonormal too). A zero-padded
// chunk would not do: its inverse needs the padding's transformed values.
// The partial block of a [1,16] / [16,1] quantizer is therefore quantized
// untransformed, under the usual partial-block rule.
#pragma once

#include <array>
#include <cstdint>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/hd.hpp"
#include "core/philox.hpp"
#include "core/tensor.hpp"

namespace fp4lab {

inline constexpr uint64_t rht_sign_stream = 0x524854u;  // "RHT"

// The 16 signs (+1.0f / -1.0f) of seed.
FP4LAB_HD constexpr float rht_sign(uint64_t seed, int i) {
  return (random_bits(seed, rht_sign_stream, uint64_t(i)) & 1u) ? -1.0f : 1.0f;
}
std::array<float, 16> rht_signs(uint64_t seed);

// Where the signs come from: fp4lab's Philox draw from the seed, or TransformerEngine's fixed vector
// (d0067d0da, pytorch/tensor/nvfp4_tensor.py: get_wgrad_sign_vector, "xkcd 221"), the same on every call and
// device: sign mask 0xD7E8, d_i = -1 iff bit i is set. (TE's matrix is diag(d) H16 / 4 applied to 16
// consecutive tokens of a hidden column: fp4lab's forward transform with these signs.)
enum class RhtSigns : uint8_t { philox, te };
// The transform's output as the quantizer sees it: FP32, or rounded to BF16 (RN; TransformerEngine's RHT
// kernels, whose tensor-core sums are rounded to BF16 before the amax and the cast; sim/quantizer.hpp).
enum class RhtOutput : uint8_t { f32, bf16 };
FP4LAB_HD inline float rht_output_value(RhtOutput o, float v) {
  constexpr Format bf16 = bfloat16;  // a local copy: device code cannot refer to the host global
  return o == RhtOutput::bf16 ? decode(bf16, encode_rn_f32<bfloat16>(v, Overflow::nonsaturate)) : v;
}
inline constexpr uint32_t te_rht_sign_mask = 0xD7E8u;
std::array<float, 16> rht_signs(RhtSigns kind, uint64_t seed);

// Which transform: fp4lab's 16-point RHT (above), or Quartet II's 128-point rotation (its Triton simulation's
// backward, src/models/quantization/schemes/quartet_2.py at 8776a90b: eden_1x16s_fp4_kernel's tl.dot(x, H^T)
// with H = bf16(hadamard(128) / sqrt(128)) diag(d)). For a chunk v of 128 elements along the block axis:
//   forward  y = c H128 D bf16(v)        inverse  v = c D H128 y        c = bf16(128^-0.5) = 181 * 2^-11
// H128 Sylvester (natural order, scipy.linalg.hadamard), D the 128 signs of rht_sign(seed, i) (the first 16 are
// the 16-point transform's). The operand is rounded to BF16 first (RN: the kernel's operands are BF16 under
// autocast), and c is BF16's 0.08837890625, so c^2 * 128 = 0.99956..., not 1: the peer's rotation shrinks a
// GEMM's product by that factor, and fp4lab's with it.
// FP64 order (bit-exact contract; cuda/rht.cu's warp per chunk does the same operations): t_i = double(bf16(v_i)) * d_i; 7 butterfly stages h = 1 .. 64
// as rht16_butterflies in FP64; y_i = float(t_i * c) (one FP64 product, then RN to FP32). Where the sum is exact
// in FP64 (always, unless a chunk spans more than about 2^37 in magnitude) y is the exact value rounded once to
// FP32, which is what the tensor-core MMA returns whenever its own sum is exact (the oracle's inputs); where
// the MMA rounds, its undocumented accumulation order is not modelled. Inverse: t_i = double(y_i); the
// butterflies; v_i = float(t_i * c) * d_i. Partial chunks stay as they are (as above).
enum class RhtKind : uint8_t { rht16, quartet2_128 };
inline constexpr float quartet2_rht_scale = 0.08837890625f;  // bf16(128^-0.5) = 181 * 2^-11
std::array<float, 128> rht_signs128(uint64_t seed);  // rht_sign(seed, i), i < 128

FP4LAB_HD inline void rht128_butterflies(double* t) {
  for (int h = 1; h < 128; h <<= 1) {
    for (int i = 0; i < 128; ++i) {
      if (i & h) continue;
      const double a = t[i], b = t[i + h];
      t[i] = a + b;
      t[i + h] = a - b;
    }
  }
}
FP4LAB_HD inline void rht128_quartet2_forward(float* v, const float* signs) {
  double t[128];
  for (int i = 0; i < 128; ++i) t[i] = double(rht_output_value(RhtOutput::bf16, v[i])) * double(signs[i]);
  rht128_butterflies(t);
  for (int i = 0; i < 128; ++i) v[i] = float(t[i] * double(quartet2_rht_scale));
}
FP4LAB_HD inline void rht128_quartet2_inverse(float* v, const float* signs) {
  double t[128];
  for (int i = 0; i < 128; ++i) t[i] = double(v[i]);
  rht128_butterflies(t);
  for (int i = 0; i < 128; ++i) v[i] = float(t[i] * double(quartet2_rht_scale)) * signs[i];
}

// In-place forward / inverse transform of one chunk of 16 values.
FP4LAB_HD constexpr void rht16_butterflies(float* t) {
  for (int h = 1; h < 16; h <<= 1) {
    for (int i = 0; i < 16; ++i) {
      if (i & h) continue;
      const float a = t[i], b = t[i + h];
      t[i] = a + b;
      t[i + h] = a - b;
    }
  }
}
FP4LAB_HD constexpr void rht16_forward(float* v, const float* signs) {
  for (int i = 0; i < 16; ++i) v[i] = v[i] * signs[i];
  rht16_butterflies(v);
  for (int i = 0; i < 16; ++i) v[i] = v[i] * 0.25f;
}
FP4LAB_HD constexpr void rht16_inverse(float* v, const float* signs) {
  rht16_butterflies(v);
  for (int i = 0; i < 16; ++i) v[i] = signs[i] * (v[i] * 0.25f);
}

enum class RhtAxis : uint8_t { rows, cols };  // rows: chunks along a row ([1,16]); cols: along a column ([16,1])

// Transforms x in place (row-major view), any shape (partial chunks above), with the signs of seed or
// the given ones. OpenMP-parallel; results do not depend on the thread count.
void rht_forward(MatrixView<float> x, RhtAxis axis, uint64_t seed);
void rht_inverse(MatrixView<float> x, RhtAxis axis, uint64_t seed);
void rht_forward(MatrixView<float> x, RhtAxis axis, const std::array<float, 16>& signs);
void rht_inverse(MatrixView<float> x, RhtAxis axis, const std::array<float, 16>& signs);
// Quartet II's 128-point rotation with the signs of seed, any shape (partial chunks stay as they are).
void rht128_quartet2(MatrixView<float> x, RhtAxis axis, uint64_t seed, bool forward);
// The forward transform of kind with the (philox) signs of seed.
void rht_forward(MatrixView<float> x, RhtAxis axis, RhtKind kind, uint64_t seed);

}  // namespace fp4lab
