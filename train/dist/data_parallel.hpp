// Data-parallel training over a Communicator (issue 30; llm.c's engine is the
// model): each of N ranks computes the gradients of its share of every global
// batch, the gradients are summed over the ranks, and the optimiser step
// follows one of three configurations (config section `distributed`):
//
//   zero 0  every rank all-reduces the whole gradient and runs AdamW on the
//           whole buffer (identical on every rank);
//   zero 1  ZeRO-1: the flat buffer is cut into even_shards(n, N) (any
//           element boundaries: shards of odd sizes, mid-row, mid-tensor);
//           a reduce-scatter gives each rank the summed gradients of its
//           shard, AdamW updates the shard (FP32 master values and both
//           moments are held for the shard only), an all-gather rebuilds
//           the full parameter buffer on every rank. The gradient norm for
//           clipping is the sum over the ranks of each shard's sum of squares.
//   zero 3  ZeRO-3 (train/dist/sharded_params.hpp): parameters, gradients,
//           masters and moments sharded by the model's units; a unit is
//           all-gathered when its parameters are first used and its
//           gradients reduce-scattered when the backward moves on; AdamW
//           updates this rank's parts; NVFP4-stored weights gathered as
//           packed codes (gather nvfp4) or as FP32 masters. CPU and CUDA
//           backends (cuda: collectives staged through the host with a
//           host communicator, on the device with NCCL).
//   stored parameters (ParamStore storage, train/param_storage.hpp)
//           the parameters the store keeps in low precision (Storage::bf16,
//           fp8_e4m3 or nvfp4_2d: the trainer stores so the weights of the
//           linear layers the recipe does not keep high-precision, and not
//           tied, when distributed.primary_weights is "bf16", "fp8" or
//           "nvfp4"): after every step the model's values of those tensors
//           are the storage's cast of the master (param_storage.hpp states
//           each), by the protocol of sim/shard_cast.hpp (partial maxima, a
//           MAX all-reduce where the form has a scale, each rank writing
//           exactly the codes it owns, the code windows gathered); with zero
//           1 the FP32 all-gather then moves only the parameters stored in
//           FP32 (the stored ones arrive as their codes). shard_cast false has
//           every rank cast the whole tensors instead (the reference; the
//           all-gather moves every parameter). The FP32 master values stay
//           in the optimiser (the shard's, with zero 1) and are what
//           checkpoints hold.
//
// The gradients' sum (config distributed.reduce, train/dist/grad_reduce.hpp): "fp32" as above; "bf16" each
// rank's scaled gradient rounded to BF16 once, the codes sent by one alltoallv, each shard's contributions
// summed in FP32 in rank order by its owner (zero 1, zero 3; zero 0: that, then the FP32 all-gather of the sums).
//
// Shares: rank r computes the samples [floor(r n / N), floor((r+1) n / N)) of
// a global batch of n (batch_share); its gradients are those of its share's
// mean loss, weighted by share / n before the sum, so the summed gradient is
// the global batch's mean-loss gradient. What differs from one process on the
// same global batch: the order of the sums (floating-point), per-tensor amax
// of quantized activations and gradients (each rank's own, as in every
// data-parallel FP8/FP4 trainer without amax reduction), and the dropout
// masks (keyed by position within the rank's share).
//
// Expert parallelism (ParamStore::set_expert_parallel over the whole world;
// docs/log/2026-12-02-expert-parallel-plan.md section 4): the buffer's region
// A (replicated tensors) takes everything above; region B (this rank's
// experts, whose gradients only this rank computes) takes no collective and
// its own AdamW over the whole region; the clipping norm^2 = SS_A + SS_B from
// one all-reduce. Checkpoint state is one process's layout (B gathered).
// NVFP4-stored parameters with expert parallelism are refused (plan step 10).
//
// Collective buffers: with a host communicator (MPI, threads, local) and the
// CUDA backend, gradients and weights are staged through host memory; with
// NCCL (device_buffers()) they stay on the device.
// World 1, zero 0, fp32: bit for bit the single-process optimiser step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.hpp"
#include "train/dist/comm.hpp"
#include "train/model.hpp"
#include "train/optim.hpp"

namespace fp4lab::train {

// The samples [begin, end) of a global batch of n that `rank` of `world` computes.
ShardRange batch_share(int64_t n, int rank, int world);

class DataParallel {
 public:
  // The parameters `ps` stores in low precision (set before) are cast at
  // once: the model starts from their stored form. dc: zero and shard_cast
  // (primary_weights is the trainer's, which sets the storage).
  // units: Model::param_units (ZeRO-3's; unused otherwise).
  DataParallel(Communicator& comm, Backend& be, ParamStore& ps, const AdamWConfig& ac, const DistributedConfig& dc,
               std::vector<std::vector<int>> units = {});
  ~DataParallel();
  int rank() const { return comm_.rank(); }
  int world() const { return comm_.world(); }

  // Before this rank's forward/backward: the gradients zeroed; they will be
  // multiplied by grad_scale (1/loss_scale) and, with more than one rank, by
  // `weight` (share / global batch) before their sum.
  void begin_step(float grad_scale, double weight);
  // The optimiser step after this rank's forward/backward (gradients of its
  // share's mean loss, times the loss scale): begin_step's scaling, gradient
  // sum over the ranks, global norm, clipping, AdamW, gather, NVFP4 cast.
  // Returns the global gradient norm before clipping.
  double step(double lr);
  // Sum over the ranks of local_loss * weight: the global batch's mean loss.
  double global_loss(double local_loss, double weight);

  // Checkpoint state, full buffers on every rank in one process's layout
  // (ParamInfo::global_offset; collective): FP32 master values, first and
  // second moments.
  void state(std::vector<float>& master, std::vector<float>& m, std::vector<float>& v);
  // The inverse (every rank passes the same full buffers, one process's
  // layout): sets the shards,
  // the model's values (NVFP4 cast included) and the step count.
  void load_state(const std::vector<float>& master, const std::vector<float>& m, const std::vector<float>& v,
                  int64_t steps_taken);
  int64_t steps_taken() const;
  // The model's values (ps.values: the NVFP4 cast where primary_weights is
  // nvfp4) in one process's layout (collective with expert parallelism).
  std::vector<float> model_values();

  // Bytes this rank holds: parameters, gradients, master shard, moments, NVFP4 codes and scales.
  nlohmann::json memory() const;
  void barrier() { comm_.barrier(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Communicator& comm_;
};

// Expert parallelism's evaluation: the MoE layers exchange tokens, so every
// rank evaluates its share of each batch (batch_share), and the shares' mean
// losses and hits are summed over the ranks weighted as training's are
// (global_loss): the batch's mean loss, within float rounding of one
// process's. Collective: every rank evaluates the same batches.
class ShareEvaluator final : public BatchEvaluator {
 public:
  ShareEvaluator(Model& model, DataParallel& dp) : model_(model), dp_(dp) {}
  double evaluate(const Batch& b, const StepContext& s, int64_t* correct) override;

 private:
  Model& model_;
  DataParallel& dp_;
};

}  // namespace fp4lab::train
