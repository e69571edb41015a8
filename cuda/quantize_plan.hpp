// How a quantization runs on the GPU, private to cuda/: the kernel family,
// the kernel kind (which formats the kernel has as compile-time constants),
// the input type, the block size, the RHT and the tensor-amax strategy. One
// place chooses them (plan_quantize, plan_dual; quantize.cu); the public
// fused_supported / dual_supported are defined from the same functions. Within
// a family, the launcher picks the kernel's form (fast rounding form, FULL,
// SPLIT) from the run-time arguments (rounding, outputs, alignment, shape):
// quantize_rows.cuh, quantize_cols.cuh, quantize.cu's tiles, quantize_dual.cu.
#pragma once

#include <cstdint>
#include <optional>

#include "core/format.hpp"
#include "cuda/quantize.hpp"

namespace fp4lab::cuda::qk {

// The formats a kernel has as compile-time constants (its template argument);
// the others it reads from KParams at run time. The compile-time element
// formats take core's branch-free encode_rn_f32 / encode_rs_f32 / decode_f32,
// and only kinds other than runtime have fast rn / SR forms (quantize_fast.cuh).
enum class KernelKind : int {
  runtime = 0,  // element and scale formats at run time (core's encode() / decode())
  nvfp4 = 1,    // E2M1 elements and UE4M3 scales, both compile-time (NVFP4)
  e2m1 = 2,     // E2M1 elements; the scale format at run time (MXFP4 and the like)
  e4m3 = 3,     // E4M3FN elements; the scale format at run time (MXFP8 E4M3)
  e5m2 = 4,     // E5M2 elements; the scale format at run time (MXFP8 E5M2)
};
// Kinds with E2M1 elements (four-bit codes).
FP4LAB_HD constexpr bool e2m1_kind(KernelKind k) { return k == KernelKind::nvfp4 || k == KernelKind::e2m1; }

// The kind of q's formats (the kernel of a family may take a more general one:
// plan_quantize).
inline KernelKind spec_kind(const QuantizerSpec& q) {
  if (q.element == &float4_e2m1fn) return q.scale == &ufloat8_e4m3 ? KernelKind::nvfp4 : KernelKind::e2m1;
  if (q.element == &float8_e4m3fn) return KernelKind::e4m3;
  if (q.element == &float8_e5m2) return KernelKind::e5m2;
  return KernelKind::runtime;
}

enum class Family : uint8_t {
  rows,     // blocks [1,16], [1,32]: one thread per block (quantize_rows.cuh)
  cols,     // blocks [16,1], [32,1]: one thread per strip of BR rows x V columns (quantize_cols.cuh)
  tiles,    // blocks [16,16]: one warp per two tiles (quantize.cu)
  dual,     // [1,16] and [16,1] blocks of one tensor in one pass (quantize_dual.cu)
  generic,  // any block shape: block amax, block scales, elements (quantize.cu)
};

// How the tensor amax that an nv rule with a per-tensor scale needs is had.
enum class AmaxStrategy : uint8_t {
  none,         // the rule needs none
  given,        // the caller's device amax bits (the producer's): the global scale from them by one tiny kernel
                // (dual: read by the kernel itself)
  pre_pass,     // one pass over x before the quantization (of the RHT output with RHT; dual: both amaxes at
                // once), whose last block computes the global scale; generic: its block-amax pass
  cooperative,  // in the quantization kernel itself, one cooperative launch (tiles, NVFP4, rn); pre_pass where
                // the grid does not fit on the GPU at once
};

struct KernelPlan {
  Family family = Family::generic;
  KernelKind kind = KernelKind::runtime;
  InputType input = InputType::f32;
  int block = 0;  // rows: block columns; cols: block rows; tiles, dual: 16; generic: 0 (any shape)
  bool rht = false;
  AmaxStrategy amax = AmaxStrategy::none;
};

// The random-bit contract of q's stochastic rounding (core/sr.hpp) on rows of
// `cols` elements, as the kernels read it (KParams::sr): the contract; the
// width W of an element's random value (sr_width: 32, or 8 under ptx_x4); the
// elements a word (sr_group: 1 or 4); element k's lsb in its word,
// k * lsb_step (sr_lsb); the words a row (sr_words_per_row: cols, or
// ceil(cols / 4)). Computed by the host compiler (quantize_plan.cpp): nvcc
// compiles sr.hpp's functions for the device too wherever a .cu file calls
// them, and there they may not read the host format constants they compare
// with, so .cu files call them in constant expressions only.
struct SrLayout {
  SrBits bits = SrBits::per_element;
  int width = 32, group = 1, lsb_step = 0;
  int64_t words_per_row = 0;
};
SrLayout sr_layout(const QuantizerSpec& q, int64_t cols);

// The fused family of q's block shape and RHT, or nullopt (generic only).
std::optional<Family> fused_family(const QuantizerSpec& q);
// The plan of quantize_device(q, ..., path, tensor_amax_bits != null); throws
// fp4lab::Error where `path` cannot run q.
KernelPlan plan_quantize(const QuantizerSpec& q, InputType in, QuantPath path, bool amax_given);
// The plan of quantize_dual_device, or nullopt where one pass cannot make both.
std::optional<KernelPlan> plan_dual(const QuantizerSpec& row_q, const QuantizerSpec& col_q, InputType in, int64_t rows,
                                    int64_t cols, bool amax_given);

}  // namespace fp4lab::cuda::qk
