// Block quantization on the GPU, bit-identical to sim's quantize().
//
// Semantics: exactly those of sim/quantizer.hpp (QuantizerSpec, quantize()):
// optional 16-point RHT along the block axis (sim/rht.hpp's operation order),
// block amax over valid elements, block scale by the spec's rule
// (sim/scale_rules.hpp, the same FP4LAB_HD functions), element code =
// core's encode(element, x * mult) (x / scale for nv_noglobal; the exact
// float64 product for MX rules with rp/rm), stochastic rounding with the
// spec's random-bit contract q.sr_bits (core/sr.hpp): per_element
// random_bits(seed, stream, r * cols + c) (core/philox.hpp), 32 bits an
// element; ptx_x4 byte c % 4 of random_bits(seed, stream, r * ceil(cols / 4) +
// c / 4); and dequant = (decode(code) * scale) * g_dec. Codes, scale codes, decoded scales,
// g_dec and the FP32 dequantized tensor equal the CPU's bit for bit; partial
// blocks at the edges are handled as on the CPU (amax over valid elements,
// nothing written outside the tensor).
//
// Two implementations, selected by `QuantPath`:
//   fused    one kernel reads the input once (8 elements per thread, 16-byte
//            loads), reduces block amax with warp shuffles, computes the scale
//            and encodes: blocks [1,16], [1,32], [16,16], [16,1], [32,1]; the
//            RHT is fused into it. A tensor-amax pre-pass reads the input once
//            more when the rule needs the tensor's amax (nv with global_scale
//            tensor_amax).
//   generic  three simple kernels (block amax, block scales, elements) for
//            any block shape, [0,0] (one scale per tensor) included; no RHT.
//   automatic: fused where it applies, else generic.
//
// Inputs are row-major [rows, cols] float32 or bfloat16 (a bfloat16 input is
// its exact float32 value). Device pointers; every output is optional
// (nullptr = not written).
//
// Alignment. Every pointer need only be aligned to its element type: 4 bytes
// for float32 (x, scales, dequant, global_decode, gemm_alpha), 2 for
// bfloat16 (x, dequant_bf16), 1 for codes and scale_codes; a row slice or
// any other view of a tensor will do. What the kernels themselves require:
//   - the fused kernels (rows, cols, tiles, dual) and the generic, TE-options
//     and fp4tk kernels require nothing more of any pointer: their vector
//     loads and stores (16, 8 or 4 bytes) are taken only where each access is
//     aligned (checked per access, or once per launch for the FULL forms,
//     which need x, codes, dequant and dequant_bf16 16-byte aligned), else
//     element by element;
//   - the tensor-amax kernel (tensor_amax_device) reads x in unchecked 16-byte
//     vectors: it needs x 16-byte aligned. quantize_device runs it where the
//     rule needs the tensor's amax and no other kernel computes it: the fused
//     path's amax pass without RHT (nvfp4, nvfp4_col; nvfp4_2d under SR, or
//     under rn where its cooperative one-launch form does not fit on the GPU)
//     unless tensor_amax_bits is given, and the generic path when the tensor
//     is one block ([0,0], or a block at least the tensor's size).
// There, and only there, quantize_device copies an x that is not 16-byte
// aligned into QuantWorkspace::staging (cudaMemcpyAsync on `stream`) and
// reads the copy (quantize_staging_bytes); an aligned x, and every other
// case, runs exactly as it would without this rule (no copy, no launch).
// The outputs are the same bits for every alignment.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/tensor.hpp"
#include "cuda/device.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::cuda {

enum class InputType : uint8_t { f32, bf16 };
enum class QuantPath : uint8_t { automatic, fused, generic };

// Where element codes go.
//   bytes    one code per byte, row-major [rows * cols] (QuantizedTensor::codes)
//   packed4  4-bit elements only: two codes per byte, low nibble = even column,
//            each row ceil(cols / 2) bytes (an odd last column leaves the high
//            nibble 0)
enum class CodeLayout : uint8_t { bytes, packed4 };

struct QuantOutputs {
  uint8_t* codes = nullptr;
  CodeLayout code_layout = CodeLayout::bytes;
  uint8_t* scale_codes = nullptr;  // [scale_rows * scale_cols] scale-format codes (not for float32 scales)
  float* scales = nullptr;         // [scale_rows * scale_cols] decoded block scales
  float* dequant = nullptr;        // [rows * cols] FP32: (decode(code) * scale) * g_dec
  // [rows * cols] bfloat16 bits. gemm_operand = false: bf16_rn(dequant).
  // gemm_operand = true: decode(code) * scale WITHOUT g_dec (exact in BF16 for
  // e2m1 x ue4m3 and for MX products within BF16's range), the operand of the
  // simulated GEMMs, which apply g_dec in their epilogue.
  uint16_t* dequant_bf16 = nullptr;
  bool bf16_gemm_operand = false;
  float* global_decode = nullptr;  // 1 float: g_dec (1 when the rule has no global scale)
  // 1 float, where not null: g_dec * *gemm_alpha_other (g_dec alone where
  // that is null), written by the kernel that writes g_dec: the epilogue
  // alpha of a simulated GEMM whose other operand's g_dec is already on the
  // device, without a launch of its own. The product's bits do not depend on
  // the operand order.
  float* gemm_alpha = nullptr;
  const float* gemm_alpha_other = nullptr;
};

// Scratch memory reused between calls (the tensor amax and block amaxes).
struct QuantWorkspace {
  DeviceBuffer<uint32_t> amax;  // [1 + nbr*nbc]: tensor amax bits, then block amax bits (generic); dual: [2]
  DeviceBuffer<float> mult;     // [nbr*nbc] generic path: element multiplier per block
  DeviceBuffer<float> scale;    // [nbr*nbc] generic path: decoded scale per block
  DeviceBuffer<float> global;   // [6] NvGlobal of the tensor amax (fused path; dual: [3..5] the second's)
  DeviceBuffer<uint32_t> done;  // [1] block counter of the amax pass (zero between passes)
  // An aligned copy of an input that the chosen kernels need 16-byte aligned
  // and that is not (see "Alignment" above; quantize_staging_bytes). Grown on
  // demand; never touched for aligned inputs.
  DeviceBuffer<uint8_t> staging;
  // The generic path's RHT output (a quantizer with rht that the fused kernels do not take: rht_output bf16, or
  // an emulation's rule), FP32 [rows*cols]. Grown on demand.
  DeviceBuffer<float> transformed;
  // amax[0..1] are zero in stream order: the fused amax passes (which compute
  // the global scales) leave them so; whatever else writes them clears this.
  // While set, an amax pass needs no memset first.
  bool amax_armed = false;
};

// Shape of the scale grid: ceil(rows/block_rows) x ceil(cols/block_cols), [1,1] for [0,0].
void scale_grid(const QuantizerSpec& q, int64_t rows, int64_t cols, int64_t& scale_rows, int64_t& scale_cols);

// True if the fused kernel handles this spec (block shape and RHT constraints).
bool fused_supported(const QuantizerSpec& q);

// True if QuantOutputs' bf16_gemm_operand output (decode(code) * block scale,
// without g_dec) is exact in BF16 for q: E2M1 / E2M3 / E3M2 / E4M3 / E5M2
// elements (at most 4 significant bits) with E8M0 or UE4M3 scales (at most 4
// for UE4M3), no RHT of the quantizer (its fake-quantized value is the inverse
// transform of such a product, not the product). The product has at most 8
// significant bits; with UE4M3 scales it is always a normal BF16 number. With
// E8M0 scales it is normal unless an FP8 element's block scale is below 2^-117
// (E5M2) / 2^-124 (E4M3), i.e. a block amax below ~2^-100, whose products would
// lose low bits in BF16's subnormal range (not checked at run time); E2M1 /
// E2M3 / E3M2 elements are exact for every E8M0 scale.
bool bf16_exact(const QuantizerSpec& q);

// True if an RHT down 16-row chunks (sim's rht16_forward, chunks of a column)
// applied to a tensor and then quantized with q is q with its own RHT
// (q.rht = true, the same signs): [16,1] blocks, whose RHT the fused column
// kernels (and their amax pass) apply, and bf16_exact(q). What lets a caller
// fold its own column RHT into the quantization.
bool rht_foldable(const QuantizerSpec& q);

// Quantizes x on `stream`. Throws fp4lab::Error on an invalid spec (validate()),
// an unsupported path choice, or given random words (rs.words: CPU only; here,
// and in quantize_dual_device / fake_quantize_device). With q.rht, a partial last chunk is quantized
// untransformed (sim/rht.hpp's rule), as on the CPU.
// `tensor_amax_bits` (device pointer, optional): the tensor's amax bit pattern
// (of the RHT-transformed tensor when q.rht) supplied by the producer of x; the
// fused path then skips its amax pass. Ignored by the generic path.
// Any element-aligned x and outputs (see "Alignment" above).
void quantize_device(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols, RandomStream rs,
                     const QuantOutputs& out, QuantWorkspace& ws, cudaStream_t stream = nullptr,
                     QuantPath path = QuantPath::automatic, const uint32_t* tensor_amax_bits = nullptr);

// The bytes of QuantWorkspace::staging that quantize_device(q, x, type, rows,
// cols, ..., path, tensor_amax_bits) uses: rows * cols input elements where
// its kernels need x 16-byte aligned and x is not, else 0. A caller of many
// quantizations (quantize_grouped_device) grows the workspace once with it,
// before any launch. Throws fp4lab::Error on an invalid spec or a path that
// cannot run q (as quantize_device).
size_t quantize_staging_bytes(const QuantizerSpec& q, const void* x, InputType type, int64_t rows, int64_t cols,
                              QuantPath path = QuantPath::automatic, bool tensor_amax_given = false);

// Two quantizations of one tensor in one pass over it: row_q with blocks
// [1,16] and col_q with blocks [16,1] (with col_q.rht, the RHT down each
// column first, as quantize_device does), each with its own random stream and
// outputs; every output is bit-identical to quantize_device(row_q, ...) and
// quantize_device(col_q, ...). The trainer's forward x / wgrad x and dgrad dy /
// wgrad dy operands of NVIDIA's NVFP4 recipe. When either rule needs the tensor
// amax, one pre-pass reads x once for both (two passes in all, instead of four).
// Supported (dual_supported): both quantizers NVFP4-kind (e2m1 elements, ue4m3
// scales, nv rule, with or without the per-tensor scale), rounding rn or rs,
// rows % 16 == 0 and cols % 16 == 0; otherwise quantize_dual_device throws
// fp4lab::Error naming both specs and the shape.
// Any element-aligned x and outputs, without staging: its amax pass loads x in
// 4-byte words (two 2-byte halves each for a BF16 x that is not 4-byte
// aligned), its quantization pass checks each vector access (FULL forms only
// where x and both operands' outputs are 16-byte aligned).
// `amax_given` (device pointer to 2 words, optional): the amax bits of x and
// of col_q's RHT output (of x when !col_q.rht) supplied by x's producer
// (nn.hpp ProducerAmax); the pre-pass is then skipped.
bool dual_supported(const QuantizerSpec& row_q, const QuantizerSpec& col_q, int64_t rows, int64_t cols);
void quantize_dual_device(const QuantizerSpec& row_q, RandomStream row_rs, const QuantOutputs& row_out,
                          const QuantizerSpec& col_q, RandomStream col_rs, const QuantOutputs& col_out, const void* x,
                          InputType type, int64_t rows, int64_t cols, QuantWorkspace& ws, cudaStream_t stream = nullptr,
                          const uint32_t* amax_given = nullptr);

// A host matrix as a quantizer input on the device (the host conveniences
// below): FP32, or with bf16 the BF16 bits of x, whose values must then be
// bfloat16 values (an Error names `what` and the first element that is not).
struct DeviceInput {
  DeviceBuffer<float> f32;
  DeviceBuffer<uint16_t> bf16;
  const void* data = nullptr;
  InputType type = InputType::f32;
};
DeviceInput upload_input(MatrixView<const float> x, bool bf16, const char* what);

// Host convenience for tests and tools: uploads x, quantizes on the GPU and
// returns the same struct as sim's quantize() (codes one per byte).
// `bf16_input` feeds the kernel bfloat16 data: x must then hold values exactly
// representable in bfloat16.
QuantizedTensor quantize_gpu(const QuantizerSpec& q, MatrixView<const float> x, RandomStream rs = {},
                             QuantPath path = QuantPath::automatic, bool bf16_input = false);

// In-place fake quantization, bit-identical to sim's fake_quantize(): x (FP32
// row-major [rows, cols], device) is replaced by its dequantized value; with
// q.rht the dequantized tensor is transformed back (sim/rht.hpp's inverse,
// same operation order). What the trainer's quantized GEMM operands need.
// Any 4-byte aligned x: where quantize_device stages x, the quantization
// reads the copy and writes x.
void fake_quantize_device(const QuantizerSpec& q, float* x, int64_t rows, int64_t cols, RandomStream rs,
                          QuantWorkspace& ws, cudaStream_t stream = nullptr, QuantPath path = QuantPath::automatic);
// Host convenience (tests): the same on a host tensor, in place.
void fake_quantize_gpu(const QuantizerSpec& q, MatrixView<float> x, RandomStream rs = {},
                       QuantPath path = QuantPath::automatic);

// Tensor amax on the device: max |x| bit pattern (NaN patterns dominate) into
// *amax_bits (which the call first zeroes). x must be 16-byte aligned (the
// kernel's unchecked vector loads): throws fp4lab::Error, before any device
// work, otherwise (quantize_device stages such an x itself).
void tensor_amax_device(const void* x, InputType type, int64_t n, uint32_t* amax_bits, cudaStream_t stream = nullptr);

}  // namespace fp4lab::cuda
