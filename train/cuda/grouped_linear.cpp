// The grouped linear layer on the GPU (linear.hpp CudaLinear::grouped_forward
// / grouped_backward): a mixture of experts' experts as one layer. Each group
// runs the dense layer's calls (linear.cpp) on its rows with its plan, in
// group order, so the bits are the default's (train/backend.hpp): the same
// operand values, the same Impl::gemm with the same m, n, k and leading
// dimensions, the operands at 256-byte-aligned starts as the dense layer's
// scratch is, the same bias and column-sum kernels on the same row slices,
// the same numerics measurements and operand reports in the same order. What
// is shared is the element-wise work: x, dy and the groups' W are each rounded
// to BF16 in one launch (round_bf16_slices_device), and nothing is allocated
// per group. Quantized plans (every operand one BF16-exact quantizer of its
// source, the wgrad RHT folded in: the nvfp4 and MX families) quantize each
// operand of all groups in one grouped quantization (cuda/grouped.hpp: one
// launch where it applies, plus the per-group amax pass; the experts' W read
// at their own addresses), each group's operand at a 256-byte-aligned start,
// each group's GEMM alpha written by the quantization (g_dec times the other
// operand's, on the device), then each group's dense GEMM call. The dense
// layer's dual passes (fwd_x with wgrad_x, the two dy operands) equal the two
// separate quantizations bit for bit (cuda/quantize.hpp), which the grouped
// layer runs.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "train/cuda/linear_impl.hpp"

namespace fp4lab::train {

using namespace linear_detail;  // linear_impl.hpp: the layer's private helpers

namespace {

// The plans the grouped layer runs (linear.hpp); the default runs any other.
enum class GroupForm : uint8_t { bf16, fp32, quantized };

bool plain(const OperandPlan& p) { return !p.quantizer && !p.pre && !p.rht && !p.round_bf16; }

constexpr Operand kFwdOps[] = {Operand::fwd_x, Operand::fwd_w};
constexpr Operand kAllOps[] = {Operand::fwd_x,   Operand::fwd_w,        Operand::dgrad_grad_y,
                               Operand::dgrad_w, Operand::wgrad_grad_y, Operand::wgrad_x};
std::span<const Operand> ops_of(bool backward) {
  return backward ? std::span<const Operand>(kAllOps) : std::span<const Operand>(kFwdOps);
}

// Is every operand of the pass one BF16-exact quantization of its source (no
// double quantization, the RHT foldable: single_quantizer), as the grouped
// quantizer makes it?
bool quantizes_all(const LinearPlan& p, bool backward) {
  for (Operand op : ops_of(backward))
    if (!single_quantizer(p.operand(op))) return false;
  return true;
}

// Plans a and b alike but for their random streams (the groups' own layer ids).
bool same_but_streams(const LinearPlan& a, const LinearPlan& b) {
  for (Operand op : kAllOps) {
    const OperandPlan &x = a.operand(op), &y = b.operand(op);
    if (x.op != y.op || !same_spec(x.pre, y.pre) || x.rht != y.rht || x.rht_seed != y.rht_seed ||
        x.rht_kind != y.rht_kind || x.rht_axis != y.rht_axis || !same_spec(x.quantizer, y.quantizer) ||
        x.round_bf16 != y.round_bf16)
      return false;
  }
  return a.reuse_fwd_w == b.reuse_fwd_w && a.quantized == b.quantized && a.add_bias == b.add_bias;
}

// The form of one layer's plan for its pass (backward: the backward operands count too).
std::optional<GroupForm> form_of(const LayerPlan& l) {
  const LinearPlan& p = l.plan;
  if (l.ctx.weight_cast != nullptr) return std::nullopt;
  const bool bwd = l.ctx.backward;
  if (rounds_only(p, false) && bf16_rounding_only(p.operand(Operand::fwd_w)) &&
      (!bwd || (rounds_only(p, true) && bf16_rounding_only(p.operand(Operand::dgrad_w)))))
    return GroupForm::bf16;
  bool all_plain = true;
  for (Operand op : {Operand::fwd_x, Operand::fwd_w, Operand::dgrad_grad_y, Operand::dgrad_w, Operand::wgrad_grad_y,
                     Operand::wgrad_x})
    all_plain = all_plain && (plain(p.operand(op)) || (!bwd && op != Operand::fwd_x && op != Operand::fwd_w));
  if (all_plain) return GroupForm::fp32;
  if (quantizes_all(p, bwd)) return GroupForm::quantized;
  return std::nullopt;
}

// The one form of every group's plan (and one pass kind), or none.
std::optional<GroupForm> group_form(const LinearGroups& g) {
  if (g.size() == 0) return std::nullopt;
  const std::optional<GroupForm> f = form_of(*g.plans[0]);
  for (size_t i = 1; i < g.size() && f; ++i) {
    if (form_of(*g.plans[i]) != f || g.plans[i]->ctx.backward != g.plans[0]->ctx.backward) return std::nullopt;
    // One quantizer per operand for every group (a per-layer recipe could single out an expert).
    if (f == GroupForm::quantized && !same_but_streams(g.plans[0]->plan, g.plans[i]->plan)) return std::nullopt;
  }
  return f;
}

// Element starts of slices of n[i] elements packed at multiples of `align`
// elements; back() is the total.
std::vector<int64_t> aligned_starts(const std::vector<int64_t>& n, int64_t align) {
  std::vector<int64_t> s{0};
  for (int64_t v : n) s.push_back(s.back() + (v + align - 1) / align * align);
  return s;
}

constexpr int64_t kBf16Align = 128;  // elements: 256 bytes, cudaMalloc's alignment (the dense layer's scratch)
constexpr int64_t kF32Align = 64;

struct GroupedLinearState final : LinearState {
  GroupForm form = GroupForm::bf16;
  bool forward_only = false;
  int64_t in = 0, out = 0;
  std::vector<int64_t> offsets;  // the forward's row offsets [G + 1]
  // bf16: the groups' BF16 x and W (two per float) at x_start / w_start (BF16 elements).
  // fp32: copies of the groups' x at x_start (floats), and of their W at w_start where the plan
  // reuses the forward's W for dgrad (as the dense layer keeps Q_fwd_w(W), here W itself).
  // quantized: x_op the groups' wgrad_x operands (BF16 at x_start) and x_g their g_dec [G]; where the
  // plan reuses the forward's W for dgrad, w_op the groups' fwd_w operands (BF16 at w_start) and w_g.
  Tensor x_op, w_op, x_g, w_g;
  std::vector<int64_t> x_start, w_start;
  bool w_kept = false;                // fp32 and quantized: w_op holds the groups' W operands
  std::vector<OperandPlan> wx_plans;  // quantized: the plans x_op was made with (backward checks its own)
};

// Each non-empty group's forward, in group order, as the dense layer makes it: the reports of x and W (ops(i):
// the group's {x, W} operands), the GEMM y_g = x_g W_g^T with the dense call's m, n, k and leading dimensions, the
// bias where the plan adds it.
template <class Ops>
void forward_groups(LinearCore& im, const LinearGroups& g, Tensor& y, int64_t in, int64_t out, Ops&& ops) {
  for (size_t i = 0; i < g.size(); ++i) {
    const int64_t n = g.rows(i), off = g.offsets[i];
    if (n == 0) continue;
    const auto [xo, wo] = ops(i);
    im.report(Operand::fwd_x, xo, n, in);
    im.report(Operand::fwd_w, wo, out, in);
    im.gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, wo, in, out * in, im.slot[1], xo, in, n * in, im.slot[0],
            y.data + off * out, out, 0.0f);
    if (g.bias(i) != nullptr && g.plans[i]->plan.add_bias)
      cuda::add_bias_device(y.data + off * out, g.bias(i), n, out, kStream);
  }
}

std::string group_shape(size_t g, const Tensor& t) {
  return "group " + std::to_string(g) + "'s " + shape(t.rows, t.cols);
}

uint16_t* bf16_of(const Tensor& t) { return reinterpret_cast<uint16_t*>(t.data); }

// Operand op of every group in one grouped quantization (quantize_grouped_device, its automatic launch):
// source src (FP32; group i's sizes[i] rows of `cols` at in_off[i], or concatenated where in_off is empty),
// each group with its plan's stream, into the BF16 GEMM operands at dst + starts[i], g_dec into gdec[i],
// and, where alpha is given, alpha[i] = g_dec * other[i] (the GEMM alpha; other null: g_dec).
void quantize_groups(LinearCore& im, const LinearGroups& g, Operand op, const float* src, int64_t cols,
                     const std::vector<int64_t>& sizes, std::span<const int64_t> in_off, uint16_t* dst,
                     const std::vector<int64_t>& starts, float* gdec, float* alpha = nullptr,
                     const float* other = nullptr) {
  const size_t G = g.size();
  const QuantizerSpec q = *single_quantizer(g.plans[0]->plan.operand(op));  // group_form: every group's
  std::vector<RandomStream> streams(G);
  int64_t rows = 0;
  for (size_t i = 0; i < G; ++i) streams[i] = g.plans[i]->plan.operand(op).stream, rows += sizes[i];
  cuda::GroupedQuantOutputs o;
  o.dequant_bf16 = dst;
  o.bf16_gemm_operand = true;
  o.global_decode = gdec;
  o.gemm_alpha = alpha;
  o.gemm_alpha_other = other;
  o.value_offsets = std::span<const int64_t>(starts.data(), G);
  cuda::quantize_grouped_device(q, src, cuda::InputType::f32, rows, cols, sizes, streams, o, im.gqws, kStream,
                                cuda::QuantPath::automatic, cuda::GroupedLaunch::automatic, in_off);
}

// The groups' W as element offsets from the lowest one (the experts' W lie anywhere in device memory,
// in the trainer at a parameter stride); base: that lowest W.
std::vector<int64_t> weight_offsets(std::span<const Tensor> w, const float*& base) {
  base = w[0].data;
  for (const Tensor& t : w) base = std::min<const float*>(base, t.data);
  std::vector<int64_t> off;
  for (const Tensor& t : w)
    off.push_back(int64_t((reinterpret_cast<uintptr_t>(t.data) - reinterpret_cast<uintptr_t>(base)) / sizeof(float)));
  return off;
}

// Sizes in rows of each group's W operand: `out` for a group with tokens, none for an empty one (the
// dense path quantizes no W for an expert without tokens).
std::vector<int64_t> weight_rows(const LinearGroups& g, int64_t out) {
  std::vector<int64_t> r;
  for (size_t i = 0; i < g.size(); ++i) r.push_back(g.rows(i) > 0 ? out : 0);
  return r;
}

// The per-group scalars of one call in LinearCore::grouped_scalars: [8 G] floats.
enum ScalarSlot { kGx = 0, kAlphaFwd, kGw, kGdy, kAlphaDgrad, kGwd, kGdyc, kAlphaWgrad, kScalarSlots };

}  // namespace

bool CudaLinear::grouped_forward(const LinearGroups& g, const Tensor& x, Tensor& y,
                                 std::unique_ptr<LinearState>& state,
                                 const std::function<Tensor(int64_t, int64_t)>& alloc) {
  const std::optional<GroupForm> form = group_form(g);
  if (!form) return false;
  check_groups(g, x.rows);
  const size_t G = g.size();
  const int64_t M = x.rows, in = x.cols, out = g.w[0].rows;
  for (size_t i = 0; i < G; ++i)
    if (g.w[i].rows != out || g.w[i].cols != in)
      throw Error("CudaLinear::grouped_forward: x is " + shape(M, in) + " but W is " + group_shape(i, g.w[i]) +
                  ": every W must be [out, " + std::to_string(in) + "] with group 0's out");
  FP4LAB_CHECK(x.data || M * in == 0, "CudaLinear::grouped_forward: x has no FP32 values");
  Impl& im = *impl_;
  const bool backward = g.plans[0]->ctx.backward;
  for (size_t i = 0; i < G; ++i) {  // the dense layer measures x, then W, at each group's call
    if (g.rows(i) == 0) continue;
    const LayerPlan& l = *g.plans[i];
    im.measure(l.ctx, l.plan, {Operand::fwd_x, Operand::wgrad_x}, x.data + g.offsets[i] * in, g.rows(i), in);
    im.measure(l.ctx, l.plan, {Operand::fwd_w, Operand::dgrad_w}, g.w[i].data, out, in);
  }
  if (y.rows != M || y.cols != out || (y.data == nullptr && M * out > 0)) y = alloc(M, out);

  auto st = std::make_unique<GroupedLinearState>();
  st->form = *form;
  st->forward_only = !backward;
  st->in = in, st->out = out;
  st->offsets.assign(g.offsets.begin(), g.offsets.end());
  std::vector<int64_t> xn(G), wn(G);
  for (size_t i = 0; i < G; ++i) xn[i] = g.rows(i) * in, wn[i] = g.rows(i) > 0 ? out * in : 0;

  if (*form == GroupForm::quantized) {
    // fwd_x of every group (scratch), then wgrad_x into the state (backward), then fwd_w of every group's W
    // (the state where dgrad reuses it), whose quantization writes each forward GEMM's alpha g_w * g_x.
    const std::vector<int64_t> w_rows = weight_rows(g, out);
    std::vector<int64_t> rows_of_group(G);
    for (size_t i = 0; i < G; ++i) rows_of_group[i] = g.rows(i);
    st->x_start = aligned_starts(xn, kBf16Align);
    st->w_start = aligned_starts(wn, kBf16Align);
    float* sc = im.grouped_scalars.at_least(size_t(kScalarSlots) * G);
    float* gx = sc + kGx * G;
    float* alpha_fwd = sc + kAlphaFwd * G;
    im.grouped_xh.at_least(size_t(std::max<int64_t>(st->x_start.back(), 1)));
    quantize_groups(im, g, Operand::fwd_x, x.data, in, rows_of_group, {}, im.grouped_xh.data(), st->x_start, gx);
    if (backward) {
      st->x_op = alloc(1, std::max<int64_t>((st->x_start.back() + 1) / 2, 1));
      st->x_g = alloc(1, int64_t(G));
      quantize_groups(im, g, Operand::wgrad_x, x.data, in, rows_of_group, {}, bf16_of(st->x_op), st->x_start,
                      st->x_g.data);
      for (size_t i = 0; i < G; ++i) st->wx_plans.push_back(g.plans[i]->plan.operand(Operand::wgrad_x));
    }
    st->w_kept = backward && g.plans[0]->plan.reuse_fwd_w;
    uint16_t* wh = nullptr;
    float* gw = sc + kGw * G;
    if (st->w_kept) {
      st->w_op = alloc(1, std::max<int64_t>((st->w_start.back() + 1) / 2, 1));
      st->w_g = alloc(1, int64_t(G));
      wh = bf16_of(st->w_op);
      gw = st->w_g.data;
    } else {
      wh = im.grouped_wh.at_least(size_t(std::max<int64_t>(st->w_start.back(), 1)));
    }
    const float* wbase = nullptr;
    const std::vector<int64_t> w_off = weight_offsets(g.w, wbase);
    quantize_groups(im, g, Operand::fwd_w, wbase, in, w_rows, w_off, wh, st->w_start, gw, alpha_fwd, gx);
    forward_groups(im, g, y, in, out, [&](size_t i) {
      return std::pair{DevOperand{nullptr, im.grouped_xh.data() + st->x_start[i], gx + i},
                       DevOperand{nullptr, wh + st->w_start[i], gw + i, alpha_fwd + i, 0.0f, im.beta_of(0.0f)}};
    });
    state = std::move(st);
    return true;
  }

  // The operands: bf16, every group's x and W rounded in one launch each into the state; fp32, x and W where
  // they are, and (for backward) copies as the dense layer keeps them: x (a view) always, W where the plan
  // reuses the forward's W for dgrad.
  if (*form == GroupForm::bf16) {
    st->x_start = aligned_starts(xn, kBf16Align);
    st->w_start = aligned_starts(wn, kBf16Align);
    st->x_op = alloc(1, std::max<int64_t>(st->x_start.back() / 2, 1));
    st->w_op = alloc(1, std::max<int64_t>(st->w_start.back() / 2, 1));
    std::vector<cuda::Bf16Slice> xs, ws;
    for (size_t i = 0; i < G; ++i) {
      if (g.rows(i) == 0) continue;
      xs.push_back({x.data + g.offsets[i] * in, reinterpret_cast<uint16_t*>(st->x_op.data) + st->x_start[i], xn[i]});
      ws.push_back({g.w[i].data, reinterpret_cast<uint16_t*>(st->w_op.data) + st->w_start[i], wn[i]});
    }
    cuda::round_bf16_slices_device(xs, kStream);
    cuda::round_bf16_slices_device(ws, kStream);
  } else if (backward) {
    st->x_start = aligned_starts(xn, kF32Align);
    st->x_op = alloc(1, std::max<int64_t>(st->x_start.back(), 1));
    st->w_kept = std::all_of(g.plans.begin(), g.plans.end(), [](const LayerPlan* l) { return l->plan.reuse_fwd_w; });
    if (!st->w_kept) std::fill(wn.begin(), wn.end(), 0);
    st->w_start = aligned_starts(wn, kF32Align);
    if (st->w_kept) st->w_op = alloc(1, std::max<int64_t>(st->w_start.back(), 1));
    for (size_t i = 0; i < G; ++i) {
      if (g.rows(i) == 0) continue;
      check(cudaMemcpyAsync(st->x_op.data + st->x_start[i], x.data + g.offsets[i] * in, size_t(xn[i]) * sizeof(float),
                            cudaMemcpyDeviceToDevice, kStream),
            "CudaLinear::grouped_forward: saving x");
      if (st->w_kept)
        check(cudaMemcpyAsync(st->w_op.data + st->w_start[i], g.w[i].data, size_t(wn[i]) * sizeof(float),
                              cudaMemcpyDeviceToDevice, kStream),
              "CudaLinear::grouped_forward: saving W");
    }
  }
  forward_groups(im, g, y, in, out, [&](size_t i) {
    DevOperand xo, wo;
    if (*form == GroupForm::bf16) {
      xo.bf16 = reinterpret_cast<const uint16_t*>(st->x_op.data) + st->x_start[i];
      wo.bf16 = reinterpret_cast<const uint16_t*>(st->w_op.data) + st->w_start[i];
    } else {
      xo.f32 = x.data + g.offsets[i] * in;
      wo.f32 = g.w[i].data;
    }
    return std::pair{xo, wo};
  });
  state = std::move(st);
  return true;
}

bool CudaLinear::grouped_backward(const LinearGroups& g, const LinearState& state, const Tensor& dy, Tensor& dx,
                                  std::span<Tensor> dw_acc, std::span<float* const> db_acc,
                                  const std::function<Tensor(int64_t, int64_t)>& alloc) {
  const auto* stp = dynamic_cast<const GroupedLinearState*>(&state);
  if (stp == nullptr) return false;
  const GroupedLinearState& st = *stp;
  check_groups(g, dy.rows);
  const size_t G = g.size();
  FP4LAB_CHECK(std::equal(g.offsets.begin(), g.offsets.end(), st.offsets.begin(), st.offsets.end()) &&
                   dw_acc.size() == G && (db_acc.empty() || db_acc.size() == G),
               "CudaLinear::grouped_backward: not the groups of this state's forward, or gradients per group missing");
  if (st.forward_only)
    throw Error(
        "CudaLinear::grouped_backward: the forward ran with LinearContext::backward false (evaluation) and kept "
        "nothing for a backward pass");
  const int64_t M = dy.rows, in = st.in, out = st.out;
  if (dy.cols != out)
    throw Error("CudaLinear::grouped_backward: dy is " + shape(M, dy.cols) + ", expected " + shape(M, out));
  for (size_t i = 0; i < G; ++i)
    if (dw_acc[i].rows != out || dw_acc[i].cols != in)
      throw Error("CudaLinear::grouped_backward: dW is " + group_shape(i, dw_acc[i]) + ", expected " + shape(out, in));
  FP4LAB_CHECK(dy.data || M * out == 0, "CudaLinear::grouped_backward: dy has no FP32 values");
  Impl& im = *impl_;
  for (size_t i = 0; i < G; ++i)
    if (g.rows(i) > 0)
      im.measure(g.plans[i]->ctx, g.plans[i]->plan, {Operand::dgrad_grad_y, Operand::wgrad_grad_y},
                 dy.data + g.offsets[i] * out, g.rows(i), out);
  if (dx.rows != M || dx.cols != in || (dx.data == nullptr && M * in > 0)) dx = alloc(M, in);

  if (st.form == GroupForm::quantized) {
    // dgrad's dy (its alpha where the forward's W is kept), dgrad's W otherwise (E2: the groups' W where
    // they are; it writes the alpha), wgrad's dy (its alpha with the state's x operand); then each group's
    // dense GEMM calls.
    std::vector<int64_t> rows_of_group(G), dn(G), wn(G);
    for (size_t i = 0; i < G; ++i)
      rows_of_group[i] = g.rows(i), dn[i] = g.rows(i) * out, wn[i] = g.rows(i) > 0 ? out * in : 0;
    const std::vector<int64_t> dy_start = aligned_starts(dn, kBf16Align), w_start = aligned_starts(wn, kBf16Align);
    float* sc = im.grouped_scalars.at_least(size_t(kScalarSlots) * G);
    float* gdy = sc + kGdy * G;
    float* alpha_dgrad = sc + kAlphaDgrad * G;
    float* gwd = sc + kGwd * G;
    float* gdyc = sc + kGdyc * G;
    float* alpha_wgrad = sc + kAlphaWgrad * G;
    const size_t dy_elems = size_t(std::max<int64_t>(dy_start.back(), 1));
    uint16_t* dyh = im.grouped_dy.at_least(dy_elems);
    uint16_t* dyc = im.grouped_dyc.at_least(dy_elems);
    uint16_t* wd = nullptr;
    if (st.w_kept) {
      quantize_groups(im, g, Operand::dgrad_grad_y, dy.data, out, rows_of_group, {}, dyh, dy_start, gdy, alpha_dgrad,
                      st.w_g.data);
    } else {
      quantize_groups(im, g, Operand::dgrad_grad_y, dy.data, out, rows_of_group, {}, dyh, dy_start, gdy);
      wd = im.grouped_wh.at_least(size_t(std::max<int64_t>(w_start.back(), 1)));
      const float* wbase = nullptr;
      const std::vector<int64_t> w_off = weight_offsets(g.w, wbase);
      quantize_groups(im, g, Operand::dgrad_w, wbase, in, weight_rows(g, out), w_off, wd, w_start, gwd, alpha_dgrad,
                      gdy);
    }
    quantize_groups(im, g, Operand::wgrad_grad_y, dy.data, out, rows_of_group, {}, dyc, dy_start, gdyc, alpha_wgrad,
                    st.x_g.data);
    for (size_t i = 0; i < G; ++i) {
      const int64_t n = g.rows(i), off = g.offsets[i];
      if (n == 0) continue;
      if (!same_plan(st.wx_plans[i], g.plans[i]->plan.operand(Operand::wgrad_x)))
        throw Error("CudaLinear::grouped_backward: group " + std::to_string(i) +
                    "'s wgrad x operand was computed in the forward with another plan (recipe, seed, layer or step); "
                    "backward must get the forward's LinearContext");
      // dgrad: dx^T [in, n] = W^T [in, out] dy^T [out, n]; the alpha is written by whichever operand came second.
      DevOperand go{nullptr, dyh + dy_start[i], gdy + i}, wo;
      if (st.w_kept) {
        go.alpha_beta = alpha_dgrad + i, go.beta_at = im.beta_of(0.0f);
        wo = DevOperand{nullptr, reinterpret_cast<const uint16_t*>(st.w_op.data) + st.w_start[i], st.w_g.data + i};
      } else {
        wo = DevOperand{nullptr, wd + w_start[i], gwd + i, alpha_dgrad + i, 0.0f, im.beta_of(0.0f)};
      }
      im.report(Operand::dgrad_grad_y, go, n, out);
      im.report(Operand::dgrad_w, wo, out, in);
      im.gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, wo, in, out * in, im.slot[1], go, out, n * out, im.slot[0],
              dx.data + off * in, in, 0.0f);
      // wgrad: dW^T [in, out] += x^T [in, n] dy [n, out].
      const DevOperand gy{nullptr, dyc + dy_start[i], gdyc + i, alpha_wgrad + i, 1.0f, im.beta_of(1.0f)};
      const DevOperand xo{nullptr, reinterpret_cast<const uint16_t*>(st.x_op.data) + st.x_start[i], st.x_g.data + i};
      im.report(Operand::wgrad_grad_y, gy, n, out);
      im.report(Operand::wgrad_x, xo, n, in);
      im.gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, xo, in, n * in, im.slot[1], gy, out, n * out, im.slot[0],
              dw_acc[i].data, in, 1.0f);
      if (!db_acc.empty() && db_acc[i] != nullptr)
        cuda::nn::column_sum_acc(dy.data + off * out, out, n, out, db_acc[i], im.colsum, kStream);
    }
    return true;
  }

  // dy's operands: its BF16 rounding (one launch), or dy itself.
  std::vector<int64_t> dy_start;
  if (st.form == GroupForm::bf16) {
    std::vector<int64_t> dn(G);
    for (size_t i = 0; i < G; ++i) dn[i] = g.rows(i) * out;
    dy_start = aligned_starts(dn, kBf16Align);
    im.grouped_dy.at_least(size_t(std::max<int64_t>(dy_start.back(), 1)));
    std::vector<cuda::Bf16Slice> s;
    for (size_t i = 0; i < G; ++i)
      if (g.rows(i) > 0) s.push_back({dy.data + g.offsets[i] * out, im.grouped_dy.data() + dy_start[i], dn[i]});
    cuda::round_bf16_slices_device(s, kStream);
  }
  for (size_t i = 0; i < G; ++i) {
    const int64_t n = g.rows(i), off = g.offsets[i];
    if (n == 0) continue;
    DevOperand go, wo, xo;
    if (st.form == GroupForm::bf16) {
      go.bf16 = im.grouped_dy.data() + dy_start[i];
      wo.bf16 = reinterpret_cast<const uint16_t*>(st.w_op.data) + st.w_start[i];
      xo.bf16 = reinterpret_cast<const uint16_t*>(st.x_op.data) + st.x_start[i];
    } else {
      go.f32 = dy.data + off * out;
      wo.f32 = st.w_kept ? st.w_op.data + st.w_start[i] : g.w[i].data;
      xo.f32 = st.x_op.data + st.x_start[i];
    }
    // dgrad: dx^T [in, n] = W^T [in, out] dy^T [out, n].
    im.report(Operand::dgrad_grad_y, go, n, out);
    im.report(Operand::dgrad_w, wo, out, in);
    im.gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, wo, in, out * in, im.slot[1], go, out, n * out, im.slot[0],
            dx.data + off * in, in, 0.0f);
    // wgrad: dW^T [in, out] += x^T [in, n] dy [n, out].
    im.report(Operand::wgrad_grad_y, go, n, out);
    im.report(Operand::wgrad_x, xo, n, in);
    im.gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, xo, in, n * in, im.slot[1], go, out, n * out, im.slot[0],
            dw_acc[i].data, in, 1.0f);
    if (!db_acc.empty() && db_acc[i] != nullptr)
      cuda::nn::column_sum_acc(dy.data + off * out, out, n, out, db_acc[i], im.colsum, kStream);
  }
  return true;
}

}  // namespace fp4lab::train
