// Atomic file and directory writes: a crash (or an exception) at any moment
// leaves either the previous content or the new one under the final name,
// never a mixture or a partial file.
//
// Files: written to "<path>.tmp-<pid>-<n>", fsynced, renamed to <path>, then
// the parent directory is fsynced so the rename itself is durable.
//
// Directories (checkpoints): see Note [Atomic checkpoint directories] in
// src/checkpoint/atomic.cpp and docs/checkpoints.md. A complete checkpoint
// directory holds the marker file kCompleteMarker, written last.
#pragma once

#include <cstddef>
#include <string>

namespace strata::checkpoint {

/// Name of the completion marker inside a checkpoint directory.
inline constexpr const char* kCompleteMarker = ".complete";

/// A file written under a temporary name in the same directory and moved to
/// its final name by commit(). If the object is destroyed before commit()
/// (an exception, an early return) the temporary file is removed.
class AtomicFile {
 public:
  /// Creates the temporary file next to `path` (mode 0644). Throws
  /// CheckpointError with the path and errno text when it cannot.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `size` bytes (retrying short writes and EINTR). Throws
  /// CheckpointError on failure; a full disk reads "[checkpoint] <path>: no
  /// space left on device while writing N bytes; free space ...".
  void write(const void* data, size_t size);
  /// Writes `size` bytes at byte `offset` of the file (pwrite).
  void write_at(const void* data, size_t size, size_t offset);
  /// fsyncs the file, closes it, renames it to the final path (replacing an
  /// existing file there) and fsyncs the parent directory. Throws
  /// CheckpointError on any failure; the temporary file is then removed.
  void commit();

  /// The final path.
  const std::string& path() const { return path_; }
  /// The temporary path being written.
  const std::string& temp_path() const { return temp_path_; }
  /// The open descriptor of the temporary file (-1 after commit()).
  int fd() const { return fd_; }

 private:
  void discard() noexcept;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
};

/// Writes `contents` to `path` atomically (AtomicFile). Throws
/// CheckpointError with the path and errno text on failure.
void atomic_write_file(const std::string& path, const std::string& contents);

/// Returns a fresh sibling name "<path><tag>-<pid>-<n><suffix>" that does
/// not exist yet (n counts up within the process); `tag` is e.g. ".tmp".
std::string unique_sibling(const std::string& path, const std::string& tag,
                           const std::string& suffix = "");

/// fsyncs the directory `dir` so that entries created or renamed in it are
/// durable. Throws CheckpointError with the path and errno text.
void fsync_dir(const std::string& dir);

/// True when `path` is a directory holding the completion marker.
bool is_complete(const std::string& path);

/// Moves the complete staging directory `staging` (it must hold the marker)
/// to `path`, atomically replacing a previous complete checkpoint there, and
/// fsyncs the parent directory. Throws CheckpointError when `staging` is not
/// complete, or when `path` exists but is neither a complete checkpoint nor
/// an empty directory (so a user's directory is never replaced).
void publish_dir(const std::string& staging, const std::string& path);

namespace detail {
/// Throws the CheckpointError for `what` (e.g. "writing 12 bytes") failing
/// with `err` on the file `path`: for ENOSPC "[checkpoint] <path>: no space
/// left on device while <what>; free space ...", likewise for EDQUOT, else
/// "[checkpoint] <path>: <what> failed: <strerror> (errno N)".
[[noreturn]] void throw_write_error(int err, const std::string& path, const std::string& what);

/// publish_dir's fallback for file systems that cannot exchange two names:
/// replaces the complete checkpoint `path` by the complete `staging` with
/// two renames (old one aside to "PATH.old-<pid>-<n>", then deleted).
/// Exposed for tests.
void replace_dir_by_renames(const std::string& staging, const std::string& path);
}  // namespace detail

/// Removes `path` and everything below it (like `rm -r`); nothing happens
/// when it does not exist. Throws CheckpointError with the path and errno
/// text on failure.
void remove_all(const std::string& path);

}  // namespace strata::checkpoint
