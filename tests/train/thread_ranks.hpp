// run_training (train/run.hpp) on in-process thread ranks (make_thread_comms),
// shared by the data- and expert-parallel run tests of both backends.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "train/checkpoint.hpp"
#include "train/config.hpp"
#include "train/dist/comm.hpp"
#include "train/run.hpp"

namespace fp4lab::train::test {

// A fresh directory under the system's temporary one, <prefix><pid> (the tests' run directories).
inline std::filesystem::path scratch_dir(const std::string& prefix) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d;
}

// The ZeRO-3 tests' run (test_zero3_training.cpp, test_zero3_nvfp4.cpp, cuda/test_zero3_cuda.cpp): a 2-block GPT
// of `width` (40: 16x16 tiles cut at 32, partial tiles and odd unit sizes; 24: the dense tests') on the char text
// `text`, 6 steps of 10 samples, loss scale 8, weight decay 0.1, clipping off (the norm's partial sums follow the
// shard layout), evaluations at the start, after 3 and after 6 steps; `recipe` on `backend`.
inline nlohmann::json zero3_config(const std::string& text, const std::string& out, const std::string& name, int width,
                                   const std::string& recipe = "fp32", const std::string& backend = "cpu") {
  return nlohmann::json{
      {"name", name},
      {"model", {{"type", "gpt"}, {"layers", 2}, {"heads", 2}, {"width", width}, {"context", 8}, {"dropout", 0.0}}},
      {"data", {{"type", "char"}, {"path", text}}},
      {"training",
       {{"batch_size", 10},
        {"steps", 6},
        {"lr", 1e-2},
        {"grad_clip", 0.0},
        {"weight_decay", 0.1},
        {"loss_scale", 8.0},
        {"eval_interval", 3},
        {"eval_iters", 1},
        {"log_interval", 1}}},
      {"recipe", recipe},
      {"backend", backend},
      {"seed", 3},
      {"threads", 1},
      {"output", {{"dir", out}}}};
}

// A communicator put around each thread rank's (a decorator; null: none).
using WrapComm = std::function<std::unique_ptr<Communicator>(Communicator&)>;

// The config cfgj run on `world` thread ranks (RunOptions resume / stop_after as given; `wrap` around each
// rank's communicator); rank 0's result. The first rank's error is thrown as Error; every rank's final
// parameters are checked equal.
inline RunResult run_on_threads(int world, const nlohmann::json& cfgj, bool resume = false, int64_t stop_after = -1,
                                const WrapComm& wrap = nullptr) {
  const RunConfig cfg = config_from_json(cfgj);
  auto comms = make_thread_comms(world);
  if (wrap) {
    std::vector<std::unique_ptr<Communicator>> inner = std::move(comms);
    for (auto& c : inner) comms.push_back(wrap(*c));
    for (auto& c : inner) comms.push_back(std::move(c));  // kept alive behind the wrappers
  }
  std::vector<RunResult> res(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> th;
  for (int r = 0; r < world; ++r)
    th.emplace_back([&, r] {
      std::ostringstream log;
      RunOptions o;
      o.resume = resume;
      o.stop_after = stop_after;
      o.progress = false;
      o.log = &log;
      o.comm = comms[size_t(r)].get();
      try {
        res[size_t(r)] = run_training(cfg, o);
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : th) t.join();
  for (const auto& e : errors)
    if (!e.empty()) throw Error(e);
  for (int r = 1; r < world; ++r) CHECK(res[size_t(r)].final_params == res[0].final_params);
  return res[0];
}

// The evaluation records of a run's metrics.jsonl, in order.
inline std::vector<nlohmann::json> evals(const RunResult& r) {
  std::vector<nlohmann::json> out;
  std::ifstream f(std::filesystem::path(r.dir) / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("eval", false)) out.push_back(j);
  }
  return out;
}

// b the same run as a bit for bit: every step loss, the final parameters, the `n_evals` evaluation records,
// the checkpoint's masters and moments.
inline void check_same_run(const RunResult& a, const RunResult& b, size_t n_evals) {
  REQUIRE(b.status == "completed");
  CHECK(b.step_losses == a.step_losses);
  CHECK(b.final_params == a.final_params);
  const std::vector<nlohmann::json> ea = evals(a), eb = evals(b);
  REQUIRE(ea.size() == n_evals);
  CHECK(eb == ea);
  const int64_t n = int64_t(a.final_params.size());
  const Checkpoint x = load_checkpoint(std::filesystem::path(a.dir) / "checkpoint.bin", n);
  const Checkpoint y = load_checkpoint(std::filesystem::path(b.dir) / "checkpoint.bin", n);
  CHECK(x.values == y.values);
  CHECK(x.m == y.m);
  CHECK(x.v == y.v);
}

}  // namespace fp4lab::train::test
