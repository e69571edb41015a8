// Expert parallelism's transport over a Communicator (expert_parallel.hpp).
#include "train/dist/expert_parallel.hpp"

#include <cstring>
#include <string>

#include "core/error.hpp"

namespace fp4lab::train {

// One allgather_bytes of [E counts (int64) | this rank's block sums (double)]: the counts are the same size on
// every rank, the block sums follow each rank's token count.
RouteTotals CommExpertExchange::exchange_totals(std::span<const int64_t> counts, std::span<const double> block_sums) {
  std::vector<uint8_t> mine(counts.size_bytes() + block_sums.size_bytes());
  if (!counts.empty()) std::memcpy(mine.data(), counts.data(), counts.size_bytes());
  if (!block_sums.empty()) std::memcpy(mine.data() + counts.size_bytes(), block_sums.data(), block_sums.size_bytes());
  const std::vector<std::vector<uint8_t>> all = comm_.allgather_bytes(mine);
  RouteTotals t;
  for (size_t p = 0; p < all.size(); ++p) {
    const std::vector<uint8_t>& b = all[p];
    if (b.size() < counts.size_bytes() || (b.size() - counts.size_bytes()) % sizeof(double) != 0)
      throw Error("expert parallel: rank " + std::to_string(p) + " sent " + std::to_string(b.size()) +
                  " bytes of routing counts, expected " + std::to_string(counts.size()) + " counts and block sums");
    const size_t at = t.count_all.size(), sums = (b.size() - counts.size_bytes()) / sizeof(double);
    t.count_all.resize(at + counts.size());
    if (!counts.empty()) std::memcpy(t.count_all.data() + at, b.data(), counts.size_bytes());
    const size_t s0 = t.block_sums_all.size();
    t.block_sums_all.resize(s0 + sums);
    if (sums > 0) std::memcpy(t.block_sums_all.data() + s0, b.data() + counts.size_bytes(), sums * sizeof(double));
  }
  return t;
}

namespace {

int64_t total(std::span<const int64_t> rows) {
  int64_t n = 0;
  for (const int64_t r : rows) n += r;
  return n;
}

}  // namespace

void CommExpertExchange::exchange_rows(Backend& be, const Tensor& send, std::span<const int64_t> send_rows,
                                       Tensor& recv, std::span<const int64_t> recv_rows) {
  FP4LAB_CHECK(send.cols == recv.cols, "expert parallel: rows of " + std::to_string(send.cols) + " and " +
                                           std::to_string(recv.cols) + " columns");
  move(be, send, send_rows, recv, recv_rows, size_t(send.cols) * sizeof(float));
}

void CommExpertExchange::exchange_bytes(Backend& be, const Tensor& send, std::span<const int64_t> send_rows,
                                        Tensor& recv, std::span<const int64_t> recv_rows, int64_t row_bytes) {
  FP4LAB_CHECK(row_bytes > 0, "expert parallel: rows of " + std::to_string(row_bytes) + " bytes");
  move(be, send, send_rows, recv, recv_rows, size_t(row_bytes));
}

// One alltoallv of the first rows * unit bytes of send's and recv's memory, staged through the host for the
// CUDA backend with a host communicator.
void CommExpertExchange::move(Backend& be, const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                              std::span<const int64_t> recv_rows, size_t unit) {
  const size_t sb = size_t(total(send_rows)) * unit, rb = size_t(total(recv_rows)) * unit;
  FP4LAB_CHECK(sb <= size_t(send.size()) * 4 && rb <= size_t(recv.size()) * 4,
               "expert parallel: " + std::to_string(sb) + " and " + std::to_string(rb) + " bytes in buffers of " +
                   std::to_string(send.size() * 4) + " and " + std::to_string(recv.size() * 4));
  const bool stage = !be.host_tensors() && !comm_.device_buffers();
  if (!stage) {
    be.synchronize();  // the rows are written
    comm_.alltoallv(std::span<const uint8_t>(byte_data(send), sb), send_rows, std::span<uint8_t>(byte_data(recv), rb),
                    recv_rows, unit);
    return;
  }
  std::vector<float> hs(size_t(send.size())), hr(size_t(recv.size()));
  be.download(send, hs.data());
  comm_.alltoallv(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(hs.data()), sb), send_rows,
                  std::span<uint8_t>(reinterpret_cast<uint8_t*>(hr.data()), rb), recv_rows, unit);
  be.upload(hr.data(), recv);
}

}  // namespace fp4lab::train
