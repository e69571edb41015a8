// Grouped (mixture-of-experts) quantization and GEMMs on the GPU.
//
// Quantization: quantize_grouped_device is sim/grouped.hpp's
// quantize_grouped on the device, bit for bit: rows cut into consecutive
// groups (tokens permuted by expert; a 3-D expert weight [E, N, K] as E groups
// of N rows), each group quantized ALONE by quantize_device (cuda/quantize.hpp)
// on its own row slice, with its own RandomStream and its own global scale.
// Outputs in sim/grouped.hpp's concatenated layout: codes, dequant and the
// BF16 operand [rows, cols] row-major (group g at its row offset); block
// scales of group g its own [scale_rows_g, scale_cols] matrix, stacked in
// group order (grouped_scale_row_offsets); global_decode [groups] (1 for an
// empty group and where the rule has none). Two launch forms (GroupedLaunch):
// one_launch quantizes every group in one kernel (after one amax pass over
// all groups where the rule needs each group's amax: of its RHT output for
// column blocks with RHT), for the fused plans of row blocks without RHT, of
// 16x16 tiles and of column blocks [16,1] / [32,1] (with the RHT down 16-row
// chunks that start at each group's first row; a group's partial last chunk
// stays untransformed, as quantize_device on the group's slice); per_group runs one
// quantize_device per non-empty group, for every spec. The groups' slices
// need not start on any boundary beyond their element type's (one_launch's
// loads and stores check alignment per access; per_group follows
// quantize_device's alignment rule, cuda/quantize.hpp): where a group's
// kernels need its input slice 16-byte aligned and it is not (the tensor-amax
// pass of nvfp4 / nvfp4_col, e.g. f32 input with cols % 4 != 0),
// quantize_device copies that slice into QuantWorkspace::staging, grown once
// for the largest such group before any launch (quantize_staging_bytes).
// Output slices are written in place whatever their alignment.
//
// GEMMs on exact BF16 operands ("hopper_bf16" of cuda/gemm.hpp, per group):
// each operand is decode(code) * block_scale in BF16 (QuantOutputs::
// bf16_gemm_operand; exact for e2m1 x ue4m3 and the MX formats, cuda/
// quantize.hpp's bf16_exact), the product accumulates in FP32 on the tensor
// cores, and alpha_g (the product of the two operands' global decode scales
// of group g) is applied in cuBLAS's epilogue. Row-major, for group sizes m_g
// (tokens of expert g; M = sum m_g), hidden K and output width N:
//   forward  y_g  [m_g, N] = alpha_g * x_g [m_g, K] W_g [N, K]^T
//   dgrad    dx_g [m_g, K] = alpha_g * dy_g [m_g, N] W_g [N, K]
//   wgrad    dW_g [N, K]   = alpha_g * dy_g^T x_g  (+ dW_g when accumulating)
// with x [M, K], dy [M, N], y [M, N] and dx [M, K] concatenated over the
// groups (group g's rows at offset sum_{h<g} m_h) and W, dW [E, N, K]
// contiguous. An empty group (m_g = 0) writes no row of y / dx; its dW_g is
// set to +0 (accumulate = false) or left as it is (accumulate = true).
// Differences from sim's quantized_gemm per group: the accumulation order and
// the rounding of alpha * acc (one FP32 multiply, then the output rounding).
//
// Two implementations, the same semantics:
//   one_call  every non-empty group in ONE cublasGemmGroupedBatchedEx call
//             (cuBLAS 12.5+). Groups of one shape and one alpha go as one
//             cuBLAS "group" of several problems. cuBLAS's grouped GEMM reads
//             m/n/k, alpha and beta from HOST memory only (device pointer mode
//             answers CUBLAS_STATUS_NOT_SUPPORTED, seen with cuBLAS 13.0 on an
//             H100), and it has no BF16 x BF16 -> FP32 form (NOT_SUPPORTED,
//             same machine; documented forms: BF16->BF16, FP16->FP16,
//             FP32->FP32). Hence:
//               OutType::bf16  BF16 operands, BF16 output (the FP32 result
//                              alpha*acc rounded to nearest-even BF16), FP32
//                              compute: cuBLAS's BF16 tensor-core kernels;
//               OutType::f32   the BF16 operands are first widened to FP32 in
//                              the workspace (exact), then multiplied with
//                              CUBLAS_COMPUTE_32F_FAST_TF32: a BF16 value
//                              (8 significant bits) is exact in TF32 (11), so
//                              every product is exact and accumulates in FP32
//                              as on the BF16 path; TF32 tensor cores run at
//                              about half the BF16 rate, plus the widening
//                              pass (one read of 2 bytes and write of 4 bytes
//                              per operand element).
//             With OutType::bf16 and accumulate (wgrad, beta = 1), cuBLAS's
//             BF16 epilogue rounds more than once (both forms; seen: |err| up
//             to 0.7% of |alpha acc| + |C|): accumulate in FP32.
//   loop      one cublasGemmEx per non-empty group (BF16 operands, FP32 or BF16
//             output directly): the reference form of the tests and the
//             benchmark.
// Seen on an H100 (cuBLAS 13.0, `fp4lab bench grouped-gemm`): the one-call
// form ran at about 300 TFLOP/s (BF16 output) whatever the shape, the loop at
// up to 750 on large experts (E = 8, K = N = 4096); the one call wins only on
// many small experts (E = 64, K = N = 1024: 270-300 against 85-290).
// The device arrays of operand pointers that cublasGemmGroupedBatchedEx takes
// live in the workspace (one set per operation kind) and are uploaded only
// when they change. Use one GroupedGemmWorkspace per stream. Everything runs
// on blas.stream(); nothing synchronises the host, except
// grouped_alpha_host().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <cuda_runtime.h>

#include "core/tensor.hpp"
#include "cuda/device.hpp"
#include "cuda/gemm.hpp"
#include "cuda/quantize.hpp"
#include "sim/grouped.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::cuda {

// Outputs of quantize_grouped_device (device pointers; each optional, nullptr
// = not written), in sim/grouped.hpp's concatenated layout. With
// R = grouped_scale_row_offsets(q, sizes, cols).back() and C = scale_cols:
struct GroupedQuantOutputs {
  uint8_t* codes = nullptr;  // bytes: [rows * cols]; packed4: rows * ceil(cols / 2) bytes (QuantOutputs' layouts)
  CodeLayout code_layout = CodeLayout::bytes;
  uint8_t* scale_codes = nullptr;  // [R * C] (not for float32 scales)
  float* scales = nullptr;         // [R * C] decoded block scales
  float* dequant = nullptr;        // [rows * cols] FP32 (decode(code) * scale) * g_dec of the row's group
  uint16_t* dequant_bf16 = nullptr;  // [rows * cols] BF16 bits (QuantOutputs::dequant_bf16)
  bool bf16_gemm_operand = false;    // decode(code) * scale without g_dec (the GEMMs' operand)
  float* global_decode = nullptr;    // [groups]: g_dec of each group (1 for an empty group)
  // [groups], where not null: g_dec of group g times gemm_alpha_other[g] (g_dec
  // alone where that is null), the epilogue alpha of group g's GEMM when the
  // other operand is already quantized (QuantOutputs::gemm_alpha per group);
  // an empty group's entry is left as it is.
  float* gemm_alpha = nullptr;
  const float* gemm_alpha_other = nullptr;
  // Host [groups], or empty (the concatenated layout): the element where group
  // g's dequant and dequant_bf16 rows start (e.g. each group's GEMM operand at
  // a 256-byte-aligned start, as the dense layer's scratch, whose alignment
  // cuBLAS's choice of algorithm sees); codes and scales keep the concatenated
  // layout. Each >= 0; the caller keeps the groups' ranges apart.
  std::span<const int64_t> value_offsets;
};

// Row offsets of the groups' scale matrices: [groups + 1], group g's scale
// rows are [off[g], off[g + 1]) (ceil(rows_g / block_rows) of them; 0 for an
// empty group). scale_cols = ceil(cols / block_cols). Throws fp4lab::Error for
// a negative size or per-tensor scaling (block [0,0], which has no grouped form).
std::vector<int64_t> grouped_scale_row_offsets(const QuantizerSpec& q, std::span<const int64_t> sizes, int64_t cols,
                                               int64_t* scale_cols = nullptr);

// Scratch reused between grouped quantizations (one per stream).
struct GroupedQuantWorkspace {
  QuantWorkspace quant;  // per_group: quantize_device's (its staging too), shared by the groups
  // one_launch: the groups' table (offsets, random streams, amax work items)
  // on the device and its host image, each group's amax bits and the pass's
  // block counter ([groups + 1], zero between passes while `armed`), and each
  // group's global scale parameters [3 * groups].
  DeviceBuffer<int64_t> table;
  std::vector<int64_t> table_host;
  DeviceBuffer<uint32_t> amax;
  DeviceBuffer<float> gparams;
  bool armed = false;
};

// How quantize_grouped_device launches its kernels; the same bits either way.
//   automatic  one_launch where it applies, else per_group.
//   one_launch every group in one quantization kernel (after one per-group
//              amax pass where the rule has a tensor amax): the fused plans of
//              row blocks [1,16] / [1,32] without RHT, of [16,16] tiles and of
//              column blocks [16,1] (RHT or not) / [32,1], any group sizes, any
//              slice alignment; fp4lab::Error for another spec.
//   per_group  one quantize_device per non-empty group (two kernels each where
//              the rule needs the group's amax): every spec.
enum class GroupedLaunch : uint8_t { automatic, one_launch, per_group };
// Does automatic take one_launch for q on `path`?
bool grouped_one_launch_applies(const QuantizerSpec& q, QuantPath path = QuantPath::automatic);

// Quantizes x (row-major [rows, cols], float32 or bfloat16, device) group by
// group on `stream`. sizes: rows of each group (host; >= 0, summing to rows).
// streams: one RandomStream per group, or empty (each group draws from
// RandomStream{} like an unseeded quantize()). Bit-identical to sim's
// quantize_grouped(q, x, sizes, streams). Throws fp4lab::Error (before any
// device work) on bad sizes, a stream count other than 0 or groups, an invalid
// spec, or block [0,0]; quantize_device's errors otherwise.
// input_offsets: host [groups], or empty (x concatenated): the element of x
// where group g's sizes[g] rows of cols elements start (row-major, contiguous
// within the group; the groups anywhere, e.g. the experts' W at a constant
// stride in the flat parameters); `rows` stays sum(sizes). Each >= 0.
void quantize_grouped_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                             std::span<const int64_t> sizes, std::span<const RandomStream> streams,
                             const GroupedQuantOutputs& out, GroupedQuantWorkspace& ws, cudaStream_t stream = nullptr,
                             QuantPath path = QuantPath::automatic, GroupedLaunch launch = GroupedLaunch::automatic,
                             std::span<const int64_t> input_offsets = {});

// Host convenience for tests: uploads x (as bfloat16 when bf16_input; x must
// then hold bfloat16 values), quantizes it group by group on the GPU, returns
// sim's struct (codes one per byte; outputs poisoned before the run).
GroupedQuantizedTensor quantize_grouped_gpu(const QuantizerSpec& q, MatrixView<const float> x,
                                            std::span<const int64_t> sizes, std::span<const RandomStream> streams = {},
                                            QuantPath path = QuantPath::automatic, bool bf16_input = false,
                                            GroupedLaunch launch = GroupedLaunch::automatic);

// Per-group alpha of a grouped GEMM on the host: alpha[g] = ga[g] * gb[g] (one
// FP32 multiply, as set_alpha_device; a null pointer stands for ones), from two
// device arrays of `groups` global decode scales (GroupedQuantOutputs::
// global_decode). Copies them after the work queued on `stream` and WAITS for
// it: cuBLAS's grouped GEMM takes alpha from host memory only.
std::vector<float> grouped_alpha_host(const float* ga, const float* gb, size_t groups, cudaStream_t stream = nullptr);

enum class GroupedImpl : uint8_t { one_call, loop };

// Scratch reused between grouped GEMM calls (one per stream).
struct GroupedGemmWorkspace {
  struct Pointers {
    DeviceBuffer<const void*> dev;      // [3 * problems]: A, B, C pointers in cuBLAS's order
    std::vector<const void*> uploaded;  // what dev holds
  };
  Pointers ptrs[3];                  // one set per operation (forward, dgrad, wgrad)
  DeviceBuffer<float> constants;     // {0, 1}: beta in device pointer mode (alpha_device)
  DeviceBuffer<float> a32, b32;      // OutType::f32 with one_call: the widened FP32 operands
};

// The three products above. sizes: host [groups], m_g >= 0; n = N, k = K (> 0).
// x, dy, w: BF16 bits (device); y, dx, dw: FP32 or BF16 (out). alpha: host
// [groups], or empty for 1 each. alpha_device (loop only, exclusive with
// alpha): device [groups], read by cuBLAS in device pointer mode when the
// GEMM runs, so that nothing waits for the quantization that writes it
// (GroupedQuantOutputs::gemm_alpha). Throws fp4lab::Error on bad arguments
// (sizes, alpha count, both alphas, alpha_device with one_call, a dimension
// over 2^31 - 1) and cuBLAS errors.
void grouped_gemm_forward(Blas& blas, GroupedGemmWorkspace& ws, std::span<const int64_t> sizes, int64_t n, int64_t k,
                          const uint16_t* x, const uint16_t* w, void* y, OutType out, std::span<const float> alpha = {},
                          GroupedImpl impl = GroupedImpl::one_call, const float* alpha_device = nullptr);
void grouped_gemm_dgrad(Blas& blas, GroupedGemmWorkspace& ws, std::span<const int64_t> sizes, int64_t n, int64_t k,
                        const uint16_t* dy, const uint16_t* w, void* dx, OutType out, std::span<const float> alpha = {},
                        GroupedImpl impl = GroupedImpl::one_call, const float* alpha_device = nullptr);
void grouped_gemm_wgrad(Blas& blas, GroupedGemmWorkspace& ws, std::span<const int64_t> sizes, int64_t n, int64_t k,
                        const uint16_t* dy, const uint16_t* x, void* dw, OutType out, bool accumulate,
                        std::span<const float> alpha = {}, GroupedImpl impl = GroupedImpl::one_call,
                        const float* alpha_device = nullptr);

}  // namespace fp4lab::cuda
