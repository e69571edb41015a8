// GEMMs on the GPU: cuBLAS BF16 and the block-scaled (NVFP4 / MXFP4 / MXFP8)
// products of quantized operands.
//
// Convention (as sim/gemm.hpp): row-major A [m, k] and B [n, k], both quantized
// along k; y [m, n] = dq(A) dq(B)^T.
//
// Paths, chosen at run time by the device's compute capability:
//   hopper_bf16   (any GPU; the one used below sm_100): each operand is
//                 dequantized to BF16 as decode(code) * block_scale, WITHOUT
//                 the NVFP4 global decode scale. For e2m1 x ue4m3 (NVFP4), e2m1
//                 x e8m0 (MXFP4) and e4m3/e5m2 x e8m0 (MXFP8) this product has
//                 at most 8 significant bits, so it is exact in BF16 as long as it
//                 lies in BF16's range (always for NVFP4; for MX scales, |v| <
//                 2^128 and >= 2^-133). cuBLAS then multiplies on the BF16
//                 tensor cores with FP32 accumulation, and the epilogue applies
//                 alpha = g_dec(A) * g_dec(B). The only difference from sim's
//                 quantized_gemm is the accumulation order (and the rounding of
//                 the g_dec product): compare at a tolerance.
//                 MXFP8 also takes this path by default (see hopper_fp8).
//   hopper_fp8    (sm_89 and newer, MX [1,32] e8m0 with e4m3 / e5m2 elements,
//                 chosen only when asked for): MXFP8 on the FP8 tensor cores,
//                 one mma.sync k32 step per MX block, each partial promoted into
//                 the FP32 accumulator with its two power-of-two scales
//                 (gemm_fp8.cu). The tensor cores' internal accumulation of a
//                 k32 partial is narrower than FP32, so this path is NOT
//                 equivalent to sim's quantized_gemm up to order only: compare
//                 at a tolerance relative to sum |a||b|.
//   hopper_fp8_block (sm_90 and newer, FP8 block scaling: A [1,128], B [1,128] or
//                 [128,128], FP32 or E8M0 scales, chosen only when asked for):
//                 cuBLASLt's block-scaled FP8 matmul (VEC128_32F / BLK128x128_32F
//                 scale modes, CUDA 12.9+; split accumulation), the scales laid out
//                 as TransformerEngine lays them out for it. Tensor-core
//                 accumulation: compare at a tolerance.
//   blackwell_native (sm_100 and newer, NVFP4 [1,16] or [16,16] ue4m3 with
//                 e2m1 (a [16,16] tile's scale given to each of its rows as
//                 its [1,16] scale), or MX [1,32] e8m0 with e2m1 / e4m3 /
//                 e5m2): cuBLASLt's block-scaled
//                 matmul (CUDA_R_4F_E2M1 with CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3,
//                 FP8 with VEC32_UE8M0), operands in the packed / swizzled layouts
//                 of cuda/packing.hpp. NOT RUN: written against the cuBLASLt
//                 documentation, compiled, never executed (no Blackwell GPU).
#pragma once

#include <cstdint>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/tensor.hpp"
#include "cuda/device.hpp"
#include "cuda/quantize.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::cuda {

// cuBLAS and cuBLASLt handles plus a workspace (one per thread / stream).
class Blas {
 public:
  explicit Blas(cudaStream_t stream = nullptr);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t handle() const { return h_; }
  cublasLtHandle_t lt() const { return lt_; }
  void* workspace() const { return ws_.data(); }
  size_t workspace_bytes() const { return ws_.bytes(); }
  cudaStream_t stream() const { return stream_; }

 private:
  cublasHandle_t h_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer<uint8_t> ws_;
  cudaStream_t stream_ = nullptr;
};

void check_cublas(cublasStatus_t s, const char* what);

enum class OutType : uint8_t { f32, bf16 };

// One cuBLASLt matmul y [m, n] = alpha A [m, k] B [n, k]^T + beta y, row-major,
// k contiguous in A and B, FP32 compute and scale type. In cuBLAS's
// column-major terms this is y^T = B A^T with TRANSA = T: cuBLAS's "A" is our
// B, so its A_SCALE_* attributes describe our B. The descriptors are destroyed
// with the object. run() takes the heuristic's first algorithm within blas's
// workspace, on blas's stream; alpha/beta follow the pointer mode (host unless
// set). Errors throw fp4lab::Error naming `what`.
class LtGemmNT {
 public:
  LtGemmNT(cudaDataType_t a_type, cudaDataType_t b_type, cudaDataType_t y_type, int64_t m, int64_t n, int64_t k);
  ~LtGemmNT();
  LtGemmNT(const LtGemmNT&) = delete;
  LtGemmNT& operator=(const LtGemmNT&) = delete;
  void set(cublasLtMatmulDescAttributes_t attr, const void* value, size_t bytes, const char* what);
  void run(Blas& blas, const void* alpha, const void* a, const void* b, const void* beta, void* y,
           const char* what) const;

 private:
  void release();
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, ly_ = nullptr;  // cuBLAS's A (our B), B (our A), C = D
};

// y [m, n] = alpha * A [m, k] B [n, k]^T; A, B row-major BF16 bits; FP32
// accumulation on the tensor cores. alpha_beta_dev (device pointer to the two
// floats {alpha, 0.0f}) overrides alpha.
void gemm_bf16_nt(Blas& blas, const uint16_t* a, const uint16_t* b, void* y, OutType out, int64_t m, int64_t n,
                  int64_t k, float alpha = 1.0f, const float* alpha_beta_dev = nullptr);

// A quantized operand on the device (as quantize_device() writes it).
struct QuantOperand {
  QuantizerSpec spec;
  int64_t rows = 0, cols = 0;
  const uint8_t* codes = nullptr;  // in `layout`
  CodeLayout layout = CodeLayout::bytes;
  const uint8_t* scale_codes = nullptr;  // row-major [scale_rows, scale_cols]
  const float* scales = nullptr;         // float32 block scales, used when scale_codes is null (and always for
                                         // TE's NVFP4 options, whose scales are final: schemes/te_nvfp4/rule.hpp)
  const float* global_decode = nullptr;  // device float, may be null (= 1)
};

// alpha_beta[0] = g_dec(A) * g_dec(B) (null pointer = 1), alpha_beta[1] = 0.
void set_alpha_device(const float* ga, const float* gb, float* alpha_beta, cudaStream_t stream = nullptr);

// BF16 GEMM operand of a quantized tensor: decode(code) * block_scale (no g_dec).
void dequant_operand_bf16(const QuantOperand& q, uint16_t* out, cudaStream_t stream = nullptr);

enum class GemmPath : uint8_t { automatic, hopper_bf16, hopper_fp8, hopper_fp8_block, blackwell_native };
bool blackwell_native_supported(const QuantizerSpec& qa, const QuantizerSpec& qb);

// True when A is FP8 block-scaled in [1,128] blocks and B in [1,128] or [128,128] (hopper_fp8_block).
bool fp8_block_gemm_supported(const QuantizerSpec& qa, const QuantizerSpec& qb);

// True when both operands are MX [1,32] E8M0-scaled e4m3/e5m2 without RHT.
bool fp8_tensor_core_supported(const QuantizerSpec& qa, const QuantizerSpec& qb);

// y [m, n] = alpha * dq(A) dq(B)^T on the FP8 tensor cores (hopper_fp8 above).
// A, B: byte codes, E8M0 scale codes; k a multiple of 16, code buffers 16-byte
// aligned; alpha_dev a device float or null (= 1). Throws fp4lab::Error naming
// the violated condition otherwise.
void mxfp8_gemm_fp8_tensor_cores(const QuantOperand& a, const QuantOperand& b, void* y, OutType out,
                                 const float* alpha_dev, cudaStream_t stream = nullptr);

// Scratch reused between calls.
struct GemmWorkspace {
  DeviceBuffer<uint16_t> a16, b16;   // hopper_bf16 operands
  DeviceBuffer<uint8_t> a_sw, b_sw;  // blackwell swizzled scales
  DeviceBuffer<float> alpha;         // [2] {g_dec(A) * g_dec(B), 0}
  DeviceBuffer<float> a_scales, b_scales;  // hopper_fp8_block: the FP32 scales in cuBLASLt's layouts
};

// y = dq(A) dq(B)^T for quantized operands (A.cols == B.cols == k).
// Returns the path taken.
GemmPath quantized_gemm_device(Blas& blas, const QuantOperand& a, const QuantOperand& b, void* y, OutType out,
                               GemmWorkspace& ws, GemmPath path = GemmPath::automatic);

// Host convenience (tests): quantizes a and b on the GPU, multiplies, returns y
// [m, n] FP32 (compare with sim's quantized_gemm at a tolerance).
Tensor<float> quantized_gemm_gpu(const QuantizerSpec& qa, MatrixView<const float> a, const QuantizerSpec& qb,
                                 MatrixView<const float> b, RandomStream rs_a = {}, RandomStream rs_b = {},
                                 GemmPath path = GemmPath::automatic);

}  // namespace fp4lab::cuda
