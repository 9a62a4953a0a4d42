// One job per checkpoint folder: a lock taken on the folder for the life of
// a job, so that a second job started on the same folder is refused instead
// of mixing its checkpoints with the first one's.
//
// The lock is flock(2) on the file kFolderLockFile inside the folder; the
// kernel releases it when its holder exits in any way (kill -9 included), so
// a lock left by a dead job is simply taken. The file records the holder's
// pid and host for the message a refused job prints. See Note [One job per
// checkpoint folder] in src/checkpoint/folder_lock.cpp and
// docs/checkpoints.md.
#pragma once

#include <string>
#include <utility>

namespace strata::checkpoint {

/// Name of the lock file inside a locked folder.
inline constexpr const char* kFolderLockFile = ".strata-lock";

/// The job recorded in a folder's lock file.
struct FolderLockHolder {
  /// The holder's process id; 0 when the file records none.
  long pid = 0;
  /// The holder's host name; empty when the file records none.
  std::string host;
};

/// Reads the holder recorded in `dir`'s lock file. Returns an empty holder
/// (pid 0) when there is no lock file or it records nobody (released, or
/// being written). Never throws. The record outlives a holder killed with
/// SIGKILL: only a failed lock attempt proves that it is current.
FolderLockHolder read_folder_lock_holder(const std::string& dir);

/// An exclusive lock on a folder, held from acquire() until the object is
/// destroyed or release() is called (or the process ends). Move-only; a
/// default-constructed FolderLock holds nothing. The descriptor is
/// close-on-exec, so processes this one starts with exec do not hold it.
class FolderLock {
 public:
  /// Locks `dir` (created when missing) for this process. `label` names the
  /// folder in messages the way the user gave it (e.g. "--ckpt-dir").
  /// Throws CheckpointError "[checkpoint] <label> '<dir>' is in use by
  /// another job: pid P on host H holds its lock ..." when another process
  /// (or another FolderLock in this one) holds it, and CheckpointError
  /// naming the path on a file-system error. Where the file system cannot
  /// lock files (ENOLCK, ENOTSUP) it warns and returns a lock that holds
  /// nothing (held() false).
  static FolderLock acquire(const std::string& dir, const std::string& label = "folder");
  /// For a worker of a launched job: like acquire(), except that when this
  /// process's parent (the launcher that started it, which took the lock
  /// for the whole job) holds the lock, it returns a lock that holds
  /// nothing instead of throwing. Under a launcher that took no lock
  /// (`strata launch`, srun) the worker takes it for the job.
  static FolderLock acquire_in_worker(const std::string& dir, const std::string& label = "folder");

  FolderLock() = default;
  ~FolderLock();
  FolderLock(FolderLock&& other) noexcept;
  FolderLock& operator=(FolderLock&& other) noexcept;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  /// Clears the record and releases the lock; nothing when none is held.
  void release() noexcept;
  /// True while this object holds the lock.
  bool held() const { return fd_ >= 0; }
  /// The lock file ("<dir>/.strata-lock"); empty for a lock that holds nothing.
  const std::string& file() const { return file_; }

 private:
  FolderLock(std::string file, int fd) : file_(std::move(file)), fd_(fd) {}
  static FolderLock take(const std::string& dir, const std::string& label, bool parent_may_hold);

  std::string file_;
  int fd_ = -1;
};

}  // namespace strata::checkpoint
