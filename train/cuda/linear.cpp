// The quantized linear layer on the GPU (cuda_linear.hpp): executes
// linear_plan() (recipes/linear_plan.hpp) with the CUDA quantizers and
// cuBLAS.
//
// Operand forms. Every prepared GEMM operand is one of
//   f32      an FP32 tensor: the source itself, or the plan's result after
//            fake_quantize_device / RHT (bit-identical to the CPU's operand);
//   bf16     BF16 bits plus an optional device scalar g (the NVFP4 global
//            decode scale): value = bf16 * g in exact arithmetic. Used for
//            a bf16-rounded operand (g absent; the bits are the CPU's rounded
//            value) and for a quantizer whose decode(code) * block_scale is
//            exact in BF16 (bf16_exact() below; quantize_device's
//            bf16_gemm_operand output), whose FP32 value bf16 * g in one FP32
//            multiply is the CPU's fake-quantized value bit for bit.
// A GEMM whose two operands are both bf16 runs on the BF16 tensor cores (FP32
// accumulation, alpha = g_a * g_b in device pointer mode); otherwise any bf16
// operand is expanded to its FP32 value and the GEMM is a pure FP32 one
// (CUBLAS_COMPUTE_32F_PEDANTIC: no TF32, whatever the environment says).
//
// Exactness of the BF16 operand: an element of e2m1 / e2m3 / e3m2 / e4m3 /
// e5m2 has at most 4 significant bits, an e8m0 scale 1 and a ue4m3 scale at
// most 4, so decode(code) * scale has at most 8 significant bits: exact in
// BF16 wherever BF16 has normal numbers. With ue4m3 scales the product lies
// in [2^-18, 448 * 57344], always normal. With e8m0 scales it is normal unless
// the block scale is below 2^-117 (e5m2) / 2^-124 (e4m3), i.e. a block whose
// amax is below ~2^-100; e2m1 / e2m3 / e3m2 elements are exact for every
// e8m0 scale. Such MXFP8 blocks (values below 1e-30) would lose low bits in
// BF16's subnormal range; the layer does not check for them at run time
// (it would need a device-to-host synchronisation per GEMM).
#include "train/cuda/linear.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "train/cuda/linear_impl.hpp"

namespace fp4lab::train {

using namespace linear_detail;  // linear_impl.hpp: the layer's private helpers

CudaLinear::CudaLinear() : impl_(std::make_unique<Impl>()) {
  check_cublas(cublasSetMathMode(impl_->blas.handle(), CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
}
CudaLinear::~CudaLinear() = default;

void CudaLinear::set_operand_hook(OperandHook hook) { impl_->hook = std::move(hook); }
void CudaLinear::force_native_route(bool on) { impl_->force_native = on; }
void CudaLinear::set_native_hook(NativeHook hook) { impl_->native_hook = std::move(hook); }

LinearInputNeeds CudaLinear::input_needs(const LayerPlan& l, bool grad, int64_t rows, int64_t cols) const {
  const LinearPlan& plan = l.plan;
  if (rounds_only(plan, grad)) return LinearInputNeeds{true, std::nullopt};
  // The amaxes: the conditions under which forward / backward take the pair path.
  if (!l.ctx.backward) return {};  // a forward-only layer takes no pair path
  const OperandPlan& a = plan.operand(grad ? Operand::dgrad_grad_y : Operand::fwd_x);
  const OperandPlan& b = plan.operand(grad ? Operand::wgrad_grad_y : Operand::wgrad_x);
  if (!grad && !(b.quantizer != nullptr && bf16_exact(*b.quantizer))) return {};
  const std::optional<PairSpecs> q = pair_specs(a, b, rows, cols);
  if (!q || (q->a.global_scale != GlobalScale::tensor_amax && q->b.global_scale != GlobalScale::tensor_amax))
    return {};
  return LinearInputNeeds{false, request_of(*q)};
}

namespace {
// The producer output `from` (null: none) for a [rows, cols] source, checked:
// the producer of a tensor that `from` came with had that shape.
const ProducerOutputs* checked_from(const ProducerOutputs* from, int64_t rows, int64_t cols, const char* what) {
  if (from) FP4LAB_CHECK(from->rows == rows && from->cols == cols, std::string(what) + ": producer outputs of another shape");
  return from;
}
}  // namespace

void CudaLinear::forward(const LayerPlan& l, const Tensor& x, const Tensor& w, const float* b, Tensor& y,
                         std::unique_ptr<LinearState>& state, const std::function<Tensor(int64_t, int64_t)>& alloc,
                         const ProducerOutputs* x_from, uint16_t* y_bf16) {
  const LinearContext& ctx = l.ctx;
  if (x.cols != w.cols)
    throw Error("CudaLinear::forward: x is " + shape(x.rows, x.cols) + " but W is " + shape(w.rows, w.cols) +
                ": x's columns must equal W's columns (in_features)");
  const int64_t B = x.rows, in = x.cols, out = w.rows;
  const LinearPlan& plan = l.plan;
  Impl& im = *impl_;
  x_from = checked_from(x_from, B, in, "CudaLinear::forward x");
  const bool x_bf16_given = x_from && x_from->bf16_written;
  FP4LAB_CHECK(x.data || B * in == 0 || (x_bf16_given && rounds_only(plan, false)),
               "CudaLinear::forward: x has no FP32 values and the plan reads more than its written BF16");
  im.measure(ctx, plan, {Operand::fwd_x, Operand::wgrad_x}, x.data, B, in);  // x and W are the backward's too
  im.measure(ctx, plan, {Operand::fwd_w, Operand::dgrad_w}, w.data, out, in);
  if (y_bf16) {
    y = view_of(nullptr, B, out);  // the BF16 storage alone
  } else if (y.rows != B || y.cols != out || (y.data == nullptr && B * out > 0)) {
    y = alloc(B, out);
  }

  auto st = std::make_unique<CudaLinearState>();
  st->batch = B;
  st->in = in;
  st->forward_only = !ctx.backward;
  // The native-operand route (linear_native.hpp): x goes in as codes, made with W's operand after this block.
  const std::optional<NativeRoute> native = im.native_route_of(l, Operand::fwd_w, Operand::fwd_x, in);
  DevOperand xo;
  bool wx_made = false;  // the wgrad x operand is made (st->wx_ready)
  if (rounds_only(plan, false)) {
    // Backward needs only the BF16 rounding of x: keep that (half the bytes
    // of the FP32 copy, and wgrad does not round x again).
    st->x_bf16 = true;
    if (x_bf16_given) {
      // The producer wrote the rounding (ProducerOutputs::bf16): keep a reference to it.
      st->x = view_of(reinterpret_cast<float*>(x_from->bf16), 1, (B * in + 1) / 2);
      st->x.mem = x_from->bf16_mem;
    } else {
      st->x = alloc(1, (B * in + 1) / 2);
      cuda::round_bf16_device(x.data, B * in, reinterpret_cast<uint16_t*>(st->x.data), kStream);
    }
    xo.bf16 = reinterpret_cast<const uint16_t*>(st->x.data);
    im.report(Operand::fwd_x, xo, B, in);
  } else if (!ctx.backward) {
    // Evaluation: the forward operand alone; nothing is kept for backward.
    if (!native) xo = im.prepare(plan.operand(Operand::fwd_x), x.data, B, in, im.slot[0]);
  } else {
    // A BF16 quantizer operand for wgrad (the quantized recipes) is made in
    // the forward from x and kept instead of a copy of x: together with the
    // forward's operand in one pass where quantize_dual_device applies, else
    // after the forward GEMM.
    const OperandPlan& fx = plan.operand(Operand::fwd_x);
    const OperandPlan& wx = plan.operand(Operand::wgrad_x);
    st->wx_ready = wx.quantizer != nullptr && bf16_exact(*wx.quantizer);
    if (st->wx_ready) {
      st->wx_plan = wx;
      st->wx = alloc(1, (B * in + 1) / 2);
      st->wx_g = alloc(1, 1);
      if (const std::optional<PairSpecs> q = native ? std::nullopt : pair_specs(fx, wx, B, in)) {
        xo = im.prepare_pair(*q, fx, wx, x.data, x_from, B, in, im.slot[0], reinterpret_cast<uint16_t*>(st->wx.data),
                             st->wx_g.data);
        im.report(Operand::fwd_x, xo, B, in);
        wx_made = true;
      }
    } else if (x.mem) {
      st->x = x;  // an owned tensor: keep a reference (the caller leaves x unchanged until backward)
    } else {
      st->x = alloc(B, in);  // a view: its memory may go away, copy it
      if (B * in > 0)
        check(cudaMemcpyAsync(st->x.data, x.data, size_t(B * in) * sizeof(float), cudaMemcpyDeviceToDevice, kStream),
              "CudaLinear::forward: saving x");
    }
    if (!wx_made && !native) xo = im.prepare(fx, x.data, B, in, im.slot[0]);
  }

  // y^T [out, B] = W [out, in] x^T (column-major view of row-major y = x W^T).
  // W is made after x: its quantization writes the forward GEMM's alpha (x's g_dec is on the device).
  // Where both W operands are its plain BF16 rounding (the bf16 recipes), W is rounded once, into the
  // state, and dgrad takes it (as autocast's cast cache serves a weight's backward).
  const bool w_rounded_once = ctx.backward && out * in > 0 && ctx.weight_cast == nullptr &&
                              bf16_rounding_only(plan.operand(Operand::fwd_w)) &&
                              bf16_rounding_only(plan.operand(Operand::dgrad_w));
  DevOperand wo;
  const float* bias = b != nullptr && plan.add_bias ? b : nullptr;
  if (native) {
    // y [B, out] = Q(x) W^T with W's packed cast as it is (its wgrad x operand, if any, is made below).
    im.native_product(*native, Operand::fwd_x, Operand::fwd_w, l, x.data, B, in, out, in, /*columnwise=*/false,
                      y.data, y_bf16, bias);
  } else if (w_rounded_once) {
    st->has_w = st->w_bf16 = true;
    st->w_op = alloc(1, (out * in + 1) / 2);
    cuda::round_bf16_device(w.data, out * in, reinterpret_cast<uint16_t*>(st->w_op.data), kStream);
    wo.bf16 = reinterpret_cast<const uint16_t*>(st->w_op.data);
    im.report(Operand::fwd_w, wo, out, in);
  } else {
    wo = im.prepare_w(Operand::fwd_w, l, plan.operand(Operand::fwd_w), w.data, out, in, xo.is_bf16(),
                      xo.is_bf16() ? im.alpha_for(Impl::kFwd, xo.g) : GemmAlpha{});
  }
  if (!native) {
    const Bf16Out y_out{y_bf16, bias};
    im.gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, B, in, wo, in, out * in, im.slot[1], xo, in, B * in, im.slot[0], y.data,
            out, 0.0f, y_bf16 ? &y_out : nullptr);
    if (bias && !y_bf16) cuda::add_bias_device(y.data, bias, B, out, kStream);
  }

  if (st->wx_ready && !wx_made) {
    // After the GEMM: the slots' scratch is free again (same stream, so in order).
    im.prepare(st->wx_plan, x.data, B, in, im.slot[0], reinterpret_cast<uint16_t*>(st->wx.data), st->wx_g.data,
               /*report_now=*/false);
  }

  if (ctx.backward && plan.reuse_fwd_w && out * in > 0 && !st->has_w && !native) {
    // Keep Q_fwd_w(W) for dgrad (the same bits it would compute again).
    st->has_w = true;
    if (wo.is_bf16()) {
      st->w_bf16 = true;
      st->w_op = alloc(1, (out * in + 1) / 2);
      check(cudaMemcpyAsync(st->w_op.data, wo.bf16, size_t(out * in) * sizeof(uint16_t), cudaMemcpyDeviceToDevice,
                            kStream),
            "CudaLinear::forward: saving Q(W)");
      if (wo.g) {
        st->w_has_g = true;
        st->w_g = alloc(1, 1);
        check(cudaMemcpyAsync(st->w_g.data, wo.g, sizeof(float), cudaMemcpyDeviceToDevice, kStream),
              "CudaLinear::forward: saving g_dec(W)");
      }
    } else {
      st->w_op = alloc(out, in);
      check(cudaMemcpyAsync(st->w_op.data, wo.f32, size_t(out * in) * sizeof(float), cudaMemcpyDeviceToDevice, kStream),
            "CudaLinear::forward: saving Q(W)");
    }
  }
  state = std::move(st);
}

void CudaLinear::backward(const LayerPlan& l, const LinearState& state, const Tensor& w, const Tensor& dy,
                          Tensor& dx, Tensor& dw_acc, float* db_acc,
                          const std::function<Tensor(int64_t, int64_t)>& alloc, const ProducerOutputs* dy_from,
                          uint16_t* dx_bf16) {
  const LinearContext& ctx = l.ctx;
  const auto* stp = dynamic_cast<const CudaLinearState*>(&state);
  if (stp == nullptr) throw Error("CudaLinear::backward: `state` was not written by CudaLinear::forward");
  const CudaLinearState& st = *stp;
  if (st.forward_only)
    throw Error(
        "CudaLinear::backward: the forward ran with LinearContext::backward false (evaluation) and kept "
        "nothing for a backward pass");
  const int64_t B = st.batch, in = st.in, out = w.rows;
  if (w.cols != in)
    throw Error("CudaLinear::backward: W is " + shape(w.rows, w.cols) + " but the forward's x was " + shape(B, in) +
                ": W's columns must equal x's columns (in_features)");
  if (dy.rows != B || dy.cols != out)
    throw Error("CudaLinear::backward: dy is " + shape(dy.rows, dy.cols) + ", expected " + shape(B, out) +
                " (batch rows of x, out_features of W)");
  if (dw_acc.rows != out || dw_acc.cols != in)
    throw Error("CudaLinear::backward: dW is " + shape(dw_acc.rows, dw_acc.cols) + ", expected W's shape " +
                shape(out, in));
  const LinearPlan& plan = l.plan;
  Impl& im = *impl_;
  dy_from = checked_from(dy_from, B, out, "CudaLinear::backward dy");
  const bool dy_bf16_given = dy_from && dy_from->bf16_written;
  FP4LAB_CHECK(dy.data || B * out == 0 || (dy_bf16_given && rounds_only(plan, true) && db_acc == nullptr),
               "CudaLinear::backward: dy has no FP32 values and the layer reads more than its written BF16");
  im.measure(ctx, plan, {Operand::dgrad_grad_y, Operand::wgrad_grad_y}, dy.data, B, out);
  if (dx_bf16) {
    dx = view_of(nullptr, B, in);  // the BF16 storage alone
  } else if (dx.rows != B || dx.cols != in || (dx.data == nullptr && B * in > 0)) {
    dx = alloc(B, in);
  }

  // dgrad: dx^T [in, B] = W^T [in, out] dy^T [out, B].
  // When both dy operands are plain BF16 roundings, wgrad reuses dgrad's (slot[0]
  // is not written in between: the dgrad GEMM of two BF16 operands expands nothing).
  const bool dy_shared = rounds_only(plan, true);
  // Otherwise both dy operands in one pass where quantize_dual_device applies.
  const OperandPlan& dgy = plan.operand(Operand::dgrad_grad_y);
  const OperandPlan& wgy = plan.operand(Operand::wgrad_grad_y);
  // The native-operand route (linear_native.hpp): dgrad's dy goes in as codes, made with W^T's operand below;
  // wgrad's dy operand is then made on its own (prepare).
  const std::optional<NativeRoute> native = im.native_route_of(l, Operand::dgrad_w, Operand::dgrad_grad_y, out);
  DevOperand dy_op;
  bool dy_pair = false;
  GemmAlpha wgrad_alpha;
  if (const std::optional<PairSpecs> q = dy_shared || native ? std::nullopt : pair_specs(dgy, wgy, B, out)) {
    im.dy_cols_h.at_least(size_t(B * out));
    // The GEMM alphas, where the other operand's g_dec is already on the device:
    // dgrad's W kept from the forward; wgrad's x operand made in the forward.
    const GemmAlpha dgrad_alpha = plan.reuse_fwd_w && st.has_w && st.w_bf16
                                      ? im.alpha_for(Impl::kDgrad, st.w_has_g ? st.w_g.data : nullptr)
                                      : GemmAlpha{};
    if (st.x_bf16 || st.wx_ready) wgrad_alpha = im.alpha_for(Impl::kWgrad, st.x_bf16 ? nullptr : st.wx_g.data);
    dy_op = im.prepare_pair(*q, dgy, wgy, dy.data, dy_from, B, out, im.slot[0], im.dy_cols_h.data(),
                            im.dy_cols_g.data(), dgrad_alpha, wgrad_alpha);
    im.report(Operand::dgrad_grad_y, dy_op, B, out);
    dy_pair = true;
  } else if (dy_shared && dy_bf16_given) {
    dy_op.bf16 = dy_from->bf16;  // the producer's rounding (ProducerOutputs::bf16)
    im.report(Operand::dgrad_grad_y, dy_op, B, out);
  } else if (!native) {
    dy_op = im.prepare(dgy, dy.data, B, out, im.slot[0]);
  }
  if (native) {
    // dx [B, in] = Q(dy) W with W^T [in, out] made from W's packed cast (never quantized again).
    im.native_product(*native, Operand::dgrad_grad_y, Operand::dgrad_w, l, dy.data, B, out, out, in,
                      /*columnwise=*/true, dx.data, dx_bf16, nullptr);
  } else {
    const DevOperand& go = dy_op;
    DevOperand wo;
    if (st.has_w) {
      if (st.w_bf16) {
        wo.bf16 = reinterpret_cast<const uint16_t*>(st.w_op.data);
        wo.g = st.w_has_g ? st.w_g.data : nullptr;
      } else {
        wo.f32 = st.w_op.data;
      }
      im.report(Operand::dgrad_w, wo, out, in);
    } else {
      wo = im.prepare_w(Operand::dgrad_w, l, plan.operand(Operand::dgrad_w), w.data, out, in, go.is_bf16());
    }
    const Bf16Out dx_out{dx_bf16, nullptr};
    im.gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, B, out, wo, in, out * in, im.slot[1], go, out, B * out, im.slot[0], dx.data,
            in, 0.0f, dx_bf16 ? &dx_out : nullptr);
  }

  // wgrad: dW^T [in, out] += x'^T [in, B] dy [B, out]  (x' = the wgrad_x operand).
  {
    DevOperand go, xo;
    if (dy_shared && dy_op.is_bf16()) {
      go = dy_op;
      im.report(Operand::wgrad_grad_y, go, B, out);
    } else if (dy_pair) {
      go = DevOperand{nullptr, im.dy_cols_h.data(), im.dy_cols_g.data(), wgrad_alpha.dev, wgrad_alpha.beta};
      im.report(Operand::wgrad_grad_y, go, B, out);
    } else {
      go = im.prepare(wgy, dy.data, B, out, im.slot[0]);
    }
    if (st.x_bf16) {
      xo.bf16 = reinterpret_cast<const uint16_t*>(st.x.data);
      im.report(Operand::wgrad_x, xo, B, in);
    } else if (st.wx_ready) {
      if (!same_plan(st.wx_plan, plan.operand(Operand::wgrad_x)))
        throw Error(
            "CudaLinear::backward: the wgrad x operand was computed in the forward with another plan (recipe, "
            "seed, layer or step); backward must get the forward's LinearContext");
      xo.bf16 = reinterpret_cast<const uint16_t*>(st.wx.data);
      xo.g = st.wx_g.data;
      im.report(Operand::wgrad_x, xo, B, in);
    } else {
      xo = im.prepare(plan.operand(Operand::wgrad_x), st.x.data, B, in, im.slot[1]);
    }
    im.gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, B, xo, in, B * in, im.slot[1], go, out, B * out, im.slot[0], dw_acc.data,
            in, 1.0f);
  }

  if (db_acc != nullptr) cuda::nn::column_sum_acc(dy.data, out, B, out, db_acc, im.colsum, kStream);
}

}  // namespace fp4lab::train
