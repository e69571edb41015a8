#include "train/params.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/philox.hpp"

namespace fp4lab::train {

namespace {
constexpr uint64_t kInitStream = uint64_t(0xB) << 60;

// Uniform in (0, 1): 24 random bits, never 0.
double unit(uint64_t seed, uint64_t stream, uint64_t i) {
  return (double(random_bits(seed, stream, i) >> 8) + 0.5) / 16777216.0;
}
// Standard normal, Box-Muller on two uniforms of counters 2i, 2i+1.
double std_normal(uint64_t seed, uint64_t stream, uint64_t i) {
  const double u1 = unit(seed, stream, 2 * i), u2 = unit(seed, stream, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace

int ParamStore::add(const std::string& name, int64_t rows, int64_t cols, bool decay, Init init, float init_arg,
                    Placement placement) {
  if (!names_.insert(name).second) throw Error("parameter \"" + name + "\" declared twice");
  if (placement.expert >= 0 && (placement.experts <= 0 || placement.expert >= placement.experts))
    throw Error("parameter \"" + name + "\": expert " + std::to_string(placement.expert) + " of " +
                std::to_string(placement.experts) + " (valid: 0 <= expert < experts)");
  ParamInfo p;
  p.name = name;
  p.offset = p.global_offset = global_total_;
  p.rows = rows;
  p.cols = cols;
  p.decay = decay;
  p.init = init;
  p.init_arg = init_arg;
  p.placement = placement;
  infos_.push_back(p);
  global_total_ += rows * cols;
  total_ = replicated_ = global_total_;  // until finalize: everything held, one process's layout
  return int(infos_.size() - 1);
}

void ParamStore::set_expert_parallel(int ranks, int rank) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error("parameters: expert-parallel rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                " (valid: ranks >= 1, 0 <= rank < ranks)");
  ep_ranks_ = ranks, ep_rank_ = rank;
}

int ParamStore::owner(int i) const {
  const Placement& p = infos_[size_t(i)].placement;
  if (p.expert < 0) return -1;
  return ep_ranks_ == 1 ? 0 : int(p.expert / (p.experts / ep_ranks_));
}

void ParamStore::set_provider(ParamProvider* p) {
  if (!p || provider_) throw Error("ParamStore::set_provider: a provider is set once, and not null");
  provider_ = p;
  values = Tensor{}, grads = Tensor{};
  cast_store_.reset();  // the provider's own stores hold the cast (its device memory is not kept twice)
}

int64_t ParamStore::held_offset(int i) const {
  const ParamInfo& p = infos_[size_t(i)];
  if (!p.held)
    throw Error("parameter \"" + p.name + "\" is expert " + std::to_string(p.placement.expert) +
                ", held by another expert-parallel rank than " + std::to_string(ep_rank_));
  return p.offset;
}

int ParamStore::index(const std::string& name) const {
  std::string all;
  for (size_t i = 0; i < infos_.size(); ++i) {
    if (infos_[i].name == name) return int(i);
    all += (i ? ", " : "") + infos_[i].name;
  }
  throw Error("no parameter \"" + name + "\"; parameters: " + all);
}

std::vector<float> init_values(const ParamInfo& p, uint64_t seed, int index) {
  std::vector<float> v(size_t(p.size()));
  const uint64_t stream = kInitStream | uint64_t(index);
  for (int64_t i = 0; i < p.size(); ++i) {
    double x = 0.0;
    switch (p.init) {
      case Init::zeros: x = 0.0; break;
      case Init::ones: x = 1.0; break;
      case Init::normal: x = p.init_arg * std_normal(seed, stream, uint64_t(i)); break;
      case Init::trunc_normal: {
        // Rejection on successive draws (counter i + k * size), like torch's [-2, 2] absolute bounds.
        for (uint64_t k = 0;; ++k) {
          x = p.init_arg * std_normal(seed, stream, uint64_t(i) + k * uint64_t(p.size()));
          if (x >= -2.0 && x <= 2.0) break;
        }
        break;
      }
      case Init::uniform: x = p.init_arg * (2.0 * unit(seed, stream, uint64_t(i)) - 1.0); break;
    }
    v[size_t(i)] = float(x);
  }
  return v;
}

void ParamStore::finalize(Backend& be, uint64_t seed) {
  // The local layout: region A (replicated; with one rank, everything) then region B (held experts).
  const auto in_a = [&](const ParamInfo& p) { return ep_ranks_ == 1 || p.placement.expert < 0; };
  int64_t at = 0;
  for (ParamInfo& p : infos_) {
    p.held = true;
    if (in_a(p)) p.offset = at, at += p.size();
  }
  replicated_ = at;
  for (ParamInfo& p : infos_) {
    if (in_a(p)) continue;
    const int64_t E = p.placement.experts;
    if (E % ep_ranks_ != 0)
      throw Error("parameter \"" + p.name + "\": " + std::to_string(E) + " experts over " + std::to_string(ep_ranks_) +
                  " expert-parallel ranks (valid: experts a multiple of the ranks)");
    p.held = p.placement.expert / (E / ep_ranks_) == ep_rank_;  // owner()
    p.offset = p.held ? at : -1;
    if (p.held) at += p.size();
  }
  total_ = at;
  values = be.empty(1, total_);
  grads = be.zeros(1, total_);
  decay_ranges.clear();
  std::vector<float> host(static_cast<size_t>(total_));
  std::vector<size_t> order;  // the held tensors by increasing offset: region A's, then B's
  for (const bool a : {true, false})
    for (size_t k = 0; k < infos_.size(); ++k)
      if (infos_[k].held && in_a(infos_[k]) == a) order.push_back(k);
  for (const size_t k : order) {
    const ParamInfo& p = infos_[k];
    const std::vector<float> v = init_values(p, seed, int(k));
    std::copy(v.begin(), v.end(), host.begin() + p.offset);
    if (!p.decay || p.size() == 0) continue;
    if (!decay_ranges.empty() && decay_ranges.back().offset + decay_ranges.back().size == p.offset)
      decay_ranges.back().size += p.size();
    else
      decay_ranges.push_back(IndexRange{p.offset, p.size()});
  }
  be.upload(host.data(), values);
  finalized_ = true;
}

void ParamStore::set_storage(std::span<const int> params, Storage s, Backend& be) {
  if (!finalized_) throw InternalError("ParamStore::set_storage before finalize");
  std::vector<bool> seen(infos_.size(), false);
  for (const int i : params) {
    if (i < 0 || size_t(i) >= infos_.size())
      throw Error("parameters: storage " + storage_name(s) + " for parameter index " + std::to_string(i) +
                  " (valid: 0 <= index < " + std::to_string(infos_.size()) + ")");
    if (seen[size_t(i)])
      throw Error("parameters: storage " + storage_name(s) + " lists parameter \"" + infos_[size_t(i)].name +
                  "\" twice");
    seen[size_t(i)] = true;
  }
  for (const int i : params) infos_[size_t(i)].storage = s;
  // One low-precision form a store (its CastStore casts them all alike).
  Storage low = Storage::fp32;
  for (const ParamInfo& p : infos_) {
    if (p.storage == Storage::fp32 || p.storage == low) continue;
    if (low != Storage::fp32)
      throw Error("parameters: storages " + storage_name(low) + " and " + storage_name(p.storage) +
                  " in one store (valid: one low-precision storage beside fp32)");
    low = p.storage;
  }
  // The cast over the held low-precision tensors, in index order (increasing offsets: the packed layout's order).
  std::vector<FlatTensor> tensors;
  cast_slot_.assign(infos_.size(), -1);
  for (const int i : low == Storage::fp32 ? std::vector<int>{} : params_with(low)) {
    const ParamInfo& p = infos_[size_t(i)];
    if (!p.held) continue;
    cast_slot_[size_t(i)] = int(tensors.size());
    tensors.push_back(FlatTensor{p.rows, p.cols, p.offset});
  }
  cast_store_ = tensors.empty() ? nullptr : be.make_cast_store(low, tensors);
}

const StoredWeight* ParamStore::stored(int i) const {
  if (provider_) return provider_->stored(i);
  if (!cast_store_ || cast_slot_[size_t(i)] < 0) return nullptr;
  return cast_store_->stored(size_t(cast_slot_[size_t(i)]));
}

std::vector<int> ParamStore::params_with(Storage s) const {
  std::vector<int> out;
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].storage == s) out.push_back(int(i));
  return out;
}

}  // namespace fp4lab::train
