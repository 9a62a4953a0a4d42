// Checkpoint directories (include/strata/checkpoint/directory.h): staging,
// metadata.json, the completion marker, and the checks made on open.
#include "strata/checkpoint/directory.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/input.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

using ::strata::detail::cat;
namespace fs = std::filesystem;

constexpr const char* kTensorSuffix = ".safetensors";

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_plain_name(const std::string& file, const std::string& path) {
  STRATA_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
               CheckpointError, "[checkpoint] ", path, ": file name '", file,
               "' must be a plain name without '/'");
  STRATA_CHECK(file != kMetadataFile && file != kCompleteMarker, CheckpointError, "[checkpoint] ",
               path, ": file name '", file, "' is reserved");
}

std::string host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

// The host as it appears in staging names: characters other than letters,
// digits, '.', '-' and '_' become '_' (gethostname may return anything).
std::string host_tag() {
  std::string tag = host_name();
  for (char& c : tag) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '.' || c == '-' || c == '_';
    if (!plain) c = '_';
  }
  return tag;
}

// "PATH.tmp-<pid>-<n>" -> true and the pid; anything else -> false.
bool staging_pid(const std::string& name, long& pid) {
  const auto tag = name.rfind(".tmp-");
  if (tag == std::string::npos || tag == 0) return false;
  const std::string rest = name.substr(tag + 5);
  const auto dash = rest.find('-');
  if (dash == std::string::npos || dash == 0 || dash + 1 == rest.size()) return false;
  for (size_t i = 0; i < rest.size(); ++i)
    if (i != dash && (rest[i] < '0' || rest[i] > '9')) return false;
  if (dash > 9) return false;
  pid = std::stol(rest.substr(0, dash));
  return pid > 0;
}

// "PATH.tmp-<pid>-<n>@<host>" -> true, the pid and the host tag;
// "PATH.tmp-<pid>-<n>" (older strata) -> true, the pid and "".
bool parse_staging(const std::string& name, long& pid, std::string& host) {
  const auto at = name.rfind('@');
  if (at != std::string::npos && at + 1 < name.size() &&
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
                             at + 1) == std::string::npos &&
      staging_pid(name.substr(0, at), pid)) {
    host = name.substr(at + 1);
    return true;
  }
  host.clear();
  return staging_pid(name, pid);
}

// What /proc/PID/stat says of a process: its state letter (field 3) and
// its start time in clock ticks after boot (field 22). False when it
// cannot be read (no such process, or no /proc).
bool read_process_stat(long pid, char& state, unsigned long long& start) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  // The name (field 2) is in parentheses and may hold spaces or ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 3) state = field.empty() ? '?' : field[0];
    if (i == 22) {
      try {
        start = std::stoull(field);
      } catch (const std::exception&) {
        return false;
      }
      return true;
    }
  }
  return false;
}

// This process's start time, as its owner files record it ("" if unknown).
std::string own_start_time() {
  char state = '?';
  unsigned long long start = 0;
  return read_process_stat(::getpid(), state, start) ? std::to_string(start) : std::string();
}

// Note [Who owns a staging directory]
// A staging directory belongs to the process its name gives (the pid, on
// this host) for as long as that process runs. Three things say it no
// longer does: no such process (kill(pid, 0) fails with ESRCH); a zombie
// (state Z, or X while being reaped): it has exited and waits only for its
// parent to reap it, which can take a while when the parent is itself
// busy or stopped (kill-during-save trials left folders behind this way in
// 9 runs of 40); and a process whose start time differs from the one recorded
// in the owner file: its pid was reused by another process. The start time
// (field 22 of /proc/PID/stat) is written on a third line of the owner
// file, "start T"; owner files without it (older strata, or one cut short)
// rely on the first two tests. A process that cannot be looked at (no
// /proc) counts as running: strata removes only what it knows is dead.
bool process_gone(long pid, const std::optional<unsigned long long>& recorded_start) {
  if (::kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH) return true;
  char state = '?';
  unsigned long long start = 0;
  if (!read_process_stat(pid, state, start)) return false;
  if (state == 'Z' || state == 'X') return true;
  return recorded_start.has_value() && *recorded_start != start;
}

// Reads an owner file: "host H\npid P\n" and, from newer strata, "start T\n".
// True when it names `host` and `pid`; `start` is then the recorded start
// time, if any. Anything else (missing, cut short, another owner) is false.
bool read_owner(const std::string& path, const std::string& host, long pid,
                std::optional<unsigned long long>& start) {
  std::string owner;
  try {
    owner = read_regular_file(path + "/" + kStagingOwner, 4096);
  } catch (const CheckpointError&) {
    return false;
  }
  const std::string named = cat("host ", host, "\npid ", pid, "\n");
  if (owner.compare(0, named.size(), named) != 0) return false;
  const std::string rest = owner.substr(named.size());
  start.reset();
  if (rest.empty()) return true;
  if (rest.rfind("start ", 0) != 0 || rest.back() != '\n') return false;
  const std::string digits = rest.substr(6, rest.size() - 7);
  if (digits.empty() || digits.size() > 20 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  try {
    start = std::stoull(digits);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

}  // namespace

// Note [Leftover staging directories]
// A save killed before it publishes leaves its staging directory behind, and
// so does one killed after the exchange rename, before the old checkpoint
// (now under the staging name) is deleted. The name says who made it:
// "PATH.tmp-<pid>-<n>@<host>", chosen before the directory exists, so even a
// save killed between its mkdir and its owner file (kStagingOwner, written
// after) is recognised. A later save or resume removes those made on this
// host by a process that no longer runs, whatever their owner file holds
// (missing, empty, cut short). A live owner (even another job's) or another
// host's is left alone. Directories named by older strata, without the
// host, are removed only when their owner file names this host and a
// process that is gone; one without an owner file is left alone: strata
// removes only what it knows it wrote and nobody is still writing. Whether
// the process still runs: Note [Who owns a staging directory].
std::vector<std::string> remove_stale_staging(const std::string& dir_in) {
  std::vector<std::string> removed;
  const std::string dir = dir_in.empty() ? "." : dir_in;
  std::error_code ec;
  const std::string host = host_name();
  const std::string tag = host_tag();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    long pid = 0;
    std::string named_host;
    if (!parse_staging(name, pid, named_host)) continue;
    struct stat st {};
    const std::string path = it->path().string();
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    std::optional<unsigned long long> start;
    if (!named_host.empty()) {
      if (named_host != tag) continue;
      if (!read_owner(path, host, pid, start)) start.reset();  // the name is enough
    } else if (!read_owner(path, host, pid, start)) {
      continue;
    }
    if (!process_gone(pid, start)) continue;  // alive, or unknown
    std::error_code rm;
    fs::remove_all(path, rm);
    if (!rm) removed.push_back(path);
  }
  return removed;
}

// ---- writer -----------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string path, std::string staging, bool owner)
    : path_(std::move(path)), staging_(std::move(staging)), owner_(owner) {}

CheckpointWriter CheckpointWriter::begin(const std::string& path_in) {
  const std::string path = strip_trailing_slashes(path_in);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec))) {
    const bool empty_dir = fs::is_directory(path, ec) && fs::is_empty(path, ec);
    STRATA_CHECK(empty_dir || is_complete(path), CheckpointError, "[checkpoint] ", path,
                 " exists and is not a complete strata checkpoint; refusing to overwrite it "
                 "(move or delete it, or save elsewhere)");
  }
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    STRATA_CHECK(!ec, CheckpointError, "[checkpoint] ", path, ": creating parent directory ",
                 parent.string(), ": ", ec.message());
  }
  for (const std::string& stale : remove_stale_staging(parent.empty() ? "." : parent.string()))
    warn(cat("removed ", stale, ", left by an interrupted save whose process is gone"));
  // Note [Leftover staging directories]: the name carries pid and host.
  std::string staging = unique_sibling(path, ".tmp", "@" + host_tag());
  if (::mkdir(staging.c_str(), 0755) == -1)
    detail::throw_write_error(errno, path, cat("creating its staging directory ", staging));
  CheckpointWriter writer(path, staging, /*owner=*/true);
  // Note [Who owns a staging directory]: the start time tells a reused pid.
  const std::string start = own_start_time();
  atomic_write_file(staging + "/" + kStagingOwner,
                    cat("host ", host_name(), "\npid ", ::getpid(), "\n", start.empty() ? "" : "start " + start + "\n"));
  return writer;
}

CheckpointWriter CheckpointWriter::join(const std::string& path, const std::string& staging_dir) {
  std::error_code ec;
  STRATA_CHECK(fs::is_directory(staging_dir, ec), CheckpointError, "[checkpoint] ", path,
               ": staging directory ", staging_dir,
               " does not exist (was begin() called, on a file system this process sees?)");
  return CheckpointWriter(strip_trailing_slashes(path), staging_dir, /*owner=*/false);
}

CheckpointWriter::~CheckpointWriter() {
  if (owner_ && !committed_ && !staging_.empty()) {
    std::error_code ec;
    fs::remove_all(staging_, ec);  // best effort: we are already failing
  }
}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& other) noexcept
    : path_(std::move(other.path_)),
      staging_(std::move(other.staging_)),
      owner_(std::exchange(other.owner_, false)),
      committed_(other.committed_) {}

CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&& other) noexcept {
  if (this != &other) {
    if (owner_ && !committed_ && !staging_.empty()) {
      std::error_code ec;
      fs::remove_all(staging_, ec);
    }
    path_ = std::move(other.path_);
    staging_ = std::move(other.staging_);
    owner_ = std::exchange(other.owner_, false);
    committed_ = other.committed_;
  }
  return *this;
}

std::string CheckpointWriter::file_path(const std::string& file) const {
  check_plain_name(file, path_);
  STRATA_CHECK(!committed_, CheckpointError, "[checkpoint] ", path_,
               ": writing '", file, "' after commit()");
  return staging_ + "/" + file;
}

void CheckpointWriter::write_file(const std::string& file, const NamedTensors& tensors,
                                  const Metadata& metadata) {
  write_safetensors(file_path(file), tensors, metadata);
}

SafetensorsWriter CheckpointWriter::open_file(const std::string& file,
                                              std::vector<TensorSpec> specs, Metadata metadata) {
  return SafetensorsWriter(file_path(file), std::move(specs), std::move(metadata));
}

void CheckpointWriter::commit(const nlohmann::json& metadata) {
  STRATA_CHECK(owner_, CheckpointError, "[checkpoint] ", path_,
               ": commit() must be called by the process that began the save, not one that joined");
  STRATA_CHECK(!committed_, CheckpointError, "[checkpoint] ", path_, ": commit() called twice");
  STRATA_CHECK(metadata.is_object(), CheckpointError, "[checkpoint] ", path_,
               ": checkpoint metadata must be a JSON object, got ", metadata.type_name());
  for (const char* reserved : {"format", "version", "files"})
    STRATA_CHECK(!metadata.contains(reserved), CheckpointError, "[checkpoint] ", path_,
                 ": metadata field '", reserved, "' is reserved (strata sets it)");

  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(staging_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (ends_with(name, kTensorSuffix) && it->is_regular_file()) files.push_back(name);
  }
  STRATA_CHECK(!ec, CheckpointError, "[checkpoint] ", path_, ": listing ", staging_, ": ",
               ec.message());
  std::sort(files.begin(), files.end());

  STRATA_CHECK_SYSCALL(::unlink((staging_ + "/" + kStagingOwner).c_str()), CheckpointError,
                       "[checkpoint] ", path_, ": removing the staging owner file");
  nlohmann::json full = metadata;
  full["format"] = kCheckpointFormat;
  full["version"] = kCheckpointVersion;
  full["files"] = files;
  atomic_write_file(staging_ + "/" + kMetadataFile, full.dump(2) + "\n");
  // The marker last: its presence means every file above is complete.
  atomic_write_file(staging_ + "/" + kCompleteMarker,
                    cat(kCheckpointFormat, " ", kCheckpointVersion, "\n"));
  fsync_dir(staging_);
  publish_dir(staging_, path_);
  committed_ = true;
}

void write_checkpoint_dir(const std::string& path, const std::map<std::string, NamedTensors>& files,
                          const nlohmann::json& metadata) {
  CheckpointWriter writer = CheckpointWriter::begin(path);
  for (const auto& [file, tensors] : files) writer.write_file(file, tensors);
  writer.commit(metadata);
}

// ---- reader -----------------------------------------------------------------

void check_checkpoint_format(const nlohmann::json& meta, const std::string& where) {
  STRATA_CHECK(meta.is_object() && meta.contains("format") && meta["format"].is_string(),
               CheckpointError, "[checkpoint] ", where,
               ": has no \"format\" field; not a strata checkpoint");
  const std::string format = meta["format"].get<std::string>();
  STRATA_CHECK(format == kCheckpointFormat, CheckpointError, "[checkpoint] ", where,
               ": format is '", format, "', expected '", kCheckpointFormat, "'");
  STRATA_CHECK(meta.contains("version") && meta["version"].is_number_integer(), CheckpointError,
               "[checkpoint] ", where, ": has no integer \"version\" field");
  const int64_t version = meta["version"].get<int64_t>();
  STRATA_CHECK(version >= 1 && version <= kCheckpointVersion, CheckpointError, "[checkpoint] ",
               where, ": format version ", version, " is not supported (this build reads 1 to ",
               kCheckpointVersion, "; a newer strata wrote it?)");
}

CheckpointReader CheckpointReader::open(const std::string& path_in, const ReadOptions& options) {
  std::string path = strip_trailing_slashes(path_in);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    // See Note [Atomic checkpoint directories]: an interrupted replacement
    // on a file system without RENAME_EXCHANGE leaves the previous complete
    // checkpoint at PATH.old-<pid>-<n>.
    const fs::path p(path);
    const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    const std::string prefix = p.filename().string() + ".old-";
    std::vector<std::string> aside;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(prefix, 0) == 0 && is_complete(it->path().string()))
        aside.push_back(it->path().string());
    }
    STRATA_CHECK(!aside.empty(), CheckpointError, "[checkpoint] ", path,
                 ": no such checkpoint (the directory does not exist)");
    std::sort(aside.begin(), aside.end());
    path = aside.back();
  }
  STRATA_CHECK(fs::is_directory(path, ec), CheckpointError, "[checkpoint] ", path,
               ": not a directory (a strata checkpoint is a directory holding ", kMetadataFile,
               ")");
  STRATA_CHECK(is_complete(path), CheckpointError, "[checkpoint] ", path,
               " is incomplete: it has no ", kCompleteMarker,
               " marker, so the save that wrote it did not finish (a crash mid-save?); load an "
               "earlier checkpoint");
  const std::string meta_path = path + "/" + kMetadataFile;
  const JsonLimits limits = metadata_json_limits();
  CheckpointReader reader;
  reader.path_ = path;
  reader.options_ = options;
  reader.metadata_ = parse_json_limited(read_regular_file(meta_path, limits.max_bytes), limits,
                                        meta_path, kMetadataFile);
  const auto& meta = reader.metadata_;
  check_checkpoint_format(meta, meta_path);
  STRATA_CHECK(meta.contains("files") && meta["files"].is_array(), CheckpointError,
               "[checkpoint] ", meta_path, ": has no \"files\" list");
  std::set<std::string> listed;
  for (const auto& f : meta["files"]) {
    STRATA_CHECK(f.is_string(), CheckpointError, "[checkpoint] ", meta_path,
                 ": \"files\" holds ", f.dump(), ", not a file name");
    const std::string& name = f.get_ref<const std::string&>();
    check_contained_name(name, meta_path, "\"files\"");
    STRATA_CHECK(ends_with(name, kTensorSuffix), CheckpointError, "[checkpoint] ", meta_path,
                 ": \"files\" names '", name, "', not a ", kTensorSuffix, " file");
    STRATA_CHECK(listed.insert(name).second, CheckpointError, "[checkpoint] ", meta_path,
                 ": \"files\" names '", name, "' twice");
  }
  return reader;
}

std::vector<std::string> CheckpointReader::files() const {
  return metadata_["files"].get<std::vector<std::string>>();
}

bool CheckpointReader::has_file(const std::string& file) const {
  const auto& list = metadata_["files"];
  return std::find(list.begin(), list.end(), file) != list.end();
}

SafetensorsFile CheckpointReader::open_file(const std::string& file) const {
  STRATA_CHECK(has_file(file), CheckpointError, "[checkpoint] ", path_, ": has no file '", file,
               "' (", kMetadataFile, " lists ", metadata_["files"].dump(), ")");
  return SafetensorsFile::open(path_ + "/" + file, options_);
}

}  // namespace strata::checkpoint
