// The CUDA trainer tests' device tensors: train::Tensor over cudaMalloc'ed
// memory (freed with the last reference), uploads and downloads, and the
// allocator CudaLinear's calls take. Synchronous copies (cudaMemcpy).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/device.hpp"
#include "train/backend.hpp"

namespace fp4lab::test {

// An owned [rows, cols] device tensor (contents unspecified; at least one float allocated).
inline train::Tensor dev_tensor(int64_t rows, int64_t cols) {
  float* p = nullptr;
  cuda::check(cudaMalloc(&p, size_t(std::max<int64_t>(1, rows * cols)) * sizeof(float)), "test cudaMalloc");
  train::Tensor t;
  t.data = p;
  t.rows = rows;
  t.cols = cols;
  t.mem = std::shared_ptr<float[]>(p, [](float* q) { cudaFree(q); });
  return t;
}
// A device tensor holding h (h.size() == rows * cols).
inline train::Tensor dev_upload(const std::vector<float>& h, int64_t rows, int64_t cols) {
  train::Tensor t = dev_tensor(rows, cols);
  if (!h.empty()) cuda::check(cudaMemcpy(t.data, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), "H2D");
  return t;
}
// n floats at device pointer p.
inline std::vector<float> dev_download(const float* p, int64_t n) {
  std::vector<float> h(static_cast<size_t>(n));
  if (n > 0) cuda::check(cudaMemcpy(h.data(), p, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost), "D2H");
  return h;
}
inline const std::function<train::Tensor(int64_t, int64_t)> kAlloc = [](int64_t r, int64_t c) { return dev_tensor(r, c); };

}  // namespace fp4lab::test
