// The MPI communicator (comm.hpp), compiled with MPI (FP4LAB_WITH_MPI) or as
// stubs that say this build has none.
//
// Every collective is MPI's non-blocking form (MPI_Iallreduce, ...) polled by
// MPI_Test until it completes or the communicator's timeout passes (issue 42:
// a stopped or dead rank must not hang the others forever). On a timeout the
// rank asks every other rank, by a point-to-point message, whether it is
// alive: ranks waiting in a collective answer from their polling loop, so the
// ones that do not answer within a short grace are the ones named. The
// process then throws EnvironmentError and, at exit, calls MPI_Abort instead
// of MPI_Finalize (which would wait for the missing rank): mpirun ends every
// rank of the job.
#include <string>

#include "core/error.hpp"
#include "train/dist/comm.hpp"

#if FP4LAB_WITH_MPI
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
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

// Set when a collective timed out: MPI_Finalize would wait for the missing
// rank, so the exit handler aborts the job instead.
std::atomic<bool> g_timed_out{false};

void ensure_init() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit([] {
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    if (g_timed_out) {
      std::fflush(nullptr);  // the error line is out before mpirun tears the job down
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Finalize();
  });
}

// Tags of the liveness question asked after a timeout and of its answer
// (point-to-point: never matched by a collective).
constexpr int kAliveQuestionTag = 4242, kAliveAnswerTag = 4243;
// How long a rank that timed out waits for the others' answers (at most the timeout).
constexpr std::chrono::milliseconds kAliveGrace{1000};
const int kAliveWord = 1;  // the questions' and answers' payload (a static buffer: sends outlive the call)

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
  void allreduce_max(std::span<uint32_t> v) override { allreduce(v, MPI_UINT32_T, MPI_MAX, "MPI_Iallreduce(max)"); }
  void allreduce_sum(std::span<float> v) override { allreduce(v, MPI_FLOAT, MPI_SUM, "MPI_Iallreduce(sum)"); }
  void allreduce_sum(std::span<double> v) override { allreduce(v, MPI_DOUBLE, MPI_SUM, "MPI_Iallreduce(sum, double)"); }
  void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                          std::span<float> mine) override {
    std::vector<int> counts = shard_counts(full.size(), shards, "reduce_scatter_sum");
    const char* what = "MPI_Ireduce_scatter";
    MPI_Request req;
    check_mpi(MPI_Ireduce_scatter(full.data(), mine.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req),
              what);
    wait(req, what);
  }
  void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) override {
    std::vector<int> counts = shard_counts(full.size(), shards, "allgather"), displs(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) displs[r] = int(shards[r].begin);
    const ShardRange s = shards[size_t(rank_)];
    const bool in_place = mine.data() == full.data() + s.begin;
    const char* what = "MPI_Iallgatherv(float)";
    MPI_Request req;
    check_mpi(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : mine.data(), counts[size_t(rank_)], MPI_FLOAT, full.data(),
                              counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD, &req),
              what);
    wait(req, what);
  }
  void allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) override {
    check_allgather_equal(mine.size(), all.size(), world_, "mpi");
    if (mine.size() >= size_t(1) << 31) throw Error("communicator (mpi): allgather_equal: parts of 2^31 bytes or more");
    const bool in_place = mine.data() == all.data() + size_t(rank_) * mine.size();
    const char* what = "MPI_Iallgather(bytes)";
    MPI_Request req;
    check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : mine.data(), int(mine.size()), MPI_BYTE, all.data(),
                             int(mine.size()), MPI_BYTE, MPI_COMM_WORLD, &req),
              what);
    wait(req, what);
  }
  std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) override {
    const int n = int(mine.size());
    std::vector<int> sizes(static_cast<size_t>(world_)), displs(static_cast<size_t>(world_));
    MPI_Request req;
    check_mpi(MPI_Iallgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD, &req), "MPI_Iallgather(sizes)");
    wait(req, "MPI_Iallgather(sizes)");
    int total = 0;
    for (int r = 0; r < world_; ++r) displs[size_t(r)] = total, total += sizes[size_t(r)];
    std::vector<uint8_t> all(static_cast<size_t>(total));
    check_mpi(MPI_Iallgatherv(mine.data(), n, MPI_BYTE, all.data(), sizes.data(), displs.data(), MPI_BYTE,
                              MPI_COMM_WORLD, &req),
              "MPI_Iallgatherv(bytes)");
    wait(req, "MPI_Iallgatherv(bytes)");
    std::vector<std::vector<uint8_t>> out;
    for (int r = 0; r < world_; ++r)
      out.emplace_back(all.begin() + displs[size_t(r)], all.begin() + displs[size_t(r)] + sizes[size_t(r)]);
    return out;
  }
  // MPI_Ialltoallv in units of a contiguous datatype of unit_bytes bytes (MPI's counts and displacements are ints).
  void alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts, std::span<uint8_t> recv,
                 std::span<const int64_t> recv_counts, size_t unit_bytes) override {
    check_alltoallv(send.size(), send_counts, recv.size(), recv_counts, unit_bytes, world_, "mpi");
    const char* what = "MPI_Ialltoallv";
    const size_t w = static_cast<size_t>(world_);
    std::vector<int> sc(w), sd(w), rc(w), rd(w);
    int64_t so = 0, ro = 0;
    for (int p = 0; p < world_; ++p) {
      if (so + send_counts[size_t(p)] >= (int64_t(1) << 31) || ro + recv_counts[size_t(p)] >= (int64_t(1) << 31) ||
          unit_bytes >= (size_t(1) << 31))
        throw Error("communicator (mpi): alltoallv: more than 2^31 - 1 rows or bytes a row");
      sc[size_t(p)] = int(send_counts[size_t(p)]), sd[size_t(p)] = int(so), so += send_counts[size_t(p)];
      rc[size_t(p)] = int(recv_counts[size_t(p)]), rd[size_t(p)] = int(ro), ro += recv_counts[size_t(p)];
    }
    MPI_Datatype row;
    check_mpi(MPI_Type_contiguous(int(unit_bytes), MPI_BYTE, &row), "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&row), "MPI_Type_commit");
    MPI_Request req;
    const int rc_start = MPI_Ialltoallv(send.data(), sc.data(), sd.data(), row, recv.data(), rc.data(), rd.data(), row,
                                        MPI_COMM_WORLD, &req);
    if (rc_start != MPI_SUCCESS) MPI_Type_free(&row);
    check_mpi(rc_start, what);
    try {
      wait(req, what);
    } catch (...) {
      MPI_Type_free(&row);
      throw;
    }
    MPI_Type_free(&row);
  }
  void barrier() override {
    MPI_Request req;
    check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");
    wait(req, "MPI_Ibarrier");
  }

 private:
  // In place over MPI_COMM_WORLD.
  template <class T>
  void allreduce(std::span<T> v, MPI_Datatype type, MPI_Op op, const char* what) {
    MPI_Request req;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, v.data(), int(v.size()), type, op, MPI_COMM_WORLD, &req), what);
    wait(req, what);
  }
  // Polls `req` until it completes; throws (no_answer) once timeout() has passed.
  // The first polls spin (a collective of a healthy world is usually done within
  // microseconds); later ones sleep, growing to 1 ms, and answer liveness questions.
  void wait(MPI_Request& req, const char* what) {
    if (g_timed_out)
      throw EnvironmentError("rank " + std::to_string(rank_) + ": " + what +
                             ": this MPI world timed out before and is being aborted");
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + timeout();
    std::chrono::microseconds nap{0};
    for (long polls = 0;; ++polls) {
      int done = 0;
      check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (polls < 4096) continue;
      answer_alive_questions();
      if (clock::now() >= deadline) no_answer(req, what);
      nap = std::min<std::chrono::microseconds>(std::chrono::microseconds(1000), nap + std::chrono::microseconds(20));
      std::this_thread::sleep_for(nap);
    }
  }
  // Answers every pending "are you alive" question (see no_answer).
  void answer_alive_questions() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kAliveQuestionTag, MPI_COMM_WORLD, &flag, &st);
      if (!flag) return;
      int word = 0;
      MPI_Recv(&word, 1, MPI_INT, st.MPI_SOURCE, kAliveQuestionTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Request r;
      if (MPI_Isend(&kAliveWord, 1, MPI_INT, st.MPI_SOURCE, kAliveAnswerTag, MPI_COMM_WORLD, &r) == MPI_SUCCESS)
        MPI_Request_free(&r);
    }
  }
  // The timeout: asks every other rank whether it is alive, names those that
  // do not answer within kAliveGrace, marks the world for MPI_Abort at exit,
  // throws. The collective stays pending: the job is ending.
  [[noreturn]] void no_answer(MPI_Request& req, const char* what) {
    g_timed_out = true;
    std::vector<MPI_Request> answers(size_t(world_), MPI_REQUEST_NULL);
    std::vector<int> words(size_t(world_), 0);
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      MPI_Request q;
      if (MPI_Isend(&kAliveWord, 1, MPI_INT, r, kAliveQuestionTag, MPI_COMM_WORLD, &q) == MPI_SUCCESS)
        MPI_Request_free(&q);
      MPI_Irecv(&words[size_t(r)], 1, MPI_INT, r, kAliveAnswerTag, MPI_COMM_WORLD, &answers[size_t(r)]);
    }
    const auto until = std::chrono::steady_clock::now() + std::min(kAliveGrace, timeout());
    std::vector<int> answered(size_t(world_), 0);
    answered[size_t(rank_)] = 1;
    while (std::chrono::steady_clock::now() < until && std::count(answered.begin(), answered.end(), 1) < world_) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);  // keeps the world's progress going
      answer_alive_questions();
      for (int r = 0; r < world_; ++r)
        if (!answered[size_t(r)]) MPI_Test(&answers[size_t(r)], &answered[size_t(r)], MPI_STATUS_IGNORE);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<int> silent;
    for (int r = 0; r < world_; ++r)
      if (!answered[size_t(r)]) silent.push_back(r);
    throw_no_answer(what, silent);
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
