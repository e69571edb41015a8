// Before data-parallel ranks run a collective whose sizes depend on the run
// (issue 42): every rank checks that all ranks were launched with the same
// run. Ranks with different configs (another --set, model size, recipe, step
// count) would otherwise pass buffers of different lengths to the same
// collective (memory corruption under MPI) or stop at different steps (the
// others wait forever).
//
// The exchange is a fixed-size record (kRunRecordBytes) per rank through
// allgather_bytes, so it is safe whatever the ranks' configs: a tag naming
// this protocol, the config hash, the run's total steps and the world size
// the rank sees. Every rank compares every record with rank 0's and throws
// the same fp4lab::Error naming the first rank that differs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "train/dist/comm.hpp"

namespace fp4lab::train {

// What this rank's run is; the world size is the communicator's.
struct RunAgreement {
  std::string config_hash;  // config_hash(resolved config): 16 hex digits (at most 31 characters)
  int64_t total_steps = 0;  // the run's steps (from epochs: depends on the data this rank loaded)
  double timeout_s = 600.0;  // distributed.timeout_s: set on the communicator first; not compared
};

inline constexpr size_t kRunRecordBytes = 64;

// Sets comm's collective timeout to run.timeout_s, then (world > 1) the
// collective check above. Called by every rank before its first other
// collective of the run. Throws fp4lab::Error "rank R's config differs from
// rank 0's (config_hash A vs B): launch every rank with the same config and
// --set options" (or the steps / world / record that differ); EnvironmentError
// when a rank does not answer within the timeout. run.timeout_s must be
// positive and finite (config_from_json checks distributed.timeout_s).
void agree_on_run(Communicator& comm, const RunAgreement& run);

}  // namespace fp4lab::train
