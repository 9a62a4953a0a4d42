// What the file loggers (CSVLogger, JSONLinesLogger) share: Lightning's
// versioned folder layout, <root_dir>/<name>/version_<N>/, N one past the
// largest version already there unless given, and the writing of whole
// files in it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "strata/loggers/logger.h"

namespace strata::trainer {

/// Where a file logger writes: <root_dir>/<name>/version_<version>.
/// version: nullopt takes the next free number (the folder is chosen when
/// the logger is constructed, before any other rank could race for it:
/// the Trainer calls loggers on global rank 0 only).
std::string versioned_log_dir(const std::string& root_dir, const std::string& name,
                              std::optional<int64_t> version);

/// What the file loggers share: a versioned folder (versioned_log_dir),
/// the files written in it, and finalize = save.
class FileLogger : public Logger {
 public:
  std::string log_dir() const override { return log_dir_; }
  void finalize(const std::string& status) override;

 protected:
  /// Throws ConfigError for an empty root_dir or a name with '/'.
  FileLogger(const std::string& root_dir, const std::string& name, std::optional<int64_t> version);
  /// The path of `file` in the log folder, creating the folder (Error
  /// when it cannot).
  std::string file_path(const std::string& file) const;
  /// Replaces `file` in the log folder by `text` (Error when it cannot).
  void write_file(const std::string& file, const std::string& text) const;

  std::string log_dir_;
};

}  // namespace strata::trainer
