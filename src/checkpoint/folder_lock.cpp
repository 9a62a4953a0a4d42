// One job per checkpoint folder (include/strata/checkpoint/folder_lock.h).
#include "strata/checkpoint/folder_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <system_error>
#include <thread>

#include "strata/checkpoint/input.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

using ::strata::detail::cat;
using ::strata::detail::errno_string;

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::string lock_file(const std::string& dir) {
  return (dir.empty() ? std::string(".") : dir) + "/" + kFolderLockFile;
}

// The record is exactly "pid <digits>\nhost <name>\n"; anything else (empty,
// or cut short while its holder writes it) records nobody.
FolderLockHolder parse_holder(const std::string& text) {
  FolderLockHolder holder;
  if (text.rfind("pid ", 0) != 0 || text.empty() || text.back() != '\n') return holder;
  const auto end_of_pid = text.find('\n');
  const std::string pid = text.substr(4, end_of_pid - 4);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos)
    return holder;
  const std::string rest = text.substr(end_of_pid + 1);
  if (rest.rfind("host ", 0) != 0 || rest.size() < 7 || rest.find('\n') != rest.size() - 1)
    return holder;
  holder.pid = std::stol(pid);
  holder.host = rest.substr(5, rest.size() - 6);
  return holder;
}

// True when `holder` names a process that may still run: another host's
// (we cannot tell) or a live one on this host.
bool may_be_running(const FolderLockHolder& holder) {
  if (holder.pid <= 0) return false;
  if (holder.host != host_name()) return true;
  return ::kill(static_cast<pid_t>(holder.pid), 0) == 0 || errno != ESRCH;
}

}  // namespace

FolderLockHolder read_folder_lock_holder(const std::string& dir) {
  try {
    return parse_holder(read_regular_file(lock_file(dir), 4096));
  } catch (const std::exception&) {
    return {};
  }
}

// Note [One job per checkpoint folder]
// Two jobs saving into one folder interleave their step-N checkpoints, and
// both exit 0. So a job locks the folder first: flock(LOCK_EX | LOCK_NB) on
// "<dir>/.strata-lock", which the kernel releases when the holder's last
// descriptor closes, however the process ends; a lock left by a job killed
// with SIGKILL is therefore never stale, and the next job takes it. The
// file is never deleted (deleting it would let two jobs lock two different
// files under one name); its content, "pid P\nhost H\n", exists only for
// the refusal message and is cleared on release. A job refused reads it; if
// the holder has locked but not yet written its record (or the record is a
// killed job's, about to be overwritten) it waits briefly for the current
// one. The descriptor is close-on-exec: a launcher holds the lock, its
// workers (fork + exec) do not, so killing the launcher releases it and the
// workers never wait on it. A worker under a launcher that knows nothing of
// the folder (strata launch, srun) takes it itself: acquire_in_worker is
// refused only by a holder other than its parent.
FolderLock FolderLock::acquire(const std::string& dir, const std::string& label) {
  return take(dir, label, /*parent_may_hold=*/false);
}

FolderLock FolderLock::acquire_in_worker(const std::string& dir, const std::string& label) {
  return take(dir, label, /*parent_may_hold=*/true);
}

FolderLock FolderLock::take(const std::string& dir_in, const std::string& label, bool parent_may_hold) {
  const std::string dir = dir_in.empty() ? "." : dir_in;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  STRATA_CHECK(!ec, CheckpointError, "[checkpoint] ", label, " '", dir,
               "' cannot be created: ", ec.message());
  const std::string file = lock_file(dir);
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd == -1) {
    const int err = errno;
    throw CheckpointError(cat("[checkpoint] ", label, " '", dir, "': cannot open its lock file ",
                              file, ": ", errno_string(err)));
  }
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc == -1 && errno == EINTR);
  if (rc == -1) {
    const int err = errno;
    ::close(fd);
    if (err == ENOLCK || err == ENOTSUP || err == EOPNOTSUPP || err == ENOSYS) {
      warn(cat(label, " '", dir, "': this file system cannot lock ", file, " (",
               errno_string(err), "); a second job started on this folder will not be refused"));
      return FolderLock();
    }
    STRATA_CHECK(err == EWOULDBLOCK, CheckpointError, "[checkpoint] ", label, " '", dir,
                 "': locking ", file, " failed: ", errno_string(err));
    FolderLockHolder holder = read_folder_lock_holder(dir);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (!may_be_running(holder) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      holder = read_folder_lock_holder(dir);
    }
    if (parent_may_hold && holder.pid == static_cast<long>(::getppid()) && holder.host == host_name())
      return FolderLock();  // the launcher holds it for this job
    const std::string who = may_be_running(holder)
                                ? cat("pid ", holder.pid, " on host ", holder.host)
                                : std::string("a process that has not recorded its pid");
    throw CheckpointError(cat(
        "[checkpoint] ", label, " '", dir, "' is in use by another job: ", who,
        " holds its lock (", file, "). Two jobs saving into one folder would mix their "
        "checkpoints; wait for that job to end or stop it, or give this job another ", label));
  }
  FolderLock lock(file, fd);
  const std::string record = cat("pid ", ::getpid(), "\nhost ", host_name(), "\n");
  ssize_t written = -1;
  if (::ftruncate(fd, 0) == 0) {
    do {
      written = ::pwrite(fd, record.data(), record.size(), 0);
    } while (written == -1 && errno == EINTR);
  }
  if (written != static_cast<ssize_t>(record.size())) {
    const int err = written == -1 ? errno : ENOSPC;
    throw CheckpointError(cat("[checkpoint] ", label, " '", dir, "': writing the holder to ", file,
                              " failed: ", errno_string(err)));
  }
  return lock;
}

FolderLock::~FolderLock() { release(); }

FolderLock::FolderLock(FolderLock&& other) noexcept
    : file_(std::move(other.file_)), fd_(std::exchange(other.fd_, -1)) {
  other.file_.clear();
}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    release();
    file_ = std::move(other.file_);
    other.file_.clear();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void FolderLock::release() noexcept {
  if (fd_ < 0) return;
  // Cleared while still held, so nobody reads a finished job as the holder.
  if (::ftruncate(fd_, 0) != 0) {
    // best effort: the record then names a finished job, which no refusal shows
  }
  ::close(fd_);  // releases the lock
  fd_ = -1;
  file_.clear();
}

}  // namespace strata::checkpoint
