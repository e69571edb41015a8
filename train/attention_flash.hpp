// What the BF16 flash attention (model.attention "bf16_flash") fixes of its
// numerics beyond the formula, shared by the CUDA kernels
// (train/cuda/attention_flash.cu) and their CPU twin (train/cpu/attention_flash.cpp),
// so that both round at the same points. No dependencies: nvcc and the CPU
// build include it alike.
#pragma once

namespace fp4lab::train {

// Key columns per step of the forward's online softmax: the running row max m
// is updated, o and l rescaled, and P = exp2(s - m) rounded to BF16 once per
// step of this many keys (steps at multiples of it from key 0). It decides
// which max each P element is taken against before its rounding, so it is part
// of the numerics: 32 at head dim 128 (the kernel's register budget), else 64.
// The backward's tiles do not change values (no running max: P = exp2(s -
// lse2) with the saved lse2), so they are the kernels' own business.
constexpr int flash_forward_key_step(int head_dim) { return head_dim == 128 ? 32 : 64; }

// log2(e) in FP32: scores are scaled by scale2 = float(scale * kFlashLog2e)
// (one FP32 product) and exponentiated with exp2.
inline constexpr float kFlashLog2e = 1.4426950408889634f;

// Head dims the flash attention takes.
constexpr bool flash_head_dim_ok(long long head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

}  // namespace fp4lab::train
