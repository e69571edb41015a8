// How `fp4lab train` joins a data-parallel world (issue 30):
//   - one process (no flags, not under mpirun): a world of one;
//   - under mpirun (OpenMPI's OMPI_COMM_WORLD_SIZE, or `--rendezvous mpi`):
//     the cpu backend's collectives go through MPI; the cuda backend's through
//     NCCL with the NCCL id broadcast over MPI (MPI with host staging where
//     this build has no NCCL);
//   - `--rendezvous file:PATH --rank R --world N`, one process per GPU and no
//     MPI: NCCL with the id passed through the file PATH (fresh for each run;
//     every rank must see it: one host or a shared file system).
// With the cuda backend, rank r uses GPU (local rank) mod (GPU count), the
// local rank from OMPI_COMM_WORLD_LOCAL_RANK, else r.
#pragma once

#include <memory>
#include <string>

#include "train/dist/comm.hpp"

namespace fp4lab::train {

struct LaunchOptions {
  std::string rendezvous;  // "", "mpi" or "file:PATH"
  int rank = -1, world = -1;  // with file:PATH
};

// The communicator of this process (a local one for a world of one); selects
// the GPU first when `backend` is "cuda". Errors name the flag at fault.
std::unique_ptr<Communicator> join_world(const LaunchOptions& o, const std::string& backend);

}  // namespace fp4lab::train
