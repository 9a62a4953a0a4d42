// make_logger: a logger built from its format name, as `strata train
// --logger` and TrainerOptions users name them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "strata/loggers/logger.h"

namespace strata::trainer {

/// Builds a logger by format name: "csv" (CSVLogger), "jsonl"
/// (JSONLinesLogger) or "tensorboard" (TensorBoardLogger), writing under
/// <root_dir>/<name>/version_<version>. Throws ConfigError for another
/// name, listing the known ones, and for a version out of range.
LoggerPtr make_logger(const std::string& kind, const std::string& root_dir, const std::string& name = "lightning_logs",
                      std::optional<int64_t> version = std::nullopt);

}  // namespace strata::trainer
