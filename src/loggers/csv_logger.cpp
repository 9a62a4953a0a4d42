// CSVLogger (loggers/csv_logger.h): rows buffered as text, written in
// Lightning's column order.
#include "strata/loggers/csv_logger.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "strata/core/error.h"
#include "strata/trainer/hparams.h"

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

}  // namespace

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

}  // namespace strata::trainer
