// The ranks' agreement on the run (agreement.hpp).
#include "train/dist/agreement.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.hpp"

namespace fp4lab::train {

namespace {

// Layout: [0, 16) the tag, [16, 48) the hash (NUL-padded), [48, 56) total
// steps, [56, 64) world; integers little-endian whatever the host's order.
constexpr char kTag[16] = "fp4lab-run-v1";
constexpr size_t kHashAt = 16, kHashBytes = 32, kStepsAt = 48, kWorldAt = 56;

void put_i64(std::array<uint8_t, kRunRecordBytes>& b, size_t at, int64_t v) {
  for (int k = 0; k < 8; ++k) b[at + size_t(k)] = uint8_t(uint64_t(v) >> (8 * k));
}
int64_t get_i64(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v = 0;
  for (int k = 0; k < 8; ++k) v |= uint64_t(b[at + size_t(k)]) << (8 * k);
  return int64_t(v);
}

struct Record {
  bool ours = false;  // kRunRecordBytes long with this protocol's tag
  std::string hash;
  int64_t steps = 0, world = 0;
};

Record decode(const std::vector<uint8_t>& b) {
  Record r;
  if (b.size() != kRunRecordBytes || std::memcmp(b.data(), kTag, sizeof kTag) != 0) return r;
  r.ours = true;
  const char* h = reinterpret_cast<const char*>(b.data() + kHashAt);
  r.hash.assign(h, strnlen(h, kHashBytes));
  r.steps = get_i64(b, kStepsAt);
  r.world = get_i64(b, kWorldAt);
  return r;
}

}  // namespace

void agree_on_run(Communicator& comm, const RunAgreement& run) {
  // config_from_json validated distributed.timeout_s already.
  FP4LAB_CHECK(run.timeout_s > 0 && std::isfinite(run.timeout_s), "timeout_s " + std::to_string(run.timeout_s));
  // Whole milliseconds, at least one (a timeout below 1 ms would round to none).
  comm.set_timeout(std::chrono::milliseconds(std::max<int64_t>(1, std::llround(run.timeout_s * 1000.0))));
  if (comm.world() == 1) return;
  FP4LAB_CHECK(run.config_hash.size() < kHashBytes, "config hash of " + std::to_string(run.config_hash.size()) + " characters");

  std::array<uint8_t, kRunRecordBytes> mine{};
  std::memcpy(mine.data(), kTag, sizeof kTag);
  std::memcpy(mine.data() + kHashAt, run.config_hash.data(), run.config_hash.size());
  put_i64(mine, kStepsAt, run.total_steps);
  put_i64(mine, kWorldAt, comm.world());
  comm.set_step(-1);  // before the run's first step
  const std::vector<std::vector<uint8_t>> all = comm.allgather_bytes(mine);

  const Record first = decode(all.at(0));
  const std::string fix = ": launch every rank with the same config and --set options";
  for (size_t r = 0; r < all.size(); ++r) {
    const Record x = decode(all[r]);
    const std::string who = "rank " + std::to_string(r);
    if (!x.ours || !first.ours)
      throw Error((x.ours ? std::string("rank 0") : who) +
                  " sent no run record of this fp4lab (another fp4lab build on some rank?): launch every rank with "
                  "the same fp4lab binary");
    if (x.hash != first.hash)
      throw Error(who + "'s config differs from rank 0's (config_hash " + x.hash + " vs " + first.hash + ")" + fix);
    if (x.steps != first.steps)
      throw Error(who + "'s run has " + std::to_string(x.steps) + " steps, rank 0's " + std::to_string(first.steps) +
                  " (the same config_hash " + x.hash + ": different data files?)" + fix + " and data");
    if (x.world != first.world)
      throw Error(who + " sees a world of " + std::to_string(x.world) + " ranks, rank 0 of " +
                  std::to_string(first.world) + ": every rank must be launched with the same --world");
  }
}

}  // namespace fp4lab::train
