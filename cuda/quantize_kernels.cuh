// Device building blocks shared by the quantization kernels (quantize*.cu,
// quantize_rows.cuh, quantize_cols.cuh), private to cuda/. Every numeric step
// calls the same FP4LAB_HD functions as sim/quantizer.cpp (core's
// encode()/encode_rn_f32()/decode()/random_bits(), sim/scale_rules.hpp,
// sim/rht.hpp); nothing here is a second implementation. The parts:
//   quantize_params.cuh  KParams, kinds, fast forms, host-side form predicates
//   quantize_amax.cuh    tensor-amax passes, register amax, RHT of strips
//   quantize_io.cuh      loads and stores
//   quantize_encode.cuh  block parameters, element encoding, outputs
//   quantize_fast.cuh    the fast rn / SR forms
#pragma once

#include "cuda/quantize_amax.cuh"
#include "cuda/quantize_encode.cuh"
#include "cuda/quantize_fast.cuh"
#include "cuda/quantize_io.cuh"
#include "cuda/quantize_params.cuh"
