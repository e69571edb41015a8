// The CUDA backend's routing state and expert parallelism's calls on it (route_state.hpp).
#include "train/cuda/route_state.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "train/cuda/moe_ops.hpp"
#include "train/cuda/shape_check.hpp"

namespace fp4lab::train {

namespace nn = fp4lab::cuda::nn;
using fp4lab::cuda::check;

const RouteSummary& CudaRouteState::summary() const {
  if (summary_read_) return summary_;
  const int64_t E = d.experts;
  std::vector<int64_t> words(size_t(E + 3));
  check(cudaMemcpy(words.data(), d.summary, nn::route_summary_bytes(E), cudaMemcpyDeviceToHost),
        "moe_route (download of the counts and losses)");
  RouteSummary& m = summary_;
  m.tokens = d.tokens, m.experts = E, m.k = d.k;
  m.count.assign(words.begin(), words.begin() + E);
  std::memcpy(&m.aux_loss, &words[size_t(E)], 8);
  std::memcpy(&m.z_loss, &words[size_t(E + 1)], 8);
  m.capacity = d.capacity, m.dropped = words[size_t(E + 2)];
  summary_read_ = true;
  return summary_;
}

void CudaRouteState::set_summary(RouteSummary m) {
  summary_ = std::move(m);
  summary_read_ = true;
}

CudaRouteState& device_route(const RouteState& r) {
  auto* c = dynamic_cast<CudaRouteState*>(const_cast<RouteState*>(&r));
  FP4LAB_CHECK(c != nullptr, "cuda backend moe_*: a routing state of another backend's moe_route");
  return *c;
}

std::unique_ptr<RouteState> expert_parallel_route_local(Backend& be, const RouteParams& p, const Tensor& logits) {
  check_shape("moe_route_local", "logits", logits, logits.rows, p.experts);
  const int64_t N = logits.rows, E = p.experts;
  auto s = std::make_unique<CudaRouteState>();
  s->mem = be.empty(1, int64_t((nn::route_bytes(N, E, p.top_k, 0) + 3) / 4));
  s->d = nn::route_layout(s->mem.data, N, E, p.top_k, 0);
  nn::route_local(logits.data, s->d, p.normalize_top_k);
  s->params = p;
  s->tokens = N;
  return s;
}
std::vector<int64_t> expert_parallel_counts(const RouteState& r) {
  const nn::RouteDevice& d = device_route(r).d;
  std::vector<int64_t> counts(size_t(d.experts));
  check(cudaMemcpy(counts.data(), d.summary, counts.size() * 8, cudaMemcpyDeviceToHost), "moe_route_counts");
  return counts;
}
// Routing::block_sums' layout [blocks, experts + 1] from the device's P and z block sums.
std::vector<double> expert_parallel_partials(const RouteState& r) {
  const nn::RouteDevice& d = device_route(r).d;
  const int64_t E = d.experts, nb = (d.tokens + kRouteSumBlock - 1) / kRouteSumBlock;
  std::vector<double> ps(static_cast<size_t>(nb * E)), zs(static_cast<size_t>(nb)),
      out(static_cast<size_t>(nb * (E + 1)));
  if (nb > 0) {
    check(cudaMemcpy(ps.data(), d.psum, ps.size() * 8, cudaMemcpyDeviceToHost), "moe_route_partials (P)");
    check(cudaMemcpy(zs.data(), d.zsum, zs.size() * 8, cudaMemcpyDeviceToHost), "moe_route_partials (z)");
  }
  for (int64_t b = 0; b < nb; ++b) {
    std::copy(ps.begin() + b * E, ps.begin() + (b + 1) * E, out.begin() + b * (E + 1));
    out[size_t(b * (E + 1) + E)] = zs[size_t(b)];
  }
  return out;
}
void expert_parallel_finish(Backend& be, RouteState& r, const ExpertShard& shard, std::vector<int64_t> count_all,
                            const std::vector<double>& block_sums_all, int64_t grad_tokens) {
  CudaRouteState& c = device_route(r);
  nn::RouteDevice& d = c.d;
  const int64_t N = d.tokens, E = d.experts, M = N * d.k;
  auto h = std::make_unique<Routing>();
  h->tokens = N, h->experts = E, h->k = d.k;
  h->expert.resize(size_t(M));
  if (M > 0)
    check(cudaMemcpy(h->expert.data(), d.expert, size_t(M) * 4, cudaMemcpyDeviceToHost), "moe_route_finish (experts)");
  h->count = expert_parallel_counts(r);
  route_group(c.params, *h, shard, std::move(count_all), grad_tokens);
  route_losses(c.params, *h, block_sums_all);
  // The send layout's rows (one rank under capacity pads each group: more rows than slots).
  d.rows = h->offset.back();
  d.capacity = h->capacity;
  if (d.rows > M) {
    c.token_mem = be.empty(1, d.rows);
    d.token = reinterpret_cast<int32_t*>(c.token_mem.data);
  }
  auto put = [](void* dst, const void* src, size_t bytes, const char* what) {
    if (bytes > 0) check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what);
  };
  put(d.pos, h->pos.data(), size_t(M) * 4, "moe_route_finish (pos)");
  put(d.token, h->token.data(), size_t(d.rows) * 4, "moe_route_finish (token)");
  std::vector<int64_t> words(size_t(E + 3));
  std::copy(h->global_count.begin(), h->global_count.end(), words.begin());
  std::memcpy(&words[size_t(E)], &h->aux_loss, 8);
  std::memcpy(&words[size_t(E + 1)], &h->z_loss, 8);
  words[size_t(E + 2)] = h->dropped;
  put(d.summary, words.data(), nn::route_summary_bytes(E), "moe_route_finish (summary)");
  // The receive map (moe_reorder) and its inverse (moe_unreorder).
  const std::vector<int32_t> back = receive_inverse(h->recv_index);
  c.received = int64_t(back.size());
  c.reorder = be.empty(1, std::max<int64_t>(1, int64_t(h->recv_index.size())));
  c.unreorder = be.empty(1, std::max<int64_t>(1, c.received));
  put(c.reorder.data, h->recv_index.data(), h->recv_index.size() * 4, "moe_route_finish (receive map)");
  put(c.unreorder.data, back.data(), back.size() * 4, "moe_route_finish (its inverse)");
  c.set_from(*h);
  c.set_summary(route_summary(*h));
  c.host = std::move(h);
}
void expert_parallel_reorder(const RouteState& r, const Tensor& received, Tensor& grouped) {
  const CudaRouteState& c = device_route(r);
  FP4LAB_CHECK(c.host != nullptr, "cuda backend moe_reorder: no moe_route_finish before it");
  check_shape("moe_reorder", "grouped", grouped, int64_t(c.host->recv_index.size()), received.cols);
  nn::gather_rows_indexed(received.data, received.cols, reinterpret_cast<const int32_t*>(c.reorder.data), grouped.data,
                          grouped.rows);
}
void expert_parallel_unreorder(const RouteState& r, const Tensor& grouped, Tensor& back) {
  const CudaRouteState& c = device_route(r);
  FP4LAB_CHECK(c.host != nullptr, "cuda backend moe_unreorder: no moe_route_finish before it");
  check_shape("moe_unreorder", "back", back, c.received, grouped.cols);
  nn::gather_rows_indexed(grouped.data, grouped.cols, reinterpret_cast<const int32_t*>(c.unreorder.data), back.data,
                          back.rows);
}

}  // namespace fp4lab::train
