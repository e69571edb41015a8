// The backend interface's free functions (backend.hpp): the choice of a
// backend by name and the checks of index ranges and row indices; the
// defaults of the grouped linear and of the routing seam.
#include "train/backend.hpp"

#include <string>
#include <vector>

#include "core/error.hpp"
#include "sim/quantizer.hpp"
#include "train/mx_rows.hpp"

namespace fp4lab::train {

void check_ranges(const char* what, std::span<const IndexRange> ranges, int64_t n) {
  int64_t end = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const IndexRange& r = ranges[k];
    if (r.size <= 0 || r.offset < end || r.offset > n - r.size)
      throw Error(std::string(what) + ": range " + std::to_string(k) + " [" + std::to_string(r.offset) + ", " +
                  std::to_string(r.offset + r.size) + ") is " +
                  (r.size <= 0      ? "empty"
                   : r.offset < end ? "not after the previous range's end " + std::to_string(end)
                                    : "outside the buffer of " + std::to_string(n) + " elements") +
                  "; ranges must be non-empty, sorted, disjoint and inside [0, n)");
    end = r.offset + r.size;
  }
}

void check_same_cols(const char* what, const Tensor& a, const Tensor& b) {
  if (a.cols != b.cols)
    throw Error(std::string(what) + ": tensors of " + std::to_string(a.cols) + " and " + std::to_string(b.cols) +
                " columns; they must have the same width");
}

int64_t check_row_indices(const char* what, const int32_t* idx, int64_t n, int64_t rows) {
  int64_t named = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < -1 || idx[i] >= rows)
      throw Error(std::string(what) + ": index " + std::to_string(i) + " is " + std::to_string(idx[i]) +
                  ", outside the " + std::to_string(rows) + " rows [0, " + std::to_string(rows) +
                  ") and not -1 (no row)");
    named += idx[i] >= 0;
  }
  return named;
}

void check_groups(const LinearGroups& g, int64_t rows) {
  const size_t G = g.size();
  FP4LAB_CHECK(g.w.size() == G && (g.b.empty() || g.b.size() == G) && g.offsets.size() == G + 1,
               "LinearGroups: " + std::to_string(G) + " plans with " + std::to_string(g.w.size()) + " weights, " +
                   std::to_string(g.b.size()) + " biases and " + std::to_string(g.offsets.size()) + " offsets");
  FP4LAB_CHECK(g.offsets[0] == 0 && g.offsets[G] == rows, "LinearGroups: offsets do not run from 0 to the rows");
  for (size_t i = 0; i < G; ++i) FP4LAB_CHECK(g.rows(i) >= 0, "LinearGroups: decreasing offsets");
}

namespace {

// The default grouped linear's state: each non-empty group's own.
struct PerGroupState final : LinearState {
  std::vector<std::unique_ptr<LinearState>> groups;
};

}  // namespace

void Backend::grouped_linear_forward(const LinearGroups& g, const Tensor& x, Tensor& y,
                                     std::unique_ptr<LinearState>& state) {
  check_groups(g, x.rows);
  const int64_t out = g.size() ? g.w[0].rows : 0;
  if (y.rows != x.rows || y.cols != out || (y.data == nullptr && y.size() > 0)) y = empty(x.rows, out);
  auto st = std::make_unique<PerGroupState>();
  st->groups.resize(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    if (g.rows(i) == 0) continue;  // a group without rows runs nothing
    Tensor yg = rows_of(y, g.offsets[i], g.rows(i));
    linear_forward(*g.plans[i], rows_of(x, g.offsets[i], g.rows(i)), g.w[i], g.bias(i), yg, st->groups[i]);
  }
  state = std::move(st);
}

void Backend::grouped_linear_backward(const LinearGroups& g, const LinearState& state, const Tensor& dy, Tensor& dx,
                                      std::span<Tensor> dw_acc, std::span<float* const> db_acc) {
  check_groups(g, dy.rows);
  const auto* st = dynamic_cast<const PerGroupState*>(&state);
  FP4LAB_CHECK(st != nullptr && st->groups.size() == g.size() && dw_acc.size() == g.size() &&
                   (db_acc.empty() || db_acc.size() == g.size()),
               "grouped_linear_backward: not the state of this grouped_linear_forward, or gradients per group missing");
  const int64_t in = g.size() ? g.w[0].cols : 0;
  if (dx.rows != dy.rows || dx.cols != in || (dx.data == nullptr && dx.size() > 0)) dx = empty(dy.rows, in);
  for (size_t i = 0; i < g.size(); ++i) {
    if (g.rows(i) == 0) continue;
    Tensor dxg = rows_of(dx, g.offsets[i], g.rows(i));
    linear_backward(*g.plans[i], *st->groups[i], g.w[i], rows_of(dy, g.offsets[i], g.rows(i)), dxg, dw_acc[i],
                    db_acc.empty() ? nullptr : db_acc[i]);
  }
}

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") {
#ifdef FP4LAB_WITH_CUDA
    return make_cuda_backend();
#else
    throw Error("backend \"cuda\": this fp4lab was built without CUDA (valid backends here: cpu)");
#endif
  }
  throw Error("backend \"" + name + "\" unknown; valid: cpu, cuda");
}

void Backend::fake_quantize(Tensor& x, const QuantizerSpec& q) {
  std::vector<float> h(static_cast<size_t>(x.size()));
  download(x, h.data());
  fp4lab::fake_quantize(q, MatrixView<float>(h.data(), x.rows, x.cols));
  upload(h.data(), x);
}

void Backend::encode_rows_mx(const QuantizerSpec& q, const Tensor& x, Tensor& bytes) {
  const MxRows m = mx_rows_for("encode_rows_mx", q, x.rows, x.cols, bytes.size() * 4);
  std::vector<float> h(size_t(x.size())), hb(size_t(bytes.size()), 0.0f);
  download(x, h.data());
  mx_encode_rows(m, h.data(), x.rows, reinterpret_cast<uint8_t*>(hb.data()));
  upload(hb.data(), bytes);
}

void Backend::decode_rows_mx(const QuantizerSpec& q, const Tensor& bytes, Tensor& x) {
  const MxRows m = mx_rows_for("decode_rows_mx", q, x.rows, x.cols, bytes.size() * 4);
  std::vector<float> hb(size_t(bytes.size())), h(size_t(x.size()));
  download(bytes, hb.data());
  mx_decode_rows(m, reinterpret_cast<const uint8_t*>(hb.data()), x.rows, h.data());
  upload(h.data(), x);
}

// ---- the routing seam's defaults: the routing on the host (HostRouteState) ----

namespace {

HostRouteState& host_route(RouteState& r) {
  auto* h = dynamic_cast<HostRouteState*>(&r);
  FP4LAB_CHECK(h != nullptr, "Backend::moe_*: a routing state of another backend's moe_route");
  return *h;
}
const HostRouteState& host_route(const RouteState& r) { return host_route(const_cast<RouteState&>(r)); }

}  // namespace

std::unique_ptr<RouteState> Backend::moe_route(const RouteParams& p, const Tensor& logits) {
  FP4LAB_CHECK(logits.cols == p.experts, "moe_route: logits of " + std::to_string(logits.cols) + " columns for " +
                                             std::to_string(p.experts) + " experts");
  std::vector<float> host(static_cast<size_t>(logits.size()));
  download(logits, host.data());
  auto s = std::make_unique<HostRouteState>(route(p, host.data(), logits.rows));
  s->params = p;
  return s;
}

std::unique_ptr<RouteState> Backend::moe_route_local(const RouteParams& p, const Tensor& logits) {
  FP4LAB_CHECK(logits.cols == p.experts, "moe_route_local: logits of " + std::to_string(logits.cols) + " columns for " +
                                             std::to_string(p.experts) + " experts");
  std::vector<float> host(static_cast<size_t>(logits.size()));
  download(logits, host.data());
  auto s = std::make_unique<HostRouteState>(route_local(p, host.data(), logits.rows));
  s->params = p;
  return s;
}

std::vector<int64_t> Backend::moe_route_counts(const RouteState& r) { return host_route(r).r.count; }

std::vector<double> Backend::moe_route_partials(const RouteState& r) { return host_route(r).r.block_sums; }

void Backend::moe_route_finish(RouteState& r, const ExpertShard& shard, std::vector<int64_t> count_all,
                               const std::vector<double>& block_sums_all, int64_t grad_tokens) {
  HostRouteState& h = host_route(r);
  route_group(h.params, h.r, shard, std::move(count_all), grad_tokens);
  route_losses(h.params, h.r, block_sums_all);
  h.refresh();
}

void Backend::moe_reorder(const Tensor& received, const RouteState& r, Tensor& grouped) {
  const HostRouteState& h = host_route(r);
  FP4LAB_CHECK(grouped.rows == int64_t(h.r.recv_index.size()),
               "moe_reorder: grouped of " + std::to_string(grouped.rows) + " rows, the routing's experts take " +
                   std::to_string(h.r.recv_index.size()));
  gather_rows_indexed(received, h.r.recv_index.data(), grouped);
}

void Backend::moe_unreorder(const Tensor& grouped, const RouteState& r, Tensor& back) {
  const HostRouteState& h = host_route(r);
  FP4LAB_CHECK(back.rows == int64_t(h.unreorder.size()), "moe_unreorder: back of " + std::to_string(back.rows) +
                                                             " rows, the routing received " +
                                                             std::to_string(h.unreorder.size()));
  gather_rows_indexed(grouped, h.unreorder.data(), back);
}

void Backend::moe_gather(const Tensor& x, const RouteState& r, Tensor& grouped) {
  gather_rows_indexed(x, host_route(r).r.token.data(), grouped);
}

void Backend::moe_combine(const Tensor& src, const RouteState& r, bool gated, Tensor& out) {
  const Routing& h = host_route(r).r;
  combine_rows(src, h.pos.data(), gated ? h.gate.data() : nullptr, h.k, out);
}

void Backend::moe_combine_backward(const Tensor& dout, const Tensor& src, RouteState& r, Tensor& dsrc) {
  HostRouteState& h = host_route(r);
  h.dgate.resize(static_cast<size_t>(h.r.tokens * h.r.k));
  combine_rows_backward(dout, src, h.r.pos.data(), h.r.gate.data(), h.r.k, dsrc, h.dgate.data());
}

void Backend::moe_router_grad(const RouteState& r, float loss_scale, Tensor& dlogits) {
  const HostRouteState& h = host_route(r);
  FP4LAB_CHECK(h.dgate.size() == static_cast<size_t>(h.r.tokens * h.r.k),
               "moe_router_grad: no moe_combine_backward before it");
  FP4LAB_CHECK(dlogits.rows == h.r.tokens && dlogits.cols == h.r.experts, "moe_router_grad: dlogits' shape");
  const std::vector<float> d = router_logit_grad(h.params, h.r, h.dgate.data(), loss_scale);
  upload(d.data(), dlogits);
}

Routing Backend::moe_download(const RouteState& r, std::vector<float>* dgate) {
  const HostRouteState& h = host_route(r);
  if (dgate) *dgate = h.dgate;
  return h.r;
}

}  // namespace fp4lab::train
