// The element-wise parameter casts on the GPU (element_cast.hpp).
#include "cuda/element_cast.hpp"

#include <algorithm>
#include <string>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "cuda/amax_device.cuh"
#include "cuda/shard_cast.hpp"
#include "sim/element_layout.hpp"
#include "sim/scale_rules.hpp"

namespace fp4lab::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

// max |x| bit pattern over x[lo, hi) into *amax (a warp's maximum, one atomicMax a warp: order-independent).
__global__ void tensor_amax_kernel(const float* x, int64_t lo, int64_t hi, uint32_t* amax) {
  uint32_t m = 0;
  for (int64_t i = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x)
    m = umax(m, abs_bits(x[i]));
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if ((threadIdx.x & 31) == 0 && m) atomicMax(amax, m);
}

// One thread a tensor: sim's tensor_amax_scale of the reduced maximum (E4M3's largest finite, 448).
__global__ void tensor_scale_kernel(const uint32_t* amax, int64_t n, float elem_max, float* encode, float* decode) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const TensorScale s = tensor_amax_scale(bits_float(amax[t]), elem_max);
  encode[t] = s.encode;
  decode[t] = s.decode;
}

// Elements [lo, hi) of a tensor at x into its codes (code index i of the tensor at codes).
__global__ void cast_bf16_kernel(const float* x, int64_t lo, int64_t hi, uint16_t* codes) {
  for (int64_t i = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x)
    codes[i] = uint16_t(encode_rn_f32<bfloat16>(x[i], Overflow::nonsaturate));
}
__global__ void cast_fp8_kernel(const float* x, int64_t lo, int64_t hi, const float* encode, uint8_t* codes) {
  const float e = *encode;
  for (int64_t i = lo + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < hi; i += int64_t(gridDim.x) * blockDim.x)
    codes[i] = uint8_t(encode_rn_f32<float8_e4m3fn>(x[i] * e, Overflow::saturate));
}

// A tensor's n codes back into its values at x.
__global__ void decode_bf16_kernel(const uint16_t* codes, int64_t n, float* x) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = decode_f32<bfloat16>(codes[i]);
}
__global__ void decode_fp8_kernel(const uint8_t* codes, int64_t n, const float* decode_scale, float* x) {
  const float d = *decode_scale;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = decode_f32<float8_e4m3fn>(codes[i]) * d;
}

}  // namespace

DeviceElementCast::DeviceElementCast(std::span<const FlatTensor> tensors, bool fp8)
    : tensors_(tensors.begin(), tensors.end()),
      code_at_(element_code_at(tensors_)),
      fp8_(fp8),
      code_bytes_(fp8 ? 1 : 2),
      packed_(element_bytes(tensors, fp8 ? 1 : 2), "element cast") {
  if (fp8_) {
    amax_.resize(tensors_.size());
    encode_.resize(tensors_.size());
    decode_.resize(tensors_.size());
  }
}

void DeviceElementCast::partial_amax(const float* flat, ShardRange shard) {
  if (!fp8_ || tensors_.empty()) return;
  check(cudaMemset(amax_.data(), 0, amax_.bytes()), "element cast: amax memset");
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const ShardRange p = tensor_part(tensors_[t], shard);
    if (p.begin >= p.end) continue;
    tensor_amax_kernel<<<blocks_for(p.end - p.begin), kThreads>>>(flat + tensors_[t].offset, p.begin, p.end,
                                                                  amax_.data() + t);
    check_launch("tensor_amax_kernel");
  }
  check(cudaDeviceSynchronize(), "element cast: partial amax");
}

void DeviceElementCast::compute_scales() {
  if (!fp8_ || tensors_.empty()) return;
  const int64_t n = int64_t(tensors_.size());
  tensor_scale_kernel<<<blocks_for(n), kThreads>>>(amax_.data(), n, max_finite(float8_e4m3fn), encode_.data(),
                                                   decode_.data());
  check_launch("tensor_scale_kernel");
}

std::vector<float> DeviceElementCast::decode_scales() const { return fp8_ ? decode_.download() : std::vector<float>{}; }

ShardRange DeviceElementCast::byte_span(ShardRange shard) const {
  return element_byte_span(tensors_, code_at_, code_bytes_, shard);
}

void DeviceElementCast::cast(const float* flat, ShardRange shard) {
  uint8_t* packed = packed_.need("cast");
  if (packed_.bytes() > 0) check(cudaMemset(packed, 0, size_t(packed_.bytes())), "element cast: packed memset");
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const ShardRange p = tensor_part(tensors_[t], shard);
    if (p.begin >= p.end) continue;
    const float* x = flat + tensors_[t].offset;
    uint8_t* codes = packed + code_at_[t] * code_bytes_;
    if (fp8_)
      cast_fp8_kernel<<<blocks_for(p.end - p.begin), kThreads>>>(x, p.begin, p.end, encode_.data() + t, codes);
    else
      cast_bf16_kernel<<<blocks_for(p.end - p.begin), kThreads>>>(x, p.begin, p.end,
                                                                  reinterpret_cast<uint16_t*>(codes));
    check_launch(fp8_ ? "cast_fp8_kernel" : "cast_bf16_kernel");
  }
  span_ = byte_span(shard);
  check(cudaDeviceSynchronize(), "element cast: cast");
}

ShardBytes DeviceElementCast::span() const {
  ShardBytes s;
  if (span_.end <= span_.begin) return s;
  s.first_byte = span_.begin;
  s.bytes.resize(size_t(span_.end - span_.begin));
  check(cudaMemcpy(s.bytes.data(), packed_.need("span") + span_.begin, s.bytes.size(), cudaMemcpyDeviceToHost),
        "element cast: span download");
  return s;
}

void DeviceElementCast::set_packed(const std::vector<uint8_t>& full) { packed_.upload(full); }

void DeviceElementCast::or_windows(std::span<const uint8_t> windows, const PackedWindows& w) {
  or_windows_device(packed_.need("or_windows"), packed_.bytes(), windows, w, window_at_);
}

void DeviceElementCast::dequantize(float* flat) const {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const int64_t n = tensors_[t].rows * tensors_[t].cols;
    if (n == 0) continue;
    const uint8_t* codes = packed_.need("dequantize") + code_at_[t] * code_bytes_;
    float* x = flat + tensors_[t].offset;
    if (fp8_)
      decode_fp8_kernel<<<blocks_for(n), kThreads>>>(codes, n, decode_.data() + t, x);
    else
      decode_bf16_kernel<<<blocks_for(n), kThreads>>>(reinterpret_cast<const uint16_t*>(codes), n, x);
    check_launch(fp8_ ? "decode_fp8_kernel" : "decode_bf16_kernel");
  }
  check(cudaDeviceSynchronize(), "element cast: dequantize");
}

}  // namespace fp4lab::cuda
