// CudaLinear's native-operand route (linear_native.hpp).
#include "train/cuda/linear_native.hpp"

#include "core/error.hpp"
#include "sim/quantizer.hpp"
#include "train/cuda/linear_ops.hpp"

namespace fp4lab::train::linear_detail {

std::optional<NativeRoute> native_route(const LayerPlan& l, Operand w_op, const std::optional<QuantizerSpec>& other,
                                        int64_t k, int cc, bool forced) {
  if (!takes_stored_w(l, l.plan.operand(w_op))) return std::nullopt;
  const auto* stored = dynamic_cast<const StoredNvfp4*>(l.w_stored);
  if (stored == nullptr) return std::nullopt;  // prepare_w reports a foreign stored form
  // The other operand: one NVFP4 [1,16] quantizer (e2m1, UE4M3 scales, no RHT) that the native GEMM pairs
  // with the cast's nvfp4_2d.
  static const QuantizerSpec nvfp4_2d = quantizer_by_name("nvfp4_2d");  // looked up once, not per GEMM
  if (!other || other->block_rows != 1 || other->block_cols != 16 || !cuda::blackwell_native_supported(*other, nvfp4_2d))
    return std::nullopt;
  if (forced) return NativeRoute{stored, *other, cuda::GemmPath::hopper_bf16};
  if (cc >= 100 && k % 16 == 0) return NativeRoute{stored, *other, cuda::GemmPath::blackwell_native};
  return std::nullopt;
}

cuda::QuantOperand native_codes(const QuantizerSpec& q, RandomStream rs, const float* src, int64_t rows, int64_t cols,
                                NativeScratch& s, cuda::QuantWorkspace& qws, cudaStream_t stream) {
  int64_t sr = 0, sc = 0;
  cuda::scale_grid(q, rows, cols, sr, sc);
  cuda::QuantOutputs out;
  out.codes = s.codes.at_least(size_t(rows * ((cols + 1) / 2)));
  out.code_layout = cuda::CodeLayout::packed4;
  out.scale_codes = s.scale_codes.at_least(size_t(sr * sc));
  out.global_decode = s.g.data();
  if (rows * cols > 0) cuda::quantize_device(q, src, cuda::InputType::f32, rows, cols, rs, out, qws, stream);
  cuda::QuantOperand o;
  o.spec = q;
  o.rows = rows;
  o.cols = cols;
  o.codes = out.codes;
  o.layout = cuda::CodeLayout::packed4;
  o.scale_codes = out.scale_codes;
  o.global_decode = out.global_decode;
  return o;
}

cuda::QuantOperand native_w(const StoredNvfp4& w, bool columnwise, int64_t rows, int64_t cols, NativeScratch& s,
                            cudaStream_t stream) {
  const cuda::PackedNvfp4 c = w.form;  // read at the time of use
  if (columnwise) return cuda::packed_operand_columnwise(c, rows, cols, s.wt, stream);  // s.wt: cudaMalloc's, aligned
  cuda::QuantOperand q = cuda::packed_operand(c, rows, cols);  // checks the cast first
  const int64_t bytes = rows * ((cols + 1) / 2);
  if (bytes > 0 && reinterpret_cast<uintptr_t>(q.codes) % kNativeAlign != 0) {
    uint8_t* aligned = s.w_codes.at_least(size_t(bytes));
    cuda::check(cudaMemcpyAsync(aligned, q.codes, size_t(bytes), cudaMemcpyDeviceToDevice, stream),
                "CudaLinear: aligned copy of W's packed codes");
    q.codes = aligned;
  }
  return q;
}

void native_gemm(cuda::Blas& blas, cuda::GemmPath path, const cuda::QuantOperand& a, const cuda::QuantOperand& b,
                 float* y, uint16_t* y_bf16, const float* bias, NativeScratch& s, cudaStream_t stream) {
  const int64_t m = a.rows, n = b.rows, k = a.cols;
  if (m == 0 || n == 0) return;
  float* f = y_bf16 ? s.out_f32.at_least(size_t(m * n)) : y;
  if (k == 0) {
    cuda::check(cudaMemsetAsync(f, 0, size_t(m * n) * sizeof(float), stream), "CudaLinear: zero C");
  } else {
    const cuda::GemmPath taken = cuda::quantized_gemm_device(blas, a, b, f, cuda::OutType::f32, s.gemm, path);
    FP4LAB_CHECK(taken == path, "CudaLinear: the native GEMM took another path than its route's");
  }
  if (y_bf16)
    cuda::bias_round_bf16_device(f, bias, m, n, y_bf16, stream);
  else if (bias)
    cuda::add_bias_device(y, bias, m, n, stream);
}

}  // namespace fp4lab::train::linear_detail
