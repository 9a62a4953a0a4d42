// Atomic file and directory writes (include/strata/checkpoint/atomic.h).
//
// Every system call is checked; a failure is a CheckpointError carrying the
// call, the path and the errno text.
#include "strata/checkpoint/atomic.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

using ::strata::detail::cat;

std::atomic<uint64_t> g_sibling_counter{0};

// Throws "<what>: <strerror> (errno N)" for a failure whose errno was saved.
[[noreturn]] void fail(int err, const std::string& what) {
  throw CheckpointError(cat(what, ": ", ::strata::detail::errno_string(err)));
}

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string parent_dir(const std::string& path) {
  const std::string p = strip_trailing_slashes(path);
  const auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

bool exists(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return true;
  const int err = errno;
  STRATA_CHECK(err == ENOENT || err == ENOTDIR, CheckpointError, "[checkpoint] ", path,
               ": lstat failed: ", ::strata::detail::errno_string(err));
  return false;
}

bool is_empty_dir(const std::string& path) {
  std::error_code ec;
  const bool empty = std::filesystem::is_directory(path, ec) &&
                     std::filesystem::directory_iterator(path, ec) ==
                         std::filesystem::directory_iterator();
  return empty && !ec;
}

void checked_rename(const std::string& from, const std::string& to) {
  STRATA_CHECK_SYSCALL(::rename(from.c_str(), to.c_str()), CheckpointError,
                       "[checkpoint] renaming ", from, " to ", to);
}

}  // namespace

std::string unique_sibling(const std::string& path, const std::string& tag,
                           const std::string& suffix) {
  const std::string base = strip_trailing_slashes(path);
  for (;;) {
    std::string candidate =
        cat(base, tag, "-", ::getpid(), "-", g_sibling_counter.fetch_add(1), suffix);
    if (!exists(candidate)) return candidate;
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  STRATA_CHECK_SYSCALL(fd, CheckpointError, "[checkpoint] opening directory ", dir, " to fsync it");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc == -1) fail(err, cat("[checkpoint] fsync of directory ", dir, " failed"));
}

// ---- AtomicFile ---------------------------------------------------------------

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_path_ = unique_sibling(path_, ".tmp");
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ == -1) detail::throw_write_error(errno, path_, cat("creating ", temp_path_));
}

AtomicFile::~AtomicFile() { discard(); }

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)) {
  other.temp_path_.clear();
}

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
  if (this != &other) {
    discard();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    other.temp_path_.clear();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    ::unlink(temp_path_.c_str());  // best effort: we are already failing
  }
}

void AtomicFile::write(const void* data, size_t size) {
  STRATA_CHECK(fd_ >= 0, CheckpointError, "[checkpoint] ", path_, ": write after commit");
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, bytes, std::min<size_t>(size, size_t(1) << 30));
    if (n == -1 && errno == EINTR) continue;
    if (n == -1) detail::throw_write_error(errno, path_, cat("writing ", size, " bytes"));
    bytes += n;
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::write_at(const void* data, size_t size, size_t offset) {
  STRATA_CHECK(fd_ >= 0, CheckpointError, "[checkpoint] ", path_, ": write after commit");
  const char* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n =
        ::pwrite(fd_, bytes, std::min<size_t>(size, size_t(1) << 30), static_cast<off_t>(offset));
    if (n == -1 && errno == EINTR) continue;
    if (n == -1) detail::throw_write_error(errno, path_, cat("writing ", size, " bytes at offset ", offset));
    bytes += n;
    offset += static_cast<size_t>(n);
    size -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  STRATA_CHECK(fd_ >= 0, CheckpointError, "[checkpoint] ", path_, ": commit called twice");
  // On failure the destructor (discard) removes the temporary file.
  if (::fsync(fd_) == -1) detail::throw_write_error(errno, path_, "flushing it to disk (fsync)");
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) == -1) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    detail::throw_write_error(err, path_, "closing it");
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) == -1) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    fail(err, cat("[checkpoint] renaming ", temp_path_, " to ", path_, " failed"));
  }
  fsync_dir(parent_dir(path_));
}

void atomic_write_file(const std::string& path, const std::string& contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

// ---- directories ------------------------------------------------------------

bool is_complete(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  const std::string marker = strip_trailing_slashes(path) + "/" + kCompleteMarker;
  // lstat: a marker that is a symbolic link does not count.
  return ::lstat(marker.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void remove_all(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  STRATA_CHECK(!ec, CheckpointError, "[checkpoint] removing ", path, ": ", ec.message());
}

// Note [Atomic checkpoint directories]
// A checkpoint is built in a staging directory S = "PATH.tmp-<pid>-<n>@<host>":
// every file is written and fsynced (AtomicFile), then the marker
// ".complete" is written last and S is fsynced. Only then is S published:
//  - PATH absent (or an empty directory): rename(S, PATH), fsync PATH's
//    parent. A crash before the rename leaves PATH as it was (absent) and S
//    behind; after it, PATH is complete.
//  - PATH a complete checkpoint: renameat2(S, PATH, RENAME_EXCHANGE) swaps
//    the two names in one step, so PATH is at every instant either the old
//    or the new complete checkpoint; the old one, now named S, is removed.
//    A crash before the removal only leaves garbage under the staging name.
//  - where the file system cannot exchange (EINVAL, ENOSYS, ENOTSUP, e.g.
//    some network file systems): rename PATH aside to "PATH.old-<pid>-<n>",
//    rename S to PATH, fsync, remove the old one. A crash between the two
//    renames leaves PATH absent and the old complete checkpoint at
//    PATH.old-*; CheckpointReader::open finds it there.
// Leftover staging directories never carry the marker under PATH's name, so
// they are never loaded; a later save removes them once their process is
// gone (Note [Leftover staging directories] in directory.cpp).
void publish_dir(const std::string& staging_in, const std::string& path_in) {
  const std::string staging = strip_trailing_slashes(staging_in);
  const std::string path = strip_trailing_slashes(path_in);
  STRATA_CHECK(is_complete(staging), CheckpointError, "[checkpoint] cannot publish ", staging,
               " as ", path, ": it has no completion marker");
  const std::string parent = parent_dir(path);
  if (!exists(path) || is_empty_dir(path)) {
    checked_rename(staging, path);
    fsync_dir(parent);
    return;
  }
  STRATA_CHECK(is_complete(path), CheckpointError, "[checkpoint] ", path,
               " exists and is not a complete strata checkpoint; refusing to replace it (move or "
               "delete it, or save elsewhere)");
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_dir(parent);
    remove_all(staging);  // now holds the previous checkpoint
    return;
  }
  const int err = errno;
  if (err != EINVAL && err != ENOSYS && err != ENOTSUP)
    fail(err, cat("[checkpoint] exchanging ", staging, " and ", path, " failed"));
  detail::replace_dir_by_renames(staging, path);
}

namespace detail {
// Note [Write errors name the file]
// A failed write, fsync or create of a checkpoint file is the user's
// problem (a full disk, a quota), not strata's: the message names the file
// being written, says what happened in words and what to do, without the
// failing expression or a source location. Any other errno keeps its text.
void throw_write_error(int err, const std::string& path, const std::string& what) {
  if (err == ENOSPC || err == EDQUOT) {
    throw CheckpointError(cat("[checkpoint] ", path, ": ",
                              err == ENOSPC ? "no space left on device" : "disk quota exceeded",
                              " while ", what,
                              "; free space on that file system or save to another folder, then "
                              "save again (earlier checkpoints are untouched)"));
  }
  throw CheckpointError(cat("[checkpoint] ", path, ": ", what, " failed: ",
                            ::strata::detail::errno_string(err)));
}

void replace_dir_by_renames(const std::string& staging, const std::string& path) {
  const std::string aside = unique_sibling(path, ".old");
  checked_rename(path, aside);
  checked_rename(staging, path);
  fsync_dir(parent_dir(path));
  remove_all(aside);
}
}  // namespace detail

}  // namespace strata::checkpoint
