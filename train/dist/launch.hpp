// How `fp4lab train` joins a data-parallel world (issue 30):
//   - one process (no flags, not under mpirun): a world of one;
//   - under mpirun (OpenMPI's OMPI_COMM_WORLD_SIZE, or `--rendezvous mpi`):
//     the cpu backend's collectives go through MPI; the cuda backend's through
//     NCCL with the NCCL id broadcast over MPI (MPI with host staging where
//     this build has no NCCL);
//   - `--rendezvous file:PATH --rank R --world N`, one process per GPU and no
//     MPI: NCCL with the id passed through the file PATH (fresh for each run;
//     every rank must see it: one host or a shared file system);
//   - `--rendezvous threads:N`: N ranks in this process, one thread each,
//     over the thread communicator (make_thread_comms; sums in rank order):
//     data parallelism without mpirun on one host, and the exact byte counts
//     of N devices (CountingComm) from one (plan S0). The caller starts the
//     threads (thread_ranks says how many); join_world refuses the form.
// With the cuda backend, rank r uses GPU (local rank) mod (GPU count), the
// local rank from OMPI_COMM_WORLD_LOCAL_RANK, else r.
#pragma once

#include <memory>
#include <string>

#include "train/dist/comm.hpp"

namespace fp4lab::train {

struct LaunchOptions {
  std::string rendezvous;  // "", "mpi", "file:PATH" or "threads:N"
  int rank = -1, world = -1;  // with file:PATH
};

// The communicator of this process (a local one for a world of one); selects
// the GPU first when `backend` is "cuda". Errors name the flag at fault.
std::unique_ptr<Communicator> join_world(const LaunchOptions& o, const std::string& backend);

inline constexpr int kMaxThreadRanks = 64;
// N of `--rendezvous threads:N` (1 <= N <= kMaxThreadRanks), or 0 for another form. Errors (one line naming
// the flag): a bad N; --rank/--world with it; under mpirun.
int thread_ranks(const LaunchOptions& o);

}  // namespace fp4lab::train
