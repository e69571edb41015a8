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
// parts and releases the unit (ZeroOptions::reduce bf16: the scaled gradients sent as BF16 codes and summed in
// rank order, grad_reduce.hpp); finish_backward does the last unit and the root. A unit's gradients accessed
// again after their reduce-scatter is an internal error (a model that uses a unit's parameters in two
// separated places of its backward belongs in the root). Units are visited in the same order on every rank
// (the same model on shares of one shape), which the collectives need.
//
// Low-precision-stored parameters (Storage::nvfp4_2d, bf16, fp8_e4m3: distributed.primary_weights "nvfp4",
// "bf16", "fp8"): each unit's stored tensors, in unit coordinates, have a CastStore of their own
// (Backend::make_cast_store). With gather_codes (config distributed.gather the storage's format) cast_stored,
// after every optimiser step, casts this rank's parts of every unit (sim/shard_cast.hpp's protocol: partial
// maxima of its master parts, one MAX all-reduce of every unit's maxima together (NVFP4: tensor and tile;
// FP8: tensor; BF16: none, no collective), scales on every rank, its codes into a zeroed buffer); gathering a
// unit then moves the code windows of its stored tensors (one allgather_equal, ORed in: primary_weights.hpp
// gather_windows) and, in FP32, only the unit's parts outside them (compacted); the unit's values are the
// dequantized codes there, the FP32 masters elsewhere: what ZeRO-1's run with the same storage hands the layers.
// Without gather_codes ("fp32") a unit's FP32 masters are gathered whole and every rank casts its stored
// tensors whole (the reference, no communication in the cast).
// Prefetch (ZeroOptions::prefetch, config distributed.prefetch; FSDP2's implicit prefetch): entering a unit
// starts the gather of the unit its pass visits next (the forward: u + 1, or unit 1 from the root at the
// pass's start; the backward: u - 1, or the last unit from the root at its start), with the start forms of
// the collectives (Communicator::allgather_start, allgather_equal_start): on NCCL the gather runs on the
// communicator's stream while this unit's layers run; the unit's use then waits for it, ORs the windows in
// and decodes. Every rank starts the same gathers in the same place of its sequence of collectives (the same
// model, the same visits), so the engines' order holds; the bits are those of the gather on use (the same
// collectives moving the same bytes). A gather with nothing to move (world 1, or codes and FP32 parts kept
// from the forward) is not started early. One more unit's values are in flight.
// reshard_after_forward false keeps what the forward's gather brought (the codes and compacted FP32 parts
// with gather_codes, dropping the decoded values; the FP32 values otherwise) for the unit's backward, which
// then gathers nothing; true drops it and the backward gathers the unit again.
//
// With the thread communicator (sums in rank order) the run equals ZeRO-1's bit for bit when gradient
// clipping is off (the norm's partial sums follow the shard layout): the same gradients element by element,
// AdamW element-wise, the same cast (e.g. quantize(nvfp4_2d, master)) whatever the split.
//
// Backends (plan S5): every buffer is the backend's (be.empty / copy / upload), so the same code runs on the
// cpu and the cuda backend. Collectives take the backend's buffers where the communicator does (cpu with a
// host communicator; cuda with NCCL) and are staged through host memory otherwise (cuda with thread ranks or
// MPI: stage_). On cuda each unit's store is a DeviceShardCast, and the layers take its packed form
// (stored(): ParamStore::stored asks the provider), decoded into their BF16 operand as under ZeRO-1; the
// unit buffer still receives the FP32 decode for the plans that read FP32 W.
// Codes held between gathers (more than one rank): each unit's store keeps only this rank's window of its
// packed codes (CastStore::keep_window, after cast_stored's cast); a gather restores the full buffer (zero but
// for that window) and ORs every rank's window in; dropping the unit releases the full buffer again. So a
// rank holds 1/N of the codes (plus the padding of its window and every tile's scale) between gathers; the
// full buffer is in flight with its unit. Not built yet (plan S5-S7): FP32 W decoded by the layer instead of
// into the unit buffer, expert parallelism.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/backend.hpp"
#include "train/dist/comm.hpp"
#include "train/dist/grad_reduce.hpp"
#include "train/params.hpp"

namespace fp4lab::train {

// How ZeRO-3 moves the parameters (DistributedConfig's gather and reshard_after_forward, resolved).
struct ZeroOptions {
  bool gather_codes = true;           // stored tensors travel as their codes (false: as FP32 masters)
  bool reshard_after_forward = true;  // false: the forward's gather kept for the unit's backward
  GradReduce reduce = GradReduce::fp32;  // the gradients' reduce-scatter: FP32 or BF16 codes (grad_reduce.hpp)
  bool prefetch = true;                  // the next unit's gather started on entering a unit (above)
};

class ShardedParams final : public ParamProvider {
 public:
  // Takes this rank's parts of ps's values (full, as finalize made them) and becomes ps's provider (ps's
  // buffers are released). `units`: Model::param_units (checked: every parameter exactly once). The
  // parameters ps stores in low precision are cast by cast_stored (call it before the first forward).
  ShardedParams(Communicator& comm, Backend& be, ParamStore& ps, std::vector<std::vector<int>> units,
                ZeroOptions opt = {});
  ~ShardedParams() override;

  float* value_ptr(int i) override;
  float* grad_ptr(int i) override;
  // The unit store's form of a stored tensor (cuda: its packed NVFP4 codes on the device, which the layer
  // decodes into its GEMM operand; cpu: null), current once the tensor's unit is gathered in this pass.
  const StoredWeight* stored(int i) const override;

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
  // The masters changed (a step, a loaded state): every unit released and, with gather_codes, this rank's
  // parts of the stored tensors cast (collective: one MAX all-reduce). Nothing to do without stored tensors.
  void cast_stored();
  // Every parameter's values as the layers see them (stored tensors: the dequantized cast), in one
  // process's layout, on every rank (collective: each unit gathered in turn).
  std::vector<float> model_values();

  // A shard-shaped buffer (master, moments) in one process's layout, on every rank (collective: each unit
  // all-gathered in turn); and the inverse, this rank's parts out of such a buffer.
  std::vector<float> to_global(const Tensor& shard);
  void from_global(const std::vector<float>& global, Tensor& shard) const;

  int64_t gathers() const { return gathers_; }  // unit gathers so far
  // Bytes this rank holds (summary.json's distributed); moments_bytes: the optimiser's stored m and v of this
  // rank's parts (AdamW::moments_bytes: FP32 or BF16 by training.moments).
  nlohmann::json memory(int64_t moments_bytes) const;

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
  void add_store(Unit& x);  // x's stored tensors' cast and FP32 parts (after x.shards)
  void enter(int u);
  void leave(int u);
  void gather(int u);               // start_gather and finish_gather back to back
  void start_gather(Unit& x);       // x.values allocated, this rank's parts sent: the collectives started
  void finish_gather(Unit& x);      // waited for, the parts and windows put in place, the stored tensors decoded
  bool gather_moves(const Unit& x) const;  // a gather of x would start a collective
  void prefetch_after(int u);       // the gather of the unit the pass visits after u started (prefetch)
  void settle(Unit& x);             // a started gather of x waited for, its result discarded
  void drop(Unit& x);               // what a gather of x brought, released
  bool windowed(const Unit& x) const;  // x's store keeps only this rank's window between gathers
  void reduce(int u);
  // The collectives on backend memory: in place where the communicator takes the backend's buffers (cpu with
  // a host communicator; cuda with NCCL), else staged through host memory (stage_: cuda with threads or MPI).
  // allgather: `full` (parts.back().end elements) holds this rank's part at parts[rank]; every part after.
  void allgather(float* full, std::span<const ShardRange> parts);
  // The same, started (null: done already, staged through the host).
  std::unique_ptr<PendingCollective> allgather_start(float* full, std::span<const ShardRange> parts);
  void reduce_scatter(const Tensor& full, std::span<const ShardRange> parts, Tensor& mine);
  void reduce_maxima(const std::vector<Unit*>& stored);  // cast_stored's one MAX all-reduce
  // A unit buffer (x.size elements of `buf`) into `out` at its parameters' global offsets.
  void put_global(const Unit& x, const Tensor& buf, std::vector<float>& out);
  Communicator& comm_;
  Backend& be_;
  ParamStore& ps_;
  ZeroOptions opt_;
  bool stage_;  // a device backend and a host communicator: collectives through host memory
  std::vector<Unit> units_;
  std::vector<int> unit_of_;  // per parameter
  std::vector<int64_t> at_;   // per parameter: its offset in its unit's gathered buffer
  std::vector<int> store_slot_;  // per parameter: its tensor in its unit's store, or -1 (stored in FP32)
  int64_t local_ = 0, peak_unit_ = 0;
  Tensor master_, grad_shard_;
  int current_ = -1;
  int last_ = -1;  // the last unit other than the root entered in this pass (-1: none yet)
  bool backward_ = false;
  float grad_scale_ = 1.0f, weight_ = 1.0f;
  int64_t gathers_ = 0;
};

}  // namespace fp4lab::train
