// The run directory's files and guards (run_files.hpp).
#include "train/run_files.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <vector>
#include <mutex>
#include <system_error>

#include "core/error.hpp"
#include "core/json.hpp"
#include "train/config.hpp"

namespace fp4lab::train {

namespace fs = std::filesystem;

// ---- fault points ---------------------------------------------------------------------------------

namespace {

struct FaultPlan {
  enum Mode { none, kill, fail, list } mode = none;
  long at = 0;
  long seen = 0;
};

FaultPlan parse_fault_plan() {
  FaultPlan p;
  const char* env = std::getenv("FP4LAB_FAULT");
  if (!env || !*env) return p;
  const std::string s = env;
  if (s == "list") {
    p.mode = FaultPlan::list;
    return p;
  }
  const size_t colon = s.find(':');
  const std::string mode = s.substr(0, colon);
  char* end = nullptr;
  const long n = colon == std::string::npos ? 0 : std::strtol(s.c_str() + colon + 1, &end, 10);
  if ((mode != "kill" && mode != "fail") || n < 1 || !end || *end)
    throw Error("FP4LAB_FAULT='" + s + "': valid: kill:N, fail:N (N >= 1) or list (a test hook)");
  p.mode = mode == "kill" ? FaultPlan::kill : FaultPlan::fail;
  p.at = n;
  return p;
}

}  // namespace

void fault_point(const char* what, const fs::path& path) {
  static FaultPlan plan = parse_fault_plan();
  if (plan.mode == FaultPlan::none) return;
  const long k = ++plan.seen;
  if (plan.mode == FaultPlan::list) {
    std::fprintf(stderr, "fp4lab fault point %ld: %s %s\n", k, what, path.c_str());
    return;
  }
  if (k != plan.at) return;
  if (plan.mode == FaultPlan::kill) ::kill(::getpid(), SIGKILL);
  throw_errno(path.string() + ": " + what + " failed", ENOSPC);
}

// ---- writes -----------------------------------------------------------------------------------------

namespace {

void write_all(int fd, const void* p, size_t n, const fs::path& path) {
  const auto* s = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw_errno(path.string() + ": write failed", errno);
    s += w, n -= size_t(w);
  }
}

void sync_fd(int fd, const fs::path& path) {
  if (::fsync(fd) != 0 && errno != EINVAL) throw_errno(path.string() + ": fsync failed", errno);
}

fs::path parent_dir(const fs::path& p) { return p.parent_path().empty() ? fs::path(".") : p.parent_path(); }

}  // namespace

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno(dir.string() + ": cannot open the directory to sync it", errno);
  const int r = ::fsync(fd), e = errno;
  ::close(fd);
  if (r != 0 && e != EINVAL) throw_errno(dir.string() + ": fsync failed", e);
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  tmp_ = path_.string() + ".tmp." + std::to_string(::getpid());
  fault_point("create", tmp_);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno(tmp_.string() + ": cannot create", errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* p, size_t n) { write_all(fd_, p, n, tmp_); }

void AtomicFile::commit() {
  fault_point("sync", tmp_);
  sync_fd(fd_, tmp_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    const int e = errno;
    ::unlink(tmp_.c_str());
    throw_errno(tmp_.string() + ": close failed", e);
  }
  fd_ = -1;
  fault_point("rename", path_);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    throw_errno("cannot rename " + tmp_.string() + " to " + path_.string(), e);
  }
  sync_directory(parent_dir(path_));
}

void write_atomic(const fs::path& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

LineLog::~LineLog() {
  if (fd_ >= 0) ::close(fd_);
}

void LineLog::open(const fs::path& path) {
  close();
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno(path.string() + ": cannot open for appending", errno);
}

void LineLog::append(const std::string& line) {
  fault_point("append a line to", path_);
  write_all(fd_, (line + "\n").data(), line.size() + 1, path_);
}

void LineLog::sync() {
  if (fd_ >= 0) sync_fd(fd_, path_);
}

void LineLog::close() {
  if (fd_ < 0) return;
  const int r = ::close(fd_), e = errno;
  fd_ = -1;
  if (r != 0) throw_errno(path_.string() + ": close failed", e);
}

// ---- the run lock -----------------------------------------------------------------------------------

namespace {

struct HeldLock {
  int fd = -1;
  int holds = 0;
};
std::mutex g_locks_mutex;
std::map<std::string, HeldLock> g_locks;  // by the lock file's absolute path

std::string hostname() {
  char b[256] = {};
  ::gethostname(b, sizeof b - 1);
  return b;
}

std::string read_small(int fd) {
  std::string s(512, '\0');
  const ssize_t r = ::pread(fd, s.data(), s.size(), 0);
  s.resize(r > 0 ? size_t(r) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  for (char& c : s)
    if (c == '\n' || (unsigned char)c < 0x20) c = ' ';
  return s;
}

}  // namespace

fs::path lock_path(const fs::path& dir) {
  fs::path d = dir;
  while (!d.empty() && d.filename().empty()) d = d.parent_path();  // "runs/x/" -> "runs/x"
  return d.string() + ".lock";
}

RunLock::RunLock(const fs::path& dir) {
  const fs::path lp = fs::absolute(lock_path(dir)).lexically_normal();
  std::lock_guard<std::mutex> g(g_locks_mutex);
  auto it = g_locks.find(lp.string());
  if (it != g_locks.end()) {
    ++it->second.holds;
    key_ = lp.string();
    return;
  }
  std::error_code ec;
  fs::create_directories(parent_dir(lp), ec);  // output.dir may not exist yet
  const int fd = ::open(lp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno(lp.string() + ": cannot open the run's lock file", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    const std::string holder = read_small(fd);
    ::close(fd);
    if (e == EWOULDBLOCK)
      throw EnvironmentError(dir.string() + " is in use by another fp4lab process (" +
                             (holder.empty() ? std::string("holder unknown") : holder) + ", lock " + lp.string() +
                             "); wait for it to end, or stop it");
    throw_errno(lp.string() + ": cannot lock", e);
  }
  // This process's command line (Linux), for the message a second process prints.
  std::string cmd;
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::getline(f, cmd, '\x01');
  for (char& c : cmd)
    if (c == '\0' || c == '\n') c = ' ';
  while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
  if (cmd.size() > 160) cmd = cmd.substr(0, 157) + "...";
  if (cmd.empty()) cmd = "fp4lab";
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  const std::string who =
      "pid " + std::to_string(::getpid()) + " on " + hostname() + ", `" + cmd + "`, since " + when + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) != ssize_t(who.size())) {
    const int e = errno;
    ::close(fd);
    throw_errno(lp.string() + ": cannot write the run's lock file", e);
  }
  g_locks[lp.string()] = HeldLock{fd, 1};
  key_ = lp.string();
}

RunLock::RunLock(RunLock&& o) noexcept : key_(std::move(o.key_)) { o.key_.clear(); }

RunLock& RunLock::operator=(RunLock&& o) noexcept {
  if (this != &o) {
    release();
    key_ = std::move(o.key_);
    o.key_.clear();
  }
  return *this;
}

RunLock::~RunLock() { release(); }

void RunLock::release() {
  if (key_.empty()) return;
  std::lock_guard<std::mutex> g(g_locks_mutex);
  auto it = g_locks.find(key_);
  if (it != g_locks.end() && --it->second.holds == 0) {
    ::ftruncate(it->second.fd, 0);  // no holder any more
    ::close(it->second.fd);         // releases the flock
    g_locks.erase(it);
  }
  key_.clear();
}

// ---- recovery ---------------------------------------------------------------------------------------

namespace {

// "<stem>.<tag>.<digits>": the names this code gives temporaries (tag "tmp") and set-aside runs ("old").
bool tagged_name(const std::string& name, const std::string& stem, const std::string& tag) {
  const std::string head = stem + "." + tag + ".";
  if (name.size() <= head.size() || name.compare(0, head.size(), head) != 0) return false;
  for (size_t i = head.size(); i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return false;
  return true;
}

// A temporary named "<anything>.tmp.<digits>".
bool temporary_name(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  return at != std::string::npos && at > 0 && tagged_name(name, name.substr(0, at), "tmp");
}

void remove_noted(const fs::path& p, std::string& notes) {
  std::error_code ec;
  fs::remove_all(p, ec);
  notes += ec ? "warning: could not remove " + p.string() + " (" + ec.message() + ")\n"
              : "note: removed " + p.string() + ", left by an fp4lab process that was killed while writing it\n";
}

// The first entry of `dir` that no run writes ("" if none): a run holds config.json, metrics.jsonl,
// checkpoint.bin, summary.json, numerics.jsonl, capture/ and temporaries of these.
std::string foreign_entry(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), e; !ec && it != e; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    const bool file = n == "config.json" || n == "metrics.jsonl" || n == "checkpoint.bin" || n == "summary.json" ||
                      n == "numerics.jsonl";
    std::error_code st;
    if (file && !it->is_regular_file(st)) return n + " (not a regular file: a FIFO, device or directory)";
    const bool known = file || (n == "capture" && it->is_directory(st)) || temporary_name(n);
    if (!known) return n;
  }
  return ec ? "an unreadable entry (" + ec.message() + ")" : "";
}

}  // namespace

std::string remove_stale_temporaries(const fs::path& dir) {
  std::string notes;
  std::error_code ec;
  const fs::path parent = parent_dir(dir);
  const std::string stem = dir.filename().string();
  for (fs::directory_iterator it(parent, ec), e; !ec && it != e; it.increment(ec))
    if (tagged_name(it->path().filename().string(), stem, "tmp")) remove_noted(it->path(), notes);
  for (const fs::path& d : {dir, dir / "capture"}) {
    std::error_code ec2;
    if (!fs::is_directory(d, ec2)) continue;
    for (fs::directory_iterator it(d, ec2), e; !ec2 && it != e; it.increment(ec2))
      if (temporary_name(it->path().filename().string())) remove_noted(it->path(), notes);
  }
  return notes;
}

std::string recover_set_aside(const fs::path& dir) {
  std::string notes;
  std::error_code ec;
  const fs::path parent = parent_dir(dir);
  const std::string stem = dir.filename().string();
  std::vector<fs::path> asides;
  for (fs::directory_iterator it(parent, ec), e; !ec && it != e; it.increment(ec))
    if (tagged_name(it->path().filename().string(), stem, "old")) asides.push_back(it->path());
  if (asides.size() > 1)
    throw Error(dir.string() + ": " + std::to_string(asides.size()) + " runs set aside by interrupted --force runs (" +
                asides[0].string() + ", " + asides[1].string() +
                (asides.size() > 2 ? ", ..." : "") + "); keep one by moving it to " + dir.string() +
                " by hand and remove the others");
  for (const fs::path& old : asides) {
    const bool new_run_started = fs::exists(dir / "checkpoint.bin");
    if (new_run_started || fs::exists(dir)) {
      if (new_run_started) {
        fault_point("remove the replaced run", old);
        fs::remove_all(old);
        notes += "note: removed " + old.string() + ", the run an interrupted --force replaced (the new run in " +
                 dir.string() + " has its first checkpoint)\n";
        continue;
      }
      // The new run never reached its first checkpoint: nothing of it is kept.
      if (const std::string foreign = foreign_entry(dir); !foreign.empty())
        throw Error(dir.string() + " holds " + foreign + ", which no run writes, and " + old.string() +
                    " holds the run an interrupted --force set aside; move one of them by hand");
      fault_point("remove the unfinished replacement", dir);
      fs::remove_all(dir);
    }
    fault_point("move back the replaced run", old);
    fs::rename(old, dir);
    sync_directory(parent);
    notes += "note: moved " + old.string() + " back to " + dir.string() +
             ": an interrupted --force had set it aside, and its replacement never reached a checkpoint\n";
  }
  return notes;
}

std::string not_a_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "not a directory";
  if (const std::string foreign = foreign_entry(dir); !foreign.empty()) return "holds " + foreign + ", which no run writes";
  if (!fs::exists(dir / "config.json", ec)) return "has no config.json";
  try {
    const nlohmann::json j = read_json_file((dir / "config.json").string());
    if (!j.is_object() || !j.contains("recipe_resolved") || !j.contains("model"))
      return "its config.json is not a run's resolved config";
  } catch (const Error& e) {
    return std::string("its config.json is unreadable: ") + e.what();
  }
  return "";
}

std::vector<nlohmann::json> read_metrics(const std::string& path, std::string* torn) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_errno("cannot open " + path, errno);
  if (torn) torn->clear();
  std::vector<nlohmann::json> out;
  std::string line, bad;
  int64_t lineno = 0;
  // Lines of at most kMaxLine bytes (fp4lab writes a few hundred): a longer one is not a run's record.
  constexpr size_t kMaxLine = size_t(1) << 20;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.size() > kMaxLine)
      throw Error(path + ":" + std::to_string(lineno) + ": a line of " + std::to_string(line.size()) +
                  " bytes (at most 1 MiB); not a metrics file fp4lab writes");
    if (line.empty()) continue;
    if (!bad.empty()) throw Error(bad);  // an invalid line before the last: not a torn write
    try {
      out.push_back(parse_json(line, path + ":" + std::to_string(lineno)));
    } catch (const nlohmann::json::exception& e) {
      bad = path + ":" + std::to_string(lineno) + ": invalid JSON line: " + json_error_text(e.what());
      if (!torn) throw Error(bad);
      *torn = path + ":" + std::to_string(lineno) +
              ": dropped a torn last line (a run killed while writing it): " + text_excerpt(line);
    }
  }
  return out;
}

}  // namespace fp4lab::train
