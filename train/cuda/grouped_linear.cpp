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
// per group.
#include <algorithm>
#include <optional>
#include <vector>

#include "train/cuda/linear_impl.hpp"

namespace fp4lab::train {

using namespace linear_detail;  // linear_impl.hpp: the layer's private helpers

namespace {

// The plans the grouped layer runs (linear.hpp); the default runs any other.
enum class GroupForm : uint8_t { bf16, fp32 };

bool plain(const OperandPlan& p) { return !p.quantizer && !p.pre && !p.rht && !p.round_bf16; }

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
  return std::nullopt;
}

// The one form of every group's plan (and one pass kind), or none.
std::optional<GroupForm> group_form(const LinearGroups& g) {
  if (g.size() == 0) return std::nullopt;
  const std::optional<GroupForm> f = form_of(*g.plans[0]);
  for (size_t i = 1; i < g.size() && f; ++i)
    if (form_of(*g.plans[i]) != f || g.plans[i]->ctx.backward != g.plans[0]->ctx.backward) return std::nullopt;
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
  Tensor x_op, w_op;
  std::vector<int64_t> x_start, w_start;
  bool w_kept = false;  // fp32: w_op holds the W copies
};

std::string group_shape(size_t g, const Tensor& t) {
  return "group " + std::to_string(g) + "'s " + shape(t.rows, t.cols);
}

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
  for (size_t i = 0; i < G; ++i) {
    const int64_t n = g.rows(i), off = g.offsets[i];
    if (n == 0) continue;
    DevOperand xo, wo;
    if (*form == GroupForm::bf16) {
      xo.bf16 = reinterpret_cast<const uint16_t*>(st->x_op.data) + st->x_start[i];
      wo.bf16 = reinterpret_cast<const uint16_t*>(st->w_op.data) + st->w_start[i];
    } else {
      xo.f32 = x.data + off * in;
      wo.f32 = g.w[i].data;
    }
    im.report(Operand::fwd_x, xo, n, in);
    im.report(Operand::fwd_w, wo, out, in);
    im.gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, wo, in, out * in, im.slot[1], xo, in, n * in, im.slot[0],
            y.data + off * out, out, 0.0f);
    if (g.bias(i) != nullptr && g.plans[i]->plan.add_bias)
      cuda::add_bias_device(y.data + off * out, g.bias(i), n, out, kStream);
  }
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
