// ZeRO-3 (FSDP-style full sharding; issue 46, docs/log/2026-12-01-param-storage-plan.md section 3, step S4):
// no rank holds the whole model. The parameters fall into units (Model::param_units: GPT's root {wte, wpe,
// ln_f} and one unit a block); each unit's parameters, concatenated in the unit's order, are cut into
// even_shards(unit size, N), and rank r holds part r of every unit: its FP32 master values, AdamW moments and
// summed gradients, concatenated in unit order (`local_size()` elements).
//
// A ShardedParams is the ParamStore's provider (params.hpp ParamProvider): the first access to a parameter of
// unit u gathers u (an FP32 all-gather of its parts into a unit buffer); in the forward, moving on to another
// unit releases the previous one (reshard after forward), except the root, which stays gathered for the
// whole step (wte feeds the embedding and the tied lm_head). The first gradient access begins the backward:
// from then on moving on from a unit reduce-scatters its gradient buffer (each element times the step's
// 1/loss_scale, then its share weight: ZeRO-1's operations in ZeRO-1's order) into this rank's gradient
// parts and releases the unit; finish_backward does the last unit and the root. A unit's gradients accessed
// again after their reduce-scatter is an internal error (a model that uses a unit's parameters in two
// separated places of its backward belongs in the root). Units are visited in the same order on every rank
// (the same model on shares of one shape), which the collectives need.
//
// With the thread communicator (sums in rank order) the run equals ZeRO-1's bit for bit when gradient
// clipping is off (the norm's partial sums follow the shard layout): the same gradients element by element,
// AdamW element-wise. Not built yet (plan S5-S7): the CUDA backend, NVFP4 gathers and NVFP4-stored
// parameters, prefetch and overlap, expert parallelism.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/backend.hpp"
#include "train/dist/comm.hpp"
#include "train/params.hpp"

namespace fp4lab::train {

class ShardedParams final : public ParamProvider {
 public:
  // Takes this rank's parts of ps's values (full, as finalize made them) and becomes ps's provider (ps's
  // buffers are released). `units`: Model::param_units (checked: every parameter exactly once).
  ShardedParams(Communicator& comm, Backend& be, ParamStore& ps, std::vector<std::vector<int>> units);
  ~ShardedParams() override;

  float* value_ptr(int i) override;
  float* grad_ptr(int i) override;

  int64_t local_size() const { return local_; }
  Tensor& master() { return master_; }          // [1, local_size()] this rank's FP32 master values
  Tensor& grad_shard() { return grad_shard_; }  // [1, local_size()] summed gradients, after finish_backward
  // The decayed elements of this rank's parts (shard-relative, sorted): AdamW's mask.
  std::vector<IndexRange> decay_ranges() const;

  // A training step's forward begins: every unit released (the masters may have changed); gradients will be
  // multiplied by grad_scale (1/loss_scale) and then, with more than one rank, by weight (share / batch).
  void begin_step(float grad_scale, float weight);
  // The backward ended: the gradients of the units still held reduce-scattered (root last).
  void finish_backward();
  // Every unit released (after the optimiser step; evaluation gathers again as it goes).
  void release_all();

  // A shard-shaped buffer (master, moments) in one process's layout, on every rank (collective: each unit
  // all-gathered in turn); and the inverse, this rank's parts out of such a buffer.
  std::vector<float> to_global(const Tensor& shard);
  void from_global(const std::vector<float>& global, Tensor& shard) const;

  int64_t gathers() const { return gathers_; }  // unit gathers so far
  nlohmann::json memory() const;

 private:
  struct Unit;
  // A parameter's elements inside this rank's part: `length` of them from element `from` of parameter `param`,
  // at `at` in the shard buffers.
  struct Piece {
    int param;
    int64_t from, at, length;
  };
  // Every piece of this rank's parts, unit by unit, in shard order.
  std::vector<Piece> own_pieces() const;
  void enter(int u);
  void leave(int u);
  void gather(int u);
  void reduce(int u);
  Communicator& comm_;
  Backend& be_;
  ParamStore& ps_;
  std::vector<Unit> units_;
  std::vector<int> unit_of_;  // per parameter
  std::vector<int64_t> at_;   // per parameter: its offset in its unit's gathered buffer
  int64_t local_ = 0, peak_unit_ = 0;
  Tensor master_, grad_shard_;
  int current_ = -1;
  bool backward_ = false;
  float grad_scale_ = 1.0f, weight_ = 1.0f;
  int64_t gathers_ = 0;
};

}  // namespace fp4lab::train
