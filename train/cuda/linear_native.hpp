// CudaLinear's native-operand route (train/cuda/linear.hpp): the forward
// (y = x W^T) and dgrad (dx = dy W) GEMMs of a layer whose W is stored as its
// packed NVFP4 cast (StoredNvfp4, train/cuda/cast_store.hpp) take their
// operands as codes, not as BF16 values:
//   the other operand (x for the forward, dy for dgrad): quantize_device's
//       packed e2m1 codes (CodeLayout::packed4) and UE4M3 scale codes of its
//       plan's one NVFP4 [1,16] quantizer, into the layer's NativeScratch;
//   W: the stored cast as it is, never quantized again: packed_operand (the
//       forward's B = W [out, in], k = in) or packed_operand_columnwise (dgrad's
//       B = W^T [in, out], k = out; made into NativeScratch::wt);
//   the GEMM: cuda::quantized_gemm_device (y [m, n] = A B^T, row-major), whose
//       alpha is g_dec(A) * g_dec(B); then the bias and the output form in a
//       pass of their own (native_gemm below), so the layer's outputs keep
//       today's contract.
// Both GEMMs' outputs are row-major [B, out] / [B, in]: the memory of the
// column-major y^T / dx^T (ldc = out / in) that the BF16 route writes.
// wgrad (dW = dy^T x, k = the batch) stays on the BF16 route.
//
// The route rule (native_route): W a StoredNvfp4 whose plan takes W as it is
// (the condition under which prepare_w substitutes the stored cast), the other
// operand's plan a single NVFP4 [1,16] quantizer that blackwell_native_supported
// pairs with nvfp4_2d, and then GemmPath::blackwell_native where the device's
// compute capability is >= 100 (and k % 16 == 0: a packed row is then k / 2
// whole bytes). Otherwise the BF16 decode route (prepare_w), bits unchanged.
// A test-only switch (CudaLinear::force_native_route) takes the same route
// with GemmPath::hopper_bf16 on any GPU: every step of it runs but cuBLASLt's
// FP4 call (which the hopper_bf16 GEMM replaces by the exact BF16 decode of the
// same codes, so only the accumulation order differs from the BF16 route).
//
// The blackwell_native GEMM is compiled (sm_90a and sm_100a builds) and has
// never been executed: no sm_100 GPU was available (docs/log/2026-12-04-native-wiring.md).
#pragma once

#include <cstdint>
#include <optional>

#include <cuda_runtime.h>

#include "cuda/device.hpp"
#include "cuda/gemm.hpp"
#include "cuda/packed_operand.hpp"
#include "cuda/quantize.hpp"
#include "train/backend.hpp"
#include "train/cuda/cast_store.hpp"

namespace fp4lab::train::linear_detail {

// The alignment that a native GEMM's W codes get: cuBLASLt's heuristic assumes
// 256-byte aligned operands by default. A tensor's row-wise codes lie at its
// offset in the store's packed buffer (any byte), so native_w copies them to
// scratch where they are not so aligned.
inline constexpr uintptr_t kNativeAlign = 256;

// A GEMM the native route takes: W's stored cast, the other operand's
// quantizer and the GemmPath handed to quantized_gemm_device.
struct NativeRoute {
  const StoredNvfp4* w = nullptr;
  QuantizerSpec other;
  cuda::GemmPath path = cuda::GemmPath::blackwell_native;
};

// Whether W's operand of plan p is the layer's stored cast as it is: W is stored (l.w_stored), the values
// are a weight cast (ctx.weight_cast) and p does not change them. Both routes take the stored form then:
// prepare_w decodes it to BF16, native_route hands its codes to the GEMM.
inline bool takes_stored_w(const LayerPlan& l, const OperandPlan& p) {
  return l.w_stored != nullptr && l.ctx.weight_cast != nullptr && !p.changes();
}

// The one rule (see the file comment) for the GEMM whose W operand is w_op
// (fwd_w or dgrad_w), of reduction length k: `other` is the other operand's
// plan as one quantizer (linear_impl.hpp's single_quantizer; nullopt: it is
// not one), cc the device's compute capability, forced the test switch.
// Host only (no device work): nullopt where the BF16 route runs.
std::optional<NativeRoute> native_route(const LayerPlan& l, Operand w_op, const std::optional<QuantizerSpec>& other,
                                        int64_t k, int cc, bool forced);

// Scratch of the native route (grow-only, the layer's).
struct NativeScratch {
  cuda::DeviceBuffer<uint8_t> codes, scale_codes;  // the other operand's packed codes and UE4M3 scale codes
  cuda::DeviceBuffer<float> g{1};                  // its g_dec
  cuda::DeviceBuffer<uint8_t> w_codes;             // an aligned copy of W's row-wise codes (kNativeAlign)
  cuda::ColumnwiseScratch wt;                // dgrad's W^T
  cuda::GemmWorkspace gemm;                  // quantized_gemm_device's
  cuda::DeviceBuffer<float> out_f32;               // a BF16 output's FP32 GEMM result
};

// The other operand: src [rows, cols] (FP32, device) quantized by q with random
// stream rs into s's codes, scale codes and g_dec (asynchronous on `stream`).
cuda::QuantOperand native_codes(const QuantizerSpec& q, RandomStream rs, const float* src, int64_t rows, int64_t cols,
                                NativeScratch& s, cuda::QuantWorkspace& qws, cudaStream_t stream);

// W's operand from its stored cast, read now (w.form's pointers are not kept:
// the store may move its buffer between gathers): the row-wise [rows, cols]
// (its codes copied into s.w_codes where not kNativeAlign-aligned), or with
// columnwise the column-wise [cols, rows] into s.wt.
cuda::QuantOperand native_w(const StoredNvfp4& w, bool columnwise, int64_t rows, int64_t cols, NativeScratch& s,
                            cudaStream_t stream);

// y [m, n] = a b^T (m = a.rows, n = b.rows, row-major) by quantized_gemm_device on `path`, then the layer's
// output: FP32 y plus the bias (b[c] added to column c, one FP32 add: add_bias_device), or, where y_bf16 is
// given, the FP32 result into s.out_f32 and its BF16 bits r(acc + r(bias)) (bias_round_bf16_device) into y_bf16
// (y unused). bias may be null. k = 0: the product is zero.
void native_gemm(cuda::Blas& blas, cuda::GemmPath path, const cuda::QuantOperand& a, const cuda::QuantOperand& b,
                 float* y, uint16_t* y_bf16, const float* bias, NativeScratch& s, cudaStream_t stream);

}  // namespace fp4lab::train::linear_detail
