// Device plumbing of the CUDA backend: error checks that throw by core/error.hpp's taxonomy,
// an owning device buffer, GPU presence, and cudaEvent timing.
//
// Host-only header (plain C++; usable from .cpp files that link fp4lab_cuda).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "core/error.hpp"

namespace fp4lab::cuda {

// Unless e is cudaSuccess, throws by the error taxonomy (core/error.hpp), naming <what> and the caller's
// file:line: out of GPU memory, no device, a driver or runtime missing or too old, devices busy:
// EnvironmentError (exit 1); anything else (an illegal address, an invalid argument, a failed launch):
// InternalError (exit 3), since the backend's own checks exist to rule them out.
void check(cudaError_t e, const char* what, std::source_location at = std::source_location::current());
// Checks the last launch error (cudaGetLastError) after a kernel launch, the same way.
void check_launch(const char* kernel_name, std::source_location at = std::source_location::current());
// The taxonomy of one CUDA error (check's): true for the environment's errors.
bool environment_cuda_error(cudaError_t e);

// Number of usable CUDA devices: 0 when the driver or runtime is missing,
// cudaGetDeviceCount fails, or it reports none. Never throws.
int device_count();
inline bool gpu_available() { return device_count() > 0; }
// "NVIDIA H100 80GB HBM3, sm_90, 132 SMs" of the current device.
std::string device_description();
// Compute capability of the current device as major*10+minor (90 for sm_90).
int compute_capability();
// The current device's dense (no sparsity) BF16 tensor-core peak in TFLOP/s,
// from NVIDIA's datasheets by device name: H100 SXM, H200, GH200 989.4; H100 /
// H200 NVL 835.5; H100 PCIe 756; B200 2250; A100 312. 0 for other devices.
// The denominator of `fp4lab bench train`'s MFU.
double dense_bf16_peak_tflops();

// An owning, uninitialised device allocation of n elements of T (cudaMalloc).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }

  // Reallocates (contents lost) when n differs from the current size.
  void resize(size_t n) {
    if (n == n_) return;
    release();
    if (n > 0) check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
    n_ = n;
  }
  // Grown (contents lost) to at least n elements; returns data().
  T* at_least(size_t n) {
    if (n_ < n) resize(n);
    return p_;
  }
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const T* host, size_t n, size_t offset = 0) {
    check(cudaMemcpy(p_ + offset, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  void upload(const std::vector<T>& host) {
    resize(host.size());
    upload(host.data(), host.size());
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) check(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
  // Fills every byte with `byte` (poisoning outputs before a test run).
  void fill_bytes(int byte) {
    if (n_) check(cudaMemset(p_, byte, n_ * sizeof(T)), "cudaMemset");
  }

 private:
  void release() noexcept {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory of n T's (cudaMallocHost): the destination or the
// source of copies that must not block the host (cudaMemcpyAsync with
// pageable memory may). Grown, never shrunk; contents lost on growth.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { release(); }
  T* at_least(size_t n) {
    if (n_ < n) {
      release();
      check(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMallocHost");
      n_ = n;
    }
    return p_;
  }
  T* data() const { return p_; }

 private:
  void release() noexcept {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A cudaEvent_t made without timing (cudaEventDisableTiming), for the host to
// wait on one point of a stream.
class Event {
 public:
  Event() { check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreateWithFlags"); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { cudaEventDestroy(e_); }
  void record(cudaStream_t st) { check(cudaEventRecord(e_, st), "cudaEventRecord"); }
  void wait(const char* what) { check(cudaEventSynchronize(e_), what); }

 private:
  cudaEvent_t e_ = nullptr;
};

// Median time in milliseconds of `repeats` runs of fn() on `stream`, each timed
// with its own pair of cudaEvents, after `warmup` untimed runs.
template <class Fn>
double time_median_ms(Fn&& fn, int warmup, int repeats, cudaStream_t stream = nullptr);

// Medians (ms) of `repeats` interleaved runs of a() and b() on `stream` (a, b,
// a, b, ...; each run timed with its own pair of cudaEvents) after `warmup`
// untimed runs of each: the ratio of the two does not drift with the GPU's
// clock and temperature over a long benchmark, as one reference timed at the
// start would.
template <class A, class B>
std::pair<double, double> time_interleaved_median_ms(A&& a, B&& b, int warmup, int repeats,
                                                     cudaStream_t stream = nullptr);

// Implementation of the two above (templated so any callable works): `repeats`
// rounds, each running every fn once in order, each run timed with its own
// pair of cudaEvents, after `warmup` untimed rounds; the times of fn i in [i].
double median_of(std::vector<double> v);
template <class... Fn>
std::array<std::vector<double>, sizeof...(Fn)> time_rounds_ms(int warmup, int repeats, cudaStream_t stream,
                                                              Fn&&... fn) {
  constexpr size_t n = sizeof...(Fn);
  for (int i = 0; i < warmup; ++i) (fn(), ...);
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<cudaEvent_t> ev(2 * n * size_t(repeats));
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  size_t e = 0;
  auto timed = [&](auto& f) {
    check(cudaEventRecord(ev[e++], stream), "cudaEventRecord");
    f();
    check(cudaEventRecord(ev[e++], stream), "cudaEventRecord");
  };
  for (int i = 0; i < repeats; ++i) (timed(fn), ...);
  check(cudaStreamSynchronize(stream), "timed runs");
  std::array<std::vector<double>, n> ms;
  for (size_t k = 0; k < n; ++k) ms[k].resize(size_t(repeats));
  for (size_t i = 0; i < size_t(repeats); ++i)
    for (size_t k = 0; k < n; ++k) {
      float t = 0;
      check(cudaEventElapsedTime(&t, ev[2 * (i * n + k)], ev[2 * (i * n + k) + 1]), "cudaEventElapsedTime");
      ms[k][i] = t;
    }
  for (auto& x : ev) cudaEventDestroy(x);
  return ms;
}
template <class Fn>
double time_median_ms(Fn&& fn, int warmup, int repeats, cudaStream_t stream) {
  return median_of(std::move(time_rounds_ms(warmup, repeats, stream, fn)[0]));
}
template <class A, class B>
std::pair<double, double> time_interleaved_median_ms(A&& a, B&& b, int warmup, int repeats, cudaStream_t stream) {
  auto ms = time_rounds_ms(warmup, repeats, stream, a, b);
  return {median_of(std::move(ms[0])), median_of(std::move(ms[1]))};
}

}  // namespace fp4lab::cuda
