#include "train/optim.hpp"

#include <cmath>

#include "core/error.hpp"

namespace fp4lab::train {

double learning_rate(const ScheduleConfig& s, int64_t it, int64_t total_steps) {
  if (it < s.warmup_steps) return s.lr * double(it + 1) / double(s.warmup_steps + 1);
  if (s.kind == "constant") return s.lr;
  if (s.kind != "cosine") throw Error("training.schedule \"" + s.kind + "\" unknown; valid: constant, cosine");
  const int64_t decay = s.decay_steps > 0 ? s.decay_steps : total_steps;
  if (it > decay) return s.min_lr;
  if (decay <= s.warmup_steps) return s.min_lr;
  const double r = double(it - s.warmup_steps) / double(decay - s.warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(3.14159265358979323846 * r));
  return s.min_lr + coeff * (s.lr - s.min_lr);
}

AdamW::AdamW(const AdamWConfig& cfg, ParamStore& params, Backend& be) : cfg_(cfg), params_(params), be_(be) {
  m_ = be.zeros(1, params.size());
  v_ = be.zeros(1, params.size());
}

double AdamW::step(double lr) {
  const double norm = std::sqrt(be_.sum_squares(params_.grads));
  if (cfg_.grad_clip > 0.0) {
    // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6), only if < 1.
    const double coef = cfg_.grad_clip / (norm + 1e-6);
    if (coef < 1.0) be_.scale(params_.grads, float(coef));
  }
  ++t_;
  be_.adamw_step(params_.values, params_.grads, m_, v_, params_.decay_ranges, float(lr), float(cfg_.beta1),
                 float(cfg_.beta2), float(cfg_.eps), float(cfg_.weight_decay), t_);
  return norm;
}

}  // namespace fp4lab::train
