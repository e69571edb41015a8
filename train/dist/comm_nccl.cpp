// The NCCL communicator (comm_nccl.hpp), compiled with NCCL (FP4LAB_WITH_NCCL)
// or as stubs that say this build has none.
#include "train/dist/comm_nccl.hpp"

#include <string>

#include "core/error.hpp"

#if FP4LAB_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "cuda/device.hpp"
#include "train/dist/rendezvous.hpp"
#endif

namespace fp4lab {

#if FP4LAB_WITH_NCCL
namespace {

using cuda::check;

// One line: NCCL's name of the result and its last error's text (newlines folded).
void check_nccl(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  const char* last_c = ncclGetLastError(nullptr);
  std::string last = last_c ? last_c : "";
  std::replace(last.begin(), last.end(), '\n', ' ');
  while (!last.empty() && last.back() == ' ') last.pop_back();
  throw Error(std::string("NCCL: ") + what + ": " + ncclGetErrorString(rc) + (last.empty() ? "" : " (" + last + ")"));
}

using Clock = std::chrono::steady_clock;

// Waits, with a short sleep, until `comm`'s asynchronous state leaves
// ncclInProgress (a non-blocking communicator's init, enqueue or finalize);
// returns that state, or ncclInProgress itself once `deadline` has passed.
ncclResult_t settle(ncclComm_t comm, ncclResult_t rc, Clock::time_point deadline) {
  while (rc == ncclInProgress) {
    if (Clock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (ncclCommGetAsyncError(comm, &rc) != ncclSuccess) return ncclInternalError;
  }
  return rc;
}

// Timeouts (issue 42): a communicator made by make_nccl_comm is non-blocking
// (ncclConfig_t::blocking = 0), so no NCCL call blocks the host: a call may
// return ncclInProgress, and the rank polls the communicator's state
// (ncclCommGetAsyncError) and its stream (cudaStreamQuery) until they finish
// or the communicator's timeout() passes. Then ncclCommAbort ends the
// communicator's kernels (a dead or stopped peer would keep them spinning on
// the GPU) and the rank throws EnvironmentError; the communicator is unusable
// from there on. NCCL cannot say which peer is missing: the message names
// "the other rank(s)". make_nccl_comms_single_process's communicators
// (ncclCommInitAll: blocking) are polled the same way on their streams.
class NcclComm final : public Communicator {
 public:
  // Owns `comm` (initialised for `device`) from here on, destroying it if this throws.
  NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    int prev = device_;
    cudaGetDevice(&prev);
    try {
      check(cudaSetDevice(device_), "cudaSetDevice");
      check_nccl(ncclCommCount(comm_, &world_), "ncclCommCount");
      check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      one_.resize(1);
      one_.fill_bytes(0);
      sizes_.resize(size_t(world_));
    } catch (...) {
      cudaSetDevice(prev);
      release();
      throw;
    }
    cudaSetDevice(prev);
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() override { release(); }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string name() const override { return "nccl"; }
  bool device_buffers() const override { return true; }

  void allreduce_max(std::span<uint32_t> v) override {
    allreduce(v.data(), v.size(), ncclUint32, ncclMax, "allreduce_max");
  }
  void allreduce_sum(std::span<float> v) override {
    allreduce(v.data(), v.size(), ncclFloat32, ncclSum, "allreduce_sum");
  }
  void allreduce_sum(std::span<double> v) override {
    allreduce(v.data(), v.size(), ncclFloat64, ncclSum, "allreduce_sum(double)");
  }

  // One ncclReduce per rank r (root r, shard r's elements) in one group.
  void reduce_scatter_sum(std::span<const float> full, std::span<const ShardRange> shards,
                          std::span<float> mine) override {
    const char* what = "reduce_scatter_sum";
    check_args(full.size(), shards, mine.size(), what);
    check_device_ptr(full.data(), full.size(), what);
    check_device_ptr(mine.data(), mine.size(), what);
    launch_group(what, shards, [&](int r, const ShardRange& s) {
      const float* send = full.data() + s.begin;
      // Off the root recvbuff is not used; the send pointer stands in for it (in place).
      float* recv = r == rank_ ? mine.data() : const_cast<float*>(send);
      return ncclReduce(send, recv, size_t(s.end - s.begin), ncclFloat32, ncclSum, r, comm_, stream_);
    });
  }
  // The start form, waited for.
  void allgather(std::span<const float> mine, std::span<const ShardRange> shards, std::span<float> full) override {
    allgather_start(mine, shards, full)->wait();
  }
  // One ncclBroadcast per rank r (root r) into its shard of `full`, in one group, queued: the pending
  // collective polls its completion.
  std::unique_ptr<PendingCollective> allgather_start(std::span<const float> mine, std::span<const ShardRange> shards,
                                                     std::span<float> full) override {
    const char* what = "allgather";
    check_args(full.size(), shards, mine.size(), what);
    check_device_ptr(full.data(), full.size(), what);
    check_device_ptr(mine.data(), mine.size(), what);
    enqueue_group(what, shards, [&](int r, const ShardRange& s) {
      float* dst = full.data() + s.begin;
      const float* src = r == rank_ ? mine.data() : dst;  // off the root sendbuff is not used
      return ncclBroadcast(src, dst, size_t(s.end - s.begin), ncclFloat32, r, comm_, stream_);
    });
    return std::make_unique<Pending>(*this, what);
  }

  // The start form, waited for.
  void allgather_equal(std::span<const uint8_t> mine, std::span<uint8_t> all) override {
    allgather_equal_start(mine, all)->wait();
  }
  // One ncclAllGather (in place where `mine` is the own part of `all`), queued.
  std::unique_ptr<PendingCollective> allgather_equal_start(std::span<const uint8_t> mine,
                                                           std::span<uint8_t> all) override {
    const char* what = "allgather_equal";
    enter(what);
    check_allgather_equal(mine.size(), all.size(), world_, "nccl");
    if (!mine.empty()) {
      check_device_ptr(mine.data(), mine.size(), what);
      check_device_ptr(all.data(), all.size(), what);
      order();
      settled(ncclAllGather(mine.data(), all.data(), mine.size(), ncclUint8, comm_, stream_), what);
    }
    return std::make_unique<Pending>(*this, what);
  }

  // Host bytes: the sizes gathered first (one int64 a rank), then every
  // rank's bytes broadcast in place into one device staging buffer.
  std::vector<std::vector<uint8_t>> allgather_bytes(std::span<const uint8_t> mine) override {
    const char* what = "allgather_bytes";
    enter(what);
    const int64_t n = int64_t(mine.size());
    std::vector<int64_t> sizes(static_cast<size_t>(world_)), offsets(static_cast<size_t>(world_) + 1, 0);
    order();
    check(cudaMemcpyAsync(sizes_.data() + rank_, &n, sizeof n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    settled(ncclAllGather(sizes_.data() + rank_, sizes_.data(), 1, ncclInt64, comm_, stream_),
            "ncclAllGather(allgather_bytes sizes)");
    check(cudaMemcpyAsync(sizes.data(), sizes_.data(), sizes.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    finish(what);
    for (int r = 0; r < world_; ++r) offsets[size_t(r) + 1] = offsets[size_t(r)] + sizes[size_t(r)];
    std::vector<uint8_t> all(static_cast<size_t>(offsets.back()));
    if (!all.empty()) {
      uint8_t* staging = staging_.at_least(all.size());
      if (n > 0) staging_.upload(mine.data(), mine.size(), size_t(offsets[size_t(rank_)]));
      std::vector<ShardRange> parts(static_cast<size_t>(world_));
      for (int r = 0; r < world_; ++r) parts[size_t(r)] = {offsets[size_t(r)], offsets[size_t(r) + 1]};
      launch_group(what, parts, [&](int r, const ShardRange& s) {
        uint8_t* p = staging + s.begin;
        return ncclBroadcast(p, p, size_t(s.end - s.begin), ncclUint8, r, comm_, stream_);
      });
      check(cudaMemcpy(all.data(), staging, all.size(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H (allgather_bytes)");
    }
    std::vector<std::vector<uint8_t>> out;
    for (int r = 0; r < world_; ++r)
      out.emplace_back(all.begin() + offsets[size_t(r)], all.begin() + offsets[size_t(r) + 1]);
    return out;
  }

  // One group of ncclSend / ncclRecv for every peer with rows (both sides know the counts, so both skip the
  // empty parts alike); the own part a device copy on the communicator's stream.
  void alltoallv(std::span<const uint8_t> send, std::span<const int64_t> send_counts, std::span<uint8_t> recv,
                 std::span<const int64_t> recv_counts, size_t unit_bytes) override {
    const char* what = "alltoallv";
    enter(what);
    check_alltoallv(send.size(), send_counts, recv.size(), recv_counts, unit_bytes, world_, "nccl");
    check_device_ptr(send.data(), send.size(), what);
    check_device_ptr(recv.data(), recv.size(), what);
    std::vector<size_t> so(size_t(world_) + 1, 0), ro(size_t(world_) + 1, 0);
    for (int p = 0; p < world_; ++p) {
      so[size_t(p) + 1] = so[size_t(p)] + size_t(send_counts[size_t(p)]) * unit_bytes;
      ro[size_t(p) + 1] = ro[size_t(p)] + size_t(recv_counts[size_t(p)]) * unit_bytes;
    }
    if (send_counts[size_t(rank_)] != recv_counts[size_t(rank_)])
      throw Error("communicator (nccl): alltoallv: rank " + std::to_string(rank_) + " sends " +
                  std::to_string(send_counts[size_t(rank_)]) + " rows to itself but expects " +
                  std::to_string(recv_counts[size_t(rank_)]));
    order();
    const size_t own = so[size_t(rank_) + 1] - so[size_t(rank_)];
    if (own > 0)
      check(cudaMemcpyAsync(recv.data() + ro[size_t(rank_)], send.data() + so[size_t(rank_)], own,
                            cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync (alltoallv, own part)");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t rc = ncclSuccess;
    for (int p = 0; p < world_ && (rc == ncclSuccess || rc == ncclInProgress); ++p) {
      if (p == rank_) continue;
      const size_t sb = so[size_t(p) + 1] - so[size_t(p)], rb = ro[size_t(p) + 1] - ro[size_t(p)];
      if (sb > 0) rc = ncclSend(send.data() + so[size_t(p)], sb, ncclUint8, p, comm_, stream_);
      if (rb > 0 && (rc == ncclSuccess || rc == ncclInProgress))
        rc = ncclRecv(recv.data() + ro[size_t(p)], rb, ncclUint8, p, comm_, stream_);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (rc != ncclSuccess && rc != ncclInProgress) {
      abort();
      check_nccl(rc, what);
    }
    settled(end, what);
    finish(what);
  }

  void barrier() override { allreduce(one_.data(), 1, ncclUint32, ncclMax, "barrier"); }

 private:
  // Frees what this rank holds, on its device; the current device is left as it was.
  // The communicator is finalised first (non-blocking: polled, at most timeout(),
  // then aborted), so that a peer that went away cannot hold this rank in
  // ncclCommDestroy.
  void release() noexcept {
    int prev = device_;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    one_ = {};
    sizes_ = {};
    staging_ = {};
    if (comm_) {
      const ncclResult_t fin = settle(comm_, ncclCommFinalize(comm_), Clock::now() + timeout());
      if (fin == ncclSuccess)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
    comm_ = nullptr;
    ready_ = nullptr;
    stream_ = nullptr;
    cudaSetDevice(prev);
  }
  // The calling thread's current device must be this rank's. Starts the
  // collective's clock (deadline_); a communicator aborted by a timeout refuses.
  void enter(const char* what) {
    if (!comm_)
      throw EnvironmentError("rank " + std::to_string(rank_) + ": communicator (nccl): " + what +
                             ": this communicator was aborted after a collective timed out");
    deadline_ = Clock::now() + timeout();
    int cur = -1;
    check(cudaGetDevice(&cur), "cudaGetDevice");
    if (cur != device_)
      throw Error(std::string("communicator (nccl): ") + what + " called with CUDA device " + std::to_string(cur) +
                  " current, but this rank's device is " + std::to_string(device_) + " (cudaSetDevice first)");
  }
  // Device memory of this rank's device (or managed memory); n == 0 passes.
  void check_device_ptr(const void* p, size_t n, const char* what) const {
    if (n == 0) return;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type == cudaMemoryTypeManaged || (a.type == cudaMemoryTypeDevice && a.device == device_)) return;
    throw Error(std::string("communicator (nccl): ") + what + ": a buffer is not memory of CUDA device " +
                std::to_string(device_) + " (device_buffers() is true: pass device pointers)");
  }
  void check_args(size_t n, std::span<const ShardRange> shards, size_t mine, const char* what) {
    enter(what);
    check_shard_set(n, shards, world_, "nccl", what);
    const ShardRange s = shards[size_t(rank_)];
    if (mine != size_t(s.end - s.begin))
      throw Error(std::string("communicator (nccl): ") + what + ": rank " + std::to_string(rank_) + "'s buffer holds " +
                  std::to_string(mine) + " elements, its shard [" + std::to_string(s.begin) + ", " +
                  std::to_string(s.end) + ") " + std::to_string(s.end - s.begin));
  }
  // Our stream waits for the work queued so far on the legacy default stream.
  void order() {
    check(cudaEventRecord(ready_, cudaStreamLegacy), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
  }
  // Until the stream has run the collective: polled (cudaStreamQuery, the
  // communicator's asynchronous error) up to deadline_, then aborted.
  void finish(const char* what) {
    for (std::chrono::microseconds nap{0};;
         nap = std::min(nap + std::chrono::microseconds(20), std::chrono::microseconds(1000))) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check(q, (std::string("cudaStreamQuery after ") + what).c_str());
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort();
        check_nccl(async, what);
      }
      if (Clock::now() >= deadline_) {
        abort();
        throw_no_answer(std::string("nccl ") + what, {});
      }
      if (nap.count() > 0) std::this_thread::sleep_for(nap);
    }
  }
  // A call's result on a non-blocking communicator: ncclInProgress is waited
  // out (to deadline_; then aborted as a timeout); errors throw.
  void settled(ncclResult_t rc, const char* what) {
    rc = settle(comm_, rc, deadline_);
    if (rc == ncclInProgress) {
      abort();
      throw_no_answer(std::string("nccl ") + what, {});
    }
    if (rc != ncclSuccess) abort();
    check_nccl(rc, what);
  }
  // Ends the communicator's work on the device (ncclCommAbort: no peer needed)
  // and frees it; later collectives refuse (enter).
  void abort() noexcept {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  void allreduce(void* p, size_t n, ncclDataType_t type, ncclRedOp_t op, const char* what) {
    enter(what);
    if (n == 0) return;  // the same length on every rank: all skip
    check_device_ptr(p, n, what);
    order();
    settled(ncclAllReduce(p, p, n, type, op, comm_, stream_), what);
    finish(what);
  }
  // op(r, shards[r]) for every non-empty shard (empty ones are skipped by every
  // rank alike: the shards are the same everywhere), in one NCCL group.
  template <class Op>
  void launch_group(const char* what, std::span<const ShardRange> shards, Op op) {
    enqueue_group(what, shards, op);
    finish(what);
  }
  template <class Op>
  void enqueue_group(const char* what, std::span<const ShardRange> shards, Op op) {
    order();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t rc = ncclSuccess;
    for (int r = 0; r < world_ && (rc == ncclSuccess || rc == ncclInProgress); ++r)
      if (shards[size_t(r)].end > shards[size_t(r)].begin) rc = op(r, shards[size_t(r)]);
    const ncclResult_t end = ncclGroupEnd();  // non-blocking: the group is enqueued when the state settles
    if (rc != ncclSuccess && rc != ncclInProgress) {
      abort();
      check_nccl(rc, what);
    }
    settled(end, what);
  }
  // A collective queued on stream_ by a start form: an event after it, polled by wait() (the communicator's
  // asynchronous error too) up to the deadline its enter() set; then aborted like a blocking collective.
  // Collectives queued later run after it on the same stream (a later blocking one's finish waits for both).
  class Pending final : public PendingCollective {
   public:
    Pending(NcclComm& c, const char* what) : c_(c), what_(what), deadline_(c.deadline_) {
      check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      const cudaError_t rc = cudaEventRecord(done_, c_.stream_);
      if (rc != cudaSuccess) cudaEventDestroy(done_), check(rc, "cudaEventRecord");
    }
    ~Pending() override {
      if (done_) {
        try {
          wait();
        } catch (...) {  // reported by the next collective (the communicator is aborted)
        }
        cudaEventDestroy(done_);
      }
    }
    void wait() override {
      if (waited_) return;
      waited_ = true;
      for (std::chrono::microseconds nap{0};;
           nap = std::min(nap + std::chrono::microseconds(20), std::chrono::microseconds(1000))) {
        const cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) check(q, (std::string("cudaEventQuery after ") + what_).c_str());
        if (!c_.comm_) throw_aborted();
        ncclResult_t async = ncclSuccess;
        check_nccl(ncclCommGetAsyncError(c_.comm_, &async), "ncclCommGetAsyncError");
        if (async != ncclSuccess && async != ncclInProgress) {
          c_.abort();
          check_nccl(async, what_);
        }
        if (Clock::now() >= deadline_) {
          c_.abort();
          c_.throw_no_answer(std::string("nccl ") + what_, {});
        }
        if (nap.count() > 0) std::this_thread::sleep_for(nap);
      }
    }

   private:
    [[noreturn]] void throw_aborted() const {
      throw EnvironmentError("rank " + std::to_string(c_.rank_) + ": communicator (nccl): " + what_ +
                             ": this communicator was aborted while the collective was in flight");
    }
    NcclComm& c_;
    const char* what_;
    Clock::time_point deadline_;
    cudaEvent_t done_ = nullptr;
    bool waited_ = false;
  };
  ncclComm_t comm_ = nullptr;  // null once aborted
  int device_ = 0, rank_ = 0, world_ = 1;
  Clock::time_point deadline_;  // of the collective in progress (enter)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  cuda::DeviceBuffer<uint32_t> one_;   // barrier's element
  cuda::DeviceBuffer<int64_t> sizes_;  // allgather_bytes' sizes
  cuda::DeviceBuffer<uint8_t> staging_;
};

}  // namespace

bool have_nccl() { return true; }

std::unique_ptr<Communicator> make_nccl_comm(int rank, int world, const std::string& rendezvous) {
  parse_rendezvous(rendezvous);  // a bad form fails before CUDA is touched
  if (world < 1 || rank < 0 || rank >= world)
    throw Error("make_nccl_comm: rank " + std::to_string(rank) + " of world " + std::to_string(world) +
                ": need world >= 1 and 0 <= rank < world");
  if (!cuda::gpu_available()) throw Error("make_nccl_comm: no CUDA device (cudaGetDeviceCount)");
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  ncclUniqueId id{};
  if (rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const auto bytes = exchange_id(rendezvous, rank, world, {reinterpret_cast<const uint8_t*>(&id), sizeof id});
  std::memcpy(&id, bytes.data(), sizeof id);
  // Non-blocking (see NcclComm): the init returns at once and is polled, so a
  // rank that never joins costs the others kRendezvousTimeout, not forever.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t init = ncclCommInitRankConfig(&comm, world, id, rank, &config);
  if (init == ncclInProgress) init = settle(comm, init, Clock::now() + kRendezvousTimeout);
  if (init != ncclSuccess) {
    if (comm) ncclCommAbort(comm);
    if (init == ncclInProgress)
      throw EnvironmentError(no_answer_message(rank, {}, kRendezvousTimeout, "ncclCommInitRankConfig", -1));
    check_nccl(init, "ncclCommInitRankConfig");
  }
  release_rendezvous(rendezvous, rank);  // every rank has joined, so every rank has read the id
  return std::make_unique<NcclComm>(comm, device);
}

std::vector<std::unique_ptr<Communicator>> make_nccl_comms_single_process(std::span<const int> devices) {
  const int count = cuda::device_count();
  if (devices.empty()) throw Error("make_nccl_comms_single_process: need at least one device");
  for (int d : devices) {
    if (d < 0 || d >= count)
      throw Error("make_nccl_comms_single_process: device " + std::to_string(d) + ": this machine has " +
                  std::to_string(count) + " CUDA device(s)");
    if (std::count(devices.begin(), devices.end(), d) > 1)
      throw Error("make_nccl_comms_single_process: device " + std::to_string(d) + " listed twice (one rank a device)");
  }
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  check_nccl(ncclCommInitAll(raw.data(), int(raw.size()), devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> comms;
  for (size_t r = 0; r < raw.size(); ++r) {
    try {
      comms.push_back(std::make_unique<NcclComm>(raw[r], devices[r]));
    } catch (...) {
      for (size_t k = r + 1; k < raw.size(); ++k) ncclCommDestroy(raw[k]);
      throw;
    }
  }
  return comms;
}
#else
namespace {
[[noreturn]] void no_nccl() {
  throw Error(
      "this fp4lab was built without NCCL (it needs the CUDA backend and nccl.h + libnccl: the CUDA "
      "toolkit's, or cmake -DNCCL_ROOT=DIR; rebuild)");
}
}  // namespace

bool have_nccl() { return false; }
std::unique_ptr<Communicator> make_nccl_comm(int, int, const std::string&) { no_nccl(); }
std::vector<std::unique_ptr<Communicator>> make_nccl_comms_single_process(std::span<const int>) { no_nccl(); }
#endif

}  // namespace fp4lab
