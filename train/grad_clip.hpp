// Gradient clipping's factor, torch.nn.utils.clip_grad_norm_'s rule, one
// implementation for the host (train/optim.cpp, Backend::adamw_step_clipped's
// default) and the CUDA backend's device step (train/cuda/nn_loss.cu): the
// gradient the step reads is g * clip_grad_scale(norm, max_norm)
// (Backend::adamw_step's grad_scale).
//
// Semantics: max_norm <= 0 (or NaN): no clipping, 1. Otherwise coef =
// max_norm / (norm + 1e-6) in float64 and, where coef < 1, float(coef) (round
// to nearest); else 1. A NaN norm gives 1 (NaN < 1 is false): the step reads
// the gradients unscaled, as PyTorch's clamp does not. IEEE float64 add and
// divide, rounded to nearest, on both sides (nvcc's double division is IEEE
// unless fast-math, which fp4lab never uses): the same bits.
#pragma once

#include "core/hd.hpp"

namespace fp4lab::train {

FP4LAB_HD inline float clip_grad_scale(double norm, double max_norm) {
  if (!(max_norm > 0.0)) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace fp4lab::train
