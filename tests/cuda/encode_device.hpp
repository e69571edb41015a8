// Device evaluations of core/encode.hpp's FP4LAB_HD encoders, for tests that
// compare the GPU's form of a codec with the host's (encode_device.cu).
#pragma once

#include <cstdint>
#include <vector>

namespace fp4lab::test {

// out[i] = min(e2m1_rs_magnitude<8>(a[i], r[i]), 7) evaluated on the GPU.
std::vector<uint32_t> e2m1_rs8_magnitudes_on_gpu(const std::vector<uint32_t>& a, const std::vector<uint32_t>& r);

// out[i] = bits of core/ptx_approx.hpp's rcp_approx_ftz(bits_float(x[i])) on the GPU (the instruction).
std::vector<uint32_t> rcp_approx_ftz_on_gpu(const std::vector<uint32_t>& x);
// out[i] = bits of div_approx_ftz(a[i], b[i]) (full: div_full) on the GPU (the instructions).
std::vector<uint32_t> div_on_gpu(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, bool full);

}  // namespace fp4lab::test
