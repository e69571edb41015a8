// The MPI communicator (comm.hpp), compiled with MPI (FP4LAB_WITH_MPI) or as
// stubs that say this build has none.
#include <string>

#include "core/error.hpp"
#include "train/dist/comm.hpp"

#if FP4LAB_WITH_MPI
#include <mpi.h>

#include <cstdlib>
#include <vector>
#endif

namespace fp4lab {

#if FP4LAB_WITH_MPI
namespace {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw Error(std::string("MPI: ") + what + ": " + std::string(msg, size_t(len)));
}

void ensure_init() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit([] {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  });
}

class MpiComm final : public Communicator {
 public:
  MpiComm() {
    ensure_init();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "mpi"; }
  void allreduce_max(std::span<uint32_t> v) override {
    allreduce(v, MPI_UINT32_T, MPI_MAX, "MPI_Allreduce(max)");
  }
  void allreduce_sum(std::span<float> v) override { allreduce(v, MPI_FLOAT, MPI_SUM, "MPI_Allreduce(sum)"); }
  void allreduce_sum(std::span<double> v) override {
    allreduce(v, MPI_DOUBLE, MPI_SUM, "MPI_Allreduce(sum, double)");
  }
  void allreduce_disjoint_or(std::span<uint8_t> v) override {
    allreduce(v, MPI_UINT8_T, MPI_BOR, "MPI_Allreduce(bor)");
  }
  void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                          std::span<float> mine) override {
    std::vector<int> counts = shard_counts(full.size(), shards, "reduce_scatter_sum");
    check_mpi(MPI_Reduce_scatter(full.data(), mine.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Reduce_scatter");
  }
  void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) override {
    std::vector<int> counts = shard_counts(full.size(), shards, "allgather"), displs(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) displs[r] = int(shards[r].begin);
    const ShardRange s = shards[size_t(rank_)];
    const bool in_place = mine.data() == full.data() + s.begin;
    check_mpi(MPI_Allgatherv(in_place ? MPI_IN_PLACE : mine.data(), counts[size_t(rank_)], MPI_FLOAT, full.data(),
                             counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
              "MPI_Allgatherv(float)");
  }
  std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) override {
    const int n = int(mine.size());
    std::vector<int> sizes(static_cast<size_t>(world_)), displs(static_cast<size_t>(world_));
    check_mpi(MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather(sizes)");
    int total = 0;
    for (int r = 0; r < world_; ++r) displs[size_t(r)] = total, total += sizes[size_t(r)];
    std::vector<uint8_t> all(static_cast<size_t>(total));
    check_mpi(MPI_Allgatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE,
                             MPI_COMM_WORLD),
              "MPI_Allgatherv");
    std::vector<std::vector<uint8_t>> out;
    for (int r = 0; r < world_; ++r)
      out.emplace_back(all.begin() + displs[size_t(r)], all.begin() + displs[size_t(r)] + sizes[size_t(r)]);
    return out;
  }
  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  // In place over MPI_COMM_WORLD.
  template <class T>
  static void allreduce(std::span<T> v, MPI_Datatype type, MPI_Op op, const char* what) {
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), type, op, MPI_COMM_WORLD), what);
  }
  // MPI's int counts of the shards (check_shard_set's; MPI counts are ints: n < 2^31).
  std::vector<int> shard_counts(size_t n, std::span<const ShardRange> shards, const char* what) const {
    check_shard_set(n, shards, world_, "mpi", what);
    if (n >= size_t(1) << 31) throw Error(std::string("communicator (mpi): ") + what + ": more than 2^31 - 1 elements");
    std::vector<int> counts;
    for (const ShardRange& s : shards) counts.push_back(int(s.end - s.begin));
    return counts;
  }
  int rank_ = 0, world_ = 1;
};

}  // namespace

bool have_mpi() { return true; }
std::unique_ptr<Communicator> make_mpi_comm() { return std::make_unique<MpiComm>(); }
#else
bool have_mpi() { return false; }
std::unique_ptr<Communicator> make_mpi_comm() {
  throw Error("this fp4lab was built without MPI (install libopenmpi-dev, scripts/setup.sh, and rebuild)");
}
#endif

}  // namespace fp4lab
