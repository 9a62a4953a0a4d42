// JSONLinesLogger (loggers/jsonl_logger.h): one JSON object per line.
#include "strata/loggers/jsonl_logger.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "strata/core/error.h"

namespace strata::trainer {

namespace fs = std::filesystem;

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

}  // namespace strata::trainer
