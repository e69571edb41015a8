// The CUDA backend's caching device allocator (train/cuda/backend.cpp's memory: free lists by rounded size;
// a block goes back to its list when the last shared_ptr to it dies). Out of backend.cpp for the house's
// file-size limit; included by backend.cpp alone.
#pragma once

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/device.hpp"

namespace fp4lab::train {

// ---- caching device allocator ---------------------------------------------------

// Sizes are rounded to 512-byte steps up to 1 MiB, above that to eighths of the
// enclosing power of two (at most 12.5% slack), so that slightly different
// requests share free lists.
inline size_t round_bytes(size_t b) {
  if (b <= (size_t(1) << 20)) return std::max<size_t>(512, (b + 511) / 512 * 512);
  size_t p = size_t(1) << 20;
  while (p < b) p <<= 1;
  const size_t step = p / 8;
  return (b + step - 1) / step * step;
}

class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() {
    // At program exit the runtime may already be unloading: errors ignored.
    for (auto& [bytes, list] : free_)
      for (void* p : list) cudaFree(p);
  }

  void* acquire(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= bytes;
        count_in_use(bytes);
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      // Out of memory: hand the cached blocks back to the driver and retry once.
      cudaGetLastError();
      release_cached();
      e = cudaMalloc(&p, bytes);
    }
    if (e != cudaSuccess) fp4lab::cuda::check(e, ("cudaMalloc of " + std::to_string(bytes) + " bytes (cuda backend tensor)").c_str());
    std::lock_guard<std::mutex> lock(mu_);
    reserved_bytes_ += bytes;
    reserved_peak_ = std::max(reserved_peak_, reserved_bytes_);
    count_in_use(bytes);
    return p;
  }
  void release(void* p, size_t bytes) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_bytes_ -= bytes;
    try {
      free_[bytes].push_back(p);
      cached_bytes_ += bytes;
    } catch (...) {
      cudaFree(p);  // bookkeeping failed: give it back rather than leak
      reserved_bytes_ -= bytes;
    }
  }
  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    fp4lab::cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (releasing cached blocks)");
    for (auto& [bytes, list] : free_) {
      for (void* p : list) cudaFree(p);
      list.clear();
    }
    reserved_bytes_ -= cached_bytes_;
    cached_bytes_ = 0;
  }

  // Bytes of this pool's tensors: in use (acquired, not yet released) and
  // reserved (in use + cached, i.e. held from the driver), now and at their
  // peak since the pool was made or reset_peaks().
  struct Bytes {
    size_t in_use = 0, in_use_peak = 0, reserved = 0, reserved_peak = 0;
  };
  Bytes bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return {in_use_bytes_, in_use_peak_, reserved_bytes_, reserved_peak_};
  }
  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mu_);
    in_use_peak_ = in_use_bytes_, reserved_peak_ = reserved_bytes_;
  }

 private:
  void count_in_use(size_t bytes) {  // mu_ held
    in_use_bytes_ += bytes;
    in_use_peak_ = std::max(in_use_peak_, in_use_bytes_);
  }
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
  size_t in_use_bytes_ = 0, in_use_peak_ = 0, reserved_bytes_ = 0, reserved_peak_ = 0;
};

}  // namespace fp4lab::train
