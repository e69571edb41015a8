// The quantized linear layer y = x W^T + b on the GPU (the trainer's CUDA
// backend), executing the same recipe plan as the CPU reference
// (train/cpu/linear.hpp, recipes/linear_plan.hpp linear_plan()): same quantizers, same
// RandomStream per operand, same double quantization, same wgrad RHT, same
// bf16 rounding of unquantized operands, same reuse of Q_fwd_w(W) for dgrad.
// The quantized (or bf16-rounded) GEMM operands are bit-identical to the CPU's;
// the GEMM outputs differ from the CPU only by FP32 accumulation order:
//   - operands that are plain FP32: cuBLAS SGEMM in pure FP32 (no TF32);
//   - operands whose values are exact in BF16 (quantized with an element of
//     at most 8 significant bits times an e8m0/ue4m3 block scale, no
//     quantizer-level RHT, or bf16-rounded): cuBLAS BF16 tensor-core GEMM with
//     FP32 accumulation, alpha = g_dec(A) * g_dec(B) (device pointer mode;
//     written by the later operand's quantization where the other's g_dec is
//     already on the device, else by a one-thread kernel);
//   - otherwise: fake-quantized FP32 operands and SGEMM.
// db = column sums of dy in float64, rounded once to float and added to db_acc
// (train/cuda/nn.hpp column_sum_acc: blocks of 256 rows summed in a fixed order;
// bit-identical to the CPU for up to 256 rows), deterministic.
// Backward needs the forward's x: the state keeps a copy (allocated with
// `alloc`), and, when the plan reuses Q_fwd_w(W) for dgrad, that operand.
//
// Shapes (row-major, device memory): x [B, in], W [out, in], b [out] (device,
// may be null), y [B, out], dy [B, out], dx [B, in], dW [out, in].
// Everything runs on the default stream; the calls return without
// synchronising.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>

#include "train/backend.hpp"

namespace fp4lab::cuda {
struct QuantOperand;               // cuda/gemm.hpp
enum class GemmPath : uint8_t;     // cuda/gemm.hpp
}  // namespace fp4lab::cuda

namespace fp4lab::train {

class CudaLinear {  // owns cuBLAS handles and scratch; one per CudaBackend
 public:
  CudaLinear();
  ~CudaLinear();
  CudaLinear(const CudaLinear&) = delete;
  CudaLinear& operator=(const CudaLinear&) = delete;

  // Same contract as Backend::linear_forward / linear_backward (backend.hpp); all pointers are device pointers,
  // Tensor::data is device memory. dw_acc and db_acc are ACCUMULATED into.
  // `alloc(rows, cols)` returns a new device tensor; it is called for y (dx)
  // when y (dx) does not already have the output's shape.
  // `l`: the layer's plan for the pass (train/backend.hpp's LayerPlan; the backward gets its forward's).
  // x_from / dy_from: what the producer of x / dy wrote for this layer (null: nothing).
  // y_bf16 (dx_bf16), may be null: the output's BF16 storage (Backend::linear_forward's y_out): y (dx) is
  // written there alone as BF16, y = r(acc + r(b)) (with the plan's bias), dx = r(acc), the bits that the FP32
  // output rounded by add_bias_bf16_device (round_bf16_inplace) holds; y (dx) is then neither allocated nor
  // written. The GEMM writes the BF16 itself where its operands are both plain BF16 roundings and there is
  // no bias (cuBLASLt's BF16 output); otherwise an FP32 GEMM into scratch and one rounding pass.
  void forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
               std::unique_ptr<LinearState>& state, const std::function<Tensor(int64_t, int64_t)>& alloc,
               const ProducerOutputs* x_from = nullptr, uint16_t* y_bf16 = nullptr);
  void backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy, Tensor& dx,
                Tensor& dw_acc, float* db_acc, const std::function<Tensor(int64_t, int64_t)>& alloc,
                const ProducerOutputs* dy_from = nullptr, uint16_t* dx_bf16 = nullptr);
  // The same, planned on the spot (tests).
  void forward(const LinearContext& ctx, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
               std::unique_ptr<LinearState>& state, const std::function<Tensor(int64_t, int64_t)>& alloc) {
    forward(plan_layer(ctx), x, w, b, y, state, alloc);
  }
  void backward(const LinearContext& ctx, const LinearState& state, const Tensor& w, const Tensor& dy, Tensor& dx,
                Tensor& dw_acc, float* db_acc, const std::function<Tensor(int64_t, int64_t)>& alloc) {
    backward(plan_layer(ctx), state, w, dy, dx, dw_acc, db_acc, alloc);
  }

  // Backend::grouped_linear_forward / backward (train/backend.hpp: the bits of
  // each non-empty group's own forward / backward above, in group order) as
  // one layer where every group's plan has one form (grouped_linear.cpp):
  //   bf16  every operand its plain BF16 rounding (the bf16 recipe, layers
  //         kept in BF16): x, dy and the E weights each rounded in one launch;
  //   fp32  every operand plain FP32 (no recipe, layers kept in FP32);
  //   quantized  every operand one BF16-exact quantization of its source
  //         (single_quantizer: no double quantization, the wgrad RHT folded
  //         into [16,1] blocks), every group's plan group 0's but for its
  //         random streams, no weight cast (nvfp4, nvfp4_fwd_mxfp8_bwd, the
  //         MX recipes, fp4_all_the_way): each operand of all groups in one
  //         grouped quantization (x, dy, and the E weights read where they
  //         lie), the GEMM alphas written by the quantizations.
  // Each group's GEMM is the dense layer's GEMM call with the same
  // arguments, its operands at 256-byte-aligned starts as the dense layer's
  // scratch is (cuBLAS's choice of kernel may depend on alignment).
  // grouped_forward returns false and does nothing for other plans (the
  // caller runs the default); grouped_backward returns false for a state
  // grouped_forward did not write.
  bool grouped_forward(const LinearGroups& g, const Tensor& x, Tensor& y, std::unique_ptr<LinearState>& state,
                       const std::function<Tensor(int64_t, int64_t)>& alloc);
  bool grouped_backward(const LinearGroups& g, const LinearState& state, const Tensor& dy, Tensor& dx,
                        std::span<Tensor> dw_acc, std::span<float* const> db_acc,
                        const std::function<Tensor(int64_t, int64_t)>& alloc);

  // Backend::linear_input_needs: what the plan wants of the producer of x
  // (grad: of dy), a [rows, cols] tensor. bf16: both GEMM operands of the
  // tensor are its plain BF16 rounding, which forward (backward) then takes
  // from x_from (dy_from) where written. amax: the two amaxes of the one-pass
  // NVFP4 quantization of both operands (quantize_dual_device) with a
  // tensor-amax global scale, taken from x_from (dy_from) where written for
  // the same request instead of the layer's own amax pass.
  LinearInputNeeds input_needs(const LayerPlan& l, bool grad, int64_t rows, int64_t cols) const;

  // Test hook: when set, every GEMM operand the layer prepares is reported as
  // (operand, device pointer to its FP32 value [rows, cols] row-major, rows,
  // cols) before the GEMM runs: the exact value multiplied (for BF16 GEMM
  // operands, decode(code) * scale * g_dec in FP32, i.e. the CPU's fake-quantized
  // value). Null by default (no extra work).
  using OperandHook = std::function<void(Operand, const float*, int64_t, int64_t)>;
  void set_operand_hook(OperandHook hook);

  // The native-operand route of the forward and dgrad GEMMs (train/cuda/linear_native.hpp): where W is stored
  // as its packed NVFP4 cast (LayerPlan::w_stored) and taken as it is, and the other operand is one NVFP4
  // [1,16] quantizer, the GEMM takes W's packed codes (never quantized again) and the other operand's codes
  // (cuda::quantized_gemm_device), on sm_100 and newer (GemmPath::blackwell_native); elsewhere the BF16 decode.
  // Test only: force_native_route(true) takes that route on any GPU with GemmPath::hopper_bf16 (the same
  // operands, decoded exactly to BF16 inside the GEMM), so that everything but cuBLASLt's FP4 call runs on
  // Hopper. Off by default.
  void force_native_route(bool on);
  // Test hook: when set, each operand handed to a native-route GEMM is reported (the operand: fwd_x, fwd_w,
  // dgrad_grad_y, dgrad_w; the cuda::QuantOperand as quantized_gemm_device takes it, dgrad_w being W^T; the
  // path) before the GEMM runs. Null by default.
  using NativeHook = std::function<void(Operand, const cuda::QuantOperand&, cuda::GemmPath)>;
  void set_native_hook(NativeHook hook);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp4lab::train
