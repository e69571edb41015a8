// Per-layer numerics statistics of the quantized GEMM operands (config
// output.numerics_interval: every N optimiser steps, numerics.jsonl in the run
// directory; `fp4lab inspect` reads it). The single definition of every
// statistic; the CPU (numerics.cpp) and the CUDA backend (cuda/numerics.cu)
// compute them with the FP4LAB_HD rules below, and `fp4lab quantize --stats`
// prints the same figures through numerics_of().
//
// What is measured. For a linear layer's operand op (recipes/recipe.hpp's
// Operand) with plan p (recipes/linear_plan.hpp), the QUANTIZER INPUT t is the
// operand's source after p.pre (double quantization) and p.rht (the wgrad RHT
// along B), and after the quantizer's own RHT when q.rht (sim's
// quantizer_domain): statistics compare t with q's dequantized output in that
// same domain (RHT operands count against the RHT'd input, never against the
// raw x). Per element (v = t, d = dequant, code = element code):
//   nan, nonzero, flushed, saturated, inexact, finite: sim/element_stats.hpp's
//              element_flags (the one definition, quant_stats' too); NaN
//              inputs count in nan and in no other statistic but the
//              denominators; finite elements are the float64 sums' terms
// Per block of q's grid (sim/block_scales.hpp block_grid; [0,0] = one block),
// amax_bits = max over its elements of |v|'s bit pattern (NaN patterns win):
//   zero block   amax 0 (every element +-0): neither floor nor ceiling
//   NaN block    amax NaN: neither
//   floor        otherwise, the block's scale code decodes to at most the scale
//                format's smallest positive value (e8m0 2^-127; ue4m3 / e4m3
//                2^-9, or 0 when the scale underflowed; emulate fp4tk with e8m0:
//                fp4-trainkit's eps 2^-23): the scale cannot go lower
//   ceiling      otherwise, the scale code decodes to the format's largest finite value
//                (e8m0 2^127; ue4m3 448)
//   Float32 scales (per-tensor FP8) have no codes: floor and ceiling are not
//   reported (null).
// Tensor figures:
//   amax        max |v| over non-NaN elements (the quantizer input's)
//   flushed     flushed / nonzero (0 when no nonzero element)
//   saturated   saturated / elements; inexact: inexact / elements
//   scale_floor floor blocks / blocks; scale_ceil: ceiling blocks / blocks;
//   zero_blocks zero blocks / blocks
//   sqnr_db     10 log10(sum v^2 / sum (v - d)^2) over the finite elements;
//               null when sum (v-d)^2 is 0 (exact) or no element is finite
//   mean_error  sum (d - v) / finite, for SR operands only (round rs): the
//               bias stochastic rounding should not have; null otherwise
// The float64 sums are in a fixed order, the same on both backends, chosen so
// that a GPU sums with every SM busy and no serial pass over rows: element i of
// t (row-major flat index) belongs to LANE i mod kNumericsLanes; each lane sums
// its elements in increasing i, from 0 (products in float64, no FMA
// contraction: -ffp-contract=off, --fmad=false); the lane sums are then added
// by the pairwise tree of numerics_tree_sum() (adjacent pairs: lane 2j + 1
// into 2j, then 4j + 2 into 4j, ...). CPU and CUDA therefore agree bit for bit
// on the counts AND on the sums (hence on sqnr_db and mean_error).
// Operands without a quantizer (FP32, or BF16 rounding) report amax (of the
// operand's source after any pre/RHT) and "quantizer": null, nothing else.
// A layer called more than once in a step (several forwards of one layer)
// adds its counts and sums in call order; amax is the maximum.
// All six operands are measured from the forward's x and W and the backward's
// dy: fwd_x, fwd_w, dgrad_w, wgrad_x at the forward (x and W are the same at
// the backward), dgrad_grad_y, wgrad_grad_y at the backward. Evaluation
// forwards are never measured. Data parallel: rank 0's shard only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/hd.hpp"
#include "core/tensor.hpp"
#include "recipes/linear_plan.hpp"
#include "sim/element_stats.hpp"
#include "sim/quantizer.hpp"

namespace fp4lab::train {

// ---- the per-element and per-block rules (host and device) --------------------------------------
inline constexpr uint8_t kScaleFloor = 1, kScaleCeil = 2;
inline constexpr int64_t kNumericsLanes = 131072;  // lanes of the float64 sums (a power of two)
inline constexpr int64_t kNumericsLaneGroup = 256;  // lanes per CUDA thread block: the tree's first 8 levels

// The tree of the float64 sums: s[0] + s[1] -> s[0], s[2] + s[3] -> s[2], ...,
// then s[0] + s[2] -> s[0], s[4] + s[6] -> s[4], ..., until s[0] holds the
// total (n a power of two; s is overwritten). Adjacent pairs make the first
// log2(kNumericsLaneGroup) levels local to one CUDA block.
FP4LAB_HD inline double numerics_tree_sum(double* s, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t j = 0; j + h < n; j += 2 * h) s[j] = s[j] + s[j + h];
  return n > 0 ? s[0] : 0.0;
}

// |v|'s bit pattern (the block amax is the max of these: NaN patterns win).
FP4LAB_HD inline uint32_t abs_bits(uint32_t bits) { return bits & 0x7FFFFFFFu; }

// kScaleFloor / kScaleCeil / 0 of a block by its amax bits and scale code;
// `table[code]` is scale_class_table()'s.
FP4LAB_HD inline uint8_t block_flags(uint32_t amax_bits, uint8_t scale_code, const uint8_t* table) {
  if (amax_bits == 0 || amax_bits > 0x7F800000u) return 0;  // zero block, NaN block
  return table[scale_code];
}

// Per scale code of q.scale: kScaleFloor if it decodes to at most the smallest
// positive value of the format (0 included; under emulate fp4tk with e8m0
// scales fp4-trainkit's own floor 2^-23), kScaleCeil if to the largest finite
// value, else 0.
std::array<uint8_t, 256> scale_class_table(const QuantizerSpec& q);

// ---- the figures of one operand -----------------------------------------------------------------
struct NumericsCounts {
  bool quantized = false;    // false: only elements, nan and amax_bits are set
  bool scale_codes = false;  // the scale format has codes (floor / ceiling meaningful)
  bool sr = false;           // round rs: mean_error reported
  int64_t elements = 0, nan = 0, nonzero = 0, flushed = 0, saturated = 0, inexact = 0, finite = 0;
  int64_t blocks = 0, zero_blocks = 0, floor_blocks = 0, ceil_blocks = 0;
  uint32_t amax_bits = 0;                     // max |v| bits over non-NaN v
  double sum_x2 = 0, sum_err2 = 0, sum_err = 0;  // over finite elements: v^2, (v - d)^2, d - v

  double amax() const;
  double sqnr_db() const;  // NaN when not defined (exact, or no finite element)
  bool operator==(const NumericsCounts&) const = default;
};
// Adds b's counts and sums to a (a layer measured twice in a step).
void merge(NumericsCounts& a, const NumericsCounts& b);

// From the quantizer input t (in q's domain: after q's own RHT) and q's output:
// dequant and codes [rows * cols] row-major, scale_codes [grid] (null for
// float32 scales).
NumericsCounts numerics_of(const QuantizerSpec& q, MatrixView<const float> t, const float* dequant,
                           const uint8_t* codes, const uint8_t* scale_codes);
// The same from a QuantizedTensor and its input x (before q's RHT; as quant_stats).
NumericsCounts numerics_of(const QuantizedTensor& qt, MatrixView<const float> x);
// amax and NaN count only (operands without a quantizer).
NumericsCounts amax_only(MatrixView<const float> t);
// The CPU measurement of an operand: src (its source tensor) through p's pre
// and RHT, then quantize(*p.quantizer) (amax_only without a quantizer).
NumericsCounts operand_numerics(const OperandPlan& p, MatrixView<const float> src);

// The JSON line of numerics.jsonl (one object, keys in docs/DESIGN.md, "Numerics statistics").
std::string numerics_line(int64_t step, uint64_t layer_id, const std::string& layer, Operand op,
                          const QuantizerSpec* q, const NumericsCounts& c);

// ---- the recorder of a training step --------------------------------------------------------------
// A training step that measures sets one (NumericsScope) on its thread; the
// linear layers ask numerics_recorder() and measure only when it is set
// (off-steps: one thread-local load per layer call).
class NumericsRecorder {
 public:
  explicit NumericsRecorder(int64_t step) : step_(step) {}
  void add(const LinearContext& ctx, const OperandPlan& p, const NumericsCounts& c);
  // The same with counts still in flight (a device measurement): `counts` is
  // called by lines(), in the order of the add_later calls, so that a
  // measuring step never waits for its statistics until it ends.
  void add_later(const LinearContext& ctx, const OperandPlan& p, std::function<NumericsCounts()> counts);
  // numerics_line()s ordered by (layer id, operand), pending counts read first.
  std::vector<std::string> lines();
  size_t size() const { return entries_.size() + pending_.size(); }
  int64_t step() const { return step_; }

 private:
  struct Entry {
    uint64_t layer_id;
    std::string layer;
    Operand op;
    bool has_q;
    QuantizerSpec q;
    NumericsCounts c;
  };
  void add_entry(Entry e);
  int64_t step_;
  std::vector<Entry> entries_;
  std::vector<std::pair<Entry, std::function<NumericsCounts()>>> pending_;
};
NumericsRecorder* numerics_recorder();
class NumericsScope {
 public:
  explicit NumericsScope(NumericsRecorder* r);
  ~NumericsScope();
  NumericsScope(const NumericsScope&) = delete;
  NumericsScope& operator=(const NumericsScope&) = delete;

 private:
  NumericsRecorder* prev_;
};

// The statistic names `fp4lab inspect --stat` takes, and their one-line meanings.
const std::vector<std::pair<std::string, std::string>>& numerics_stat_names();

}  // namespace fp4lab::train
