// A float64 evaluation of the BF16 flash attention's numerics (train/cpu/
// attention_flash.hpp, train/cuda/attention_flash.cu) and its accuracy bound,
// element by element: the independent construction the CPU twin and the CUDA
// kernels are checked against.
//
// The same roundings at the same places, the rest exact: Q, K, V, dout rounded
// to BF16 by core's codec (encode_rn_f32<bfloat16>, not the trainer's
// round_bf16_f32); scores, softmax statistics and every sum in float64; the
// forward's P = exp2(v - m) against the running max of each step of
// flash_forward_key_step(hd) keys, rounded to BF16 by this file's own
// round-half-even on the float64 value; dS and drop(P) rounded likewise; the
// dropout mask from random_bits of element (bh T + i) T + j (core/philox.hpp's
// definition, checked against Random123's vectors in tests/core).
//
// The bound (attention_flash.hpp's, derived for an FP32 evaluation with unit
// roundoff `eps` per operation and exp2 within `exp2_rel`): each FP32
// intermediate v (a score, the row max, P, D, dS) is within a derived d_v of its
// float64 value (gamma_n = n eps / (1 - n eps) for an n-term FP32 sum, the
// products' and exp2's errors propagated); a BF16-rounded intermediate whose
// float64 value is farther than its d from every BF16 rounding boundary rounds
// to the same BF16 as here; one within d ("fragile") may round to the
// neighbour, one BF16 ulp <= 2^-7 (|v| + d) away. tol_* is the sum of the FP32
// noise over an output's terms and those flips.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "train/backend.hpp"

namespace fp4lab::train::test {

struct FlashBoundModel {
  double eps = 0x1p-24;       // FP32 unit roundoff of each operation and sum step (the CPU twin)
  double exp2_rel = 0x1p-23;  // exp2's relative error (glibc exp2f: 1 ulp)
};
// The CUDA kernels: tensor-core sums that may truncate (2^-23 a step) and
// ex2.approx.ftz.f32 (2 ulp: the CUDA C Programming Guide's exp2f bound).
inline constexpr FlashBoundModel kFlashCudaModel{0x1p-23, 0x1p-22};

struct FlashRef {
  std::vector<double> out, tol_out;    // [B*T, C]
  std::vector<double> lse, tol_lse;    // [B*H*T] base-2 log-sum-exp of v = s * scale2
  std::vector<double> dqkv, tol_dqkv;  // [B*T, 3C]
  std::vector<uint8_t> dropped;        // [B*H*T*T]: element (bh T + i) T + j dropped by the mask
  int64_t rounded = 0, fragile = 0;    // BF16-rounded intermediates, and those within their d of a boundary
};

// qkv [B*T, 3C] and dout [B*T, C] as FP32 values (rounded to BF16 here).
// s.bf16_flash is not read. saved (may be null): a forward's saved tensor
// ([B*H*T*(hd + 1)]: O, then lse2); the backward part then evaluates the
// backward of that forward (D and P from its O and lse2, taken as exact inputs,
// as the kernels take them), so that its bound does not carry the forward's
// error; null: the backward of this evaluation's own forward, the forward's
// bound carried into D and P (a looser bound: what two whole runs may differ by).
FlashRef flash_reference(const AttentionShape& s, const std::vector<float>& qkv, const std::vector<float>& dout,
                         DropoutKey key, const FlashBoundModel& model = {}, const std::vector<float>* saved = nullptr);

// got against want element by element, the check every consumer of the bound
// makes: how many elements lie farther than bound[i] from want[i] (NaN counts),
// and the worst ratio |got - want| / bound (the first NaN, else the largest)
// with its element. The three have equal sizes (checked).
struct BoundExcess {
  int64_t outside = 0;
  double worst = -1.0;  // -1: no elements
  size_t at = 0;
};
BoundExcess outside_bound(std::span<const float> got, std::span<const double> want, std::span<const double> bound);

// BF16 round-half-even of a float64 (no overflow handling: attention's
// intermediates are far inside BF16's range), and the distance from x to the
// nearest BF16 rounding boundary (a midpoint between two BF16 neighbours).
double bf16_rne64(double x);
double bf16_boundary_distance(double x);

}  // namespace fp4lab::train::test
