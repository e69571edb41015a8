#include "train/optim.hpp"

#include <algorithm>
#include <cmath>

#include "core/bits.hpp"
#include "core/error.hpp"
#include "train/cpu/bf16.hpp"
#include "train/grad_clip.hpp"

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

namespace {

// The decayed ranges that meet `shard`, relative to its start.
std::vector<IndexRange> ranges_in(std::span<const IndexRange> decayed, ShardRange shard) {
  std::vector<IndexRange> out;
  for (const IndexRange& r : decayed) {
    const int64_t b = std::max(r.offset, shard.begin), e = std::min(r.offset + r.size, shard.end);
    if (b < e) out.push_back(IndexRange{b - shard.begin, e - b});
  }
  return out;
}

}  // namespace

AdamW::AdamW(const AdamWConfig& cfg, ParamStore& params, Backend& be)
    : AdamW(cfg, be, params.decay_ranges, ShardRange{0, params.size()}) {
  params_ = &params;
}

AdamW::AdamW(const AdamWConfig& cfg, Backend& be, std::span<const IndexRange> decayed, ShardRange shard)
    : cfg_(cfg), be_(be), shard_(shard), decayed_(ranges_in(decayed, shard)) {
  if (shard.begin < 0 || shard.end < shard.begin) throw Error("AdamW: invalid shard");
  const int64_t floats = moment_floats(cfg.moments, shard.end - shard.begin);
  m_ = be.zeros(1, floats);  // zero floats are zero BF16 pairs too
  v_ = be.zeros(1, floats);
}

Tensor AdamW::widened(Tensor& stored) {
  if (cfg_.moments == MomentStorage::fp32) return stored;
  const int64_t n = shard_.end - shard_.begin;
  std::vector<float> packed(stored.size()), wide(static_cast<size_t>(n));
  be_.download(stored, packed.data());
  const auto* h = reinterpret_cast<const uint16_t*>(packed.data());
  for (int64_t i = 0; i < n; ++i) wide[size_t(i)] = bits_float(uint32_t(h[i]) << 16);
  Tensor t = be_.empty(1, n);
  be_.upload(wide.data(), t);
  return t;
}

void AdamW::store(Tensor& stored, const Tensor& f32) {
  const int64_t n = shard_.end - shard_.begin;
  if (f32.size() != n)
    throw Error("AdamW::set_moments: " + std::to_string(f32.size()) + " values for a shard of " + std::to_string(n));
  if (cfg_.moments == MomentStorage::fp32) return be_.copy(f32, stored);
  std::vector<float> wide(static_cast<size_t>(n)), packed(static_cast<size_t>(stored.size()), 0.0f);
  be_.download(f32, wide.data());
  auto* h = reinterpret_cast<uint16_t*>(packed.data());
  for (int64_t i = 0; i < n; ++i) h[i] = uint16_t(float_bits(round_bf16_f32(wide[size_t(i)])) >> 16);
  be_.upload(packed.data(), stored);
}

void AdamW::set_moments(const Tensor& m, const Tensor& v) {
  store(m_, m);
  store(v_, v);
}

double AdamW::step(double lr) {
  if (!params_) throw Error("AdamW::step(lr) needs the whole-buffer form");
  return step_clipped(params_->values, params_->grads, lr);
}

void AdamW::step(Tensor& p, Tensor& g, double lr, double norm) {
  ++t_;
  be_.adamw_step(p, g, m_, v_, decayed_, float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                 float(cfg_.weight_decay), t_, clip_grad_scale(norm, cfg_.grad_clip), cfg_.moments);
}

double AdamW::step_clipped(Tensor& p, Tensor& g, double lr) {
  ++t_;
  return be_.adamw_step_clipped(p, g, m_, v_, decayed_, float(lr), float(cfg_.beta1), float(cfg_.beta2),
                                float(cfg_.eps), float(cfg_.weight_decay), t_, cfg_.grad_clip, cfg_.moments);
}

}  // namespace fp4lab::train
