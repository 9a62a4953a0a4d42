// Checkpoint directories: safetensors files plus metadata.json, saved
// atomically (atomic.h) and checked on load.
//
// A checkpoint PATH is a directory:
//   PATH/<name>.safetensors ...   tensors (names chosen by the caller)
//   PATH/metadata.json            {"format": "strata-checkpoint", "version": 1,
//                                  "files": [...], <caller's fields>}
//   PATH/.complete                completion marker, written last
// It is built in a staging directory "PATH.tmp-<pid>-<n>@<host>" and published
// under PATH only once complete. docs/checkpoints.md describes the layout.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "strata/checkpoint/safetensors.h"

namespace strata::checkpoint {

/// Value of metadata.json's "format" field.
inline constexpr const char* kCheckpointFormat = "strata-checkpoint";
/// Value of metadata.json's "version" field written by this build; readers
/// accept versions up to this one.
inline constexpr int kCheckpointVersion = 1;
/// Checks a checkpoint's metadata object (from `where`): "format" is
/// kCheckpointFormat and "version" one this build reads. Throws
/// CheckpointError naming `where` otherwise.
void check_checkpoint_format(const nlohmann::json& meta, const std::string& where);

/// Name of the metadata file inside a checkpoint directory.
inline constexpr const char* kMetadataFile = "metadata.json";
/// Name of the file inside a staging directory that says which process
/// (host, pid and the process's start time) is writing it; removed before
/// the save is published.
inline constexpr const char* kStagingOwner = ".staging-owner";

/// Removes the staging directories in `dir` left by interrupted saves:
/// "NAME.tmp-<pid>-<n>@<host>" made on this host by a process that no longer
/// runs (none with that pid, a zombie, or one whose start time differs from
/// the one the owner file records: the pid was reused), whatever their
/// owner file holds (missing, empty or cut short), and
/// the older "NAME.tmp-<pid>-<n>" whose owner file names this host and a
/// process that no longer runs. Returns the paths removed. Never removes
/// another host's or a live process's, nor an older-style one without an
/// owner file. CheckpointWriter::begin calls it on the checkpoint's parent
/// directory.
std::vector<std::string> remove_stale_staging(const std::string& dir);

/// Builds a checkpoint directory. One process begins the save (begin()),
/// every process that contributes files writes them into staging_dir()
/// (others attach with join()), and the beginning process commits once all
/// files are written (the caller synchronises, e.g. with a barrier).
/// Destroying the process that began without committing removes the staging
/// directory; a crash leaves it behind, harmless (PATH is untouched).
class CheckpointWriter {
 public:
  /// Starts a save to `path`: creates the staging directory next to it.
  /// Throws CheckpointError when `path` exists and is neither a complete
  /// checkpoint nor an empty directory, or on a file-system error.
  static CheckpointWriter begin(const std::string& path);
  /// Attaches to a save begun elsewhere whose staging directory is
  /// `staging_dir` (as returned by the other process's staging_dir()).
  /// Throws CheckpointError when it does not exist. A joined writer only
  /// writes files; it cannot commit.
  static CheckpointWriter join(const std::string& path, const std::string& staging_dir);

  ~CheckpointWriter();
  CheckpointWriter(CheckpointWriter&&) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&&) noexcept;
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Writes `<file>` (e.g. "model.safetensors") into the staging directory,
  /// fsynced. `file` must be a plain file name (no '/').
  void write_file(const std::string& file, const NamedTensors& tensors,
                  const Metadata& metadata = {});
  /// A streaming writer for `<file>` in the staging directory; close() it
  /// before commit().
  SafetensorsWriter open_file(const std::string& file, std::vector<TensorSpec> specs,
                              Metadata metadata = {});

  /// Writes metadata.json (the caller's object `metadata` plus "format",
  /// "version" and "files", the sorted list of .safetensors files present),
  /// then the marker, fsyncs the staging directory and publishes it as the
  /// checkpoint (publish_dir). Throws CheckpointError when `metadata` is not
  /// an object or uses a reserved field, when this writer joined, or on a
  /// file-system error.
  void commit(const nlohmann::json& metadata = nlohmann::json::object());

  /// The final path.
  const std::string& path() const { return path_; }
  /// The staging directory files are written to.
  const std::string& staging_dir() const { return staging_; }

 private:
  CheckpointWriter(std::string path, std::string staging, bool owner);
  std::string file_path(const std::string& file) const;

  std::string path_;
  std::string staging_;
  bool owner_ = false;
  bool committed_ = false;
};

/// Saves a checkpoint in one call: each entry of `files` (file name ->
/// tensors in order) becomes a safetensors file; `metadata` goes into
/// metadata.json. Atomic (CheckpointWriter).
void write_checkpoint_dir(const std::string& path, const std::map<std::string, NamedTensors>& files,
                          const nlohmann::json& metadata = nlohmann::json::object());

/// A complete checkpoint directory opened for reading.
class CheckpointReader {
 public:
  /// Opens `path`. Throws CheckpointError when it does not exist, is not a
  /// directory, lacks the marker ("incomplete: the save that wrote it did
  /// not finish"), or metadata.json is missing, not JSON, of another format
  /// or of a newer version. When `path` is missing but an interrupted
  /// replacement left the previous complete checkpoint aside
  /// ("PATH.old-<pid>-<n>"), that one is opened (see docs/checkpoints.md).
  /// Only regular files are read (input.h); metadata.json is parsed within
  /// metadata_json_limits(); every name in "files" must be a plain
  /// ".safetensors" name inside `path`, listed once. `options` apply to
  /// every file opened through open_file().
  static CheckpointReader open(const std::string& path, const ReadOptions& options = {});

  /// The whole metadata.json object.
  const nlohmann::json& metadata() const { return metadata_; }
  /// The safetensors file names listed in metadata.json.
  std::vector<std::string> files() const;
  /// True when metadata.json lists `file`.
  bool has_file(const std::string& file) const;
  /// Opens and validates `file`; throws CheckpointError naming the
  /// checkpoint and the file when it is not listed or is damaged.
  SafetensorsFile open_file(const std::string& file) const;
  /// The path the checkpoint was read from (differs from the requested
  /// path only after the recovery described in open()).
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  nlohmann::json metadata_;
  ReadOptions options_;
};

}  // namespace strata::checkpoint
