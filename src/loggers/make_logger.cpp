// make_logger (loggers/make_logger.h): the loggers named by format.
#include "strata/loggers/make_logger.h"

#include <limits>
#include <memory>

#include "strata/core/error.h"
#include "strata/loggers/csv_logger.h"
#include "strata/loggers/jsonl_logger.h"
#include "strata/loggers/tensorboard_logger.h"

namespace strata::trainer {

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
