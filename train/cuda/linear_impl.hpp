// CudaLinear's internals (train/cuda/linear.hpp), shared by the dense layer
// (linear.cpp) and the grouped one (grouped_linear.cpp): the operand forms,
// the per-operand scratch, the plan executor `prepare` and the one GEMM call
// `gemm` that both use, so a group of the grouped layer runs the dense layer's
// very calls. Private to train/cuda/ (the file comment of linear.cpp states the
// operand forms and the exactness of the BF16 operand).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/error.hpp"
#include "core/format.hpp"
#include "cuda/device.hpp"
#include "cuda/gemm.hpp"
#include "cuda/gemm_classed.hpp"
#include "cuda/grouped.hpp"
#include "cuda/quantize.hpp"
#include "cuda/rht.hpp"
#include "cuda/shard_cast.hpp"
#include "train/cuda/cast_store.hpp"
#include "train/cuda/linear.hpp"
#include "train/cuda/linear_native.hpp"
#include "train/cuda/linear_ops.hpp"
#include "train/cuda/nn.hpp"
#include "train/cuda/numerics.hpp"

namespace fp4lab::train {

namespace linear_detail {
using cuda::check;
using cuda::check_cublas;
using cuda::DeviceBuffer;

constexpr cudaStream_t kStream = nullptr;  // the default stream

// cuda/quantize.hpp's bf16_exact (see the file comment for the e8m0 range caveat).
using cuda::bf16_exact;

// The wgrad RHT runs along columns (chunks of 16 rows): with [16,1] blocks it
// is the quantizer's own RHT (the same chunks, sim's rht16_forward, the same
// signs), fused into the quantization kernels, whose amax pass transforms too.
inline bool rht_foldable(const OperandPlan& p) {
  return p.rht && p.rht_kind == RhtKind::rht16 && p.rht_axis == RhtAxis::cols && p.quantizer &&
         cuda::rht_foldable(*p.quantizer);
}

// The one quantizer spec equivalent to plan p (its RHT folded in), when p is a
// BF16-exact quantization of its source with nothing else before it.
inline std::optional<QuantizerSpec> single_quantizer(const OperandPlan& p) {
  if (!p.quantizer || !bf16_exact(*p.quantizer) || p.pre || (p.rht && !rht_foldable(p))) return std::nullopt;
  QuantizerSpec q = *p.quantizer;
  if (p.rht) {
    q.rht = true;
    q.rht_seed = p.rht_seed;
  }
  return q;
}

// The two quantizers of plans a and b of one [rows, cols] source when one
// quantize_dual_device pass can make both (a: blocks [1,16], b: [16,1]).
struct PairSpecs {
  QuantizerSpec a, b;
};
inline std::optional<PairSpecs> pair_specs(const OperandPlan& a, const OperandPlan& b, int64_t rows, int64_t cols) {
  const std::optional<QuantizerSpec> qa = single_quantizer(a), qb = single_quantizer(b);
  if (!qa || !qb || !cuda::dual_supported(*qa, *qb, rows, cols)) return std::nullopt;
  return PairSpecs{*qa, *qb};
}

// The amaxes quantize_dual_device takes for q (its amax_given): the source's
// and its RHT's down 16-row chunks with b's signs (b's RHT, if any: a has none).
inline AmaxRequest request_of(const PairSpecs& q) { return AmaxRequest{q.b.rht, q.b.rht ? q.b.rht_seed : 0}; }

// A prepared GEMM operand (see the file comment). Row-major [rows, cols].
struct DevOperand {
  const float* f32 = nullptr;
  const uint16_t* bf16 = nullptr;
  const float* g = nullptr;  // device scalar, only with bf16; null = 1
  // [alpha, beta] on the device for the GEMM this operand was made for, alpha
  // written by its quantization (GemmAlpha), or null; ab_beta: that beta.
  const float* alpha_beta = nullptr;
  float ab_beta = 0.0f;
  // Where that beta lives when not at alpha_beta + 1 (the grouped layer's
  // per-group alphas, [G] consecutive floats: LinearCore::beta_of).
  const float* beta_at = nullptr;
  bool is_bf16() const { return bf16 != nullptr; }
};

// A GEMM's output in BF16 alone (CudaLinear's y_bf16 / dx_bf16, BF16 storage under bf16 activations):
// d [m, n] column-major, packed (ldc = m), each element r(acc), or with bias (FP32 [m], one value a row of
// the column-major C: a layer's output feature) r(acc + r(bias)); beta 0.
struct Bf16Out {
  uint16_t* d = nullptr;
  const float* bias = nullptr;
};
// Whether a GEMM of two plain BF16 operands with a bias writes its BF16 output through cuBLASLt's BIAS epilogue
// (a BF16 bias vector r(b)). false: the FP32 GEMM into scratch and bias_round_bf16_device, as for scaled
// operands. Off: on an H200 (CUDA 13.0, 2026-12-03) the epilogue's result differed from r(acc + r(b)) by a BF16
// ulp in 545 of 1887 elements of a 37 x 29 -> 51 layer (tests/train/cuda/test_bf16_storage.cpp), while the
// other shapes agreed: cuBLASLt does not promise the FP32 add then one rounding for every algorithm.
inline constexpr bool kBf16BiasEpilogue = false;
// Whether a GEMM of scaled BF16 operands (NVFP4/MX values, alpha = the global scales' product on the device)
// writes its BF16 output directly (cuBLASLt: r(alpha * acc) in its epilogue) instead of the FP32 GEMM into
// scratch and the rounding pass.
inline constexpr bool kBf16ScaledOutput = true;

// Where an operand's quantization also writes the alpha of the GEMM it feeds
// (cuda::QuantOutputs::gemm_alpha): dev -> [alpha, beta] (beta preset), other:
// the other operand's g_dec, already on the device (null = 1). dev null: none.
struct GemmAlpha {
  float* dev = nullptr;
  const float* other = nullptr;
  float beta = 0.0f;
};

// Scratch of one GEMM operand, reused from call to call (grow-only).
struct Slot {
  DeviceBuffer<float> work;        // FP32 copy the plan is applied to
  DeviceBuffer<uint16_t> h;        // BF16 operand
  DeviceBuffer<float> g;           // [1] its global decode scale
  DeviceBuffer<float> expand;      // FP32 value of a BF16 operand (mixed GEMMs, hook)
  DeviceBuffer<uint32_t> amax{1};  // the RHT output's amax bits (for the quantizer's global scale)
};

// True when the plan is "round the source to BF16" and nothing else: two such
// operands of the same source are the same bits, so the layer computes them
// once (bf16 recipes: x for forward and wgrad, dy for dgrad and wgrad).
inline bool bf16_rounding_only(const OperandPlan& p) {
  return p.round_bf16 && p.quantizer == nullptr && p.pre == nullptr && !p.rht;
}
// Are both GEMM operands of x (grad: of dy) plain BF16 roundings, i.e. one
// rounding serves both (and a producer's BF16 output can be it)?
inline bool rounds_only(const LinearPlan& plan, bool grad) {
  return grad ? bf16_rounding_only(plan.operand(Operand::dgrad_grad_y)) &&
                    bf16_rounding_only(plan.operand(Operand::wgrad_grad_y))
              : bf16_rounding_only(plan.operand(Operand::fwd_x)) && bf16_rounding_only(plan.operand(Operand::wgrad_x));
}

struct CudaLinearState final : LinearState {
  int64_t batch = 0, in = 0;  // x's shape [B, in]
  Tensor x;                   // (empty when wx_ready) the forward's input [B, in] (FP32; a reference to an owned
                              // x, else a copy), or, when x_bf16,
  bool x_bf16 = false;        // its BF16 rounding packed two per float ([1, ceil(B*in/2)]): fwd_x and wgrad_x
                              // are both bf16_rounding_only, so the forward's operand is the wgrad's
  // The forward's fwd_w operand serves dgrad (plan.reuse_fwd_w, or both W operands plain BF16 roundings).
  bool has_w = false;
  bool w_bf16 = false;
  bool w_has_g = false;
  Tensor w_op;  // FP32 [out, in], or BF16 bits packed two per float ([1, ceil(out*in/2)])
  Tensor w_g;   // [1, 1]: g of a BF16 operand
  // wgrad_x computed in the forward (a BF16 quantizer operand): its bits packed
  // two per float ([1, ceil(B*in/2)]) and g ([1, 1]); x itself is not kept.
  bool wx_ready = false;
  OperandPlan wx_plan;  // the plan it was computed with (backward checks its own is the same)
  Tensor wx, wx_g;
  bool forward_only = false;  // the forward ran with ctx.backward false: nothing above is kept for backward
};

inline bool same_spec(const QuantizerSpec* a, const QuantizerSpec* b) { return a == b || (a && b && *a == *b); }
inline bool same_stream(const RandomStream& a, const RandomStream& b) { return a.seed == b.seed && a.stream == b.stream; }
inline bool same_plan(const OperandPlan& a, const OperandPlan& b) {
  return a.op == b.op && same_spec(a.pre, b.pre) && same_stream(a.pre_stream, b.pre_stream) && a.rht == b.rht &&
         a.rht_seed == b.rht_seed && a.rht_kind == b.rht_kind && a.rht_axis == b.rht_axis && same_spec(a.quantizer, b.quantizer) && same_stream(a.stream, b.stream) &&
         a.round_bf16 == b.round_bf16;
}

inline std::string shape(int64_t r, int64_t c) { return "[" + std::to_string(r) + ", " + std::to_string(c) + "]"; }

inline void check_int(int64_t v, const char* what) {
  if (v > 0x7FFFFFFF)
    throw Error(std::string("CudaLinear: ") + what + " (" + std::to_string(v) + ") exceeds cuBLAS's int range");
}


// The layer's scratch, cuBLAS handle and operand machinery (CudaLinear::Impl).
struct LinearCore {
  cuda::Blas blas{kStream};
  cuda::ClassedGemm classed;  // the BF16 GEMMs' algorithms by shape class
  cuda::QuantWorkspace qws;
  Slot slot[2];
  DeviceBuffer<uint16_t> grouped_dy;  // the grouped layer's BF16 dy (grouped_linear.cpp)
  // The grouped layer's quantized operands (grouped_linear.cpp): the forward's x and (without
  // reuse_fwd_w) W operands, wgrad's dy; per-group g_dec and GEMM alphas; the grouped quantizer's scratch.
  DeviceBuffer<uint16_t> grouped_xh, grouped_wh, grouped_dyc;
  DeviceBuffer<float> grouped_scalars;
  cuda::GroupedQuantWorkspace gqws;
  DeviceBuffer<uint16_t> dy_cols_h;  // backward: wgrad's dy operand when made together with dgrad's
  DeviceBuffer<float> dy_cols_g{1};
  // [alpha, beta] pairs of the device-pointer-mode GEMMs: the forward, dgrad
  // and wgrad GEMMs whose alpha a quantization writes (GemmAlpha; betas 0, 0,
  // 1 set once), then the pair alpha_beta_device computes for any other.
  enum AlphaSlot { kFwd = 0, kDgrad = 1, kWgrad = 2, kComputed = 3 };
  DeviceBuffer<float> gemm_ab = preset_betas();
  GemmAlpha alpha_for(AlphaSlot slot, const float* other) {
    return GemmAlpha{gemm_ab.data() + 2 * slot, other, slot == kWgrad ? 1.0f : 0.0f};
  }
  // The device beta (0 or 1) of the preset pairs, for a GEMM whose alpha is elsewhere (DevOperand::beta_at).
  const float* beta_of(float beta) const { return gemm_ab.data() + (beta == 0.0f ? 1 : 5); }
  static DeviceBuffer<float> preset_betas() {
    DeviceBuffer<float> b;
    b.upload(std::vector<float>{1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 1.0f, 1.0f, 0.0f});
    return b;
  }
  DeviceBuffer<float> hook_buf;
  DeviceBuffer<uint16_t> hook_h;  // the native route's operands in BF16 for the operand hook
  cuda::nn::Scratch colsum;  // db's column-sum partials
  DeviceBuffer<uint16_t> bias_h;  // a BF16 output's bias r(b) (the cuBLASLt epilogue's vector)
  DeviceBuffer<float> out_f32;    // a BF16 output's FP32 GEMM result where cuBLASLt cannot write the BF16
  CudaLinear::OperandHook hook;
  // The native-operand route (linear_native.hpp): its scratch, the device's compute capability (asked once),
  // the test switch (CudaLinear::force_native_route) and the test hook (CudaLinear::set_native_hook).
  NativeScratch native;
  const int cc = cuda::compute_capability();
  bool force_native = false;
  CudaLinear::NativeHook native_hook;
  NumericsWorkspacePtr numerics_ws;  // made on the first measuring step
  int64_t numerics_step = -1;        // the step numerics_ws's slots belong to

  // Numerics statistics (train/numerics.hpp) of the operands ops made from the
  // device tensor src [rows, cols], when the step measures them (a recorder is
  // set; off-steps: this test only). A BF16-only source (no FP32 data) is not measured.
  void measure(const LinearContext& ctx, const LinearPlan& plan, std::initializer_list<Operand> ops,
               const float* src, int64_t rows, int64_t cols) {
    NumericsRecorder* rec = numerics_recorder();
    if (rec == nullptr || !ctx.backward || src == nullptr) return;
    if (!numerics_ws) numerics_ws = make_numerics_workspace();
    if (rec->step() != numerics_step) begin_measuring(*numerics_ws), numerics_step = rec->step();
    for (Operand op : ops)  // read back when the step ends (NumericsRecorder::lines)
      rec->add_later(ctx, plan.operand(op),
                     operand_numerics_device_async(plan.operand(op), src, rows, cols, *numerics_ws, kStream));
  }

  // W's operand for `op` (fwd_w, dgrad_w), whose GEMM's other operand is
  // BF16 (other_bf16) or FP32: where the plan takes W as it is, W is a weight
  // cast whose packed form the backend keeps (l.w_stored: StoredNvfp4,
  // train/cuda/cast_store.hpp) and the other operand is BF16, that form
  // decoded into slot[1]'s exact BF16 operand with the cast's g_dec (the same
  // values, W = bf16 * g_dec, so the GEMM runs on the BF16 tensor cores, as
  // the FP32-primary run's quantized W does); else prepare() (an FP32 GEMM
  // takes the FP32 W as it is, no decode and expansion).
  // Where a native FP4 GEMM takes W (native_route: sm_100+, the other operand
  // NVFP4 [1,16]), prepare_w is not called: the forward and dgrad take W as its
  // packed cast (linear_native.hpp: packed_operand / packed_operand_columnwise),
  // never quantized again. On Hopper (the default route) this BF16 decode stays.
  DevOperand prepare_w(Operand op, const LayerPlan& l, const OperandPlan& p, const float* w, int64_t rows, int64_t cols,
                       bool other_bf16, GemmAlpha alpha = {}) {
    if (!other_bf16 || !takes_stored_w(l, p))
      return prepare(p, w, rows, cols, slot[1], nullptr, nullptr, true, alpha);
    const auto* stored = dynamic_cast<const StoredNvfp4*>(l.w_stored);
    FP4LAB_CHECK(stored != nullptr, "CudaLinear: a stored weight the cuda backend did not make");
    const cuda::PackedNvfp4& c = stored->form;
    Slot& s = slot[1];
    s.h.at_least(size_t(rows * cols));
    cuda::cast_operand_device(c, rows, cols, s.h.data(), kStream);
    DevOperand o;
    o.bf16 = s.h.data();
    o.g = c.g_dec;
    report(op, o, rows, cols);
    return o;
  }

  // The native route of the GEMM whose W operand is w_op and other operand other_op, k its reduction length
  // (native_route, linear_native.hpp: the one rule), or nullopt: the BF16 route.
  std::optional<NativeRoute> native_route_of(const LayerPlan& l, Operand w_op, Operand other_op, int64_t k) const {
    return native_route(l, w_op, single_quantizer(l.plan.operand(other_op)), k, cc, force_native);
  }

  // The native route's GEMM: out [m, n] = Q(src) [m, k] times W's operand (w_rows x w_cols its stored shape;
  // columnwise: dgrad's W^T [w_cols, w_rows], else the forward's W [w_rows, w_cols]) transposed, src's plan
  // (other_op) quantized into codes (native_codes), out FP32 (y) or BF16 (y_bf16), bias as native_gemm. Reports
  // both operands to the hooks: the operand hook gets W's values in W's layout [w_rows, w_cols] (as prepare_w
  // reports them), the native hook the operands handed to the GEMM.
  void native_product(const NativeRoute& r, Operand other_op, Operand w_op, const LayerPlan& l, const float* src,
                      int64_t m, int64_t k, int64_t w_rows, int64_t w_cols, bool columnwise, float* y,
                      uint16_t* y_bf16, const float* bias) {
    const cuda::QuantOperand a =
        native_codes(r.other, l.plan.operand(other_op).stream, src, m, k, native, qws, kStream);
    const cuda::QuantOperand b = native_w(*r.w, columnwise, w_rows, w_cols, native, kStream);
    if (hook) {
      hook_h.at_least(size_t(std::max(m * k, w_rows * w_cols)));
      cuda::dequant_operand_bf16(a, hook_h.data(), kStream);
      report(other_op, DevOperand{nullptr, hook_h.data(), a.global_decode}, m, k);
      cuda::cast_operand_device(r.w->form, w_rows, w_cols, hook_h.data(), kStream);
      report(w_op, DevOperand{nullptr, hook_h.data(), r.w->form.g_dec}, w_rows, w_cols);
    }
    if (native_hook) {
      native_hook(other_op, a, r.path);
      native_hook(w_op, b, r.path);
    }
    native_gemm(blas, r.path, a, b, y, y_bf16, bias, native, kStream);
  }

  // Executes plan p on the source src [rows, cols] (device, not modified),
  // writing into slot s, or, for a BF16 quantizer operand, into bf16_dst /
  // g_dst when given (caller-owned, rows * cols BF16 values and one float).
  // Reports the operand to the hook unless `report_now` is false.
  // alpha: where the operand is a BF16 quantizer operand, its quantization also
  // writes the alpha of its GEMM (DevOperand::alpha_beta).
  DevOperand prepare(const OperandPlan& p, const float* src, int64_t rows, int64_t cols, Slot& s,
                     uint16_t* bf16_dst = nullptr, float* g_dst = nullptr, bool report_now = true,
                     GemmAlpha alpha = {}) {
    const int64_t n = rows * cols;
    const float* cur = src;
    auto to_work = [&] {
      if (cur == s.work.data()) return;
      s.work.at_least(size_t(n));
      if (n > 0)
        check(cudaMemcpyAsync(s.work.data(), cur, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, kStream),
              "CudaLinear: operand copy");
      cur = s.work.data();
    };
    if (p.pre) {
      to_work();
      cuda::fake_quantize_device(*p.pre, s.work.data(), rows, cols, p.pre_stream, qws, kStream);
    }
    const bool exact = p.quantizer && bf16_exact(*p.quantizer);
    const bool rht_in_quantizer = rht_foldable(p);  // see rht_foldable
    // Otherwise the RHT's output amax feeds the quantizer's tensor-amax scale
    // directly when nothing transforms the tensor in between.
    const bool rht16_cols = p.rht_kind == RhtKind::rht16 && p.rht_axis == RhtAxis::cols;
    const bool amax_from_rht = p.rht && rht16_cols && exact && !rht_in_quantizer;
    if (p.rht && !rht_in_quantizer) {
      // Out of place from the source (no copy first), in place after `pre`.
      s.work.at_least(size_t(n));
      if (rht16_cols)
        cuda::rht_forward_device(cur, s.work.data(), rows, cols, RhtAxis::cols, p.rht_seed, kStream,
                                 amax_from_rht ? s.amax.data() : nullptr);
      else
        cuda::rht_forward_device(cur, s.work.data(), rows, cols, p.rht_axis, p.rht_kind, p.rht_seed, kStream);
      cur = s.work.data();
    }
    DevOperand o;
    if (exact) {
      if (bf16_dst == nullptr) {
        s.h.at_least(size_t(n));
        bf16_dst = s.h.data();
      }
      if (g_dst == nullptr) {
        s.g.at_least(1);
        g_dst = s.g.data();
      }
      QuantizerSpec q = *p.quantizer;
      if (rht_in_quantizer) {
        q.rht = true;
        q.rht_seed = p.rht_seed;
      }
      cuda::QuantOutputs out;
      out.dequant_bf16 = bf16_dst;
      out.bf16_gemm_operand = true;
      out.global_decode = g_dst;
      out.gemm_alpha = alpha.dev;
      out.gemm_alpha_other = alpha.other;
      cuda::quantize_device(q, cur, cuda::InputType::f32, rows, cols, p.stream, out, qws, kStream,
                            cuda::QuantPath::automatic, amax_from_rht ? s.amax.data() : nullptr);
      o.bf16 = bf16_dst;
      o.g = g_dst;
      o.alpha_beta = alpha.dev;
      o.ab_beta = alpha.beta;
    } else if (p.quantizer) {
      to_work();
      cuda::fake_quantize_device(*p.quantizer, s.work.data(), rows, cols, p.stream, qws, kStream);
      o.f32 = s.work.data();
    } else if (p.round_bf16) {
      s.h.at_least(size_t(n));
      cuda::round_bf16_device(cur, n, s.h.data(), kStream);
      o.bf16 = s.h.data();
    } else {
      o.f32 = cur;
    }
    if (report_now) report(p.op, o, rows, cols);
    return o;
  }

  // Plans a and b of one source [rows, cols] in one quantize_dual_device pass
  // with their quantizers q (pair_specs): a into slot sa (returned), b into
  // b_h / b_g (rows * cols BF16 values and one float). Reports neither.
  // alpha_a / alpha_b: the GEMM alphas their quantization writes (GemmAlpha);
  // the caller sets b's on the operand it builds from b_h / b_g.
  // from: what the source's producer wrote for this layer (null: nothing);
  // its amaxes serve where written for these quantizers' request.
  DevOperand prepare_pair(const PairSpecs& q, const OperandPlan& a, const OperandPlan& b, const float* src,
                          const ProducerOutputs* from, int64_t rows, int64_t cols, Slot& sa, uint16_t* b_h, float* b_g,
                          GemmAlpha alpha_a = {}, GemmAlpha alpha_b = {}) {
    const bool given = from != nullptr && from->amax_written && from->request == request_of(q);  // shape: checked_from
    sa.h.at_least(size_t(rows * cols));
    sa.g.at_least(1);
    cuda::QuantOutputs out_a, out_b;
    out_a.dequant_bf16 = sa.h.data();
    out_a.global_decode = sa.g.data();
    out_b.dequant_bf16 = b_h;
    out_b.global_decode = b_g;
    out_a.bf16_gemm_operand = out_b.bf16_gemm_operand = true;
    out_a.gemm_alpha = alpha_a.dev;
    out_a.gemm_alpha_other = alpha_a.other;
    out_b.gemm_alpha = alpha_b.dev;
    out_b.gemm_alpha_other = alpha_b.other;
    cuda::quantize_dual_device(q.a, a.stream, out_a, q.b, b.stream, out_b, src, cuda::InputType::f32, rows, cols, qws,
                               kStream, given ? from->amax : nullptr);
    return DevOperand{nullptr, sa.h.data(), sa.g.data(), alpha_a.dev, alpha_a.beta};
  }

  // The FP32 value of a BF16 operand (into s.expand), or the FP32 operand itself.
  const float* as_f32(const DevOperand& o, int64_t n, Slot& s) {
    if (!o.is_bf16()) return o.f32;
    s.expand.at_least(size_t(n));
    cuda::bf16_to_f32_device(o.bf16, n, o.g, s.expand.data(), kStream);
    return s.expand.data();
  }

  void report(Operand op, const DevOperand& o, int64_t rows, int64_t cols) {
    if (!hook) return;
    const float* v = o.f32;
    if (o.is_bf16()) {
      hook_buf.at_least(size_t(rows * cols));
      cuda::bf16_to_f32_device(o.bf16, rows * cols, o.g, hook_buf.data(), kStream);
      v = hook_buf.data();
    }
    hook(op, v, rows, cols);
  }

  // Column-major C [m, n] (ldc) = alpha op(A) op(B) + beta C, with A, B the
  // prepared operands (row-major buffers seen column-major with lda / ldb;
  // a_elems / b_elems = their element counts). A and B come from slot[0] / slot[1]
  // as given in sa / sb (for expansion scratch).
  // The alpha and beta of a GEMM of two BF16 operands: alpha = g_dec(A) g_dec(B) on the device when either
  // operand has a global scale (where an operand's quantization wrote this GEMM's alpha, GemmAlpha, no kernel
  // computes it here), else host 1 and the caller's beta (which must outlive the GEMM call).
  struct Scalars {
    const float *alpha, *beta;
    bool device;
  };
  Scalars scalars(const DevOperand& a, const DevOperand& b, const float& beta) {
    static constexpr float kOne = 1.0f;
    if (!a.g && !b.g) return {&kOne, &beta, false};
    const DevOperand* made = a.alpha_beta ? &a : b.alpha_beta ? &b : nullptr;
    if (made) {
      if (made->ab_beta != beta) throw Error("CudaLinear: a GEMM alpha slot was prepared for another beta");
      return {made->alpha_beta, made->beta_at ? made->beta_at : made->alpha_beta + 1, true};
    }
    float* ab = gemm_ab.data() + 2 * kComputed;
    cuda::alpha_beta_device(a.g, b.g, beta, ab, kStream);
    return {ab, ab + 1, true};
  }

  // out (may be null): C in BF16 alone (Bf16Out; c unused): cuBLASLt's BF16 output where both operands are
  // BF16 (plain roundings, or scaled NVFP4/MX values with alpha on the device) and no bias goes into its
  // epilogue (kBf16BiasEpilogue), else this GEMM into FP32 scratch and one rounding pass (the same bits: r() of
  // the FP32 result; ClassedGemm::bf16_bf16 states the equality and where it is checked).
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const DevOperand& a,
            int64_t lda, int64_t a_elems, Slot& sa, const DevOperand& b, int64_t ldb, int64_t b_elems, Slot& sb,
            float* c, int64_t ldc, float beta, const Bf16Out* out = nullptr) {
    if (m == 0 || n == 0) return;
    if (out) {
      FP4LAB_CHECK(beta == 0.0f && ldc == m, "CudaLinear: a BF16 GEMM output needs beta 0 and a packed C");
      if (k > 0 && a.is_bf16() && b.is_bf16() && ((!a.g && !b.g) || kBf16ScaledOutput) &&
          (!out->bias || kBf16BiasEpilogue)) {
        check_int(m, "GEMM m");
        check_int(n, "GEMM n");
        check_int(k, "GEMM k");
        const uint16_t* bias = nullptr;
        if (out->bias) {
          cuda::round_bf16_device(out->bias, m, bias_h.at_least(size_t(m)), kStream);
          bias = bias_h.data();
        }
        const Scalars sc = scalars(a, b, beta);
        classed.bf16_bf16(blas, ta, tb, m, n, k, sc.alpha, a.bf16, lda, b.bf16, ldb, sc.beta, out->d, ldc, sc.device,
                          bias);
        return;
      }
      float* f = out_f32.at_least(size_t(m * n));
      gemm(ta, tb, m, n, k, a, lda, a_elems, sa, b, ldb, b_elems, sb, f, ldc, 0.0f);
      cuda::bias_round_bf16_device(f, out->bias, n, m, out->d, kStream);
      return;
    }
    check_int(m, "GEMM m");
    check_int(n, "GEMM n");
    check_int(k, "GEMM k");
    if (k == 0) {
      // C = beta C (cuBLAS with k = 0 does the same, but say it explicitly).
      if (beta == 0.0f) check(cudaMemsetAsync(c, 0, size_t(m * n) * sizeof(float), kStream), "CudaLinear: zero C");
      return;
    }
    const cublasHandle_t h = blas.handle();
    if (a.is_bf16() && b.is_bf16()) {
      // cuBLASLt with the algorithm of the shape's class (cuda/gemm_classed.hpp): an expert's token count
      // changes every step, and cublasGemmEx's heuristic for an unseen shape costs ~200 us of host time.
      const Scalars sc = scalars(a, b, beta);
      classed.bf16_f32(blas, ta, tb, m, n, k, sc.alpha, a.bf16, lda, b.bf16, ldb, sc.beta, c, ldc, sc.device);
      return;
    }
    const float* af = as_f32(a, a_elems, sa);
    const float* bf = as_f32(b, b_elems, sb);
    const float alpha = 1.0f;
    check_cublas(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
    check_cublas(
        cublasGemmEx(h, ta, tb, int(m), int(n), int(k), &alpha, af, CUDA_R_32F, int(lda), bf, CUDA_R_32F, int(ldb),
                     &beta, c, CUDA_R_32F, int(ldc), CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (fp32, pedantic)");
  }
};

}  // namespace linear_detail

struct CudaLinear::Impl : linear_detail::LinearCore {};

}  // namespace fp4lab::train
