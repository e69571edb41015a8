// All trainable parameters of a model in one flat float32 buffer (plus one
// flat gradient buffer of the same layout), with named 2-D views.
//
// 1-D parameters (biases, LayerNorm gains) are stored as [1, n]. `decay` marks
// the parameters AdamW decays (nanoGPT: every parameter with dim >= 2, i.e.
// weight matrices and embeddings; never biases or LayerNorm gains).
//
// Initialisation is reproducible from (seed, parameter index): element i of
// parameter k draws from Philox (core/philox.hpp) with stream kInitStream | k
// and counter i, so it does not depend on the thread count or on other
// parameters' sizes.
//
// Expert parallelism (docs/log/2026-12-02-expert-parallel-plan.md section 4):
// every rank declares every parameter in one process's order (the same
// indices everywhere), each with a placement: replicated, or expert e of a
// layer's E, held by rank e / (E / R) of the R ranks (set_expert_parallel).
// finalize() allocates the held tensors only, in two regions of the local
// buffer: A = the replicated tensors in index order, then B = the held expert
// tensors in index order. `global_offset` is a tensor's offset in one
// process's buffer (every tensor in index order), which checkpoints keep. With
// one rank everything is held and in A: the buffer is one process's.
//
// Storage (train/param_storage.hpp): every parameter records how its values
// are stored (FP32 unless set_storage says otherwise). The store hands each
// layer what follows from it (cast_spec: the quantizer its values are the
// output of; stored: its form in the backend's memory) and owns the
// low-precision tensors' CastStore; whoever steps the optimiser
// (train/dist/data_parallel.hpp) keeps the FP32 masters and runs the cast
// after every step.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "train/backend.hpp"
#include "train/param_storage.hpp"

namespace fp4lab::train {

enum class Init : uint8_t {
  zeros,
  ones,
  normal,        // N(0, std^2)
  trunc_normal,  // N(0, std^2) truncated to [-2, 2] (absolute, as torch.nn.init.trunc_normal_'s defaults)
  uniform,       // U(-bound, bound)
};

// Where a parameter lives: on every rank (expert -1), or with expert `expert` of `experts`.
struct Placement {
  int64_t expert = -1, experts = 0;
};

struct ParamInfo {
  std::string name;
  int64_t offset = 0, rows = 0, cols = 0;  // offset: in this rank's buffer (finalize's; -1: not held)
  bool decay = false;
  Init init = Init::zeros;
  float init_arg = 0.0f;  // std (normal, trunc_normal) or bound (uniform)
  Placement placement;
  bool held = true;                 // this rank holds it (finalize's)
  int64_t global_offset = 0;        // in one process's buffer
  Storage storage = Storage::fp32;  // set_storage's
  int64_t size() const { return rows * cols; }
};

// Where parameter values and gradients live when the store does not hold
// them whole (ZeRO-3, train/dist/sharded_params.hpp): value_ptr / grad_ptr
// hand out the provider's pointers, valid until the next access to another
// unit's parameters (the provider may gather, release or reduce on access).
class ParamProvider {
 public:
  virtual ~ParamProvider() = default;
  virtual float* value_ptr(int i) = 0;
  virtual float* grad_ptr(int i) = 0;
  // Parameter i's stored form for its layer (ParamStore::stored's contract), or null. Handed out without a
  // gather (the layers plan before they run); its contents are current once value_ptr(i) was called in
  // the same pass, i.e. when the layer that reads W runs.
  virtual const StoredWeight* stored(int i) const = 0;
};

class ParamStore {
 public:
  // Declares a parameter; returns its index. Names must be unique.
  int add(const std::string& name, int64_t rows, int64_t cols, bool decay, Init init, float init_arg = 0.0f,
          Placement placement = {});
  // This rank of `ranks` expert-parallel ranks (before finalize; default 1, 0).
  void set_expert_parallel(int ranks, int rank);
  // Allocates the held tensors' buffers on `be` and initialises them from `seed` (one process's values).
  void finalize(Backend& be, uint64_t seed);
  // Stores the parameters `params` (indices, each at most once) as `s`
  // (after finalize; the others keep theirs), and makes the CastStore of
  // every low-precision-stored tensor this rank holds on `be` (the values are
  // not cast here: the optimiser's step does that, DataParallel). Throws
  // Error naming an index out of range or listed twice, or a second
  // low-precision storage (one store casts one form).
  void set_storage(std::span<const int> params, Storage s, Backend& be);
  Storage storage(int i) const { return info(i).storage; }
  // storage_cast(storage(i)): the quantizer parameter i's values are the output of; null for FP32.
  const QuantizerSpec* cast_spec(int i) const { return storage_cast(storage(i)); }
  // The indices of the parameters stored as `s`, increasing (so are their offsets within a region).
  std::vector<int> params_with(Storage s) const;
  // The low-precision-stored tensors' cast (null: none); its storage() says the form.
  CastStore* cast_store() const { return cast_store_.get(); }
  // Parameter i's stored form for its layer (LayerPlan::w_stored), or null (FP32, or a backend that keeps none).
  const StoredWeight* stored(int i) const;

  int64_t size() const { return total_; }                  // this rank's buffer (after finalize)
  int64_t global_size() const { return global_total_; }    // one process's buffer
  int64_t replicated_size() const { return replicated_; }  // region A: [0, replicated_size()); B after it
  int expert_ranks() const { return ep_ranks_; }
  int owner(int i) const;  // the expert-parallel rank holding tensor i; -1: replicated (every rank)
  int expert_rank() const { return ep_rank_; }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(int i) const { return infos_[size_t(i)]; }
  int index(const std::string& name) const;  // throws naming the valid names
  // Views of a held tensor (Error for a tensor another rank holds).
  Tensor value(int i) const { return view_of(value_ptr(i), info(i).rows, info(i).cols); }
  Tensor grad(int i) const { return view_of(grad_ptr(i), info(i).rows, info(i).cols); }
  float* value_ptr(int i) const { return provider_ ? provider_->value_ptr(i) : values.data + held_offset(i); }
  float* grad_ptr(int i) const { return provider_ ? provider_->grad_ptr(i) : grads.data + held_offset(i); }
  // Values and gradients from `p` for the store's life (not null); `values` and `grads` are released (the
  // provider copied what it needs before), and so is the whole-model CastStore (the provider keeps the
  // stored form: stored() asks it; cast_store() is null from then on). ZeRO-3's.
  void set_provider(ParamProvider* p);
  bool has_provider() const { return provider_ != nullptr; }

  Tensor values, grads;                  // [1, size()] each; empty with a provider
  std::vector<IndexRange> decay_ranges;  // the decayed parameters' elements, merged where adjacent
 private:
  int64_t held_offset(int i) const;
  std::vector<ParamInfo> infos_;
  std::unordered_set<std::string> names_;  // infos_' names: add() checks uniqueness in O(1), not O(count)
  int64_t total_ = 0, global_total_ = 0, replicated_ = 0;
  int ep_ranks_ = 1, ep_rank_ = 0;
  bool finalized_ = false;
  std::unique_ptr<CastStore> cast_store_;
  std::vector<int> cast_slot_;  // per parameter: its tensor in cast_store_, or -1
  ParamProvider* provider_ = nullptr;
};

// Host-side initial values of one parameter (what finalize() uploads).
std::vector<float> init_values(const ParamInfo& p, uint64_t seed, int index);

}  // namespace fp4lab::train
