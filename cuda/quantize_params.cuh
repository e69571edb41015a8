// The quantization kernels' parameters and compile-time choices, private to
// cuda/: KParams (what every kernel receives), the kinds (compile-time element
// and scale formats), the fast forms (Fast: one rounding mode's code per
// kernel), the host-side predicates that choose a kernel form (fast_rn_applies,
// full_spans_apply, ...), and launch helpers. Part of quantize_kernels.cuh.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/encode.hpp"
#include "core/format.hpp"
#include "core/philox.hpp"
#include "core/sr.hpp"
#include "cuda/amax_device.cuh"
#include "cuda/fast_div.hpp"
#include "cuda/quantize.hpp"
#include "cuda/quantize_plan.hpp"
#include "sim/rht.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab::cuda::qk {

constexpr int kThreads = 256;

// Optional end of a tensor-amax pass (quantize_amax.cuh, amax_pass_done): where the grid's
// last block writes NvGlobal of the final amax (out[0..2] = g_enc, g_dec,
// mult), and the block counter it uses (zero between passes). out == null: off.
struct AmaxFinish {
  Format elem, sfmt;
  float* out = nullptr;
  uint32_t* done = nullptr;
};

// Everything a quantization kernel needs, passed by value (kernel parameter
// space). Formats travel by value: their constexpr globals are host objects.
struct KParams {
  Format elem, sfmt;
  ScaleRule rule;
  Round round;
  Overflow overflow;
  bool global;  // nv rule with global_scale tensor_amax
  int64_t rows, cols, nbc;
  int64_t br, bc;  // generic path block shape (whole tensor for [0,0])
  const void* x;
  uint64_t seed, stream;
  SrLayout sr;  // stochastic rounding's random-bit contract (quantize_plan.hpp)
  float signs[16];       // RHT signs (sim/rht.hpp rht_sign)
  uint32_t* gamax;       // tensor amax bits (read by nv+global; written by amax passes)
  const float* gparams;  // optional precomputed NvGlobal {g_enc, g_dec, mult} of *gamax
  uint32_t* block_amax;  // generic path [nbr*nbc]
  float* block_mult;     // generic path
  float* block_scale;    // generic path
  AmaxFinish fin;        // amax passes: NvGlobal of the result by the last block
  QuantOutputs out;
  // FULL kernel forms (full_params): the count of work units (row-kernel
  // threads, tile-kernel warps) and the division of a unit index by the units
  // per row (of elements, or of tiles).
  uint32_t units = 0;
  FastDivU31 unit_div;
};

__device__ __forceinline__ uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

// The compile-time formats of kernel kind K (KernelKind, quantize_plan.hpp).
// kind_format<K>() is kind K's element format (K != runtime): the one place
// that maps a kind to it; the codec helpers take it as a template argument.
template <KernelKind K>
FP4LAB_HD constexpr const Format& kind_format() {
  static_assert(K != KernelKind::runtime, "the runtime kind has a run-time format");
  if constexpr (e2m1_kind(K)) {
    return float4_e2m1fn;
  } else if constexpr (K == KernelKind::e4m3) {
    return float8_e4m3fn;
  } else {
    return float8_e5m2;
  }
}
template <KernelKind K>
__device__ __forceinline__ Format kind_elem(const KParams& p) {
  if constexpr (K != KernelKind::runtime) {
    constexpr Format f = kind_format<K>();
    return f;
  } else {
    return p.elem;
  }
}
template <KernelKind K>
__device__ __forceinline__ Format kind_scale(const KParams& p) {
  if constexpr (K == KernelKind::nvfp4) {
    constexpr Format f = ufloat8_e4m3;
    return f;
  } else {
    return p.sfmt;
  }
}

// Does p's tensor hold fewer than 2^31 elements (every FULL form's host
// condition, so that elem_index<true> and the strip indices fit 32 bits)?
inline bool index32_fits(const KParams& p) { return p.rows * p.cols < (int64_t(1) << 31); }

// The fast forms of a kernel (template argument): none (every mode), rn, rs
// (the row kernels' encode_store_rn / encode_store_rs_fast; encode_and_store's
// FM), rn_bf16 / rs_bf16 (rn / rs, E2M1 elements with UE4M3 or E8M0 scales
// (nvfp4, e2m1 kinds), rn_bf16 also E4M3 / E5M2 (e4m3, e5m2, saturating), and the
// one element output is the BF16 GEMM operand: the trainer's;
// encode_and_store only). A kernel compiled for one fast form holds none of
// the other modes' code, so that its register count, and with it its
// occupancy, is its own.
// The SR forms come in two random-bit contracts (KParams::sr.bits): rs,
// rs_bf16, rs_bf16_div draw per_element's words (one Philox group per 4
// elements, 32 bits an element), their _x4 twins ptx_x4's (one word per 4
// columns of a row, 8 bits an element: one Philox group per 16 elements).
enum class Fast { none, rn, rs, rn_bf16, rs_bf16, rn_bf16_div, rs_bf16_div, rs_x4, rs_bf16_x4, rs_bf16_div_x4 };
// The value forms; _div: fp4-trainkit's nv_noglobal rule (x / scale; E2M1 with
// UE4M3 scales, the nvfp4 kind), which the other fast forms exclude.
FP4LAB_HD constexpr bool value_form_sr(Fast fm) {
  return fm == Fast::rs_bf16 || fm == Fast::rs_bf16_div || fm == Fast::rs_bf16_x4 || fm == Fast::rs_bf16_div_x4;
}
FP4LAB_HD constexpr bool value_form_div(Fast fm) {
  return fm == Fast::rn_bf16_div || fm == Fast::rs_bf16_div || fm == Fast::rs_bf16_div_x4;
}
FP4LAB_HD constexpr bool value_form(Fast fm) {
  return fm == Fast::rn_bf16 || fm == Fast::rn_bf16_div || value_form_sr(fm);
}
// The SR forms that store codes (the row kernels' encode_store_rs_fast).
FP4LAB_HD constexpr bool code_form_sr(Fast fm) { return fm == Fast::rs || fm == Fast::rs_x4; }
// The forms of the ptx_x4 contract.
FP4LAB_HD constexpr bool x4_form(Fast fm) {
  return fm == Fast::rs_x4 || fm == Fast::rs_bf16_x4 || fm == Fast::rs_bf16_div_x4;
}
// SR form fm (per_element's) in contract b: itself, or its _x4 twin.
FP4LAB_HD constexpr Fast sr_form(Fast fm, SrBits b) {
  if (b == SrBits::per_element) return fm;
  return fm == Fast::rs ? Fast::rs_x4 : fm == Fast::rs_bf16 ? Fast::rs_bf16_x4 : Fast::rs_bf16_div_x4;
}

// Is p's one element output the BF16 GEMM operand (the condition of the
// _bf16 fast forms on the outputs)?
inline bool bf16_operand_only(const KParams& p) {
  const QuantOutputs& o = p.out;
  return o.dequant_bf16 && o.bf16_gemm_operand && !o.codes && !o.dequant;
}

// Kinds with a fast rn path (encode_store_rn_fast): E2M1 (nvfp4, e2m1) under
// either policy (it always saturates), E4M3FN / E5M2 when saturating.
inline bool fast_rn_applies(KernelKind kind, const KParams& p) {
  return kind != KernelKind::runtime && p.round == Round::rn && p.rule != ScaleRule::nv_noglobal &&
         (e2m1_kind(kind) || p.overflow == Overflow::saturate);
}
// Are the input and every requested output of p 16-byte aligned?
inline bool bases_aligned16(const KParams& p) {
  auto aligned16 = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; };
  const QuantOutputs& o = p.out;
  return aligned16(p.x) && (!o.codes || aligned16(o.codes)) && (!o.dequant || aligned16(o.dequant)) &&
         (!o.dequant_bf16 || aligned16(o.dequant_bf16));
}

// May a fast-form kernel (Fast::rn / Fast::rs) whose threads each take `elems`
// consecutive elements of a row take its FULL form (no bounds or alignment
// checks, 32-bit indices)?
// Whole thread spans (cols % elems == 0, elems a multiple of 16: then every
// span of every output starts aligned for its vector stores given 16-byte
// aligned bases: 16 bytes, or 8 for the 8 bytes of 16 FP4 codes), aligned
// bases, fewer than 2^31 elements.
inline bool full_spans_apply(const KParams& p, int elems) {
  return elems % 16 == 0 && p.cols % elems == 0 && index32_fits(p) && bases_aligned16(p);
}

// p for a FULL kernel form of `units` work units, `per_row` of them per row
// (full_spans_apply() holds, so both fit in 31 bits).
inline KParams full_params(const KParams& p, int64_t units, int64_t per_row) {
  KParams f = p;
  f.units = uint32_t(units);
  f.unit_div = FastDivU31::of(uint32_t(per_row));
  return f;
}

// Do the fast SR forms' runs of 4 elements (from a column c0 % 4 == 0) each
// take whole random words? per_element: element r * cols + c's word is
// r * cols + c, one Philox group per aligned 4 (cols % 4 == 0 keeps every
// row's groups aligned); ptx_x4: the 4 share word r * ceil(cols / 4) + c0 / 4,
// any cols (core/sr.hpp).
inline bool sr_runs_aligned(const KParams& p) { return p.sr.bits == SrBits::ptx_x4 || p.cols % 4 == 0; }

// Kinds with a fast SR path (encode_store_rs_fast): all but runtime under rs (not the
// nv_noglobal rule, which divides), where sr_runs_aligned().
inline bool fast_rs_applies(KernelKind kind, const KParams& p) {
  return kind != KernelKind::runtime && p.round == Round::rs && p.rule != ScaleRule::nv_noglobal &&
         sr_runs_aligned(p);
}

// How many blocks of kThreads threads (no dynamic shared memory) of `kernel`
// the GPU holds at once: SMs x resident blocks per SM (0 if it cannot run),
// the size of a cooperative or persistent grid. Callers keep it (static).
template <class Kernel>
int64_t resident_blocks(Kernel kernel) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  return int64_t(sms) * per_sm;
}

// Lets Kernel take `bytes` (> 48 KB) of dynamic shared memory: the attribute
// is set on the first call only (it applies to every later launch).
template <auto Kernel>
void allow_dynamic_smem(size_t bytes, const char* what) {
  static const cudaError_t e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  check(e, what);
}

// Launchers (quantize_rows.cu, quantize_cols.cu) of a plan's row blocks
// [1,bc] (one thread per block) or column blocks [br,1] (one thread per
// br x V strip) of kind `kind`; the _amax forms: the RHT amax pass of [1,16] /
// [16,1] blocks, which only atomicMax the transformed tensor's amax into
// *p.gamax (finished by p.fin).
void launch_rows(const KParams& p, int bc, bool rht, KernelKind kind, InputType in, cudaStream_t st);
void launch_cols(const KParams& p, int br, bool rht, KernelKind kind, InputType in, cudaStream_t st);
void launch_rows_amax(const KParams& p, InputType in, cudaStream_t st);
void launch_cols_amax(const KParams& p, InputType in, cudaStream_t st);
// quantize_dual.cu: pr ([1,16] blocks) and pc ([16,1] blocks, RHT when rht)
// of the same input in one pass; amax_only: both tensor amaxes (pc's of the
// RHT output) into pr.gamax / pc.gamax, finished by pr.fin / pc.fin.
void launch_dual(const KParams& pr, const KParams& pc, bool rht, InputType in, bool amax_only, cudaStream_t st);

}  // namespace fp4lab::cuda::qk
