// Rendezvous of the ranks of a run (issue 30): rank 0's bytes (NCCL's unique
// id, comm_nccl.hpp) delivered to every rank before any communicator exists.
// Two forms, as llm.c has them:
//   "mpi"        through MPI (make_mpi_comm()->allgather_bytes): the ranks
//                launched by mpirun; needs a build with MPI.
//   "file:PATH"  through a file on a filesystem every rank sees (one host's
//                /tmp, or a shared mount): for launchers without MPI.
//                Rank 0 writes PATH atomically (PATH.tmp.<pid>, fsync,
//                rename); the other ranks poll every 50 ms until PATH exists
//                with the id's size, for at most `timeout` (120 s).
//                PATH must be fresh per run: the launcher passes a new name
//                (a job id, a timestamp). An existing PATH at rank 0's start
//                is an error naming it, never overwritten: a leftover of an
//                earlier run could otherwise hand its stale id to ranks that
//                start before rank 0 writes. release_rendezvous removes the
//                file once every rank has joined.
// No CUDA here: the exchange is plain bytes, and always compiled.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace fp4lab {

struct RendezvousSpec {
  enum class Kind { mpi, file } kind = Kind::mpi;
  std::string path;  // "file:" only: the file's path, non-empty
};

// "mpi" or "file:PATH"; anything else throws fp4lab::Error listing the valid forms.
RendezvousSpec parse_rendezvous(const std::string& rendezvous);

inline constexpr std::chrono::milliseconds kRendezvousTimeout{120'000};

// Every rank calls it with the same `rendezvous` and `world`, its own `rank`
// (0 <= rank < world). Rank 0 passes its bytes in `id_of_rank0`; the others
// pass a buffer of the same size whose contents are ignored (the size is what
// they expect to receive). Returns rank 0's bytes on every rank. Throws
// fp4lab::Error on a bad form or rank, a PATH that already exists at rank 0's
// start, an I/O failure, or (ranks other than 0, as EnvironmentError: rank 0
// is gone or silent) no complete PATH within `timeout` (a parameter so that
// tests need not wait 120 s).
std::vector<uint8_t> exchange_id(const std::string& rendezvous, int rank, int world,
                                 std::span<const uint8_t> id_of_rank0,
                                 std::chrono::milliseconds timeout = kRendezvousTimeout);

// After the collective init that used the id (every rank has read it): rank 0
// removes a "file:" rendezvous's PATH; a no-op for other ranks and for "mpi".
// Never throws (a file already gone is no error).
void release_rendezvous(const std::string& rendezvous, int rank) noexcept;

}  // namespace fp4lab
