// Optimiser: AdamW with decoupled weight decay on the parameters marked
// `decay` (2-D weights and embeddings), learning-rate schedule, global-norm
// gradient clipping. Semantics follow PyTorch's torch.optim.AdamW and
// torch.nn.utils.clip_grad_norm_, the schedule nanoGPT's get_lr().
#pragma once

#include <cstdint>
#include <string>

#include "train/backend.hpp"
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
};

class AdamW {
 public:
  AdamW(const AdamWConfig& cfg, ParamStore& params, Backend& be);
  // Clips the gradients (if configured), then one AdamW step at `lr`.
  // Returns the global gradient norm before clipping.
  double step(double lr);
  int64_t steps_taken() const { return t_; }
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  AdamWConfig cfg_;
  ParamStore& params_;
  Backend& be_;
  Tensor m_, v_;
  int64_t t_ = 0;
};

}  // namespace fp4lab::train
