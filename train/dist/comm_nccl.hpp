// The NCCL communicator of the CUDA backend's data-parallel training (issue
// 30; llm.c's scheme: NCCL collectives, the unique id from rank 0 handed
// round through MPI or a shared file, rendezvous.hpp). Built when the CUDA
// backend is and CMake finds NCCL (FP4LAB_WITH_NCCL); otherwise the factories
// throw fp4lab::Error saying this build has none.
//
// Buffers: device_buffers() is true. The float, double and u32 collectives
// take device pointers on the communicator's CUDA device, which must be the
// current device of the calling thread (checked); allgather_bytes takes and
// returns host bytes (staged through device memory).
//
// Streams: every collective runs on a stream of the communicator's own
// (non-blocking, created at init) and is complete when the call returns (the
// stream is synchronised), so the results can be read by anything that runs
// next. Before launching, the stream waits for the work queued on the legacy
// default stream, which the trainer's CUDA backend uses (train/cuda; no
// per-thread default stream), so inputs written there are ready; work on other
// streams is the caller's to finish first.
//
// Order of summation: NCCL's (ring or tree, by size and topology), not rank
// order: fixed for a given world, topology and NCCL version, so two such runs
// agree bitwise, but not bitwise equal to `threads` or MPI.
//
// reduce_scatter_sum and allgather take shards of any sizes (empty, odd):
// NCCL's ReduceScatter and AllGather need equal counts, so they are a group of
// one ncclReduce (resp. ncclBroadcast) per rank, rooted at the shard's owner.
//
// NVLink multicast (NVLS) is neither enabled nor used here: NCCL_NVLS_ENABLE
// is the environment's to set.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "train/dist/comm.hpp"

namespace fp4lab {

// One rank of a run of `world` processes (or threads), on the calling thread's
// current CUDA device: cudaSetDevice is the caller's job, before this call and
// before every collective (usually one device per process: its local rank).
// `rendezvous` is "mpi" or "file:PATH" (rendezvous.hpp): rank 0 makes the
// NCCL unique id, every rank receives it, then ncclCommInitRank, which
// returns once all `world` ranks have joined (rank 0 then removes PATH).
std::unique_ptr<Communicator> make_nccl_comm(int rank, int world, const std::string& rendezvous);

// One process driving several GPUs (tests): ncclCommInitAll over `devices`
// (distinct device ordinals; rank r on devices[r]). Each communicator is then
// used from its own thread, which first calls cudaSetDevice(devices[r]); the
// collectives of different ranks must run concurrently, as those of separate
// processes do (one thread calling them in turn would wait forever). Destroy
// each in its own thread too: NCCL documents ncclCommDestroy as a collective of
// the ranks of one node. The caller's current device is left as it was.
std::vector<std::unique_ptr<Communicator>> make_nccl_comms_single_process(std::span<const int> devices);

// Whether this build has NCCL (the factories above throw without it).
bool have_nccl();

}  // namespace fp4lab
