// Data-parallel optimiser step (data_parallel.hpp).
#include "train/dist/data_parallel.hpp"
#include "train/data.hpp"

#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "train/dist/grad_reduce.hpp"
#include "train/dist/primary_weights.hpp"
#include "train/dist/sharded_params.hpp"

namespace fp4lab::train {

ShardRange batch_share(int64_t n, int rank, int world) { return ShardRange{n * rank / world, n * (rank + 1) / world}; }

namespace {

Tensor slice(const Tensor& flat, ShardRange r) { return view_of(flat.data + r.begin, 1, r.end - r.begin); }

}  // namespace

struct DataParallel::Impl {
  Communicator& comm;
  Backend& be;
  ParamStore& ps;
  DistributedConfig dc;
  // Region A [0, na): the replicated tensors, reduced over the world (the whole buffer without expert
  // parallelism); region B [na, n): this rank's experts, no collective (ParamStore's regions).
  int64_t na = 0, n = 0;
  std::vector<ShardRange> shards;  // even_shards of region A
  ShardRange mine;                 // this rank's optimiser shard of A (zero 1) or the whole of A (zero 0)
  bool stage = false;              // host communicator, device tensors: copy through host memory
  std::unique_ptr<AdamW> adam;
  std::unique_ptr<AdamW> adam_b;           // region B's (null when B is empty)
  Tensor master;                           // FP32 master values of `mine`: a view of ps.values, or (nvfp4) a copy
  Tensor gshard;                           // the summed gradients of `mine` (zero 1), else a view of ps.grads
  Tensor scalar;                           // one double's bytes, for sums over a device communicator
  std::unique_ptr<ShardedParams> sharded;  // zero 3: ps's provider, the shards' owner
  float grad_scale = 1.0f;                 // begin_step's
  double weight = 1.0;
  // ZeRO-1 with stored tensors cast shard by shard: the parts of each rank's shard outside them (the FP32
  // elements the all-gather moves; the stored ones travel as packed codes, run_cast), and where each rank's
  // parts lie in the compacted buffer (rank order). Empty: the all-gather moves region A whole.
  std::vector<std::vector<ShardRange>> fp32_parts;
  std::vector<ShardRange> compact;

  Impl(Communicator& c, Backend& b, ParamStore& p, const AdamWConfig& ac, const DistributedConfig& d,
       std::vector<std::vector<int>> units)
      : comm(c), be(b), ps(p), dc(d) {
    const bool device = !be.host_tensors();
    if (comm.device_buffers() && !device)
      throw Error("data parallel: the " + comm.name() + " communicator needs the cuda backend");
    stage = device && !comm.device_buffers();
    const bool low = ps.cast_store() != nullptr;  // low-precision stored tensors (any form)
    if (ps.expert_ranks() != 1 && ps.expert_ranks() != comm.world())
      throw Error("data parallel: " + std::to_string(ps.expert_ranks()) + " expert-parallel ranks in a world of " +
                  std::to_string(comm.world()) + " (valid for now: the whole world; plan step 9 lifts this)");
    if (ps.expert_ranks() > 1 && low)
      throw Error("data parallel: parameters stored as " + storage_name(ps.cast_store()->storage()) +
                  " (distributed.primary_weights) with expert parallelism are not supported yet (plan step 10); "
                  "valid: fp32");
    if (comm.device_buffers()) scalar = be.empty(1, 4);  // sum_over_ranks' room (every zero)
    if (dc.zero == 3) {
      // The storage's gather (shard_cast true) moves the stored tensors as codes; the codes are kept from
      // forward to backward unless reshard_after_forward says otherwise (FP32 gathers: regathered, unless it
      // says so).
      const bool codes = low && dc.shard_cast;
      const ZeroOptions zo{codes, dc.reshard_after_forward >= 0 ? dc.reshard_after_forward == 1 : !codes, dc.reduce,
                           dc.prefetch != 0};
      sharded = std::make_unique<ShardedParams>(comm, be, ps, std::move(units), zo);
      master = sharded->master();
      gshard = sharded->grad_shard();
      const std::vector<IndexRange> decayed = sharded->decay_ranges();
      adam = std::make_unique<AdamW>(ac, be, decayed, ShardRange{0, sharded->local_size()});
      return;
    }
    n = ps.size();
    na = ps.replicated_size();
    shards = even_shards(na, comm.world());
    mine = dc.zero == 1 ? shards[size_t(comm.rank())] : ShardRange{0, na};
    adam = std::make_unique<AdamW>(ac, be, ps.decay_ranges, mine);
    if (n > na) adam_b = std::make_unique<AdamW>(ac, be, ps.decay_ranges, ShardRange{na, n});
    if (low) {
      master = be.empty(1, mine.end - mine.begin);
      be.copy(slice(ps.values, mine), master);
    } else {
      master = slice(ps.values, mine);
    }
    gshard = dc.zero == 1 ? be.empty(1, mine.end - mine.begin) : slice(ps.grads, mine);
    if (low && dc.zero == 1 && dc.shard_cast && comm.world() > 1) {
      int64_t at = 0;
      for (const ShardRange& s : shards) {
        fp32_parts.push_back(outside_tensors(s, ps.cast_store()->tensors()));
        const int64_t begin = at;
        for (const ShardRange& p : fp32_parts.back()) at += p.end - p.begin;
        compact.push_back({begin, at});
      }
    }
  }

  double step_sharded(double lr);
  double global_norm2(const Tensor& ga);
  // The master values live apart from ps.values (low-precision primary weights: ps.values holds the cast).
  bool separate_master() const { return master.data != ps.values.data + mine.begin; }

  // Collectives on backend tensors, staged through host memory where needed.
  void allreduce(Tensor& t) {
    if (!stage) return comm.allreduce_sum(std::span<float>(t.data, size_t(t.size())));
    std::vector<float> h(size_t(t.size()));
    be.download(t, h.data());
    comm.allreduce_sum(h);
    be.upload(h.data(), t);
  }
  void reduce_scatter(const Tensor& full, Tensor& out) {
    if (dc.reduce == GradReduce::bf16) return reduce_scatter_bf16(comm, be, full, shards, out);
    if (!stage)
      return comm.reduce_scatter_sum(std::span<const float>(full.data, size_t(full.size())), shards,
                                     std::span<float>(out.data, size_t(out.size())));
    std::vector<float> h(size_t(full.size())), o(size_t(out.size()));
    be.download(full, h.data());
    comm.reduce_scatter_sum(h, shards, o);
    be.upload(o.data(), out);
  }
  // Every rank's shards[rank] part of `full` (region A) gathered into `full`.
  void allgather(Tensor& full) {
    const ShardRange s = shards[size_t(comm.rank())];
    if (!stage)
      return comm.allgather(std::span<const float>(full.data + s.begin, size_t(s.end - s.begin)), shards,
                            std::span<float>(full.data, size_t(full.size())));
    std::vector<float> h(size_t(full.size()));
    be.download(full, h.data());
    comm.allgather(std::span<const float>(h.data() + s.begin, size_t(s.end - s.begin)), shards, h);
    be.upload(h.data(), full);
  }
  // ZeRO-1's weight gather after the step: region A whole, or (stored tensors) only its FP32 parts,
  // compacted, gathered, put back; the stored tensors' values come from the cast.
  void gather_values() {
    if (fp32_parts.empty()) {
      Tensor va = region_a(ps.values);
      return allgather(va);
    }
    const size_t me = size_t(comm.rank());
    const int64_t total = compact.back().end;
    if (total == 0) return;
    // Each part of rank r between the model's values and its place in the compact buffer, in order.
    auto each_part = [&](size_t r, auto&& f) {
      int64_t at = compact[r].begin;
      for (const ShardRange& p : fp32_parts[r])
        f(slice(ps.values, p), ShardRange{at, at + (p.end - p.begin)}), at += p.end - p.begin;
    };
    const ShardRange own = compact[me];
    if (!stage) {
      Tensor c = be.empty(1, total);
      each_part(me, [&](const Tensor& v, ShardRange at) {
        Tensor dst = slice(c, at);
        be.copy(v, dst);
      });
      comm.allgather(std::span<const float>(c.data + own.begin, size_t(own.end - own.begin)), compact,
                     std::span<float>(c.data, size_t(total)));
      for (size_t r = 0; r < compact.size(); ++r)
        if (r != me) each_part(r, [&](Tensor v, ShardRange at) { be.copy(slice(c, at), v); });
      return;
    }
    std::vector<float> h(static_cast<size_t>(total));
    each_part(me, [&](const Tensor& v, ShardRange at) { be.download(v, h.data() + at.begin); });
    comm.allgather(std::span<const float>(h.data() + own.begin, size_t(own.end - own.begin)), compact, h);
    for (size_t r = 0; r < compact.size(); ++r)
      if (r != me) each_part(r, [&](Tensor v, ShardRange at) { be.upload(h.data() + at.begin, v); });
  }
  double sum_over_ranks(double x) {
    sum_over_ranks(std::span<double>(&x, 1));
    return x;
  }
  // In place, at most two doubles (the scalar's room).
  void sum_over_ranks(std::span<double> x) {
    if (comm.world() == 1) return;
    if (!comm.device_buffers()) return comm.allreduce_sum(x);
    Tensor t = view_of(scalar.data, 1, int64_t(2 * x.size()));
    be.upload(reinterpret_cast<const float*>(x.data()), t);
    be.synchronize();
    comm.allreduce_sum(std::span<double>(reinterpret_cast<double*>(scalar.data), x.size()));
    be.download(t, reinterpret_cast<float*>(x.data()));
  }
  Tensor region_a(const Tensor& flat) const { return slice(flat, ShardRange{0, na}); }
  Tensor region_b(const Tensor& flat) const { return slice(flat, ShardRange{na, n}); }

  // Every expert-parallel rank's region B (equal sizes: experts are uniform), rank r's at [r nb, (r + 1) nb).
  std::vector<float> gather_b(const std::vector<float>& mine_b) {
    const int R = comm.world();
    const int64_t nb = int64_t(mine_b.size());
    std::vector<ShardRange> parts;
    for (int r = 0; r < R; ++r) parts.push_back(ShardRange{r * nb, (r + 1) * nb});
    std::vector<float> all(size_t(R * nb));
    if (!comm.device_buffers()) {
      comm.allgather(mine_b, parts, all);
      return all;
    }
    Tensor t = be.zeros(1, R * nb);
    Tensor own = slice(t, parts[size_t(comm.rank())]);
    be.upload(mine_b.data(), own);
    be.synchronize();
    comm.allgather(std::span<const float>(own.data, size_t(nb)), parts, std::span<float>(t.data, size_t(R * nb)));
    be.download(t, all.data());
    return all;
  }
  // A local buffer (regions A and B) in one process's layout: A's tensors and every rank's B tensors at their
  // global offsets (collective with expert parallelism; the same buffer without).
  std::vector<float> to_global(const std::vector<float>& local) {
    if (ps.expert_ranks() == 1) return local;
    const std::vector<float> all = gather_b(std::vector<float>(local.begin() + na, local.end()));
    std::vector<float> out(size_t(ps.global_size()), 0.0f);
    const int64_t nb = n - na;
    std::vector<int64_t> at(size_t(comm.world()), 0);  // each rank's next B element, its tensors in index order
    for (int i = 0; i < int(ps.infos().size()); ++i) {
      const ParamInfo& p = ps.info(i);
      const float* src = nullptr;
      if (p.placement.expert < 0) {
        src = local.data() + p.offset;
      } else {
        const int q = ps.owner(i);
        src = all.data() + q * nb + at[size_t(q)];
        at[size_t(q)] += p.size();
      }
      std::copy(src, src + p.size(), out.begin() + p.global_offset);
    }
    return out;
  }
  // The inverse: this rank's held tensors out of a buffer in one process's layout.
  std::vector<float> to_local(const std::vector<float>& global) const {
    if (ps.expert_ranks() == 1) return global;
    std::vector<float> out(static_cast<size_t>(n));
    for (const ParamInfo& p : ps.infos())
      if (p.held)
        std::copy(global.begin() + p.global_offset, global.begin() + p.global_offset + p.size(),
                  out.begin() + p.offset);
    return out;
  }

  // The stored weights' values from the master values that ps.values holds in full: the store's cast
  // (run_cast), then its dequantized values into ps.values.
  void cast_stored() {
    CastStore* store = ps.cast_store();
    if (!store) return;
    run_cast(comm, be, *store, ps.values.data, shards, dc.shard_cast);
    store->dequantize(ps.values.data);
  }
};

DataParallel::DataParallel(Communicator& comm, Backend& be, ParamStore& ps, const AdamWConfig& ac,
                           const DistributedConfig& dc, std::vector<std::vector<int>> units)
    : impl_(std::make_unique<Impl>(comm, be, ps, ac, dc, std::move(units))), comm_(comm) {
  if (impl_->sharded)
    impl_->sharded->cast_stored();
  else
    impl_->cast_stored();
}

void DataParallel::begin_step(float grad_scale, double weight) {
  Impl& d = *impl_;
  d.grad_scale = grad_scale;
  d.weight = weight;
  if (d.sharded) return d.sharded->begin_step(grad_scale, float(weight));
  d.be.fill(d.ps.grads, 0.0f);
}

// ZeRO-3's step: the last gradients reduce-scattered, the norm over every rank's parts, AdamW on this rank's.
double DataParallel::Impl::step_sharded(double lr) {
  sharded->finish_backward();
  const double norm = std::sqrt(sum_over_ranks(be.sum_squares(gshard)));
  adam->step(master, gshard, lr, norm);
  sharded->cast_stored();  // the masters changed: every unit released, the stored parts cast again
  return norm;
}

DataParallel::~DataParallel() = default;

double DataParallel::step(double lr) {
  Impl& d = *impl_;
  ParamStore& ps = d.ps;
  const int world = comm_.world();
  comm_.set_step(steps_taken());  // the step being taken, for a collective's timeout message
  if (d.sharded) return d.step_sharded(lr);
  if (d.grad_scale != 1.0f) d.be.scale(ps.grads, d.grad_scale);  // 1/loss_scale, then the weight
  if (world > 1) d.be.scale(ps.grads, float(d.weight));          // both regions
  Tensor ga = d.region_a(ps.grads);
  if (d.dc.zero == 1) {
    d.reduce_scatter(ga, d.gshard);
  } else if (d.dc.reduce == GradReduce::bf16) {  // zero 0: the BF16 reduce to even shards, the FP32 sums gathered
    Tensor own = slice(ga, d.shards[size_t(comm_.rank())]);
    d.reduce_scatter(ga, own);
    if (world > 1) d.allgather(ga);
  } else if (world > 1) {
    d.allreduce(ga);
  }
  double norm = 0.0;
  if (d.dc.zero == 0 && !d.adam_b) {
    norm = d.adam->step_clipped(d.master, d.gshard, lr);  // gshard is all of the gradient: its norm is the global one
  } else {
    norm = std::sqrt(d.global_norm2(ga));
    d.adam->step(d.master, d.gshard, lr, norm);
  }
  if (d.adam_b) {
    Tensor pb = d.region_b(ps.values), gb = d.region_b(ps.grads);
    d.adam_b->step(pb, gb, lr, norm);
  }
  if (d.separate_master()) {  // back into the values, which the all-gather and the cast read
    Tensor dst = slice(ps.values, d.mine);
    d.be.copy(d.master, dst);
  }
  if (d.dc.zero == 1 && world > 1) d.gather_values();
  d.cast_stored();
  return norm;
}

// The squared global gradient norm of a ZeRO-1 step or of a step with a region B (experts): region A's
// reduced gradient `ga` (its shard under zero 1), B's local part, over the ranks.
double DataParallel::Impl::global_norm2(const Tensor& ga) {
  Impl& d = *this;
  double norm2 = 0.0;
  if (!d.adam_b) {
    norm2 = d.dc.zero == 1 ? d.sum_over_ranks(d.be.sum_squares(d.gshard)) : d.be.sum_squares(ga);
  } else {
    // norm^2 = SS_A + SS_B, in that order, from one all-reduce: [A's shard part (zero 1), B's local part]; with
    // zero 0 every rank holds all of A, added after.
    double parts[2] = {d.dc.zero == 1 ? d.be.sum_squares(d.gshard) : 0.0, d.be.sum_squares(d.region_b(ps.grads))};
    d.sum_over_ranks(parts);
    norm2 = (parts[0] + (d.dc.zero == 1 ? 0.0 : d.be.sum_squares(ga))) + parts[1];
  }
  return norm2;
}

double DataParallel::global_loss(double local_loss, double weight) {
  if (comm_.world() == 1) return local_loss;
  comm_.set_step(steps_taken());  // the first collective of the step
  return impl_->sum_over_ranks(local_loss * weight);
}

void DataParallel::state(std::vector<float>& master, std::vector<float>& m, std::vector<float>& v) {
  Impl& d = *impl_;
  if (d.sharded) {
    master = d.sharded->to_global(d.master);
    m = d.sharded->to_global(d.adam->m_f32());
    v = d.sharded->to_global(d.adam->v_f32());
    return;
  }
  const int64_t na = d.na, n = d.n;
  // Each of the three as a local buffer: region A from this rank's part at `mine` (gathered with zero 1), then
  // region B (B's values are their own masters); then in one process's layout.
  auto full_of = [&](const Tensor& part, const Tensor* b, std::vector<float>& out) {
    std::vector<float> local(size_t(n), 0.0f);
    if (d.mine.begin == 0 && d.mine.end == na) {
      Tensor a = slice(part, ShardRange{0, na});
      d.be.download(a, local.data());
    } else {
      Tensor t = d.be.zeros(1, na);
      Tensor dst = slice(t, d.mine);
      d.be.copy(part, dst);
      d.allgather(t);
      d.be.download(t, local.data());
    }
    if (b) d.be.download(*b, local.data() + na);
    out = d.to_global(local);
  };
  Tensor vb = d.region_b(d.ps.values);
  full_of(d.master, d.adam_b ? &vb : nullptr, master);
  Tensor mb = d.adam_b ? d.adam_b->m_f32() : Tensor{}, vbm = d.adam_b ? d.adam_b->v_f32() : Tensor{};
  full_of(d.adam->m_f32(), d.adam_b ? &mb : nullptr, m);
  full_of(d.adam->v_f32(), d.adam_b ? &vbm : nullptr, v);
}

double ShareEvaluator::evaluate(const Batch& b, const StepContext& s, int64_t* correct) {
  const ShardRange share = batch_share(b.size, dp_.rank(), dp_.world());
  int64_t hits = 0;
  const double loss = model_.evaluate(slice_batch(b, share.begin, share.end), s, correct ? &hits : nullptr);
  if (correct) *correct = std::llround(dp_.global_loss(double(hits), 1.0));
  return dp_.global_loss(loss, double(share.end - share.begin) / double(b.size));
}

std::vector<float> DataParallel::model_values() {
  Impl& d = *impl_;
  if (d.sharded) return d.sharded->model_values();
  std::vector<float> local(size_t(d.n));
  d.be.download(d.ps.values, local.data());
  return d.to_global(local);
}

void DataParallel::load_state(const std::vector<float>& master_global, const std::vector<float>& m_global,
                              const std::vector<float>& v_global, int64_t steps_taken) {
  Impl& d = *impl_;
  const size_t g = size_t(d.ps.global_size());
  if (master_global.size() != g || m_global.size() != g || v_global.size() != g)
    throw Error("DataParallel::load_state: buffers of " + std::to_string(master_global.size()) +
                " elements, the model has " + std::to_string(g));
  if (d.sharded) {
    d.sharded->release_all();
    d.sharded->from_global(master_global, d.master);
    Tensor m = d.be.zeros(1, d.sharded->local_size()), v = d.be.zeros(1, d.sharded->local_size());
    d.sharded->from_global(m_global, m);
    d.sharded->from_global(v_global, v);
    d.adam->set_moments(m, v);
    d.adam->set_steps_taken(steps_taken);
    d.sharded->cast_stored();
    return;
  }
  const std::vector<float> master = d.to_local(master_global), m = d.to_local(m_global), v = d.to_local(v_global);
  const ShardRange s = d.mine;
  d.be.upload(master.data(), d.ps.values);
  if (d.separate_master()) d.be.upload(master.data() + s.begin, d.master);
  // The moments of [begin, end) of the local layout into `adam` (FP32 staged, then stored as it stores them).
  auto load_moments = [&](AdamW& adam, int64_t begin, int64_t end) {
    Tensor tm = d.be.empty(1, end - begin), tv = d.be.empty(1, end - begin);
    d.be.upload(m.data() + begin, tm);
    d.be.upload(v.data() + begin, tv);
    adam.set_moments(tm, tv);
    adam.set_steps_taken(steps_taken);
  };
  load_moments(*d.adam, s.begin, s.end);
  if (d.adam_b) load_moments(*d.adam_b, d.na, d.n);
  d.cast_stored();
}

int64_t DataParallel::steps_taken() const { return impl_->adam->steps_taken(); }

nlohmann::json DataParallel::memory() const {
  const Impl& d = *impl_;
  if (d.sharded) return d.sharded->memory(d.adam->moments_bytes());  // the optimiser says what it stores
  const int64_t n = d.ps.size(), s = d.mine.end - d.mine.begin, f = int64_t(sizeof(float));
  const int64_t grad_shard = d.dc.zero == 1 ? s * f : 0;
  // The stored weights' cast (codes and scales, the store's count); nvfp4_bytes as before for NVFP4 runs.
  const CastStore* store = d.ps.cast_store();
  const int64_t cast = store ? store->bytes() : 0;
  const int64_t nvfp4 = store && store->storage() == Storage::nvfp4_2d ? cast : 0;
  nlohmann::json j = {{"params_bytes", n * f},
                      {"grads_bytes", n * f + grad_shard},
                      {"master_bytes", d.separate_master() ? s * f : 0},
                      {"moments_bytes", d.adam->moments_bytes()},
                      {"nvfp4_bytes", nvfp4},
                      {"stored_bytes", cast},
                      {"storage", storage_name(store ? store->storage() : Storage::fp32)},
                      {"shard_elements", s},
                      {"world", d.comm.world()},
                      {"zero", d.dc.zero}};
  j["optimizer_bytes"] = j["master_bytes"].get<int64_t>() + j["moments_bytes"].get<int64_t>();
  j["total_bytes"] =
      j["params_bytes"].get<int64_t>() + j["grads_bytes"].get<int64_t>() + j["optimizer_bytes"].get<int64_t>() + cast;
  return j;
}

}  // namespace fp4lab::train
