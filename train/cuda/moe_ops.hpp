// Mixture-of-experts routing kernels of the trainer's CUDA backend: the
// device side of Backend::gather_rows_indexed, combine_rows and
// combine_rows_backward (train/backend.hpp states the semantics; the CPU
// backend is the reference). Device pointers; row-major float32; `k` slots per
// token, slot (t, j) at t * k + j. Compiled with --fmad=false, so every product
// and sum is rounded to float as in the CPU's loops: the same bits.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "train/mx_rows.hpp"

namespace fp4lab::cuda::nn {

// out [n, cols] row r = x row idx[r] (idx -1: a row of +0).
void gather_rows_indexed(const float* x, int64_t cols, const int32_t* idx, float* out, int64_t n,
                         cudaStream_t stream = nullptr);
// out [tokens, cols] row t = sum_j (in order, from 0) w[t*k+j] * src row pos[t*k+j] (w null: weight 1; pos -1
// skipped).
void combine_rows(const float* src, int64_t cols, const int32_t* pos, const float* w, int64_t k, float* out,
                  int64_t tokens, cudaStream_t stream = nullptr);
// dsrc row pos[i] = w[i] * dout row i/k; dw[i] = (float) sum_c in order, in
// float64, of dout[i/k, c] * src[pos[i], c] (the CPU's serial order).
// pos -1 (a dropped slot): nothing written, dw 0. all_named false: dsrc's
// src_rows rows are zeroed first (rows no slot names stay +0).
void combine_rows_backward(const float* dout, const float* src, int64_t cols, const int32_t* pos, const float* w,
                           int64_t k, int64_t tokens, float* dsrc, int64_t src_rows, bool all_named, float* dw,
                           cudaStream_t stream = nullptr);

// The compact row codec of the dispatch cast (train/mx_rows.hpp's functions, one thread a block of a row to
// encode, one an element to decode): rows of x [rows, m.cols] into rows * m.row_bytes() bytes at out, and
// back; the CPU's bytes and values bit for bit.
void encode_rows_mx(const train::MxRows& m, const float* x, int64_t rows, uint8_t* out, cudaStream_t stream = nullptr);
void decode_rows_mx(const train::MxRows& m, const uint8_t* in, int64_t rows, float* x, cudaStream_t stream = nullptr);

}  // namespace fp4lab::cuda::nn
