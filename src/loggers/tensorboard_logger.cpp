// TensorBoardLogger: Lightning's folder layout and version numbering, scalar
// events through EventFileWriter, and hparams.yaml written atomically.
#include "strata/loggers/tensorboard_logger.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "strata/core/error.h"
#include "strata/trainer/hparams.h"

namespace strata::trainer {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxNameBytes = 255;

// Lightning's _get_next_version: 1 + the largest K of the version_K folders
// in `dir`, 0 when there are none (or `dir` does not exist yet).
int next_version(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  int next = 0;
  fs::directory_iterator it(dir, ec);
  STRATA_CHECK(!ec, ConfigError, "[tensorboard] cannot list ", dir.string(), " to choose the next version: ",
               ec.message(), "; pass a version or another root_dir");
  for (const fs::directory_entry& entry : it) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("version_", 0) != 0 || !entry.is_directory(ec)) continue;
    const std::string digits = file.substr(8);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    next = std::max(next, std::atoi(digits.c_str()) + 1);
  }
  return next;
}

// Writes `text` to `path` through a temporary file and a rename.
void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  STRATA_CHECK_SYSCALL(fd, Error, "[tensorboard] cannot write ", temp);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(temp.c_str());
      throw Error(detail::cat("[tensorboard] writing ", temp, " failed: ", detail::errno_string(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  const int synced = ::fsync(fd);
  ::close(fd);
  if (synced != 0 || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw Error(detail::cat("[tensorboard] replacing ", path, " failed: ", detail::errno_string(err)));
  }
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TensorBoardLogger::TensorBoardLogger(std::string root_dir, std::string name, std::optional<int> version,
                                     bool default_hp_metric)
    : root_dir_(std::move(root_dir)), name_(std::move(name)), default_hp_metric_(default_hp_metric) {
  STRATA_CHECK(!root_dir_.empty(), ConfigError,
               "[tensorboard] root_dir is empty; name the folder that holds the runs (\".\" for here)");
  STRATA_CHECK(root_dir_.find('\0') == std::string::npos && root_dir_.size() <= 4096, ConfigError,
               "[tensorboard] root_dir holds a NUL byte or is longer than 4096 bytes");
  STRATA_CHECK(name_.size() <= kMaxNameBytes && name_ != "." && name_ != ".." &&
                   name_.find_first_of(std::string("/\0", 2)) == std::string::npos,
               ConfigError, "[tensorboard] name '", name_.substr(0, 80),
               "' must be a plain folder name (no '/', not '.' or '..', at most ", kMaxNameBytes,
               " bytes) or empty");
  STRATA_CHECK(!version || *version >= 0, ConfigError, "[tensorboard] version ", version.value_or(0),
               " is negative; pass a version >= 0 or none to take the next free one");
  const fs::path parent = name_.empty() ? fs::path(root_dir_) : fs::path(root_dir_) / name_;
  version_ = version ? *version : next_version(parent);
  log_dir_ = (parent / ("version_" + std::to_string(version_))).string();
}

TensorBoardLogger::~TensorBoardLogger() = default;  // the writer closes its file

void TensorBoardLogger::ensure_dir() {
  std::error_code ec;
  fs::create_directories(log_dir_, ec);
  STRATA_CHECK(!ec && fs::is_directory(log_dir_), Error, "[tensorboard] cannot create the log folder ", log_dir_,
               ": ", ec ? ec.message() : std::string("a file of that name is in the way"),
               "; choose another root_dir");
  if (!writer_) writer_ = std::make_unique<EventFileWriter>(log_dir_);
}

void TensorBoardLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  std::vector<std::pair<std::string, double>> scalars;
  scalars.reserve(metrics.size());
  for (const auto& [tag, value] : metrics) {
    check_tag(tag);  // every name first: a bad one writes nothing
    scalars.emplace_back(tag, value);
  }
  if (scalars.empty()) return;
  ensure_dir();
  write_pending_hparams();
  writer_->append_event(encode_scalars_event(now_seconds(), step, scalars));
}

void TensorBoardLogger::log_hyperparams(const Hyperparams& params) {
  for (const auto& [key, value] : params) hparams_[key] = value;
  ensure_dir();
  write_hparams();
  hparams_pending_ = true;  // Note [One hparams record]
}

// Note [One hparams record]: TensorBoard keeps the first summary it reads
// for a tag, so the HPARAMS tab shows the first session_start_info of a run.
// log_hyperparams therefore only marks the hyperparameters pending; they
// are written, all merged, just before the first scalars (or at save or
// finalize). A later log_hyperparams writes another record that TensorBoard
// ignores, exactly as with Lightning's logger; hparams.yaml has them all.
void TensorBoardLogger::write_pending_hparams() {
  if (!hparams_pending_) return;
  hparams_pending_ = false;
  ensure_dir();
  // Lightning's TensorBoardLogger: with default_hp_metric, "hp_metric" = -1
  // at step 0 and the three hparams summaries naming it as the metric;
  // without it (and no metrics given), nothing reaches the event file.
  if (!default_hp_metric_) return;
  const double now = now_seconds();
  writer_->append_event(encode_scalars_event(now, 0, {{"hp_metric", -1.0}}));
  for (const std::string& event : encode_hparams_events(now, tensorboard_hparams(hparams_), {"hp_metric"})) {
    writer_->append_event(event);
  }
}

void TensorBoardLogger::write_hparams() {
  write_file_atomically((fs::path(log_dir_) / "hparams.yaml").string(), hparams_yaml(hparams_));
}

void TensorBoardLogger::save() {
  write_pending_hparams();
  if (writer_) writer_->flush();
  // Lightning writes hparams.yaml on save when the run has none yet.
  std::error_code ec;
  if (fs::is_directory(log_dir_, ec) && !fs::exists(fs::path(log_dir_) / "hparams.yaml", ec)) write_hparams();
}

void TensorBoardLogger::finalize(const std::string& status) {
  (void)status;  // TensorBoard has no place for it; the event file is simply closed
  if (!writer_) return;
  save();
  std::unique_ptr<EventFileWriter> writer = std::move(writer_);
  writer->close();
}

std::string TensorBoardLogger::event_file() const { return writer_ ? writer_->path() : std::string(); }

}  // namespace strata::trainer
