// The rendezvous of a run's ranks (rendezvous.hpp): rank 0's bytes to every
// rank through MPI or a fresh file.
#include "train/dist/rendezvous.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.hpp"
#include "train/dist/comm.hpp"

namespace fp4lab {

namespace {

namespace fs = std::filesystem;

std::string duration_text(std::chrono::milliseconds t) {
  return t.count() % 1000 == 0 ? std::to_string(t.count() / 1000) + " s" : std::to_string(t.count()) + " ms";
}

std::vector<uint8_t> exchange_mpi(int rank, int world, std::span<const uint8_t> id) {
  auto comm = make_mpi_comm();  // throws in a build without MPI
  if (comm->rank() != rank || comm->world() != world)
    throw Error("rendezvous mpi: MPI says this process is rank " + std::to_string(comm->rank()) + " of " +
                std::to_string(comm->world()) + ", but it was given rank " + std::to_string(rank) + " of " +
                std::to_string(world) + " (take rank and world from MPI)");
  // Only rank 0 contributes bytes; every other entry is empty.
  auto all = comm->allgather_bytes(rank == 0 ? id : std::span<const uint8_t>{});
  if (all[0].size() != id.size())
    throw Error("rendezvous mpi: rank 0 sent " + std::to_string(all[0].size()) + " bytes, expected " +
                std::to_string(id.size()));
  return std::move(all[0]);
}

// Rank 0: PATH.tmp.<pid> written in full and fsynced, then renamed to PATH, so
// that a reader sees either no PATH or the whole id.
void write_id(const std::string& path, std::span<const uint8_t> id) {
  const std::string where = "rendezvous file:" + path + ": ";
  std::error_code ec;
  if (fs::exists(path, ec))
    throw Error(where + path +
                " already exists: pass a fresh path per run (a leftover would hand its stale id to "
                "the other ranks)");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(where + what + ": " + reason);
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create " + tmp);
  size_t done = 0;
  while (done < id.size()) {
    const ssize_t n = ::write(fd, id.data() + done, id.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("cannot write " + tmp);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("cannot fsync " + tmp);
  }
  if (::close(fd) != 0) fail("cannot close " + tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp + " to " + path);
}

// Ranks other than 0: poll every 50 ms until PATH holds n bytes, or time out.
std::vector<uint8_t> read_id(const std::string& path, int rank, size_t n, std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + timeout;
  std::string seen = "did not exist";
  for (;;) {
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (!ec && size == n) {
      std::vector<uint8_t> id(n);
      std::ifstream f(path, std::ios::binary);
      if (f.read(reinterpret_cast<char*>(id.data()), std::streamsize(n)) && size_t(f.gcount()) == n) return id;
      seen = "could not be read";
    } else if (!ec) {
      seen = "held " + std::to_string(size) + " bytes, expected " + std::to_string(n);
    }
    const auto now = clock::now();
    if (now >= deadline)  // rank 0 absent or silent: the environment's failure (exit 1), not the input's
      throw EnvironmentError("rendezvous file:" + path + ": rank " + std::to_string(rank) + " waited " + duration_text(timeout) +
                  " for rank 0 to write " + path + " (it " + seen + "); is rank 0 running with the same path?");
    std::this_thread::sleep_for(std::min<clock::duration>(std::chrono::milliseconds(50), deadline - now));
  }
}

}  // namespace

RendezvousSpec parse_rendezvous(const std::string& rendezvous) {
  if (rendezvous == "mpi") return {RendezvousSpec::Kind::mpi, {}};
  if (rendezvous.rfind("file:", 0) == 0 && rendezvous.size() > 5)
    return {RendezvousSpec::Kind::file, rendezvous.substr(5)};
  throw Error("rendezvous \"" + rendezvous +
              "\": expected \"mpi\" (ranks launched by mpirun) or \"file:PATH\" (a fresh file every rank can see)");
}

std::vector<uint8_t> exchange_id(const std::string& rendezvous, int rank, int world,
                                 std::span<const uint8_t> id_of_rank0, std::chrono::milliseconds timeout) {
  const RendezvousSpec spec = parse_rendezvous(rendezvous);
  if (world < 1 || rank < 0 || rank >= world)
    throw Error("rendezvous " + rendezvous + ": rank " + std::to_string(rank) + " of world " + std::to_string(world) +
                ": need world >= 1 and 0 <= rank < world");
  if (id_of_rank0.empty()) throw Error("rendezvous " + rendezvous + ": the id to exchange is empty");
  if (spec.kind == RendezvousSpec::Kind::mpi) return exchange_mpi(rank, world, id_of_rank0);
  if (rank != 0) return read_id(spec.path, rank, id_of_rank0.size(), timeout);
  write_id(spec.path, id_of_rank0);
  return {id_of_rank0.begin(), id_of_rank0.end()};
}

void release_rendezvous(const std::string& rendezvous, int rank) noexcept {
  if (rank != 0) return;
  try {
    const RendezvousSpec spec = parse_rendezvous(rendezvous);
    std::error_code ec;
    if (spec.kind == RendezvousSpec::Kind::file) fs::remove(spec.path, ec);
  } catch (...) {
  }
}

}  // namespace fp4lab
