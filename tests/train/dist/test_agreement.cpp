// Issue 42: data-parallel ranks agree on the run before their first
// size-dependent collective (train/dist/agreement.hpp), and no collective of
// the thread ranks waits forever (comm.hpp's timeout).
#include <doctest/doctest.h>

#include <chrono>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "train/config.hpp"
#include "train/dist/agreement.hpp"
#include "train/dist/comm.hpp"

using namespace fp4lab;
using namespace fp4lab::train;

namespace {

// Each thread rank's agree_on_run outcome: "" (agreed) or the error's text.
std::vector<std::string> agree(const std::vector<RunAgreement>& runs) {
  const int n = int(runs.size());
  auto comms = make_thread_comms(n);
  std::vector<std::string> out(size_t(n), "not run");
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r)
    t.emplace_back([&, r] {
      try {
        agree_on_run(*comms[size_t(r)], runs[size_t(r)]);
        out[size_t(r)] = "";
      } catch (const EnvironmentError& e) {
        out[size_t(r)] = std::string("environment: ") + e.what();
      } catch (const Error& e) {
        out[size_t(r)] = e.what();
      }
    });
  for (auto& th : t) th.join();
  return out;
}

}  // namespace

TEST_CASE("agree_on_run: equal runs pass; a different config hash fails on every rank, naming the first rank") {
  const RunAgreement a{"0123456789abcdef", 10, 5.0}, b{"fedcba9876543210", 10, 5.0};
  for (const std::string& s : agree({a, a, a})) CHECK(s == "");
  const std::string want =
      "rank 1's config differs from rank 0's (config_hash fedcba9876543210 vs 0123456789abcdef): launch every rank "
      "with the same config and --set options";
  for (const std::string& s : agree({a, b})) CHECK(s == want);
  // Ranks 1 and 2 both differ: every rank names rank 1, the first.
  for (const std::string& s : agree({a, b, b})) CHECK(s == want);
  for (const std::string& s : agree({a, a, b}))
    CHECK(s.rfind("rank 2's config differs from rank 0's (config_hash fedcba9876543210 vs ", 0) == 0);
}

TEST_CASE("agree_on_run: the same config with different step counts fails on every rank; the timeout is not compared") {
  const RunAgreement a{"0123456789abcdef", 10, 5.0}, b{"0123456789abcdef", 20, 5.0}, c{"0123456789abcdef", 10, 7.0};
  for (const std::string& s : agree({a, b})) {
    CHECK(s.rfind("rank 1's run has 20 steps, rank 0's 10", 0) == 0);
    CHECK(s.find("launch every rank with the same config") != std::string::npos);
  }
  for (const std::string& s : agree({a, c})) CHECK(s == "");
  // A world of one agrees with itself and sets the timeout.
  auto one = make_local_comm();
  agree_on_run(*one, RunAgreement{"x", 1, 2.5});
  CHECK(one->timeout() == std::chrono::milliseconds(2500));
  CHECK_THROWS_AS(agree_on_run(*one, RunAgreement{"x", 1, 0.0}), InternalError);  // the config refuses it first
}

TEST_CASE("thread communicator: a rank that never arrives makes the others throw after the timeout, not hang") {
  auto comms = make_thread_comms(3);
  for (auto& c : comms) c->set_timeout(std::chrono::milliseconds(200));
  comms[0]->set_step(7);
  std::vector<std::string> err(3);
  std::vector<double> waited(3, 0.0);
  std::vector<std::thread> t;
  // Ranks 0 and 1 all-reduce; rank 2 is stopped (never calls).
  for (int r = 0; r < 2; ++r)
    t.emplace_back([&, r] {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        std::vector<float> v{1.0f};
        comms[size_t(r)]->allreduce_sum(v);
      } catch (const EnvironmentError& e) {
        err[size_t(r)] = e.what();
      }
      waited[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  for (auto& th : t) th.join();
  // The first rank to time out names rank 2; the other either does too or says the world was given up.
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    CAPTURE(err[size_t(r)]);
    CHECK(waited[size_t(r)] < 5.0);
    CHECK(err[size_t(r)].find("no answer from rank 2 within 0.2 s during allreduce_sum") != std::string::npos);
    named = named || err[size_t(r)].rfind("rank " + std::to_string(r) + ": no answer from rank 2", 0) == 0;
  }
  CHECK(named);
  CHECK((err[0].find("at step 7; a rank stopped or died") != std::string::npos ||
         err[1].find("before the first step; a rank stopped or died") != std::string::npos));
  // The late rank finds the world given up at once.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(comms[2]->barrier(), doctest::Contains("given up after a timeout"), EnvironmentError);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
}

TEST_CASE("agree_on_run: a rank that never arrives is a timeout naming it (EnvironmentError), within the config's wait") {
  auto comms = make_thread_comms(2);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(agree_on_run(*comms[0], RunAgreement{"0123456789abcdef", 10, 0.25}),
                       "rank 0: no answer from rank 1 within 0.25 s during allgather_bytes before the first step; a "
                       "rank stopped or died (distributed.timeout_s sets the wait)",
                       EnvironmentError);
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 5.0);
}

TEST_CASE("no_answer_message: several silent ranks, and an engine that cannot tell which") {
  CHECK(no_answer_message(0, {1, 3}, std::chrono::milliseconds(5000), "MPI_Iallreduce(sum)", 12) ==
        "rank 0: no answer from ranks 1, 3 within 5 s during MPI_Iallreduce(sum) at step 12; a rank stopped or died "
        "(distributed.timeout_s sets the wait)");
  CHECK(no_answer_message(2, {}, std::chrono::milliseconds(600000), "ncclAllReduce", -1) ==
        "rank 2: no answer from the other rank(s) within 600 s during ncclAllReduce before the first step; a rank "
        "stopped or died (distributed.timeout_s sets the wait)");
}

TEST_CASE("config distributed.timeout_s: positive and finite; written when set, but not part of the run's identity") {
  using nlohmann::json;
  const json base = {{"name", "t"},
                     {"model", {{"type", "gpt"}, {"layers", 1}, {"heads", 2}, {"width", 32}, {"context", 16}}},
                     {"data", {{"type", "char"}, {"path", "text.txt"}}},
                     {"training", {{"batch_size", 4}, {"steps", 3}}}};
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    json j = base;
    j["distributed"] = {{"timeout_s", bad}};
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(config_from_json(j), doctest::Contains("config.distributed.timeout_s: "), Error);
  }
  CHECK(config_from_json(base).distributed.timeout_s == 600.0);
  json j = base;
  j["distributed"] = {{"timeout_s", 5}};
  const RunConfig c = config_from_json(j);
  CHECK(c.distributed.timeout_s == 5.0);
  const json resolved = config_to_json(c), plain = config_to_json(config_from_json(base));
  CHECK(resolved["distributed"] == json{{"timeout_s", 5.0}});  // the other distributed keys stay unwritten
  CHECK(config_from_json(resolved).distributed == c.distributed);
  CHECK(!plain.contains("distributed"));
  CHECK(config_hash(resolved) == config_hash(plain));  // ranks with different waits agree on the run
  j["distributed"]["zero"] = 1;
  json z = base;
  z["distributed"] = {{"zero", 1}};
  CHECK(config_hash(config_to_json(config_from_json(j))) == config_hash(config_to_json(config_from_json(z))));
  CHECK(config_hash(config_to_json(config_from_json(z))) != config_hash(plain));
}
