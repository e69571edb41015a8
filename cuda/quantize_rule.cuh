// The generic CUDA pipeline on a block rule (sim/block_rule.hpp), private to cuda/ and schemes/: three
// kernels (block and outer amax, each block's choice, the elements), any block shape, any rule, every
// QuantOutputs form; one thread per block in the scale pass, one per pair of columns in the element pass.
// quantize_device runs it for Family::generic plans, under the rule with_block_rule picks. The fused
// families (cuda/quantize_plan.hpp) take the standard rule only (BlockRuleTraits::fused).
//
// Defined in cuda/quantize_rule_kernels.cuh and instantiated once per rule, each in its own unit (the bounded-unit
// rule of cuda/quantize_launch.cuh): StandardRule in cuda/inst/rule_standard.cu, the others in
// schemes/<name>/kernel.cu.
#pragma once

#include <cstdint>

#include "cuda/quantize.hpp"
#include "cuda/quantize_params.cuh"
#include "sim/block_scales.hpp"
#include "sim/block_rules.hpp"

namespace fp4lab::cuda::qk {

// p: make_params' kernel parameters of the call (x already staged where it must be 16-byte aligned: a one-block
// tensor's amax is tensor_amax_device's); rp: the rule's parameters. Workspace: ws.amax [1 + nblocks + outer
// rows] (left dirty: ws.amax_armed false), ws.mult and ws.scale [nblocks].
template <class R>
void run_rule(KParams& p, const typename R::Params& rp, const BlockGrid& grid, InputType type, QuantWorkspace& ws,
              cudaStream_t stream);

extern template void run_rule<StandardRule>(KParams&, const StandardRule::Params&, const BlockGrid&, InputType,
                                            QuantWorkspace&, cudaStream_t);
extern template void run_rule<Fp4tkRule>(KParams&, const Fp4tkRule::Params&, const BlockGrid&, InputType,
                                         QuantWorkspace&, cudaStream_t);
extern template void run_rule<TeFastMathRule>(KParams&, const TeFastMathRule::Params&, const BlockGrid&, InputType,
                                              QuantWorkspace&, cudaStream_t);
extern template void run_rule<Quartet2Rule>(KParams&, const Quartet2Rule::Params&, const BlockGrid&, InputType,
                                            QuantWorkspace&, cudaStream_t);
extern template void run_rule<TeFusedFastMathRule>(KParams&, const TeFusedFastMathRule::Params&, const BlockGrid&,
                                                   InputType, QuantWorkspace&, cudaStream_t);
extern template void run_rule<Tetrajet2Rule>(KParams&, const Tetrajet2Rule::Params&, const BlockGrid&, InputType,
                                             QuantWorkspace&, cudaStream_t);
extern template void run_rule<Quartet2TritonRule>(KParams&, const Quartet2TritonRule::Params&, const BlockGrid&,
                                                  InputType, QuantWorkspace&, cudaStream_t);
extern template void run_rule<Quartet2EdenTritonRule>(KParams&, const Quartet2EdenTritonRule::Params&, const BlockGrid&,
                                                      InputType, QuantWorkspace&, cudaStream_t);
extern template void run_rule<TeReferenceRule>(KParams&, const TeReferenceRule::Params&, const BlockGrid&, InputType,
                                               QuantWorkspace&, cudaStream_t);
extern template void run_rule<TeNvfp4Rule>(KParams&, const TeNvfp4Rule::Params&, const BlockGrid&, InputType,
                                           QuantWorkspace&, cudaStream_t);

}  // namespace fp4lab::cuda::qk
