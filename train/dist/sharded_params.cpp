// ZeRO-3's sharded parameters (sharded_params.hpp).
#include "train/dist/sharded_params.hpp"

#include <algorithm>
#include <optional>
#include <span>
#include <string>

#include "core/error.hpp"
#include "train/dist/primary_weights.hpp"

namespace fp4lab::train {

struct ShardedParams::Unit {
  std::vector<int> params;
  int64_t size = 0;                // elements of the gathered unit
  std::vector<ShardRange> shards;  // even_shards(size, N): rank r's part, in unit coordinates
  int64_t local_at = 0;            // where this rank's part starts in the shard buffers
  Tensor values, grads;            // the gathered unit and its gradients (empty: not held)
  bool reduced = false;            // its gradients were reduce-scattered this backward
  // Low-precision-stored parameters: their cast, in unit coordinates (null: none in this unit). With more than
  // one rank it holds only this rank's window of its codes between gathers (CastStore::keep_window): a gather
  // restores the full buffer, dropping the unit releases it (windowed()).
  std::unique_ptr<CastStore> store;
  // gather_codes: every rank's parts outside the stored tensors (unit coordinates), where each rank's lie in
  // the compacted FP32 buffer, and that buffer once gathered (kept with the codes for the backward).
  std::vector<std::vector<ShardRange>> fp32_parts;
  std::vector<ShardRange> compact;
  Tensor gathered;
  bool codes = false;  // store->packed() holds every rank's codes of the current cast
  // A gather started and not finished (start_gather): its collectives in flight.
  bool in_flight = false;
  std::unique_ptr<PendingCollective> values_pending;  // the FP32 gather (whole unit, or the compacted parts)
  std::optional<WindowGather> windows_pending;        // the stored tensors' code windows
};

namespace {

Tensor slice(const Tensor& flat, int64_t begin, int64_t end) { return view_of(flat.data + begin, 1, end - begin); }

}  // namespace

ShardedParams::ShardedParams(Communicator& comm, Backend& be, ParamStore& ps, std::vector<std::vector<int>> units,
                             ZeroOptions opt)
    : comm_(comm), be_(be), ps_(ps), opt_(opt), stage_(!be.host_tensors() && !comm.device_buffers()) {
  const int n = int(ps.infos().size());
  if (comm.device_buffers() && be.host_tensors())
    throw Error("ZeRO-3: the " + comm.name() + " communicator needs the cuda backend");
  if (ps.expert_ranks() != 1) throw Error("distributed.zero 3 with expert parallelism is not built yet (plan step S4)");
  if (units.empty()) throw Error("ShardedParams: no units");
  unit_of_.assign(size_t(n), -1);
  at_.assign(size_t(n), 0);
  store_slot_.assign(size_t(n), -1);
  const int me = comm.rank();
  for (size_t u = 0; u < units.size(); ++u) {
    Unit x;
    x.params = units[u];
    for (int i : x.params) {
      if (i < 0 || i >= n || unit_of_[size_t(i)] >= 0)
        throw Error("ShardedParams: parameter " + std::to_string(i) + " of unit " + std::to_string(u) +
                    (i < 0 || i >= n ? " does not exist" : " is in two units"));
      unit_of_[size_t(i)] = int(u);
      at_[size_t(i)] = x.size;
      x.size += ps.info(i).size();
    }
    x.shards = even_shards(x.size, comm.world());
    add_store(x);
    x.local_at = local_;
    local_ += x.shards[size_t(me)].end - x.shards[size_t(me)].begin;
    peak_unit_ = std::max(peak_unit_, x.size);
    units_.push_back(std::move(x));
  }
  for (int i = 0; i < n; ++i)
    if (unit_of_[size_t(i)] < 0) throw Error("ShardedParams: parameter " + ps.info(i).name + " is in no unit");
  // This rank's parts of the initial values (ps holds them whole until set_provider).
  master_ = be.empty(1, local_);
  for (const Piece& p : own_pieces()) {
    const int64_t src = ps.info(p.param).offset + p.from;
    Tensor d = slice(master_, p.at, p.at + p.length);
    be.copy(slice(ps.values, src, src + p.length), d);
  }
  grad_shard_ = be.zeros(1, local_);
  ps.set_provider(this);
}

ShardedParams::~ShardedParams() = default;

void ShardedParams::add_store(Unit& x) {
  std::vector<FlatTensor> tensors;  // in the unit's order: increasing offsets, the packed layout's order
  Storage form = Storage::fp32;     // the store's one low-precision form (ParamStore::set_storage keeps one)
  for (int i : x.params)
    if (ps_.storage(i) != Storage::fp32) {
      form = ps_.storage(i);
      store_slot_[size_t(i)] = int(tensors.size());
      tensors.push_back(FlatTensor{ps_.info(i).rows, ps_.info(i).cols, at_[size_t(i)]});
    }
  if (tensors.empty()) return;
  x.store = be_.make_cast_store(form, tensors);  // host memory (cpu backend) or the device's (cuda)
  int64_t at = 0;
  for (const ShardRange& s : x.shards) {
    x.fp32_parts.push_back(outside_tensors(s, x.store->tensors()));
    const int64_t begin = at;
    for (const ShardRange& p : x.fp32_parts.back()) at += p.end - p.begin;
    x.compact.push_back({begin, at});
  }
}

float* ShardedParams::value_ptr(int i) {
  const int u = unit_of_.at(size_t(i));
  enter(u);
  return units_[size_t(u)].values.data + at_[size_t(i)];
}

const StoredWeight* ShardedParams::stored(int i) const {
  const int t = store_slot_.at(size_t(i));
  return t < 0 ? nullptr : units_[size_t(unit_of_[size_t(i)])].store->stored(size_t(t));
}

float* ShardedParams::grad_ptr(int i) {
  const int u = unit_of_.at(size_t(i));
  if (!backward_) backward_ = true, last_ = -1;  // the backward pass begins
  enter(u);
  Unit& x = units_[size_t(u)];
  if (x.reduced)
    throw Error("ShardedParams: the gradients of unit " + std::to_string(u) + " (" + ps_.info(i).name +
                ") were accessed after their reduce-scatter in this backward; such a parameter belongs in the root "
                "unit (Model::param_units)");
  if (!x.grads.data) x.grads = be_.zeros(1, x.size);
  return x.grads.data + at_[size_t(i)];
}

void ShardedParams::enter(int u) {
  if (u != current_) {
    if (current_ >= 0) leave(current_);
    current_ = u;
  }
  Unit& x = units_[size_t(u)];
  if (x.in_flight)
    finish_gather(x);
  else if (!x.values.data)
    gather(u);
  if (opt_.prefetch) prefetch_after(u);
  if (u > 0) last_ = u;
}

// The pass's next unit: forward 1, 2, ..., L, then the root; backward (from the root) L, ..., 1, then the root.
void ShardedParams::prefetch_after(int u) {
  const int last = int(units_.size()) - 1;
  int next = -1;
  if (u == 0)
    next = last_ >= 0 ? -1 : (backward_ ? last : 1);  // only at the pass's start
  else
    next = backward_ ? u - 1 : u + 1;
  if (next < 1 || next > last) return;
  Unit& y = units_[size_t(next)];
  if (y.in_flight || y.values.data || y.reduced || !gather_moves(y)) return;
  start_gather(y);
}

void ShardedParams::leave(int u) {
  if (u == 0) return;  // the root stays for the whole step
  Unit& x = units_[size_t(u)];
  if (x.grads.data) reduce(u);
  if (!backward_ && !opt_.reshard_after_forward) {  // kept for the unit's backward
    if (x.store && opt_.gather_codes) x.values = Tensor{};  // the codes and FP32 parts stay; decoded again
    return;
  }
  drop(x);
}

void ShardedParams::settle(Unit& x) {
  if (!x.in_flight) return;
  if (x.values_pending) x.values_pending->wait();
  if (x.windows_pending) x.windows_pending->pending->wait();
  x.values_pending.reset();
  x.windows_pending.reset();
  x.in_flight = false;
  x.values = Tensor{};
  x.gathered = Tensor{};  // the parts may not have arrived in it: gathered again on use
}

void ShardedParams::drop(Unit& x) {
  settle(x);
  x.values = Tensor{};
  x.gathered = Tensor{};
  x.codes = false;
  if (windowed(x)) x.store->release_packed();  // this rank's window stays (cast_stored's)
}

bool ShardedParams::windowed(const Unit& x) const { return x.store && comm_.world() > 1; }

void ShardedParams::gather(int u) {
  Unit& x = units_[size_t(u)];
  start_gather(x);
  finish_gather(x);
}

bool ShardedParams::gather_moves(const Unit& x) const {
  if (comm_.world() == 1) return false;
  if (!(x.store && opt_.gather_codes)) return true;  // the FP32 masters, whole
  return !x.codes || (!x.gathered.data && x.compact.back().end > 0);
}

// The unit's gather, started: x.values allocated; the FP32 masters (whole, or with gather_codes the compacted
// parts outside the stored tensors, unless kept from the forward) and the stored tensors' code windows (unless
// present) sent. Nothing of x may be read until finish_gather.
void ShardedParams::start_gather(Unit& x) {
  const size_t me = size_t(comm_.rank());
  const ShardRange own = x.shards[me];
  x.values = be_.empty(1, x.size);
  x.in_flight = true;
  ++gathers_;
  if (!(x.store && opt_.gather_codes)) {
    Tensor dst = slice(x.values, own.begin, own.end);
    be_.copy(slice(master_, x.local_at, x.local_at + (own.end - own.begin)), dst);
    x.values_pending = allgather_start(x.values.data, x.shards);
    return;
  }
  const int64_t total = x.compact.back().end;
  if (!x.gathered.data) {  // not kept from the forward: this rank's parts of its masters, gathered
    x.gathered = be_.empty(1, std::max<int64_t>(total, 1));
    int64_t at = x.compact[me].begin;
    for (const ShardRange& p : x.fp32_parts[me]) {
      Tensor dst = slice(x.gathered, at, at + (p.end - p.begin));
      be_.copy(slice(master_, x.local_at + (p.begin - own.begin), x.local_at + (p.end - own.begin)), dst);
      at += p.end - p.begin;
    }
    if (comm_.world() > 1 && total > 0) x.values_pending = allgather_start(x.gathered.data, x.compact);
  }
  if (!x.codes && comm_.world() > 1) {
    x.store->restore_packed();  // zero but for this rank's window: as its cast left it
    x.windows_pending = start_gather_windows(comm_, be_, *x.store, x.shards);
  }
}

void ShardedParams::finish_gather(Unit& x) {
  if (x.values_pending) x.values_pending->wait(), x.values_pending.reset();
  x.in_flight = false;
  if (x.store && opt_.gather_codes) {
    for (size_t r = 0; r < x.compact.size(); ++r) {  // every rank's parts into place
      int64_t at = x.compact[r].begin;
      for (const ShardRange& p : x.fp32_parts[r]) {
        Tensor dst = slice(x.values, p.begin, p.end);
        be_.copy(slice(x.gathered, at, at + (p.end - p.begin)), dst);
        at += p.end - p.begin;
      }
    }
    if (x.windows_pending) finish_gather_windows(*x.store, *x.windows_pending), x.windows_pending.reset();
    x.codes = true;  // every rank's codes of the last cast_stored (world 1: its own)
  } else if (x.store) {  // the gathered masters cast whole by every rank (the reference)
    if (windowed(x)) x.store->restore_packed();
    run_cast(comm_, be_, *x.store, x.values.data, x.shards, false);
  }
  if (x.store) x.store->dequantize(x.values.data);
}

void ShardedParams::cast_stored() {
  release_all();
  if (!opt_.gather_codes) return;  // gather casts each unit whole
  std::vector<Unit*> stored;
  for (Unit& x : units_)
    if (x.store) stored.push_back(&x);
  if (stored.empty()) return;
  // This rank's master parts of unit x at their unit coordinates in a scratch buffer (the cast reads only them).
  Tensor scratch = be_.empty(1, peak_unit_);
  auto own_flat = [&](const Unit& x) {
    const ShardRange own = x.shards[size_t(comm_.rank())];
    Tensor dst = slice(scratch, own.begin, own.end);
    be_.copy(slice(master_, x.local_at, x.local_at + (own.end - own.begin)), dst);
    return static_cast<const float*>(scratch.data);
  };
  for (Unit* x : stored) x->store->partial_amax(own_flat(*x), x->shards[size_t(comm_.rank())]);
  if (comm_.world() > 1) reduce_maxima(stored);
  const size_t me = size_t(comm_.rank());
  for (Unit* x : stored) {
    x->store->compute_scales();
    if (windowed(*x)) x->store->restore_packed();  // a full buffer for the cast (released again below)
    x->store->cast(own_flat(*x), x->shards[me]);
    x->codes = comm_.world() == 1;  // one rank's part is the whole unit
    if (!windowed(*x)) continue;
    const PackedWindows w = x->store->windows(x->shards);  // this rank's window holds its cast's bytes
    x->store->keep_window(w.at[me], w.size);
    x->store->release_packed();
  }
}

// The stores' amax() arrays (tensor maxima, then tile maxima; host or device memory as the stores are) in one
// MAX all-reduce: concatenated where the communicator takes them (host stores and a host communicator; device
// stores and NCCL), else through host memory. Bit patterns are copied as bytes (the backend's float copies
// are memcpy), so nothing is converted.
void ShardedParams::reduce_maxima(const std::vector<Unit*>& stored) {
  auto bits = [](std::span<uint32_t> a) { return view_of(reinterpret_cast<float*>(a.data()), 1, int64_t(a.size())); };
  int64_t total = 0;
  for (Unit* x : stored) total += int64_t(x->store->amax().size());
  if (total == 0) return;  // bf16: no maxima (the same on every rank: the geometry's)
  const bool device = stored.front()->store->device();
  if (device && comm_.device_buffers()) {
    Tensor all = be_.empty(1, std::max<int64_t>(total, 1));
    int64_t at = 0;
    for (Unit* x : stored) {
      const int64_t k = int64_t(x->store->amax().size());
      Tensor d = slice(all, at, at + k);
      be_.copy(bits(x->store->amax()), d);
      at += k;
    }
    comm_.allreduce_max(std::span<uint32_t>(reinterpret_cast<uint32_t*>(all.data), size_t(total)));
    at = 0;
    for (Unit* x : stored) {
      const int64_t k = int64_t(x->store->amax().size());
      Tensor d = bits(x->store->amax());
      be_.copy(slice(all, at, at + k), d);
      at += k;
    }
    return;
  }
  std::vector<uint32_t> all(static_cast<size_t>(total));
  size_t at = 0;
  for (Unit* x : stored) {
    const std::span<uint32_t> a = x->store->amax();
    if (device)
      be_.download(bits(a), reinterpret_cast<float*>(all.data() + at));
    else
      std::copy(a.begin(), a.end(), all.begin() + std::ptrdiff_t(at));
    at += a.size();
  }
  comm_.allreduce_max(all);
  at = 0;
  for (Unit* x : stored) {
    const std::span<uint32_t> a = x->store->amax();
    if (device) {
      Tensor d = bits(a);
      be_.upload(reinterpret_cast<const float*>(all.data() + at), d);
    } else {
      std::copy_n(all.begin() + std::ptrdiff_t(at), a.size(), a.begin());
    }
    at += a.size();
  }
}

void ShardedParams::allgather(float* full, std::span<const ShardRange> parts) {
  const ShardRange own = parts[size_t(comm_.rank())];
  const int64_t n = parts.back().end, k = own.end - own.begin;
  if (!stage_)
    return comm_.allgather(std::span<const float>(full + own.begin, size_t(k)), parts, std::span<float>(full, size_t(n)));
  std::vector<float> h(static_cast<size_t>(n));
  be_.download(view_of(full + own.begin, 1, k), h.data() + own.begin);
  comm_.allgather(std::span<const float>(h.data() + own.begin, size_t(k)), parts, h);
  Tensor t = view_of(full, 1, n);
  be_.upload(h.data(), t);
}

std::unique_ptr<PendingCollective> ShardedParams::allgather_start(float* full, std::span<const ShardRange> parts) {
  if (stage_) {  // through host memory: a host engine, done on return
    allgather(full, parts);
    return nullptr;
  }
  const ShardRange own = parts[size_t(comm_.rank())];
  const int64_t n = parts.back().end, k = own.end - own.begin;
  return comm_.allgather_start(std::span<const float>(full + own.begin, size_t(k)), parts,
                               std::span<float>(full, size_t(n)));
}

void ShardedParams::reduce_scatter(const Tensor& full, std::span<const ShardRange> parts, Tensor& mine) {
  if (opt_.reduce == GradReduce::bf16) return reduce_scatter_bf16(comm_, be_, full, parts, mine);
  if (!stage_)
    return comm_.reduce_scatter_sum(std::span<const float>(full.data, size_t(full.size())), parts,
                                    std::span<float>(mine.data, size_t(mine.size())));
  std::vector<float> h(size_t(full.size())), o(size_t(mine.size()));
  be_.download(full, h.data());
  comm_.reduce_scatter_sum(h, parts, o);
  be_.upload(o.data(), mine);
}

void ShardedParams::reduce(int u) {
  Unit& x = units_[size_t(u)];
  const ShardRange own = x.shards[size_t(comm_.rank())];
  if (grad_scale_ != 1.0f) be_.scale(x.grads, grad_scale_);  // ZeRO-1's order: 1/loss_scale, then the weight
  if (comm_.world() > 1) be_.scale(x.grads, weight_);
  Tensor mine = slice(grad_shard_, x.local_at, x.local_at + (own.end - own.begin));
  reduce_scatter(x.grads, x.shards, mine);
  x.grads = Tensor{};
  x.reduced = true;
}

void ShardedParams::begin_step(float grad_scale, float weight) {
  release_all();
  be_.fill(grad_shard_, 0.0f);
  grad_scale_ = grad_scale;
  weight_ = weight;
}

void ShardedParams::finish_backward() {
  if (current_ > 0 && units_[size_t(current_)].grads.data) reduce(current_);
  if (units_[0].grads.data) reduce(0);
}

void ShardedParams::release_all() {
  for (Unit& x : units_) drop(x), x.grads = Tensor{}, x.reduced = false;
  current_ = -1;
  last_ = -1;
  backward_ = false;
}

std::vector<ShardedParams::Piece> ShardedParams::own_pieces() const {
  std::vector<Piece> out;
  for (const Unit& x : units_) {
    const ShardRange own = x.shards[size_t(comm_.rank())];
    for (int i : x.params) {
      const int64_t lo = std::max(own.begin, at_[size_t(i)]),
                    hi = std::min(own.end, at_[size_t(i)] + ps_.info(i).size());
      if (lo < hi) out.push_back(Piece{i, lo - at_[size_t(i)], x.local_at + (lo - own.begin), hi - lo});
    }
  }
  return out;
}

std::vector<IndexRange> ShardedParams::decay_ranges() const {
  std::vector<IndexRange> out;
  for (const Piece& p : own_pieces())
    if (ps_.info(p.param).decay) out.push_back(IndexRange{p.at, p.length});
  return out;
}

std::vector<float> ShardedParams::to_global(const Tensor& shard) {
  release_all();  // the unit buffers are borrowed
  std::vector<float> out(size_t(ps_.global_size()));
  for (Unit& x : units_) {
    const ShardRange own = x.shards[size_t(comm_.rank())];
    Tensor buf = be_.empty(1, x.size);
    Tensor dst = slice(buf, own.begin, own.end);
    be_.copy(slice(shard, x.local_at, x.local_at + (own.end - own.begin)), dst);
    allgather(buf.data, x.shards);
    put_global(x, buf, out);
  }
  return out;
}

std::vector<float> ShardedParams::model_values() {
  release_all();
  std::vector<float> out(size_t(ps_.global_size()));
  for (size_t u = 0; u < units_.size(); ++u) {
    gather(int(u));
    put_global(units_[u], units_[u].values, out);
    drop(units_[u]);
  }
  return out;
}

void ShardedParams::put_global(const Unit& x, const Tensor& buf, std::vector<float>& out) {
  std::vector<float> host(size_t(x.size));
  be_.download(buf, host.data());
  for (int i : x.params)
    std::copy_n(host.begin() + at_[size_t(i)], ps_.info(i).size(), out.begin() + ps_.info(i).global_offset);
}

void ShardedParams::from_global(const std::vector<float>& global, Tensor& shard) const {
  for (const Piece& p : own_pieces()) {
    Tensor d = slice(shard, p.at, p.at + p.length);
    be_.upload(global.data() + ps_.info(p.param).global_offset + p.from, d);
  }
}

nlohmann::json ShardedParams::memory(int64_t moments_bytes) const {
  const int64_t f = int64_t(sizeof(float));
  int64_t largest_other = 0;
  for (size_t u = 1; u < units_.size(); ++u) largest_other = std::max(largest_other, units_[u].size);
  // Persistent: master, both moments (as the optimiser stores them), the gradient shard. In flight: the root and
  // one other unit, each with its gradient buffer in the backward, and with prefetch the next unit's values.
  // With more than one rank a gathered unit's store holds its full packed buffer too (the root's, the
  // largest other's and, with prefetch, the next one's).
  int64_t codes_root = 0, codes_other = 0;
  if (comm_.world() > 1) {
    if (units_[0].store) codes_root = units_[0].store->packed_bytes();
    for (size_t u = 1; u < units_.size(); ++u)
      if (units_[u].store) codes_other = std::max(codes_other, units_[u].store->packed_bytes());
  }
  const int64_t in_flight = (2 * (units_[0].size + largest_other) + (opt_.prefetch ? largest_other : 0)) * f +
                            codes_root + codes_other * (opt_.prefetch ? 2 : 1);
  // The stored tensors' cast between gathers: codes and scales (CastStore::bytes: with more than one rank each
  // unit's store keeps this rank's window of the codes, with one the whole buffer). nvfp4_bytes: the same for
  // NVFP4 storage (the key earlier summaries have), 0 otherwise.
  int64_t cast = 0;
  Storage form = Storage::fp32;
  for (const Unit& x : units_)
    if (x.store) cast += x.store->bytes(), form = x.store->storage();
  const int64_t persistent = 2 * local_ * f + moments_bytes + cast;
  return {{"zero", 3},
          {"gather", gather_format_name(opt_.gather_codes ? gather_format_of(form) : GatherFormat::fp32)},
          {"reshard_after_forward", opt_.reshard_after_forward},
          {"prefetch", opt_.prefetch},
          {"nvfp4_bytes", form == Storage::nvfp4_2d ? cast : 0},
          {"stored_bytes", cast},
          {"storage", storage_name(form)},
          {"world", comm_.world()},
          {"shard_elements", local_},
          {"units", int64_t(units_.size())},
          {"master_bytes", local_ * f},
          {"moments_bytes", moments_bytes},
          {"grads_bytes", local_ * f},
          {"params_bytes", 0},
          {"optimizer_bytes", local_ * f + moments_bytes},
          {"root_unit_bytes", units_[0].size * f},
          {"largest_unit_bytes", peak_unit_ * f},
          {"largest_unit_codes_bytes", codes_other},  // a non-root unit's full packed buffer (more than one rank)
          {"in_flight_bytes", in_flight},
          {"total_bytes", persistent + in_flight}};
}

}  // namespace fp4lab::train
