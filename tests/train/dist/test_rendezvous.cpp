// The rendezvous of a run's ranks (train/dist/rendezvous.hpp): the forms it
// accepts, rank 0's bytes through a file to thread ranks that start before
// and after rank 0 writes, and its errors (a bad form or rank, an existing
// file, a timeout naming the path, a file of the wrong size).
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "train/dist/comm.hpp"
#include "train/dist/rendezvous.hpp"

using namespace fp4lab;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A path in the temp directory that no other test (or process) uses.
std::string fresh_path(const char* tag) {
  static std::atomic<int> n{0};
  const fs::path p =
      fs::temp_directory_path() / ("fp4lab_rdv_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + "_" + tag);
  fs::remove(p);
  return p.string();
}

std::vector<uint8_t> test_id(size_t n) {
  std::vector<uint8_t> id(n);
  for (size_t i = 0; i < n; ++i) id[i] = uint8_t(i * 37 + 11);
  return id;
}

}  // namespace

TEST_CASE("rendezvous: the valid forms parse; anything else is a one-line error listing them") {
  CHECK(parse_rendezvous("mpi").kind == RendezvousSpec::Kind::mpi);
  const RendezvousSpec f = parse_rendezvous("file:/tmp/run 7/id");
  CHECK(f.kind == RendezvousSpec::Kind::file);
  CHECK(f.path == "/tmp/run 7/id");
  for (const char* bad : {"", "file:", "MPI", "mpi:", "tcp:host:29500", "file", " file:/x"}) {
    CAPTURE(std::string(bad));
    try {
      parse_rendezvous(bad);
      FAIL("accepted");
    } catch (const Error& e) {
      const std::string m = e.what();
      CHECK(m.find("expected \"mpi\"") != std::string::npos);
      CHECK(m.find("\"file:PATH\"") != std::string::npos);
      CHECK(m.find('\n') == std::string::npos);
    }
  }
  const std::vector<uint8_t> id = test_id(8);
  CHECK_THROWS_WITH_AS(exchange_id("tcp:x", 0, 2, id), doctest::Contains("expected \"mpi\""), Error);
  CHECK_THROWS_WITH_AS(exchange_id("file:" + fresh_path("r"), 2, 2, id), doctest::Contains("0 <= rank < world"), Error);
  CHECK_THROWS_WITH_AS(exchange_id("file:" + fresh_path("w"), 0, 0, id), doctest::Contains("world >= 1"), Error);
  CHECK_THROWS_WITH_AS(exchange_id("file:" + fresh_path("e"), 0, 1, {}), doctest::Contains("empty"), Error);
  if (!have_mpi()) CHECK_THROWS_WITH_AS(exchange_id("mpi", 0, 1, id), doctest::Contains("without MPI"), Error);
}

TEST_CASE("rendezvous file: every thread rank gets rank 0's bytes, whether it starts before or after the write") {
  for (int world : {1, 2, 5}) {
    for (auto rank0_delay : {0ms, 200ms}) {  // 200 ms: the readers poll a few times first
      CAPTURE(world);
      CAPTURE(rank0_delay.count());
      const std::string path = fresh_path("ok");
      const std::string rv = "file:" + path;
      const std::vector<uint8_t> id = test_id(128);
      std::vector<std::vector<uint8_t>> got(static_cast<size_t>(world));
      std::vector<std::string> errors(static_cast<size_t>(world));
      std::vector<std::thread> ranks;
      for (int r = 0; r < world; ++r)
        ranks.emplace_back([&, r] {
          try {
            if (r == 0) std::this_thread::sleep_for(rank0_delay);
            // Other ranks pass a buffer of the right size and wrong contents.
            const std::vector<uint8_t> mine = r == 0 ? id : std::vector<uint8_t>(id.size(), 0xEE);
            got[size_t(r)] = exchange_id(rv, r, world, mine, 10s);
          } catch (const std::exception& e) {
            errors[size_t(r)] = e.what();
          }
        });
      for (auto& t : ranks) t.join();
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        CHECK(errors[size_t(r)] == "");
        CHECK(got[size_t(r)] == id);
      }
      CHECK(fs::exists(path));
      CHECK(!fs::exists(path + ".tmp." + std::to_string(::getpid())));  // renamed, not left behind
      release_rendezvous(rv, 1);                                        // only rank 0 removes it
      CHECK(fs::exists(path));
      release_rendezvous(rv, 0);
      CHECK(!fs::exists(path));
      release_rendezvous(rv, 0);  // already gone: no error
    }
  }
}

TEST_CASE("rendezvous file: an existing path at rank 0's start is an error naming it, and is left as it was") {
  const std::string path = fresh_path("stale");
  std::ofstream(path, std::ios::binary) << "stale id";
  try {
    exchange_id("file:" + path, 0, 2, test_id(16), 1s);
    FAIL("an existing rendezvous file was accepted");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find(path + " already exists") != std::string::npos);
    CHECK(m.find("fresh path per run") != std::string::npos);
  }
  CHECK(fs::file_size(path) == 8);
  fs::remove(path);
}

TEST_CASE("rendezvous file: a rank that never sees the file times out with the path and what it saw") {
  const std::string path = fresh_path("never");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    exchange_id("file:" + path, 1, 2, test_id(128), 150ms);
    FAIL("no timeout");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("rendezvous file:" + path + ": rank 1 waited 150 ms for rank 0 to write " + path) == 0);
    CHECK(m.find("did not exist") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= 150ms);
  CHECK(waited < 5s);

  // A file of the wrong size (another run's, or a different id size) is never taken.
  std::ofstream(path, std::ios::binary) << "abc";
  CHECK_THROWS_WITH_AS(exchange_id("file:" + path, 1, 2, test_id(128), 100ms),
                       doctest::Contains("held 3 bytes, expected 128"), Error);
  fs::remove(path);
}
