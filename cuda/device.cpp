#include "cuda/device.hpp"

#include <algorithm>
#include <cstdio>

namespace fp4lab::cuda {

bool environment_cuda_error(cudaError_t e) {
  return e == cudaErrorMemoryAllocation || e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
         e == cudaErrorDevicesUnavailable || e == cudaErrorInitializationError || e == cudaErrorSystemNotReady ||
         e == cudaErrorSystemDriverMismatch || e == cudaErrorCompatNotSupportedOnDevice ||
         e == cudaErrorUnsupportedPtxVersion || e == cudaErrorNoKernelImageForDevice;
}

namespace {

[[noreturn]] void cuda_failed(cudaError_t e, const std::string& what, const std::source_location& at) {
  const std::string where = std::string(source_path(at.file_name())) + ":" + std::to_string(at.line());
  if (e == cudaErrorMemoryAllocation)
    throw EnvironmentError("out of GPU memory in " + what + " (" + where + "); a smaller batch_size or model fits");
  if (environment_cuda_error(e)) throw EnvironmentError("CUDA error in " + what + ": " + cudaGetErrorString(e));
  throw InternalError("internal error at " + where + ": CUDA error in " + what + ": " + cudaGetErrorString(e) +
                      "; please report it");
}

}  // namespace

void check(cudaError_t e, const char* what, std::source_location at) {
  if (e != cudaSuccess) cuda_failed(e, what, at);
}

void check_launch(const char* kernel_name, std::source_location at) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) cuda_failed(e, std::string("the launch of ") + kernel_name, at);
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

int compute_capability() {
  // Two attribute queries, not cudaGetDeviceProperties (which fills the whole
  // struct and is slow): GEMM dispatch asks on every call.
  int dev = 0, major = 0, minor = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute");
  return major * 10 + minor;
}

std::string device_description() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %d SMs, %.1f GiB, L2 %d MiB", p.name, p.major, p.minor,
                p.multiProcessorCount, double(p.totalGlobalMem) / (1024.0 * 1024 * 1024), p.l2CacheSize >> 20);
  return buf;
}

double dense_bf16_peak_tflops() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  const std::string name = p.name;
  const auto has = [&name](const char* s) { return name.find(s) != std::string::npos; };
  // Datasheet figures are quoted "with sparsity" (2x): halved here.
  if (has("H100 NVL") || has("H200 NVL")) return 835.5;
  if (has("H100") && (has("PCIe") || has("PCIE"))) return 756.0;
  if (has("H100") || has("H200")) return 989.4;  // SXM; GH200 names contain "H200"
  if (has("B200")) return 2250.0;
  if (has("A100")) return 312.0;
  return 0.0;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace fp4lab::cuda
