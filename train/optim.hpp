// Optimiser: AdamW with decoupled weight decay on the parameters marked
// `decay` (2-D weights and embeddings), learning-rate schedule, global-norm
// gradient clipping. Semantics follow PyTorch's torch.optim.AdamW and
// torch.nn.utils.clip_grad_norm_, the schedule nanoGPT's get_lr().
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "train/backend.hpp"
#include "sim/shard_cast.hpp"
#include "train/params.hpp"

namespace fp4lab::train {

struct ScheduleConfig {
  std::string kind = "cosine";  // "constant" | "cosine"
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // cosine reaches min_lr here (0: the run's total steps)
};

// Learning rate at 0-based step `it` (nanoGPT get_lr):
//   it < warmup:      lr * (it + 1) / (warmup + 1)
//   it > decay_steps: min_lr
//   else:             min_lr + 0.5 (1 + cos(pi r)) (lr - min_lr), r = (it - warmup) / (decay_steps - warmup)
// "constant": lr after the warmup.
double learning_rate(const ScheduleConfig& s, int64_t it, int64_t total_steps);

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double grad_clip = 0.0;  // max global L2 norm; 0 = off
  MomentStorage moments = MomentStorage::fp32;  // training.moments (train/backend.hpp states the semantics)
};

// AdamW over the elements [shard.begin, shard.end) of a flat parameter buffer
// (the whole buffer in one process; a rank's ZeRO-1 shard in data-parallel
// training, train/dist/data_parallel.hpp). The moments hold the shard only.
class AdamW {
 public:
  // The whole buffer of `params`: step(lr) updates params.values from params.grads.
  AdamW(const AdamWConfig& cfg, ParamStore& params, Backend& be);
  // A shard of a flat buffer whose decayed elements are `decayed` (flat indices,
  // sorted, disjoint): step(p, g, lr, norm) updates it.
  AdamW(const AdamWConfig& cfg, Backend& be, std::span<const IndexRange> decayed, ShardRange shard);
  // Whole buffer: the gradient norm, clipping (if configured), one AdamW step
  // at `lr`. Returns the global gradient norm before clipping.
  double step(double lr);
  // Shard: one AdamW step of `p` (the shard's values) from `g` (the shard's
  // gradients, shard-sized like p), clipped by the global gradient norm `norm`
  // (computed by the caller over every shard) as the step reads it; g is left unchanged.
  void step(Tensor& p, Tensor& g, double lr, double norm);
  // Shard that is the whole gradient (g's own norm is the global norm): one
  // AdamW step of p clipped by that norm, computed where g lives
  // (Backend::adamw_step_clipped: on the GPU without a host read between the
  // norm and the step). The same bits as step(p, g, lr, sqrt(sum_squares(g))).
  // Returns the norm before clipping.
  double step_clipped(Tensor& p, Tensor& g, double lr);
  ShardRange shard() const { return shard_; }
  int64_t steps_taken() const { return t_; }
  // The stored moments: shard-sized FP32, or packed BF16 (moment_floats floats) under MomentStorage::bf16.
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  // The moments' values as shard-sized FP32 tensors: m() / v() themselves with FP32 storage, widened copies
  // with BF16 storage (exact). For checkpoints and resharding, not for the step.
  Tensor m_f32() { return widened(m_); }
  Tensor v_f32() { return widened(v_); }
  // Stores shard-sized FP32 values as the moments: copied, or rounded to BF16 (RNE; the identity on values
  // that m_f32 / v_f32 returned, so a checkpoint's moments resume bit for bit).
  void set_moments(const Tensor& m, const Tensor& v);
  // Bytes of both stored moments.
  int64_t moments_bytes() const { return 2 * m_.size() * int64_t(sizeof(float)); }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  AdamWConfig cfg_;
  ParamStore* params_ = nullptr;  // whole-buffer form only
  Backend& be_;
  ShardRange shard_;
  Tensor widened(Tensor& stored);
  void store(Tensor& stored, const Tensor& f32);

  std::vector<IndexRange> decayed_;  // shard-relative
  Tensor m_, v_;
  int64_t t_ = 0;
};

}  // namespace fp4lab::train
