// The run directory's files and guards (the lifecycle is in train/run.hpp):
// checked, durable writes; the run lock; recovery of what a killed process
// left; the test-only fault points that kill or fail a process at each write
// and rename of a run (tests/cli/test_run_faults.py).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fp4lab::train {

// ---- fault points (tests) ----------------------------------------------------------------
// FP4LAB_FAULT=kill:N  the N-th fault point (1-based) of this process kills it (SIGKILL);
// FP4LAB_FAULT=fail:N  the N-th fault point fails as a full disk would (EnvironmentError, ENOSPC);
// FP4LAB_FAULT=list    each fault point prints "fp4lab fault point K: WHAT" on stderr.
// Unset (users): fault_point costs one branch. A bad FP4LAB_FAULT value is an Error naming it.
void fault_point(const char* what, const std::filesystem::path& path);

// ---- writes ---------------------------------------------------------------------------------
// Every write is checked: a failure throws EnvironmentError (disk full, read-only file system,
// permissions: exit 1) or Error, naming the file and the OS's reason.

// Writes `bytes` to <path>.tmp.<pid>, fsyncs it, renames it over `path` and fsyncs the directory:
// afterwards `path` holds either the old or the new bytes, never a mix, also across a power loss.
void write_atomic(const std::filesystem::path& path, const std::string& bytes);
// The same for content produced in pieces (a checkpoint of several GB is never held twice):
// write(p, n) appends to the temporary; commit() syncs and renames. Destroyed uncommitted, the
// temporary is removed.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();
  void write(const void* p, size_t n);
  void commit();

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
};

// metrics.jsonl: whole lines appended with one write(2) each (O_APPEND), every write checked;
// sync() makes the lines so far durable (before each checkpoint).
class LineLog {
 public:
  LineLog() = default;
  LineLog(const LineLog&) = delete;
  LineLog& operator=(const LineLog&) = delete;
  ~LineLog();
  void open(const std::filesystem::path& path);
  bool is_open() const { return fd_ >= 0; }
  void append(const std::string& line);  // `line` without its '\n'
  void sync();
  void close();

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

// fsync of a directory (after a rename or removal in it).
void sync_directory(const std::filesystem::path& dir);

// ---- the run lock ---------------------------------------------------------------------------
// An exclusive flock(2) on <dir>.lock, held for the life of the object: one process at a time
// trains, resumes, replaces or sweeps a run directory. The lock file records its holder (pid,
// host, command, start time); a second process gets an EnvironmentError naming them. The kernel
// releases the lock when its holder dies, however it dies, so no lock is ever stale; the file
// itself stays (removing it would race with a process that has just opened it). One process may
// take the same lock again (sweep locks every run first, then trains each): the holds are counted.
class RunLock {
 public:
  RunLock() = default;
  explicit RunLock(const std::filesystem::path& dir);
  RunLock(RunLock&& o) noexcept;
  RunLock& operator=(RunLock&& o) noexcept;
  ~RunLock();

 private:
  void release();
  std::string key_;
};
// The path of dir's lock file.
std::filesystem::path lock_path(const std::filesystem::path& dir);

// ---- recovery (call with the lock held) -------------------------------------------------------
// Removes what killed writes of this run left: <dir>.tmp.<pid>/ (a directory being created),
// <dir>/<file>.tmp.<pid> and <dir>/capture/<step>.tmp.<pid>. Returns one note line per removal.
std::string remove_stale_temporaries(const std::filesystem::path& dir);

// Finishes what a killed --force left: <dir>.old.<pid> is the replaced run. If <dir> holds no
// checkpoint (the new run had not reached its first), the old run moves back into <dir> (the
// unfinished new one is removed); otherwise the new run stands and the old one is removed, as
// --force promises. Returns the note lines.
std::string recover_set_aside(const std::filesystem::path& dir);

// "" if `dir` is an fp4lab run directory (its config.json is a resolved config, and it holds only
// the files a run writes); else why not ("holds notes.txt, which no run writes"). --force replaces
// only runs.
std::string not_a_run(const std::filesystem::path& dir);

// ---- reads ------------------------------------------------------------------------------------
// Reads metrics.jsonl: every line must parse (errors name file:line), except,
// with `torn` given, an unparseable last line (a write cut short): it is
// dropped and *torn names it ("FILE:LINE: ..."), else *torn is left empty.
std::vector<nlohmann::json> read_metrics(const std::string& path, std::string* torn = nullptr);

}  // namespace fp4lab::train
