// The CPU twin of the BF16 flash attention (train/cuda/attention_flash.cu):
// model.attention "bf16_flash" on the CPU backend. The same numerics, step for
// step, in FP32 on the CPU:
//
// - Q, K, V (and dout in the backward) rounded to BF16 (RNE, train/cpu/bf16.hpp)
//   as they are read; scores s = q.k accumulated in FP32.
// - Forward, per query row: the online softmax over steps of
//   flash_forward_key_step(hd) keys (train/attention_flash.hpp; 64, or 32 at head
//   dim 128): v = s * scale2 (scale2 = float(scale * log2 e)), causal / out-of-range
//   keys -inf; per step the row max m is raised to the step's max, l and o are
//   rescaled by exp2(m_old - m), P = exp2(v - m) is added to l unrounded, then
//   dropped (0) where the dropout word says so, rounded to BF16 and multiplied
//   into o += r(P) V in FP32. out = o * (keep / l) (keep = 1 / (1 - p) when the
//   dropout threshold is not 0, else 1). Saved, [B*H*T, hd + 1] floats: O as
//   [B*H][T][hd] (FP32, before any BF16-activation rounding of out), then
//   lse2 = m + log2(l) of every row [B*H*T].
// - Backward: D = rowsum(dout * O) from the FP32 dout and the saved O; per
//   element P = exp2(s scale2 - lse2) (0 where masked), dP = r(dout).v,
//   g = dropped ? 0 : dP keep, dS = P (g - D) scale; dQ = r(dS) K,
//   dK = r(dS)^T Q, dV = keep r(drop(P))^T r(dout) (drop(P): P, or 0 where
//   dropped), every product accumulated in FP32.
// - Dropout: element e = (bh T + i) T + j (query row i, key j) is dropped iff
//   random_bits(seed, stream, e) < dropout_threshold(p) (core/philox.hpp): the
//   kernels' words and the FP32 attention's mask, bit for bit.
// - exp2 results below FLT_MIN are 0 (the kernels' ex2.approx.ftz).
//
// Accuracy bound (docs/DESIGN.md, "The BF16 flash attention's CPU twin"). The
// twin and the kernels evaluate one formula on the same BF16 operands; they
// differ in the order of FP32 sums (tensor-core k-chunks vs a CPU loop), in
// exp2 (ex2.approx, 2 ulp, vs glibc's exp2f, 1 ulp) and in nothing else. Let a be
// one BF16-rounded intermediate (P of the forward, drop(P), dS), a* its value in
// exact arithmetic and d_a the FP32 error bound of its computed value (derived
// from the FP32 sums and exp2 that feed it; u = 2^-8 BF16's unit roundoff,
// eps = 2^-24, 2^-23 on the tensor cores that may truncate). Both roundings of a
// agree unless a* lies within d_a of a BF16 rounding boundary ("fragile"); then
// they differ by at most one BF16 ulp, 2u |a*| + 2 d_a. For an output
// y = sum_j r(a_j) b_j (times the FP32 factors 1/l, keep):
//   |y_cuda - y_twin| <= (eta_cuda + eta_twin) sum_j |a_j b_j|
//                        + sum_{j fragile} (2u |a_j| + 2 d_j) |b_j|
// with eta the FP32 noise of the output itself: gamma_n = n eps / (1 - n eps) of
// its n-term sum (forward: n = 2K + 3 steps + 4 for o and again for l, plus
// the exp2 and score errors of l's terms and of the per-step rescalings;
// tests/train/attention_flash_ref.cpp spells each term out). Worst case (every a_j fragile) that is
// (2^-7 + 2 eta) sum_j |a_j b_j|, the size of the BF16 rounding itself; in
// practice a fraction ~d_a / (u |a|) ~ 2^-13 of the elements is fragile and the
// twin sits at FP32 noise from the kernels elsewhere. tests/train/
// attention_flash_ref.hpp computes the bound element by element from a float64
// evaluation of the same roundings; tests/train/cpu/test_attention_flash.cpp
// checks the twin against it, tests/train/cuda/test_attention_flash_twin.cpp the
// kernels against the twin.
#pragma once

#include "train/backend.hpp"

namespace fp4lab::train {

// qkv [B*T, 3C], out [B*T, C], saved [B*H*T, hd + 1] (attention_saved_cols with
// bf16_flash); OpenMP over the B*H (sequence, head) pairs, the same bits for any
// thread count. Throws fp4lab::Error for a head dim the flash attention does not take.
void flash_attention_forward_cpu(const AttentionShape& s, const Tensor& qkv, Tensor& out, Tensor& saved,
                                 DropoutKey key);
// dqkv [B*T, 3C] (every column written) from the forward's saved tensor and dout [B*T, C].
void flash_attention_backward_cpu(const AttentionShape& s, const Tensor& qkv, const Tensor& saved, const Tensor& dout,
                                  Tensor& dqkv, DropoutKey key);

}  // namespace fp4lab::train
