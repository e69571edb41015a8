// The FP32 GEMM of the CPU reference, c = a * b, on fixed output tiles:
// accumulation model "fp32_eigen" (sim/gemm.hpp).
//
// The output is cut into tiles of kGemmRowBlock rows x kGemmColBlock columns;
// OpenMP runs the tiles in parallel and each tile is one single-threaded Eigen
// product (inside an OpenMP region Eigen spawns no threads) over the whole
// reduction dimension. So each output element's summation order depends only
// on the problem shape, the fixed tiling, Eigen's version and SIMD width,
// never on the thread count. Large tiles keep Eigen's operand packing
// (O(k (m + n)) per tile) small next to the O(2 m n k) flops. Compiled
// without FMA contraction (-ffp-contract=off): every product is rounded to
// FP32 before it is added.
//
// a [m, k] and b [k, n] are Eigen expressions (matrices, maps, transposes);
// c is resized to [m, n] (zeros when k == 0).
#pragma once

#include <algorithm>
#include <cstdint>

#include <Eigen/Core>

namespace fp4lab {

inline constexpr int64_t kGemmRowBlock = 64;   // output rows of one tile
inline constexpr int64_t kGemmColBlock = 256;  // output columns of one tile

template <class C, class A, class B>
void gemm_tiled(C& c, const A& a, const B& b) {
  const int64_t m = a.rows(), n = b.cols();
  c.resize(m, n);
  if (m == 0 || n == 0) return;
  if (a.cols() == 0) {
    c.setZero();
    return;
  }
  const int64_t tm = (m + kGemmRowBlock - 1) / kGemmRowBlock;
  const int64_t tn = (n + kGemmColBlock - 1) / kGemmColBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < tm * tn; ++t) {
    const int64_t r0 = (t / tn) * kGemmRowBlock, c0 = (t % tn) * kGemmColBlock;
    const int64_t nr = std::min(kGemmRowBlock, m - r0), nc = std::min(kGemmColBlock, n - c0);
    c.block(r0, c0, nr, nc).noalias() = a.middleRows(r0, nr) * b.middleCols(c0, nc);
  }
}

}  // namespace fp4lab
