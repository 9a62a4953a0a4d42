// The file loggers' versioned folder and file writing (loggers/file_logger.h).
#include "strata/loggers/file_logger.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "strata/core/error.h"

namespace strata::trainer {
namespace {

namespace fs = std::filesystem;

void create_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  STRATA_CHECK(!ec, Error, "[logger] cannot create the log folder ", dir, ": ", ec.message(),
               "; choose a root_dir you can write to");
}

void check_name(const std::string& root_dir, const std::string& name) {
  STRATA_CHECK(!root_dir.empty(), ConfigError, "[logger] root_dir is empty; pass a folder such as 'runs'");
  STRATA_CHECK(name.find('/') == std::string::npos && name != ".." && name != ".", ConfigError,
               "[logger] name '", name, "' must be one folder name (no '/')");
}

}  // namespace

std::string versioned_log_dir(const std::string& root_dir, const std::string& name, std::optional<int64_t> version) {
  check_name(root_dir, name);
  fs::path base = fs::path(root_dir) / name;
  if (!version) {
    int64_t next = 0;
    std::error_code ec;
    if (fs::is_directory(base, ec)) {
      for (const auto& entry : fs::directory_iterator(base, ec)) {
        const std::string n = entry.path().filename().string();
        if (n.rfind("version_", 0) != 0 || n.size() == 8 || n.size() > 8 + 18) continue;
        if (n.find_first_not_of("0123456789", 8) != std::string::npos) continue;
        next = std::max<int64_t>(next, std::stoll(n.substr(8)) + 1);
      }
    }
    version = next;
  }
  STRATA_CHECK(*version >= 0, ConfigError, "[logger] version must be >= 0, got ", *version);
  return (base / ("version_" + std::to_string(*version))).string();
}

FileLogger::FileLogger(const std::string& root_dir, const std::string& name, std::optional<int64_t> version)
    : log_dir_(versioned_log_dir(root_dir, name, version)) {}

void FileLogger::finalize(const std::string&) { save(); }

std::string FileLogger::file_path(const std::string& file) const {
  create_dir(log_dir_);
  return (fs::path(log_dir_) / file).string();
}

void FileLogger::write_file(const std::string& file, const std::string& text) const {
  const std::string path = file_path(file);
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.flush();
  STRATA_CHECK(out.good(), Error, "[logger] cannot write ", path, " (is the disk full?)");
}

}  // namespace strata::trainer
