// Device evaluations of core/encode.hpp's encoders (encode_device.hpp).
#include "cuda/encode_device.hpp"

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/ptx_approx.hpp"
#include "cuda/device.hpp"

namespace fp4lab::test {
namespace {

__global__ void e2m1_rs8_kernel(const uint32_t* a, const uint32_t* r, uint32_t* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint32_t m = e2m1_rs_magnitude<8>(a[i], r[i]);
  out[i] = m < 7u ? m : 7u;
}

__global__ void rcp_kernel(const uint32_t* x, uint32_t* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = float_bits(rcp_approx_ftz(bits_float(x[i])));
}

__global__ void div_kernel(const uint32_t* a, const uint32_t* b, uint32_t* out, int64_t n, bool full) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = float_bits(full ? div_full(bits_float(a[i]), bits_float(b[i]))
                             : div_approx_ftz(bits_float(a[i]), bits_float(b[i])));
}

}  // namespace

std::vector<uint32_t> div_on_gpu(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, bool full) {
  cuda::DeviceBuffer<uint32_t> da, db, dout(a.size());
  da.upload(a);
  db.upload(b);
  const int64_t n = int64_t(a.size());
  if (n > 0) {
    div_kernel<<<unsigned((n + 255) / 256), 256>>>(da.data(), db.data(), dout.data(), n, full);
    cuda::check_launch("div_kernel");
  }
  cuda::check(cudaDeviceSynchronize(), "div_kernel");
  return dout.download();
}

std::vector<uint32_t> rcp_approx_ftz_on_gpu(const std::vector<uint32_t>& x) {
  cuda::DeviceBuffer<uint32_t> dx, dout(x.size());
  dx.upload(x);
  const int64_t n = int64_t(x.size());
  if (n > 0) {
    rcp_kernel<<<unsigned((n + 255) / 256), 256>>>(dx.data(), dout.data(), n);
    cuda::check_launch("rcp_kernel");
  }
  cuda::check(cudaDeviceSynchronize(), "rcp_kernel");
  return dout.download();
}

std::vector<uint32_t> e2m1_rs8_magnitudes_on_gpu(const std::vector<uint32_t>& a, const std::vector<uint32_t>& r) {
  cuda::DeviceBuffer<uint32_t> da, dr, dout(a.size());
  da.upload(a);
  dr.upload(r);
  const int64_t n = int64_t(a.size());
  if (n > 0) {
    e2m1_rs8_kernel<<<unsigned((n + 255) / 256), 256>>>(da.data(), dr.data(), dout.data(), n);
    cuda::check_launch("e2m1_rs8_kernel");
  }
  cuda::check(cudaDeviceSynchronize(), "e2m1_rs8_kernel");
  return dout.download();
}

}  // namespace fp4lab::test
