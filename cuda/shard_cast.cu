// The NVFP4 primary-weight cast on the GPU (shard_cast.hpp).
#include "cuda/shard_cast.hpp"

#include <algorithm>
#include <string>

#include "core/bits.hpp"
#include "core/encode.hpp"
#include "core/format.hpp"
#include "cuda/amax_device.cuh"
#include "cuda/packing.hpp"

namespace fp4lab::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kTile = 16;

unsigned blocks_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

// Packed bytes a row, and 16x16 tiles across a row, of a tensor of `cols` columns.
int64_t row_bytes(int64_t cols) { return (cols + 1) / 2; }
int64_t tiles_across(int64_t cols) { return (cols + kTile - 1) / kTile; }

// Tensor-local elements [lo, hi) of a [rows, cols] tensor at x: maxima into
// its tiles (ntc tiles a row of tiles) and into *tensor_amax. Work unit: one
// column of one 16-column tile segment, over the 16 rows of its band (the
// lanes of a half-warp take the 16 columns of one tile: coalesced loads); the
// half-warp's maxima meet by shuffles and one lane does the tile's atomicMax
// (integer maxima: the order of the atomics does not matter). Units run over
// the row bands that [lo, hi) touches only.
__global__ void partial_amax_kernel(const float* x, int64_t lo, int64_t hi, int64_t cols, int64_t ntc, int64_t band0,
                                    int64_t nbands, uint32_t* tile_amax, uint32_t* tensor_amax) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t units = nbands * ntc * kTile;  // a multiple of 16: whole half-warps
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  uint32_t tmax = 0;
  // Warp-uniform loop (every lane takes part in the shuffles).
  for (int64_t base = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) & ~int64_t(31); base < units; base += stride) {
    const int64_t u = base + lane;
    uint32_t m = 0;
    int64_t band = 0, seg = 0;
    if (u < units) {
      band = band0 + u / (ntc * kTile);
      seg = (u / kTile) % ntc;
      const int64_t c = seg * kTile + u % kTile;
      if (c < cols) {
        for (int64_t r = band * kTile; r < band * kTile + kTile; ++r) {
          const int64_t i = r * cols + c;
          if (i >= lo && i < hi) m = umax(m, abs_bits(x[i]));
        }
      }
    }
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) m = umax(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    if (u < units && (lane & 15) == 0 && m) atomicMax(&tile_amax[band * ntc + seg], m);
    tmax = umax(tmax, m);
  }
  tmax = __reduce_max_sync(0xFFFFFFFFu, tmax);
  if (lane == 0 && tmax) atomicMax(tensor_amax, tmax);
}

// Packed bytes [b0, b1) of a tensor (rb bytes a row): each byte's owned
// columns (tensor-local element index in [lo, hi)) encoded, the rest 0.
__global__ void cast_kernel(const float* x, int64_t lo, int64_t hi, int64_t cols, int64_t rb, int64_t ntc,
                            const float* tile_mult, int64_t b0, int64_t b1, uint8_t* packed) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = b0 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < b1; b += stride) {
    const int64_t r = b / rb, j = b - r * rb;
    uint32_t byte = 0;
    for (int h = 0; h < 2; ++h) {
      const int64_t c = 2 * j + h, i = r * cols + c;
      if (c >= cols || i < lo || i >= hi) continue;
      const float mult = tile_mult[(r / kTile) * ntc + c / kTile];
      byte |= (encode_rn_f32<float4_e2m1fn>(x[i] * mult, Overflow::saturate) & 0xFu) << (4 * h);
    }
    packed[b] = uint8_t(byte);
  }
}

// Step 3 for one tensor on the device, sim's shard_scales with the same
// scalar rules (scale_rules.hpp): its g_dec from the tensor amax, and per tile
// (ntiles of them) the UE4M3 code and the element multiplier.
__global__ void scales_kernel(const uint32_t* tensor_amax, const uint32_t* tile_amax, int64_t ntiles, float scale_max,
                              float elem_max, uint8_t* tile_code, float* tile_mult, float* g_dec) {
  const NvGlobal g = nv_global(bits_float(*tensor_amax), scale_max, elem_max);
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  if (first == 0) *g_dec = g.g_dec;
  for (int64_t k = first; k < ntiles; k += stride) {
    const NvBlockScale b = nv_block_scale<ufloat8_e4m3>(bits_float(tile_amax[k]), g);
    tile_code[k] = uint8_t(b.code);
    tile_mult[k] = b.encode;
  }
}

// The cast tensor [rows, cols] from its packed codes and tile codes: x[i] =
// (decode(code) * decode(tile scale)) * *g_dec where x is non-null, and the
// BF16 bits of decode(code) * decode(tile scale) (exact: cast_operand_device)
// where operand is non-null. One thread per 8 columns of a row (ncg groups a
// row): one tile scale, 4 packed bytes. VEC (cols % 8 == 0 and every pointer
// aligned for it, decode_vec): the 4 bytes in one load, the 8 outputs in 16- /
// 32-byte stores, so that a warp's stores are contiguous; else byte by byte.
constexpr int64_t kGroup = 8;
template <bool VEC>
__global__ void decode_kernel(const uint8_t* packed, int64_t rows, int64_t cols, int64_t rb, int64_t ntc,
                              const uint8_t* tile_code, const float* g_dec, float* x, uint16_t* operand) {
  const int64_t ncg = (cols + kGroup - 1) / kGroup, n = rows * ncg, stride = int64_t(gridDim.x) * blockDim.x;
  const float g = x ? *g_dec : 1.0f;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < n; u += stride) {
    const int64_t r = u / ncg, c0 = (u - r * ncg) * kGroup;
    const float scale = decode_f32<ufloat8_e4m3>(tile_code[(r / kTile) * ntc + c0 / kTile]);
    const uint8_t* row = packed + r * rb;
    const int64_t at = r * cols + c0;
    if constexpr (VEC) {
      const uint32_t codes = *reinterpret_cast<const uint32_t*>(row + c0 / 2);  // column c0 + j: nibble j
      float v[kGroup];
      uint32_t h[kGroup / 2];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) v[j] = decode_f32<float4_e2m1fn>((codes >> (4 * j)) & 0xFu) * scale;
#pragma unroll
      for (int j = 0; j < kGroup / 2; ++j)
        h[j] = encode_rn_f32<bfloat16>(v[2 * j], Overflow::nonsaturate) |
               (encode_rn_f32<bfloat16>(v[2 * j + 1], Overflow::nonsaturate) << 16);
      if (operand) *reinterpret_cast<uint4*>(operand + at) = make_uint4(h[0], h[1], h[2], h[3]);
      if (x) {
        float4* o = reinterpret_cast<float4*>(x + at);
        o[0] = make_float4(v[0] * g, v[1] * g, v[2] * g, v[3] * g);
        o[1] = make_float4(v[4] * g, v[5] * g, v[6] * g, v[7] * g);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const int64_t c = c0 + j;
        if (c >= cols) break;
        const float v = decode_f32<float4_e2m1fn>((row[c / 2] >> (4 * (c & 1))) & 0xFu) * scale;
        if (x) x[at + j] = v * g;
        if (operand) operand[at + j] = uint16_t(encode_rn_f32<bfloat16>(v, Overflow::nonsaturate));
      }
    }
  }
}
bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }
// decode_kernel's launch, the vector form where it applies.
void decode(const uint8_t* packed, int64_t rows, int64_t cols, const uint8_t* tile_code, const float* g_dec, float* x,
            uint16_t* operand, cudaStream_t stream) {
  const int64_t rb = row_bytes(cols), ntc = tiles_across(cols);
  const unsigned blocks = blocks_for(rows * ((cols + kGroup - 1) / kGroup));
  const bool vec = cols % kGroup == 0 && aligned(packed, 4) && aligned(x, 16) && aligned(operand, 16);
  if (vec)
    decode_kernel<true><<<blocks, kThreads, 0, stream>>>(packed, rows, cols, rb, ntc, tile_code, g_dec, x, operand);
  else
    decode_kernel<false><<<blocks, kThreads, 0, stream>>>(packed, rows, cols, rb, ntc, tile_code, g_dec, x, operand);
  check_launch("decode_kernel");
}

// packed[p] |= every window's byte at p (windows of `size` bytes at at[r]):
// one thread a packed byte, so no two threads write one byte.
__global__ void or_windows_kernel(uint8_t* packed, int64_t total, const uint8_t* windows, int64_t size,
                                  const int64_t* at, int64_t n) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += int64_t(gridDim.x) * blockDim.x) {
    uint8_t v = packed[p];
    for (int64_t r = 0; r < n; ++r)
      if (p >= at[r] && p < at[r] + size) v |= windows[r * size + (p - at[r])];
    packed[p] = v;
  }
}

}  // namespace

PackedMemory::PackedMemory(int64_t bytes, const char* what)
    : own_(size_t(bytes)), ptr_(own_.data()), bytes_(bytes), what_(what) {}

void PackedMemory::bind(uint8_t* p) {
  ptr_ = p;
  own_ = DeviceBuffer<uint8_t>();
}

uint8_t* PackedMemory::need(const char* step) const {
  if (ptr_ == nullptr && bytes_ > 0)
    throw Error(std::string(what_) + ": " + step + " with no packed buffer bound (bind_packed)");
  return ptr_;
}

void PackedMemory::upload(const std::vector<uint8_t>& full) {
  if (int64_t(full.size()) != bytes_)
    throw Error(std::string(what_) + ": " + std::to_string(full.size()) + " packed bytes, the tensors need " +
                std::to_string(bytes_));
  if (!full.empty())
    check(cudaMemcpy(need("set_packed"), full.data(), full.size(), cudaMemcpyHostToDevice), "set_packed");
}

DeviceShardCast::DeviceShardCast(std::span<const FlatTensor> tensors)
    : tensors_(tensors.begin(), tensors.end()),
      layout_(flat_layout(tensors)),
      packed_(layout_.packed_offset.back(), "shard cast") {
  const size_t k = size_t(layout_.tile_offset.back());
  amax_.resize(tensors_.size() + k);
  tile_mult_.resize(k);
  tile_code_.resize(k);
  g_dec_.resize(tensors_.size());
}

void DeviceShardCast::partial_amax(const float* flat, ShardRange shard) {
  check(cudaMemset(amax_.data(), 0, amax_.bytes()), "shard cast: amax memset");
  uint32_t* tiles = amax_.data() + tensors_.size();
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const FlatTensor& ft = tensors_[t];
    const ShardRange part = tensor_part(ft, shard);
    const int64_t lo = part.begin, hi = part.end;
    if (lo >= hi) continue;
    const int64_t band0 = lo / ft.cols / kTile, band1 = (hi - 1) / ft.cols / kTile + 1;
    const int64_t ntc = tiles_across(ft.cols);
    partial_amax_kernel<<<blocks_for((band1 - band0) * ntc * kTile), kThreads>>>(
        flat + ft.offset, lo, hi, ft.cols, ntc, band0, band1 - band0, tiles + layout_.tile_offset[t], amax_.data() + t);
    check_launch("partial_amax_kernel");
  }
  check(cudaDeviceSynchronize(), "shard cast: partial amax");
}

void DeviceShardCast::compute_scales() {
  const uint32_t* tiles = amax_.data() + tensors_.size();
  const float scale_max = max_finite(ufloat8_e4m3), elem_max = max_finite(float4_e2m1fn);
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const int64_t k0 = layout_.tile_offset[t], nt = layout_.tile_offset[t + 1] - k0;
    scales_kernel<<<blocks_for(std::max<int64_t>(nt, 1)), kThreads>>>(amax_.data() + t, tiles + k0, nt, scale_max,
                                                                      elem_max, tile_code_.data() + k0,
                                                                      tile_mult_.data() + k0, g_dec_.data() + t);
    check_launch("scales_kernel");
  }
}

ShardScales DeviceShardCast::scales() const {
  ShardScales s;
  s.tile_code = tile_code_.download();
  s.tile_mult = tile_mult_.download();
  s.g_dec = g_dec_.download();
  return s;
}

void DeviceShardCast::cast(const float* flat, ShardRange shard) {
  uint8_t* packed = packed_.need("cast");
  if (packed_.bytes() > 0) check(cudaMemset(packed, 0, size_t(packed_.bytes())), "shard cast: packed memset");
  span_begin_ = span_end_ = 0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const FlatTensor& ft = tensors_[t];
    const ShardRange part = tensor_part(ft, shard);
    const int64_t lo = part.begin, hi = part.end;
    if (lo >= hi) continue;
    const int64_t rb = row_bytes(ft.cols);
    const ShardRange bytes = packed_bytes_of(ft, part);
    const int64_t b0 = bytes.begin, b1 = bytes.end;
    if (span_end_ == 0) span_begin_ = layout_.packed_offset[t] + b0;
    span_end_ = layout_.packed_offset[t] + b1;
    cast_kernel<<<blocks_for(b1 - b0), kThreads>>>(flat + ft.offset, lo, hi, ft.cols, rb, tiles_across(ft.cols),
                                                   tile_mult_.data() + layout_.tile_offset[t], b0, b1,
                                                   packed + layout_.packed_offset[t]);
    check_launch("cast_kernel");
  }
  check(cudaDeviceSynchronize(), "shard cast: cast");
}

ShardBytes DeviceShardCast::span() const {
  ShardBytes s;
  if (span_end_ <= span_begin_) return s;
  s.first_byte = span_begin_;
  s.bytes.resize(size_t(span_end_ - span_begin_));
  check(cudaMemcpy(s.bytes.data(), packed_.need("span") + span_begin_, s.bytes.size(), cudaMemcpyDeviceToHost),
        "shard cast: span download");
  return s;
}

void DeviceShardCast::set_packed(const std::vector<uint8_t>& full) { packed_.upload(full); }

void or_windows_device(uint8_t* packed, int64_t total, std::span<const uint8_t> windows, const PackedWindows& w,
                       DeviceBuffer<int64_t>& at) {
  const int64_t n = int64_t(w.at.size());
  if (windows.size() != size_t(n * w.size))
    throw Error("shard cast: " + std::to_string(windows.size()) + " window bytes for " + std::to_string(n) +
                " windows of " + std::to_string(w.size));
  for (int64_t a : w.at)
    if (a < 0 || a + w.size > total) throw Error("shard cast: a window lies outside the packed buffer");
  if (total == 0 || w.size == 0) return;
  at.upload(w.at);
  or_windows_kernel<<<blocks_for(total), kThreads>>>(packed, total, windows.data(), w.size, at.data(), n);
  check(cudaDeviceSynchronize(), "shard cast: or_windows");
}

void DeviceShardCast::or_windows(std::span<const uint8_t> windows, const PackedWindows& w) {
  or_windows_device(packed_.need("or_windows"), packed_.bytes(), windows, w, window_at_);
}

int64_t DeviceShardCast::packed_bytes_transposed() const {
  int64_t n = 0;
  for (const FlatTensor& t : tensors_) n += t.cols * ((t.rows + 1) / 2);
  return n;
}

void DeviceShardCast::transpose(uint8_t* out) const {
  int64_t at = 0;
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const FlatTensor& ft = tensors_[t];
    if (ft.rows * ft.cols == 0) continue;
    transpose_fp4_packed_device(packed_.need("transpose") + layout_.packed_offset[t], ft.rows, ft.cols, out + at);
    at += ft.cols * ((ft.rows + 1) / 2);
  }
  check(cudaDeviceSynchronize(), "shard cast: transpose");
}

void DeviceShardCast::dequantize(float* flat) const {
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const FlatTensor& ft = tensors_[t];
    if (ft.rows * ft.cols == 0) continue;
    decode(packed_.need("dequantize") + layout_.packed_offset[t], ft.rows, ft.cols, tile_code_.data() + layout_.tile_offset[t],
           g_dec_.data() + t, flat + ft.offset, nullptr, nullptr);
  }
  check(cudaDeviceSynchronize(), "shard cast: dequantize");
}

PackedNvfp4 DeviceShardCast::packed_tensor(size_t t) const {
  if (t >= tensors_.size())
    throw Error("shard cast: tensor " + std::to_string(t) + " of " + std::to_string(tensors_.size()));
  uint8_t* p = packed_.data();
  return PackedNvfp4{p ? p + layout_.packed_offset[t] : nullptr, tile_code_.data() + layout_.tile_offset[t],
                     g_dec_.data() + t};
}

void cast_operand_device(const PackedNvfp4& c, int64_t rows, int64_t cols, uint16_t* out, cudaStream_t stream) {
  if (rows * cols == 0) return;
  if (c.packed == nullptr || c.tile_codes == nullptr || c.g_dec == nullptr)
    throw Error("cast_operand_device: the cast operand is incomplete (null packed codes, tile codes or g_dec)");
  decode(c.packed, rows, cols, c.tile_codes, c.g_dec, nullptr, out, stream);  // g_dec: the GEMM's alpha
}

}  // namespace fp4lab::cuda
