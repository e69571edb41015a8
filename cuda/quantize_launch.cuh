// The launchers of the row- and column-block kernels, one per (input type,
// block size, kind, RHT), declared here for the dispatch (quantize_rows.cu,
// quantize_cols.cu). Their definitions are templates in quantize_rows.cuh /
// quantize_cols.cuh, explicitly instantiated in cuda/inst/*.cu, a bounded set
// of kernels per translation unit: cicc and ptxas time grows with the kernels
// of a unit, and one unit holding every column kernel took ~10 minutes.
// A launcher the dispatch names that no instantiation file provides is a link
// error.
//
// Grouping rule of inst/: every file that instantiates a compile-time kind
// (any but KernelKind::runtime) also holds kernels of other element or scale formats (the runtime
// kind, or another kind), so that the out-of-line block_params_rt /
// encode_element_rt are called with different formats within the unit: alone,
// one kind lets cicc specialise their interface to its constant formats, which
// changes the PTX (not the values) of that kind's kernels.
#pragma once

#include <cuda_runtime.h>

#include "cuda/quantize_plan.hpp"

namespace fp4lab::cuda::qk {

struct KParams;

// Row blocks [1,BC] (BC 16 or 32), kind K (0 runtime formats; 1-4 the
// compile-time kinds, quantize_kernels.cuh), RHT of each block (BC 16).
template <class In, int BC, KernelKind K, bool RHT>
void rows_launch(const KParams& p, cudaStream_t st);
// The RHT amax pass of [1,16] blocks: the transformed tensor's amax into *p.gamax.
template <class In>
void rows_amax_launch(const KParams& p, cudaStream_t st);

// Column blocks [BR,1] (BR 16 or 32), kind K, RHT down each column (BR 16).
template <class In, int BR, KernelKind K, bool RHT>
void cols_launch(const KParams& p, cudaStream_t st);
// The RHT amax pass of [16,1] blocks.
template <class In>
void cols_amax_launch(const KParams& p, cudaStream_t st);

}  // namespace fp4lab::cuda::qk
