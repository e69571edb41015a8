// The data-parallel gradient reduction's wire format (issue 46 item; config distributed.reduce, parsed once
// into GradReduce by train/config.cpp parse_grad_reduce):
//
//   fp32  each rank's FP32 gradient goes to Communicator::reduce_scatter_sum (zero 1, zero 3) or allreduce_sum
//         (zero 0): the engine's FP32 sum (threads: rank order; MPI: its fixed order; NCCL: its ring/tree order).
//         The default; bits as before this option existed.
//   bf16  each rank rounds its local gradient to BF16 once, element by element: round to nearest, ties to even,
//         by core's codec (encode_rn_f32<bfloat16>, Overflow::nonsaturate: past BF16's largest finite gives
//         +-Inf; every NaN becomes core's NaN code 0x7FFF, so a NaN stays a NaN; a code is widened exactly,
//         its bits << 16). The rounding sits after the scalings the FP32 path applies before its sum:
//         1/loss_scale, then (more than one rank) the share weight share / batch (the 1/N-style averaging),
//         i.e. a rank rounds exactly the contribution it would otherwise send in FP32. The BF16 codes travel, 2 bytes an element (half the FP32 reduce-scatter's):
//         one Communicator::alltoallv, rank p receiving every rank's codes of shard p, so every engine
//         (threads, MPI, NCCL) has it without a new collective. The receiving rank sums the N contributions of
//         its shard in FP32, in rank order: s = c_0, then s = s + c_r for r = 1 .. N-1 (c_r the exact float of
//         rank r's code; world 1: s = c_0, the rounding alone). The sum is deterministic and independent of
//         the communicator's engine and topology (alltoallv moves bytes exactly, so MPI and NCCL give the
//         thread ranks' bits). A NaN sum is written as 0x7FFF0000 (the NaN code's float), whatever NaN the
//         hardware's adds give, so every backend writes the same bits. The rounding and the sum are the
//         backend's (Backend::round_bf16_codes, sum_bf16_codes: one implementation of each rule,
//         train/bf16_codes.hpp, in the CPU backend's loops and the CUDA backend's kernels); the reduction moves
//         only codes: on the cuda backend with NCCL nothing goes through host memory; with a host communicator
//         (threads, MPI) only the 2-byte codes are staged (downloaded, then the received ones uploaded).
//         Zero 0: the same reduce-scatter to even_shards of the buffer, then the existing FP32 all-gather of
//         the sums (every rank gets the same summed gradient).
//         Against FSDP2 (PyTorch's fully_shard, MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)): FSDP2
//         reduces in the reduce dtype, i.e. NCCL's reduce-scatter sums in BF16 along its ring, rounding every
//         partial sum to BF16. Here the inputs are rounded the same way (once each) and the N - 1 additions
//         are FP32, so this is more accurate (partial sums rounded to FP32, not BF16) and has a fixed order;
//         the bytes on the wire are the same (2 an element, (N-1)/N of the buffer a rank).
//
// Tested: tests/train/dist/test_reduce_bf16.cpp (an independent oracle on 2, 3, 5 thread ranks, one step under
// zero 0, 1, 3; the bytes counted by CountingComm; the config key), test_reduce_bf16_runs.cpp (whole runs: zero 0
// = ZeRO-1 = ZeRO-3 bit for bit), tests/cli/test_train_threads.py (the CLI on threads:2); the backend ops against
// an integer oracle: tests/train/cpu/test_bf16_codes.cpp (cpu) and tests/train/cuda/test_reduce_bf16_cuda.cpp
// (cuda; and reduce_scatter_bf16 on the cuda backend = the cpu backend's, thread ranks and NCCL).
#pragma once

#include <cstdint>
#include <span>

#include "sim/shard_cast.hpp"
#include "train/backend.hpp"

namespace fp4lab {
class Communicator;
}

namespace fp4lab::train {

enum class GradReduce : uint8_t { fp32, bf16 };

// The bf16 reduction above: rank r receives in `mine` (shards[r] elements) the FP32 sum, in rank order, of
// every rank's BF16-rounded `full` over shards[r]. `full` is this rank's whole (scaled) gradient, the same
// length on every rank; `shards` as reduce_scatter_sum's (contiguous, rank order, covering full; any sizes).
// Backend tensors: host memory on the cpu backend, the device's on cuda (the rounding and the sum on the
// device; the codes in device buffers with NCCL, staged through host memory with a host communicator). `mine`
// may alias its part of `full`.
// Collective: one alltoallv of 2-byte rows.
void reduce_scatter_bf16(Communicator& comm, Backend& be, const Tensor& full, std::span<const ShardRange> shards,
                         Tensor& mine);

}  // namespace fp4lab::train
