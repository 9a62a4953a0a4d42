// CSV and JSON-lines loggers (loggers/csv_logger.h).
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "strata/core/error.h"
#include "strata/loggers/csv_logger.h"
#include "strata/trainer/hparams.h"
#include "strata/loggers/tensorboard_logger.h"

namespace strata::trainer {
namespace {

namespace fs = std::filesystem;

// Shortest text that reads back as the same double (Python's repr rule);
// "nan", "inf", "-inf" for the rest, as Python's float() reads them.
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, result.ptr);
}

// A CSV cell: quoted when it holds a comma, quote or line break (RFC 4180).
std::string csv_cell(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

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

// ---- FileLogger -------------------------------------------------------------

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

// ---- CSVLogger --------------------------------------------------------------

CSVLogger::CSVLogger(std::string root_dir, std::string name, std::optional<int64_t> version,
                     int64_t flush_logs_every_n_steps)
    : FileLogger(root_dir, name, version), flush_every_(flush_logs_every_n_steps) {
  STRATA_CHECK(flush_every_ >= 1, ConfigError, "[logger] flush_logs_every_n_steps must be >= 1, got ", flush_every_);
}

std::string CSVLogger::metrics_file() const { return (fs::path(log_dir_) / "metrics.csv").string(); }

void CSVLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  std::map<std::string, std::string> row;
  for (const auto& [key, value] : metrics) {
    STRATA_CHECK(key != "step", ConfigError, "[logger] 'step' is the CSV's own column; log the metric under another name");
    // Whole epochs read as integers, as in Lightning's files.
    if (key == "epoch" && std::floor(value) == value && std::abs(value) < 9e15) {
      row[key] = std::to_string(static_cast<int64_t>(value));
    } else {
      row[key] = number_text(value);
    }
    if (!std::binary_search(columns_.begin(), columns_.end(), key)) {
      columns_.insert(std::upper_bound(columns_.begin(), columns_.end(), key), key);
      header_changed_ = true;
    }
  }
  row["step"] = std::to_string(step);
  rows_.push_back(std::move(row));
  // Lightning's rule: (step + 1) % N, so N=100 writes at steps 99, 199, ...
  if ((step + 1) % flush_every_ == 0) save();
}

void CSVLogger::log_hyperparams(const Hyperparams& params) {
  // Lightning keeps the union of every call's hyperparameters.
  for (const auto& [key, value] : params) hparams_[key] = value;
  write_file("hparams.yaml", hparams_yaml(hparams_));
}

void CSVLogger::save() {
  if (rows_.size() == written_ && !header_changed_) return;
  // Lightning's column order: every name sorted, "step" among them
  // ("epoch,step,train_loss_epoch,..."); "epoch" is a metric like the others.
  std::vector<std::string> header = columns_;
  header.insert(std::upper_bound(header.begin(), header.end(), std::string("step")), "step");
  const bool rewrite = header_changed_ || written_ == 0;
  std::ofstream out(file_path("metrics.csv"), rewrite ? std::ios::trunc : std::ios::app);
  STRATA_CHECK(out.is_open(), Error, "[logger] cannot open ", metrics_file(), " for writing");
  auto write_row = [&](const std::map<std::string, std::string>& row) {
    for (size_t i = 0; i < header.size(); ++i) {
      auto it = row.find(header[i]);
      out << (i ? "," : "") << (it == row.end() ? "" : csv_cell(it->second));
    }
    out << "\n";
  };
  if (rewrite) {
    for (size_t i = 0; i < header.size(); ++i) out << (i ? "," : "") << csv_cell(header[i]);
    out << "\n";
    for (const auto& row : rows_) write_row(row);
  } else {
    for (size_t i = written_; i < rows_.size(); ++i) write_row(rows_[i]);
  }
  out.flush();
  STRATA_CHECK(out.good(), Error, "[logger] writing ", metrics_file(), " failed (is the disk full?)");
  written_ = rows_.size();
  header_changed_ = false;
}

// ---- JSONLinesLogger ------------------------------------------------------------

JSONLinesLogger::JSONLinesLogger(std::string root_dir, std::string name, std::optional<int64_t> version)
    : FileLogger(root_dir, name, version) {}

std::string JSONLinesLogger::metrics_file() const { return (fs::path(log_dir_) / "metrics.jsonl").string(); }

void JSONLinesLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  nlohmann::json line = nlohmann::json::object();
  line["step"] = step;
  for (const auto& [key, value] : metrics) {
    if (key == "step") continue;
    line[key] = std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  pending_.push_back(line.dump());
}

void JSONLinesLogger::log_hyperparams(const Hyperparams& params) {
  for (const auto& [key, value] : params) hparams_[key] = value;
  // Bytes that are not UTF-8 become U+FFFD (JSON holds only UTF-8).
  const nlohmann::json h(hparams_);
  write_file("hparams.json", h.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

void JSONLinesLogger::save() {
  if (pending_.empty()) return;
  std::ofstream out(file_path("metrics.jsonl"), std::ios::app);
  for (const std::string& line : pending_) out << line << "\n";
  out.flush();
  STRATA_CHECK(out.good(), Error, "[logger] writing ", metrics_file(), " failed (is the disk full?)");
  pending_.clear();
}

// ---- make_logger ------------------------------------------------------------------

LoggerPtr make_logger(const std::string& kind, const std::string& root_dir, const std::string& name,
                      std::optional<int64_t> version) {
  if (kind == "csv") return std::make_shared<CSVLogger>(root_dir, name, version);
  if (kind == "jsonl") return std::make_shared<JSONLinesLogger>(root_dir, name, version);
  if (kind == "tensorboard") {
    STRATA_CHECK(!version || (*version >= 0 && *version <= std::numeric_limits<int>::max()), ConfigError,
                 "[logger] version ", *version, " is out of range: it must be from 0 to ",
                 std::numeric_limits<int>::max());
    return std::make_shared<TensorBoardLogger>(root_dir, name,
                                               version ? std::optional<int>(static_cast<int>(*version)) : std::nullopt);
  }
  throw ConfigError("[logger] unknown logger '" + kind + "'; choose one of: csv, jsonl, tensorboard");
}

}  // namespace strata::trainer
