// Joining a data-parallel world (launch.hpp).
#include "train/dist/launch.hpp"

#include <cstdlib>

#include "core/error.hpp"
#include "train/dist/comm_nccl.hpp"

#if FP4LAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fp4lab::train {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

void select_gpu(int rank) {
#if FP4LAB_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return;  // make_backend says there is no GPU
  const int local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", rank);
  cudaSetDevice(local % count);
#else
  (void)rank;
#endif
}

}  // namespace

std::unique_ptr<Communicator> join_world(const LaunchOptions& o, const std::string& backend) {
  const bool cuda = backend == "cuda";
  std::string rv = o.rendezvous;
  if (rv.empty() && env_int("OMPI_COMM_WORLD_SIZE", 1) > 1) rv = "mpi";
  if (rv.empty()) {
    if (o.rank >= 0 || o.world >= 0)
      throw Error("--rank/--world need --rendezvous file:PATH (under mpirun MPI gives them)");
    return make_local_comm();
  }
  if (rv == "mpi") {
    if (o.rank >= 0 || o.world >= 0) throw Error("--rank/--world go with --rendezvous file:PATH; under MPI, MPI gives them");
    std::unique_ptr<Communicator> mpi = make_mpi_comm();
    if (!cuda) return mpi;
    select_gpu(mpi->rank());
    if (!have_nccl()) return mpi;  // host-staged collectives
    return make_nccl_comm(mpi->rank(), mpi->world(), "mpi");
  }
  if (thread_ranks(o) > 0)
    throw InternalError("join_world: --rendezvous " + rv + " is started by the caller, one thread a rank");
  if (rv.rfind("file:", 0) != 0 || rv.size() == 5)
    throw Error("--rendezvous \"" + rv + "\" is not valid; valid: mpi, file:PATH, threads:N");
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    throw Error("--rendezvous " + rv + " needs --world N (N >= 1) and --rank R (0 <= R < N); got --rank " +
                std::to_string(o.rank) + " --world " + std::to_string(o.world));
  if (!cuda)
    throw Error("--rendezvous " + rv + ": the cpu backend's collectives need MPI (mpirun -np N fp4lab train ...); "
                "file rendezvous is for NCCL (backend cuda)");
  select_gpu(o.rank);
  return make_nccl_comm(o.rank, o.world, rv);
}

int thread_ranks(const LaunchOptions& o) {
  const std::string& rv = o.rendezvous;
  if (rv.rfind("threads:", 0) != 0) return 0;
  const std::string n = rv.substr(8);
  const bool digits = !n.empty() && n.size() <= 3 && n.find_first_not_of("0123456789") == std::string::npos;
  const int N = digits ? std::stoi(n) : 0;
  if (N < 1 || N > kMaxThreadRanks)
    throw Error("--rendezvous " + rv + ": N must be 1.." + std::to_string(kMaxThreadRanks) +
                " (the number of in-process ranks)");
  if (o.rank >= 0 || o.world >= 0)
    throw Error("--rendezvous " + rv + " starts every rank itself; --rank/--world go with file:PATH");
  if (env_int("OMPI_COMM_WORLD_SIZE", 1) > 1)
    throw Error("--rendezvous " + rv + " under mpirun: run one process (threads:N starts N ranks in it)");
  return N;
}

}  // namespace fp4lab::train
