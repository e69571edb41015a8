// FP4LAB_HD marks functions callable from host and device code.
// Under nvcc it expands to `__host__ __device__`; elsewhere to nothing, so the
// same scalar codecs serve the CPU reference and the CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define FP4LAB_HD __host__ __device__
#else
#define FP4LAB_HD
#endif
